"""ONNX Runtime's ``onnxblock.optim``: its names, over :mod:`onnxtrain.optim`.

``AdamW`` and ``SGD`` build, from ``TrainingBlock.parameters()``, a model with
ONNX Runtime's sequence inputs (``learning_rate``, ``step``, ``params``,
``gradients``, ``first_order_moments`` (, ``second_order_moments``)), in
standard operators for ``target="onnxruntime"`` (the default: calling the
block returns the name of ``params.updated``), or as ONNX Runtime's own
``com.microsoft`` nodes for ``target="onnxruntime-training"`` (the call
returns the name of the update flag); :mod:`onnxtrain.optim.sequence_model`
describes both.

Each is an :mod:`onnxtrain.optim` optimizer with ONNX Runtime's arguments and
defaults: ``AdamW`` is :class:`onnxtrain.optim.AdamW` with ``adam_mode=1``
(Hugging Face's math, ONNX Runtime's: bias correction on the step size, weight
decay after the update) unless ``adam_mode=0`` (torch's) is asked for;
``SGD`` is :class:`onnxtrain.optim.SGD` without momentum. ``ClipGradNorm``
takes a list of gradient names or the name of a sequence. ``AdamWOptimizer``
and ``SGDOptimizer`` append one ONNX Runtime node on named inputs.
onnxtrain's other optimizers (momentum SGD, Adam, Adagrad, RMSprop) are in
:mod:`onnxtrain.optim`, with one input per tensor.
"""

from __future__ import annotations

from onnxtrain import optim
from onnxtrain.blocks.block import Block
from onnxtrain.optim.clip import ClipGradNorm
from onnxtrain.optim.ort_nodes import ADAMW_OP, SGD_OP, adamw_attributes, append_flag_node
from onnxtrain.optim.sequence_model import CONFIG_KEY, SequenceOptimizer, Target, optimizer_of, sequence_optimizer


class AdamW(SequenceOptimizer):
    """ONNX Runtime's ``onnxblock.optim.AdamW``: its arguments and defaults over :class:`onnxtrain.optim.AdamW`."""

    def __init__(
        self,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        clip_grad: ClipGradNorm | None = None,
        *,
        adam_mode: int = 1,
        target: Target = "onnxruntime",
    ) -> None:
        inner = optim.AdamW(bias_correction, betas, eps, weight_decay, clip_grad, adam_mode=adam_mode)
        super().__init__(inner, target)


class SGD(SequenceOptimizer):
    """ONNX Runtime's ``onnxblock.optim.SGD``: ``p = p - lr * g``; ``first_order_moments`` is an input it
    does not read, as in ONNX Runtime."""

    def __init__(self, clip_grad: ClipGradNorm | None = None, *, target: Target = "onnxruntime") -> None:
        super().__init__(optim.SGD(clip_grad=clip_grad), target)


class AdamWOptimizer(Block):
    """ONNX Runtime's low-level block: one ``com.microsoft::AdamWOptimizer`` node on named inputs, computing
    :class:`onnxtrain.optim.AdamW` with ``adam_mode=1``."""

    def __init__(
        self,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__()
        self._attributes = adamw_attributes(optim.AdamW(bias_correction, betas, eps, weight_decay, adam_mode=1))

    def build(
        self, learning_rate_name: str, step_name: str, parameter_sequence_name: str, gradient_sequence_name: str,
        first_order_moment_sequence_name: str, second_order_moment_sequence_name: str,
    ) -> str:  # fmt: skip
        """Append the node; return its output (bool[1], true once the step is applied)."""
        inputs = [learning_rate_name, step_name, parameter_sequence_name, gradient_sequence_name,
                  first_order_moment_sequence_name, second_order_moment_sequence_name]  # fmt: skip
        return append_flag_node(self.builder, ADAMW_OP, inputs, self._attributes, hint="adamw.updated_flag")


class SGDOptimizer(Block):
    """ONNX Runtime's low-level block: one ``com.microsoft::SGDOptimizerV2`` node on named inputs."""

    def build(self, learning_rate_name: str, gradients_name: str, params_name: str) -> str:
        """Append the node (inputs in ONNX Runtime's order: rate, then the names as passed); return its flag."""
        inputs = [learning_rate_name, gradients_name, params_name]
        return append_flag_node(self.builder, SGD_OP, inputs, {}, hint="update_completed")


__all__ = [
    "CONFIG_KEY",
    "SGD",
    "AdamW",
    "AdamWOptimizer",
    "ClipGradNorm",
    "SGDOptimizer",
    "optimizer_of",
    "sequence_optimizer",
]
