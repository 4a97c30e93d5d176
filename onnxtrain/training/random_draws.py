"""Random operators drawn from a seed and the step, so that a resumed run draws what the uninterrupted one drew.

onnxruntime's ``Dropout`` kernels draw from a generator of their own where
the node has a ``seed`` attribute, else from the process's default
generators (``RandomGenerator``, ``PhiloxGenerator`` on CUDA), each run
taking the next seeds in the order the kernels run. Its other random
kernels (``RandomUniformLike``, ``RandomNormal``, ``Bernoulli``...) always
draw from a generator of their own, seeded when the session is made (from
the node's ``seed``, else from the process's seed and the node's index).
None of these is in a checkpoint, and every new session restarts such a
generator: a run resumed from a checkpoint, or run again in a fresh process,
draws other masks than the first run drew.

Every module first draws the Bernoulli masks of torch's ``nn.Dropout1d/2d/3d``
(``Less(RandomUniformLike(t), q)``, as torch's dynamo exporter writes them)
with ``Dropout`` (:func:`bernoulli_masks_as_dropout`), which draws from the
default generators: the same distribution, and no session repeats another's
first masks.

With a seed, the module runs its training models with those ``seed``
attributes removed and, before each train step, sets the default
generators' seed (``onnxruntime.set_seed``, process-wide) to a mix of its
seed, the optimizer steps taken and the train steps since the gradients were
last reset. A train step's draws are then a function of those numbers and of
the order the kernels run in, which is the models' forward order on every
path of a step (the fused step, the step from reset gradients, the plain
training model): the same in a resumed run as in the uninterrupted one.
``train_epoch`` runs such a module a step at a time, since a pass in one run
would draw its batches' masks in one sequence. The random nodes left that
draw from generators of their own (noise drawn with ``RandomNormalLike``,
say) are named in a :class:`OwnGeneratorWarning`: their draws are
onnxruntime's.
"""

from __future__ import annotations

import warnings

import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from onnxtrain.graph import versions
from onnxtrain.graph.attributes import attribute
from onnxtrain.graph.io import copy_model
from onnxtrain.graph.operators import RANDOM_OPERATORS as DRAWING_OPERATORS
from onnxtrain.graph.versions import is_standard
from onnxtrain.graph.walk import all_nodes, constant_tensors
from onnxtrain.training.models import LoadedModel

FLOAT, BOOL = onnx.TensorProto.FLOAT, onnx.TensorProto.BOOL

#: Operators that draw from onnxruntime's random generators: the ones that draw random numbers, and ``Dropout``.
RANDOM_OPERATORS = frozenset({"Dropout", *DRAWING_OPERATORS})

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
        """``model`` with its Bernoulli masks drawn by ``Dropout`` (:func:`bernoulli_masks_as_dropout`) and, with a
        ``seed``, without its random nodes' ``seed`` attributes, and the seeds to set before each train step
        (``None`` where ``seed`` is ``None`` or nothing in it draws)."""
        proto, owned = model.proto, False  # owned: a copy made here, changed, serialized once at the end
        if any(node.op_type == "RandomUniformLike" for node in proto.graph.node):
            rewritten = copy_model(proto)
            if bernoulli_masks_as_dropout(rewritten):
                proto, owned = rewritten, True
        seeds = None if seed is None else cls(seed)
        if seeds is not None and not any(draws_at_random(node) for node in all_nodes(proto.graph)):
            seeds = None
        if seeds is not None:
            own = [node.name or node.output[0] for node in all_nodes(proto.graph) if _own_generator(node)]
            if own:
                warnings.warn(
                    f"random nodes {own[:5]}{' and more' if len(own) > 5 else ''} draw from generators of their own "
                    "that onnxruntime seeds when a session is made: the module's seed does not reach them, so a "
                    "resumed run draws other values there than the uninterrupted one (Dropout's masks are exact)",
                    OwnGeneratorWarning,
                    stacklevel=4,
                )
            if any(attribute.name == "seed" for node in all_nodes(proto.graph) for attribute in node.attribute):
                proto, owned = (proto if owned else copy_model(proto)), True
                for node in all_nodes(proto.graph):
                    if node.op_type in RANDOM_OPERATORS and is_standard(node):
                        kept = [attribute for attribute in node.attribute if attribute.name != "seed"]
                        del node.attribute[:]
                        node.attribute.extend(kept)
        return (LoadedModel(proto, proto.SerializeToString()) if owned else model), seeds

    def before_step(self, step: int, micro_step: int) -> None:
        """Seed onnxruntime's default generators for the train step after ``step`` optimizer steps, the
        ``micro_step``-th since the gradients were reset."""
        ort.set_seed(mixed_seed(self.seed, step, micro_step))


