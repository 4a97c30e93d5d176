"""Dynamic loss scaling, as ``torch.amp.GradScaler``, inside the training and optimizer models.

A float16 backward loses the small gradients that underflow its range. The
training model differentiates ``loss * loss_scale`` instead of the loss, so
every gradient it outputs is scaled; the optimizer model then, in the same
run as its update:

- ``found_inf``: whether any gradient holds an infinity or a NaN, from
  ``sum over g of ReduceSum(g * 0)`` (NaN exactly when some element is not
  finite, and no overflow of a sum of large finite values);
- unscales every gradient (``g / loss_scale``) before the clipping and the
  update, so that both see the true gradients;
- keeps every parameter and moment as it was when ``found_inf`` (the step
  is skipped), and takes the step with the count of steps not skipped
  (``step - skipped_steps``), so Adam's bias correction counts only real steps;
- updates the scale as GradScaler does: ``found_inf``: ``scale *
  backoff_factor``, the growth tracker to 0; else the tracker + 1, and at
  ``growth_interval`` good steps in a row ``scale * growth_factor``, the
  tracker to 0.

The scaler's state is four tensors of shape ``[1]`` kept as frozen
parameters of the checkpoint (so they are saved and resumed bit for bit, and
any runtime binds them as it binds parameters): ``loss_scale`` (float32, read
by both models), ``loss_scale.growth_tracker``, ``loss_scale.skipped_steps``
and ``loss_scale.last_step_skipped`` (int64, 0 or 1), each written by the
optimizer model as ``<name>.updated``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from onnxtrain.graph import ops
from onnxtrain.graph.builder import GraphBuilder, tensor_type

#: The scale of the loss (float32 ``[1]``), read by the training model and the optimizer model.
LOSS_SCALE = "loss_scale"
#: Good steps in a row since the scale last changed (int64 ``[1]``).
GROWTH_TRACKER = "loss_scale.growth_tracker"
#: Steps skipped so far for a gradient that was not finite (int64 ``[1]``).
SKIPPED_STEPS = "loss_scale.skipped_steps"
#: 1 when the last optimizer step was skipped, else 0 (int64 ``[1]``).
LAST_STEP_SKIPPED = "loss_scale.last_step_skipped"
#: The scaler's state tensors, in the optimizer model's input order (after ``learning_rate`` and ``step``).
SCALER_STATE = (LOSS_SCALE, GROWTH_TRACKER, SKIPPED_STEPS, LAST_STEP_SKIPPED)

_FLOAT, _INT64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64


@dataclass(frozen=True)
class LossScaling:
    """GradScaler's settings, with its defaults."""

    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000

    def __post_init__(self) -> None:
        if not (self.init_scale > 0 and self.growth_factor > 1 and 0 < self.backoff_factor < 1):
            raise ValueError(
                f"LossScaling needs init_scale > 0, growth_factor > 1 and 0 < backoff_factor < 1; got {self!r}"
            )
        if not isinstance(self.growth_interval, int) or self.growth_interval < 1:
            raise ValueError(f"LossScaling's growth_interval must be an integer >= 1, not {self.growth_interval!r}")

    def initial_state(self) -> dict[str, np.ndarray]:
        """The scaler's state before the first step, by name."""
        return {
            LOSS_SCALE: np.array([self.init_scale], np.float32),
            GROWTH_TRACKER: np.zeros(1, np.int64),
            SKIPPED_STEPS: np.zeros(1, np.int64),
            LAST_STEP_SKIPPED: np.zeros(1, np.int64),
        }

    def add_inputs(self, b: GraphBuilder) -> None:
        """The state tensors as inputs of the model being built."""
        for name, value in self.initial_state().items():
            b.add_input(name, tensor_type(onnx.helper.np_dtype_to_tensor_dtype(value.dtype), [1]))

    def unscale(self, b: GraphBuilder, grads: Sequence[str], step: str) -> tuple[list[str], str, str]:
        """``(grads / loss_scale, found_inf, step - skipped_steps)``: the true gradients, a bool scalar
        that is true when some gradient is not finite, and the step number counting only steps taken."""
        inverse = b.add_node1("Reciprocal", [LOSS_SCALE], hint="inverse_scale")
        factors, zeros = {_FLOAT: inverse}, {}  # per element type, made once
        sums, unscaled = [], []
        for grad in grads:
            elem = b.elem_type(grad)
            if elem not in factors:
                factors[elem] = b.add_node1("Cast", [inverse], to=elem, hint="inverse_scale")
            if elem not in zeros:
                zeros[elem] = ops.constant(b, 0.0, elem, "zero")
            factor, zero = factors[elem], zeros[elem]
            true = b.add_node1("Mul", [grad, factor], hint=f"{grad}.unscaled")
            # probed after the unscaling, so that every reader of the scale comes before its new value (in place)
            total = ops.reduce(b, "ReduceSum", b.add_node1("Mul", [true, zero], hint="nan_probe"), None, keepdims=False)
            sums.append(total if elem == _FLOAT else b.add_node1("Cast", [total], to=_FLOAT, hint="nan_probe"))
            unscaled.append(true)
        probe = sums[0] if len(sums) == 1 else b.add_node1("Sum", sums, hint="nan_probe")
        found_inf = b.add_node1("IsNaN", [probe], hint="found_inf")
        taken = b.add_node1("Sub", [step, SKIPPED_STEPS], hint="steps_taken")
        return unscaled, found_inf, taken

    def update_state(self, b: GraphBuilder, found_inf: str, step: str, taken: str, outputs: Sequence[str]) -> None:
        """Write the scaler's new state into ``outputs`` (one per :data:`SCALER_STATE` name, in order);
        ``step`` and ``taken`` are the step input and :meth:`unscale`'s steps taken.

        Each new value is computed from every node that reads its input, so that the runtime can write it
        over its input (the steps skipped as ``step - taken + skipped now``, not ``skipped + skipped now``)."""

        def const(value: float, elem: int) -> str:
            return ops.constant(b, np.full([1], value), elem, "scaler")

        one, zero = const(1, _INT64), const(0, _INT64)
        tracker = b.add_node1("Add", [GROWTH_TRACKER, one], hint="growth_tracker")
        grow = b.add_node1("Equal", [tracker, const(self.growth_interval, _INT64)], hint="grow")
        grown = b.add_node1("Mul", [LOSS_SCALE, const(self.growth_factor, _FLOAT)], hint="grown_scale")
        kept_scale = b.add_node1("Where", [grow, grown, LOSS_SCALE], hint="scale")
        kept_tracker = b.add_node1("Where", [grow, zero, tracker], hint="growth_tracker")
        backed_off = b.add_node1("Mul", [LOSS_SCALE, const(self.backoff_factor, _FLOAT)], hint="backed_off_scale")
        skipped = b.add_node1("Where", [found_inf, one, zero], hint="skipped")
        scale_out, tracker_out, skipped_out, last_out = outputs
        b.add_node("Where", [found_inf, backed_off, kept_scale], [scale_out])
        b.add_node("Where", [found_inf, zero, kept_tracker], [tracker_out])
        b.add_node("Add", [b.add_node1("Sub", [step, taken], hint="skipped_before"), skipped], [skipped_out])
        b.add_node("Identity", [skipped], [last_out])


def scaled_loss(b: GraphBuilder, loss: str) -> str:
    """``loss * loss_scale`` (the training model's input ``loss_scale`` cast to the loss's type): what the
    backward differentiates when the loss is scaled."""
    scale = ops.squeeze(b, LOSS_SCALE, [0], hint="loss_scale")
    elem = b.elem_type(loss)
    if elem != _FLOAT:
        scale = b.add_node1("Cast", [scale], to=elem, hint="loss_scale")
    return b.add_node1("Mul", [loss, scale], hint="scaled_loss")


__all__ = [
    "GROWTH_TRACKER",
    "LAST_STEP_SKIPPED",
    "LOSS_SCALE",
    "SCALER_STATE",
    "SKIPPED_STEPS",
    "LossScaling",
    "scaled_loss",
]
