"""``RMSprop``, as ``torch.optim.RMSprop``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from onnxtrain.optim import _checks, reference
from onnxtrain.optim.base import Optimizer, Slot, StateSpec, Update
from onnxtrain.optim.clip import GradientClipping


class RMSprop(Optimizer):
    """``torch.optim.RMSprop``; states ``square_avg`` (``momentum0``), then
    ``momentum_buffer`` when ``momentum > 0``, then ``grad_avg`` when ``centered``::

        g = g + weight_decay * p
        sq = alpha * sq + (1 - alpha) * g * g
        ga = alpha * ga + (1 - alpha) * g              (centered)
        avg = sqrt(sq - ga * ga) + eps   (centered)   or   sqrt(sq) + eps
        buf = momentum * buf + g / avg;  p = p - lr * buf     (momentum > 0)
        p = p - lr * g / avg                                   (otherwise)
    """

    reference_update = staticmethod(reference.rmsprop_step)

    def __init__(
        self,
        *,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        centered: bool = False,
        clip_grad: GradientClipping | None = None,
        no_decay: Sequence[str] = (),
        lr_scale: Mapping[str, float] | None = None,
    ) -> None:
        super().__init__(clip_grad, no_decay, lr_scale)
        self._alpha = _checks.unit_interval("RMSprop", "alpha", alpha)
        self._eps = _checks.non_negative("RMSprop", "eps", eps)
        self._weight_decay = _checks.non_negative("RMSprop", "weight_decay", weight_decay)
        self._momentum = _checks.non_negative("RMSprop", "momentum", momentum)
        self._centered = _checks.flag("RMSprop", "centered", centered)

    def hyperparameters(self) -> dict[str, Any]:
        return self.with_patterns(
            {
                "alpha": self._alpha,
                "eps": self._eps,
                "weight_decay": self._weight_decay,
                "momentum": self._momentum,
                "centered": self._centered,
            }
        )

    def state_specs(self) -> tuple[StateSpec, ...]:
        roles = ["square_avg"]
        if self._momentum:
            roles.append("momentum_buffer")
        if self._centered:
            roles.append("grad_avg")
        return tuple(StateSpec(f"momentum{i}", role) for i, role in enumerate(roles))

    def update(self, slot: Slot) -> Update:
        m = slot.math
        alpha = self._alpha
        grad = m.axpy(self.weight_decay_of(slot.name, self._weight_decay), slot.param, slot.grad, hint="g")
        square_avg = m.add(
            m.scale(alpha, slot.states[0], hint="sq"), m.scale(1.0 - alpha, m.mul(grad, grad, hint="g2"), hint="sq"),
            out=slot.out_states[0], hint="sq",
        )  # fmt: skip
        states = [square_avg]
        if self._centered:
            grad_avg = m.add(
                m.scale(alpha, slot.states[-1], hint="ga"), m.scale(1.0 - alpha, grad, hint="ga"),
                out=slot.out_states[-1], hint="ga",
            )  # fmt: skip
            variance = m.sub(square_avg, m.mul(grad_avg, grad_avg, hint="ga2"), hint="var")
            avg = m.sqrt(variance, hint="avg")
        else:
            avg = m.sqrt(square_avg, hint="avg")
        avg = m.add(avg, m.const(self._eps, "eps"), hint="avg")
        ratio = m.div(grad, avg, hint="ratio")
        if self._momentum:
            buf = m.add(m.scale(self._momentum, slot.states[1], hint="buf"), ratio, out=slot.out_states[1], hint="buf")
            states.insert(1, buf)
            delta = m.mul(m.lr(), buf, hint="delta")
        else:
            delta = m.mul(m.lr(), ratio, hint="delta")
        if self._centered:
            states.append(grad_avg)
        return Update(m.sub(slot.param, delta, out=slot.out_param, hint="p"), tuple(states))
