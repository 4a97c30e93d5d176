"""Random operators drawn from a seed and the step, so that a resumed run draws what the uninterrupted one drew.

onnxruntime's ``Dropout`` and ``Random*`` kernels draw from a generator of
their own where the node has a ``seed`` attribute, else from the process's
default generators (``RandomGenerator``, ``PhiloxGenerator`` on CUDA), each
run taking the next seeds in the order the kernels run. Neither is in a
checkpoint, and every new session restarts a seeded node's generator: a run
resumed from a checkpoint, or run again in a fresh process, draws other
masks than the first run drew.

With a seed, the module runs its training models with those ``seed``
attributes removed and, before each train step, sets the default
generators' seed (``onnxruntime.set_seed``, process-wide) to a mix of its
seed, the optimizer steps taken and the train steps since the gradients were
last reset. A train step's draws are then a function of those numbers and of
the order the kernels run in, which is the models' forward order on every
path of a step (the fused step, the step from reset gradients, the plain
training model): the same in a resumed run as in the uninterrupted one.
``train_epoch`` runs such a module a step at a time, since a pass in one run
would draw its batches' masks in one sequence.
"""

from __future__ import annotations

import onnx
import onnxruntime as ort

from onnxtrain.graph.io import copy_model
from onnxtrain.graph.versions import is_standard
from onnxtrain.graph.walk import all_nodes
from onnxtrain.training.models import LoadedModel

#: Operators that draw from onnxruntime's random generators.
RANDOM_OPERATORS = frozenset(
    {"Dropout", "RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Bernoulli", "Multinomial"}
)

_MASK = (1 << 64) - 1


def draws_at_random(node: onnx.NodeProto) -> bool:
    """Whether ``node`` draws random numbers when it runs: a random operator, a ``Dropout`` only with a training
    flag input (without one it passes its input through)."""
    if node.op_type not in RANDOM_OPERATORS or not is_standard(node):
        return False
    return node.op_type != "Dropout" or (len(node.input) > 2 and bool(node.input[2]))


def mixed_seed(seed: int, step: int, micro_step: int) -> int:
    """A seed in ``[0, 2^63)`` for a train step: SplitMix64's finalizer over ``seed``, ``step`` and
    ``micro_step`` (neighbouring steps get unrelated seeds)."""
    value = 0
    for part in (seed, step, micro_step):
        value = ((value ^ (part & _MASK)) + 0x9E3779B97F4A7C15) & _MASK
        value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK
        value ^= value >> 31
    return value >> 1


class StepSeeds:
    """A module's seed for the random operators of its training model (see the module docstring)."""

    def __init__(self, seed: int) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, not {type(seed).__name__}")
        self.seed = seed

    @classmethod
    def for_model(cls, model: LoadedModel, seed: int | None) -> tuple[LoadedModel, StepSeeds | None]:
        """``model`` without its random nodes' ``seed`` attributes, and the seeds to set before each train step;
        ``model`` itself and ``None`` where ``seed`` is ``None`` or nothing in it draws."""
        if seed is None:
            return model, None
        seeds = cls(seed)
        if not any(draws_at_random(node) for node in all_nodes(model.proto.graph)):
            return model, None
        if not any(attribute.name == "seed" for node in all_nodes(model.proto.graph) for attribute in node.attribute):
            return model, seeds
        unseeded = copy_model(model.proto)
        for node in all_nodes(unseeded.graph):
            if node.op_type in RANDOM_OPERATORS and is_standard(node):
                kept = [attribute for attribute in node.attribute if attribute.name != "seed"]
                del node.attribute[:]
                node.attribute.extend(kept)
        return LoadedModel(unseeded, unseeded.SerializeToString()), seeds

    def before_step(self, step: int, micro_step: int) -> None:
        """Seed onnxruntime's default generators for the train step after ``step`` optimizer steps, the
        ``micro_step``-th since the gradients were reset."""
        ort.set_seed(mixed_seed(self.seed, step, micro_step))


__all__ = ["RANDOM_OPERATORS", "StepSeeds", "draws_at_random", "mixed_seed"]