def bernoulli_masks_as_dropout(model: onnx.ModelProto) -> int:
    """Each Bernoulli mask ``Less(RandomUniformLike(t), q)`` of ``model``'s top graph (torch's dynamo exporter
    writes ``nn.Dropout1d/2d/3d``'s so, ``q`` a constant keep probability) drawn instead as the mask of a
    ``Dropout(ones like t, ratio 1 - q, training)``, in place; the number rewritten.

    The same distribution, but ``RandomUniformLike`` draws from a generator of its own that onnxruntime seeds
    when a session is made (each session's first draws are the same, and ``onnxruntime.set_seed`` does not reach
    it), where ``Dropout`` draws from the process's default generator, which :class:`StepSeeds` seeds at each
    step: a resumed run then draws what the uninterrupted one drew.
    """
    opset = versions.opset_version(model, "")
    if opset is None or opset < 12:  # Dropout's training input
        return 0
    graph = model.graph
    constants = constant_tensors(graph)
    producers = {name: node for node in graph.node for name in node.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in all_nodes(graph):
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {value.name for value in graph.output}
    replaced: dict[int, list[onnx.NodeProto]] = {}  # by the Less's position, the nodes that draw its mask
    dropped: set[int] = set()  # the ids of the nodes no longer run: the uniform draws, the casts of q to their type
    for position, node in enumerate(graph.node):
        if node.op_type != "Less" or not is_standard(node):
            continue
        uniform = producers.get(node.input[0])
        keep = _scalar(node.input[1], producers, constants)
        if (
            uniform is None
            or uniform.op_type != "RandomUniformLike"
            or not is_standard(uniform)
            or keep is None
            or not 0.0 < keep <= 1.0
            or uniform.output[0] in outputs
            or _float_attribute(uniform, "low", 0.0) != 0.0
            or _float_attribute(uniform, "high", 1.0) != 1.0
        ):
            continue
        # besides the Less, only casts of q to the draws' type may read them (the exporter's CastLike(q, draws))
        casts = [reader for reader in readers.get(uniform.output[0], []) if reader is not node]
        if not all(_casts_only_for(cast, node, uniform.output[0], readers, outputs) for cast in casts):
            continue
        dropped.update(id(cast) for cast in casts)
        dropped.add(id(uniform))
        mask = node.output[0]
        shape, ones, ratio, training, scaled = (f"{mask}.{part}" for part in ("shape", "ones", "ratio", "on", "kept"))
        replaced[position] = [
            helper.make_node("Shape", [uniform.input[0]], [shape]),
            helper.make_node("ConstantOfShape", [shape], [ones], value=helper.make_tensor("one", FLOAT, [1], [1.0])),
            helper.make_node("Constant", [], [ratio], value=helper.make_tensor("ratio", FLOAT, [], [1.0 - keep])),
            helper.make_node("Constant", [], [training], value=helper.make_tensor("on", BOOL, [], [True])),
            helper.make_node("Dropout", [ones, ratio, training], [scaled, mask], name=f"{node.name or mask}.dropout"),
        ]
    if not replaced:
        return 0
    nodes = []
    for position, node in enumerate(graph.node):
        if id(node) not in dropped:
            nodes.extend(replaced.get(position, [node]))
    del graph.node[:]
    graph.node.extend(nodes)
    return len(replaced)


def _casts_only_for(
    cast: onnx.NodeProto,
    less: onnx.NodeProto,
    draws: str,
    readers: dict[str, list[onnx.NodeProto]],
    outputs: set[str],
) -> bool:
    """Whether ``cast`` is a ``CastLike`` of the keep probability to the type of ``draws`` that only ``less``
    reads: it goes with the draws."""
    return (
        cast.op_type == "CastLike"
        and is_standard(cast)
        and list(cast.input[1:]) == [draws]
        and cast.input[0] != draws
        and cast.output[0] not in outputs
        and all(reader is less for reader in readers.get(cast.output[0], []))
    )


def _scalar(name: str, producers: dict[str, onnx.NodeProto], constants: dict[str, onnx.TensorProto]) -> float | None:
    """The value of ``name`` where it is a one-element float constant, read through ``Cast``, ``CastLike`` and
    ``Identity``; ``None`` otherwise."""
    while name not in constants:
        node = producers.get(name)
        if node is None or node.op_type not in ("Cast", "CastLike", "Identity") or not is_standard(node):
            return None
        name = node.input[0]
    array = numpy_helper.to_array(constants[name])
    return float(array.reshape(-1)[0]) if array.size == 1 and array.dtype.kind == "f" else None


class OwnGeneratorWarning(UserWarning):
    """A seeded module's training model draws with random operators that its seed does not reach."""


def _own_generator(node: onnx.NodeProto) -> bool:
    """Whether ``node`` draws from a generator of its own (every random operator but ``Dropout``)."""
    return node.op_type in DRAWING_OPERATORS and is_standard(node)


def _float_attribute(node: onnx.NodeProto, name: str, default: float) -> float:
    return float(attribute(node, name, default))


__all__ = [
    "RANDOM_OPERATORS",
    "OwnGeneratorWarning",
    "StepSeeds",
    "bernoulli_masks_as_dropout",
    "draws_at_random",
    "mixed_seed",
]
