"""``SGD``: stochastic gradient descent with momentum, dampening, Nesterov and weight decay."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from onnxtrain.optim import _checks, reference
from onnxtrain.optim.base import Optimizer, Slot, StateSpec, Update
from onnxtrain.optim.clip import GradientClipping


class SGD(Optimizer):
    """``torch.optim.SGD``; one state tensor (the momentum buffer) when ``momentum > 0``::

        d = g + weight_decay * p
        buf = d                                         (step 1)
        buf = momentum * buf + (1 - dampening) * d      (later steps)
        d = d + momentum * buf  (nesterov)   or   d = buf
        p = p - lr * d

    Without momentum: ``p = p - lr * (g + weight_decay * p)``, no state.
    """

    reference_update = staticmethod(reference.sgd_step)

    def __init__(
        self,
        *,
        momentum: float = 0.0,
        dampening: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
        clip_grad: GradientClipping | None = None,
        no_decay: Sequence[str] = (),
        lr_scale: Mapping[str, float] | None = None,
    ) -> None:
        super().__init__(clip_grad, no_decay, lr_scale)
        self._momentum = _checks.non_negative("SGD", "momentum", momentum)
        self._dampening = _checks.unit_interval("SGD", "dampening", dampening)
        self._nesterov = _checks.flag("SGD", "nesterov", nesterov)
        self._weight_decay = _checks.non_negative("SGD", "weight_decay", weight_decay)
        if self._nesterov and (self._momentum == 0.0 or self._dampening != 0.0):
            raise ValueError(
                f"SGD: nesterov=True needs momentum > 0 and dampening = 0, got momentum={momentum!r} "
                f"and dampening={dampening!r}"
            )

    def hyperparameters(self) -> dict[str, Any]:
        return self.with_patterns(
            {
                "momentum": self._momentum,
                "dampening": self._dampening,
                "nesterov": self._nesterov,
                "weight_decay": self._weight_decay,
            }
        )

    def state_specs(self) -> tuple[StateSpec, ...]:
        return (StateSpec("momentum0", "momentum_buffer"),) if self._momentum else ()

    def update(self, slot: Slot) -> Update:
        m = slot.math
        d = m.axpy(self.weight_decay_of(slot.name, self._weight_decay), slot.param, slot.grad, hint="d")
        states: tuple[str, ...] = ()
        if self._momentum:
            out = slot.out_states[0]
            kept = m.scale(self._momentum, slot.states[0], hint="buf")
            if self._dampening:
                later = m.axpy(1.0 - self._dampening, d, kept, hint="buf")
                buf = m.where(m.first_step(), d, later, out=out, hint="buf")
            else:
                buf = m.add(kept, d, out=out, hint="buf")
            states = (buf,)
            d = m.axpy(self._momentum, buf, d, hint="d") if self._nesterov else buf
        new_param = m.sub(slot.param, m.mul(m.lr(), d, hint="delta"), out=slot.out_param, hint="p")
        return Update(new_param, states)
