"""``Adagrad``, as ``torch.optim.Adagrad``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from onnxtrain.optim import _checks, reference
from onnxtrain.optim.base import Optimizer, Slot, StateSpec, Update
from onnxtrain.optim.clip import GradientClipping


class Adagrad(Optimizer):
    """``torch.optim.Adagrad``; one state tensor ``sum`` (``momentum0``), starting at
    ``initial_accumulator_value``::

        g = g + weight_decay * p
        clr = lr / (1 + (t - 1) * lr_decay)
        sum = sum + g * g
        p = p - clr * g / (sqrt(sum) + eps)
    """

    reference_update = staticmethod(reference.adagrad_step)

    def __init__(
        self,
        *,
        lr_decay: float = 0.0,
        weight_decay: float = 0.0,
        initial_accumulator_value: float = 0.0,
        eps: float = 1e-10,
        clip_grad: GradientClipping | None = None,
        no_decay: Sequence[str] = (),
        lr_scale: Mapping[str, float] | None = None,
    ) -> None:
        super().__init__(clip_grad, no_decay, lr_scale)
        self._lr_decay = _checks.non_negative("Adagrad", "lr_decay", lr_decay)
        self._weight_decay = _checks.non_negative("Adagrad", "weight_decay", weight_decay)
        self._initial = _checks.non_negative("Adagrad", "initial_accumulator_value", initial_accumulator_value)
        self._eps = _checks.non_negative("Adagrad", "eps", eps)

    def hyperparameters(self) -> dict[str, Any]:
        return self.with_patterns(
            {
                "lr_decay": self._lr_decay,
                "weight_decay": self._weight_decay,
                "initial_accumulator_value": self._initial,
                "eps": self._eps,
            }
        )

    def state_specs(self) -> tuple[StateSpec, ...]:
        return (StateSpec("momentum0", "sum", self._initial),)

    def update(self, slot: Slot) -> Update:
        m = slot.math
        grad = m.axpy(self.weight_decay_of(slot.name, self._weight_decay), slot.param, slot.grad, hint="g")
        if self._lr_decay:
            clr = m.shared(
                ("adagrad_clr",),
                lambda s: s.div(
                    s.lr(),
                    s.add(s.const(1.0), s.scale(self._lr_decay, s.sub(s.step(), s.const(1.0)), hint="decay")),
                    hint="clr",
                ),
            )
        else:
            clr = m.lr()
        total = m.add(slot.states[0], m.mul(grad, grad, hint="g2"), out=slot.out_states[0], hint="sum")
        std = m.add(m.sqrt(total, hint="std"), m.const(self._eps, "eps"), hint="std")
        delta = m.mul(clr, m.div(grad, std, hint="ratio"), hint="delta")
        return Update(m.sub(slot.param, delta, out=slot.out_param, hint="p"), (total,))
