"""``Adam`` (L2 weight decay) and ``AdamW`` (decoupled weight decay), as in ``torch.optim``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from onnxtrain.optim import _checks, reference
from onnxtrain.optim.base import Optimizer, Slot, StateSpec, Update
from onnxtrain.optim.clip import GradientClipping
from onnxtrain.optim.emit import Math


class _AdamBase(Optimizer):
    """Adam's update; ``_decoupled`` selects AdamW's weight decay."""

    _decoupled = False

    def __init__(
        self,
        *,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
        bias_correction: bool,
        amsgrad: bool,
        clip_grad: GradientClipping | None,
        no_decay: Sequence[str],
        lr_scale: Mapping[str, float] | None,
    ) -> None:
        super().__init__(clip_grad, no_decay, lr_scale)
        owner = type(self).__name__
        self._betas = _checks.betas(owner, betas)
        self._eps = _checks.non_negative(owner, "eps", eps)
        self._weight_decay = _checks.non_negative(owner, "weight_decay", weight_decay)
        self._bias_correction = _checks.flag(owner, "bias_correction", bias_correction)
        self._amsgrad = _checks.flag(owner, "amsgrad", amsgrad)

    def hyperparameters(self) -> dict[str, Any]:
        return self.with_patterns(
            {
                "betas": self._betas,
                "eps": self._eps,
                "weight_decay": self._weight_decay,
                "bias_correction": self._bias_correction,
                "amsgrad": self._amsgrad,
            }
        )

    def state_specs(self) -> tuple[StateSpec, ...]:
        specs = (StateSpec("momentum0", "exp_avg"), StateSpec("momentum1", "exp_avg_sq"))
        return (*specs, StateSpec("momentum2", "max_exp_avg_sq")) if self._amsgrad else specs

    def update(self, slot: Slot) -> Update:
        m = slot.math
        beta1, beta2 = self._betas
        param, grad = slot.param, slot.grad
        weight_decay = self.weight_decay_of(slot.name, self._weight_decay)
        if weight_decay and not self._decoupled:
            grad = m.axpy(weight_decay, param, grad, hint="g")
        # the nodes in the order that keeps the fewest full-size temporaries alive under onnxruntime's
        # priority-based order (node order), which the fused step runs in: two at most
        exp_avg = m.add(
            m.scale(beta1, slot.states[0], hint="m"), m.scale(1.0 - beta1, grad, hint="m"),
            out=slot.out_states[0], hint="m",
        )  # fmt: skip
        new_part = m.scale(1.0 - beta2, m.mul(grad, grad, hint="g2"), hint="v")  # g*g dies at once
        exp_avg_sq = m.add(m.scale(beta2, slot.states[1], hint="v"), new_part, out=slot.out_states[1], hint="v")
        states = [exp_avg, exp_avg_sq]
        v_hat = exp_avg_sq
        if self._amsgrad:
            v_hat = m.max(slot.states[2], exp_avg_sq, out=slot.out_states[2], hint="vmax")
            states.append(v_hat)
        root = m.sqrt(v_hat, hint="sqrt_v")
        if self._bias_correction:
            # m / (sqrt(v) / c + eps) * s == m / (sqrt(v) + eps * c) * (s * c), c = sqrt(1 - beta2**t):
            # both factors are scalars computed once per model, which saves a full-size Div per parameter
            step_size, eps = m.shared(("adam_bias",), self._bias)
        else:
            step_size, eps = m.lr(), m.const(self._eps, "eps")
        denom = m.add(root, eps, hint="denom")
        delta = m.mul(step_size, m.div(exp_avg, denom, hint="ratio"), hint="delta")
        if weight_decay and self._decoupled:  # p * (1 - lr * wd), made last: alive only for the Sub
            keep = m.shared(
                ("decay",),
                lambda s: s.sub(s.const(1.0), s.mul(s.lr(), s.const(self._weight_decay, "weight_decay")), hint="decay"),
            )
            param = m.mul(param, keep, hint="decayed")
        return Update(m.sub(param, delta, out=slot.out_param, hint="p"), tuple(states))

    def _bias(self, m: Math) -> tuple[str, str]:
        """``(lr / (1 - beta1**t) * c, eps * c)`` with ``c = sqrt(1 - beta2**t)``, shared by the parameters
        of one type."""
        beta1, beta2 = self._betas
        one, t = m.const(1.0), m.step()
        bc1 = m.sub(one, m.pow(m.const(beta1, "beta1"), t, hint="beta1_t"), hint="bias_correction1")
        bc2 = m.sub(one, m.pow(m.const(beta2, "beta2"), t, hint="beta2_t"), hint="bias_correction2")
        root_bc2 = m.sqrt(bc2, hint="bias_correction2_sqrt")
        step_size = m.mul(m.div(m.lr(), bc1, hint="step_size"), root_bc2, hint="step_size")
        return step_size, m.mul(m.const(self._eps, "eps"), root_bc2, hint="eps")


class Adam(_AdamBase):
    """``torch.optim.Adam``; states ``exp_avg`` (``momentum0``), ``exp_avg_sq`` (``momentum1``)
    and with ``amsgrad`` ``max_exp_avg_sq`` (``momentum2``)::

        g = g + weight_decay * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        vmax = max(vmax, v)                     (amsgrad; used as v below)
        p = p - lr / (1 - b1**t) * m / (sqrt(v) / sqrt(1 - b2**t) + eps)

    ``bias_correction=False`` drops both ``1 - b**t`` factors.
    """

    reference_update = staticmethod(reference.adam_step)

    def __init__(
        self,
        *,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        bias_correction: bool = True,
        amsgrad: bool = False,
        clip_grad: GradientClipping | None = None,
        no_decay: Sequence[str] = (),
        lr_scale: Mapping[str, float] | None = None,
    ) -> None:
        super().__init__(
            betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=bias_correction, amsgrad=amsgrad,
            clip_grad=clip_grad, no_decay=no_decay, lr_scale=lr_scale,
        )  # fmt: skip


class AdamW(_AdamBase):
    """ONNX Runtime's ``optim.AdamW`` arguments and defaults, ``torch.optim.AdamW``'s math::

        p = p * (1 - lr * weight_decay)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        p = p - lr / (1 - b1**t) * m / (sqrt(v) / sqrt(1 - b2**t) + eps)

    ``adam_mode=1`` is Hugging Face's variant, the math of ONNX Runtime's
    on-device ``AdamWOptimizer`` as its ``onnxblock.optim.AdamW`` writes it
    (``adam_mode`` 0 there is torch's, the default here)::

        m, v as above
        p = p - lr * sqrt(1 - b2**t) / (1 - b1**t) * m / (sqrt(v) + eps)
        p = p * (1 - lr * weight_decay)

    States as :class:`Adam` (``amsgrad`` and ``adam_mode`` are keyword-only
    here; ``amsgrad`` needs ``adam_mode=0``).
    """

    reference_update = staticmethod(reference.adamw_step)
    _decoupled = True

    def __init__(
        self,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        clip_grad: GradientClipping | None = None,
        *,
        amsgrad: bool = False,
        adam_mode: int = 0,
        no_decay: Sequence[str] = (),
        lr_scale: Mapping[str, float] | None = None,
    ) -> None:
        super().__init__(
            betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=bias_correction, amsgrad=amsgrad,
            clip_grad=clip_grad, no_decay=no_decay, lr_scale=lr_scale,
        )  # fmt: skip
        if adam_mode not in (0, 1) or isinstance(adam_mode, bool):
            raise ValueError(f"AdamW: adam_mode must be 0 (torch's math) or 1 (Hugging Face's), not {adam_mode!r}")
        if adam_mode == 1 and amsgrad:
            raise ValueError("AdamW: amsgrad=True needs adam_mode=0; Hugging Face's AdamW has no amsgrad")
        self._adam_mode = adam_mode

    def hyperparameters(self) -> dict[str, Any]:
        hyper = super().hyperparameters()
        hyper = {"bias_correction": hyper.pop("bias_correction"), **hyper}
        return {**hyper, "adam_mode": self._adam_mode} if self._adam_mode else hyper

    def update(self, slot: Slot) -> Update:
        if self._adam_mode == 0:
            return super().update(slot)
        m = slot.math
        beta1, beta2 = self._betas
        exp_avg = m.add(
            m.scale(beta1, slot.states[0], hint="m"), m.scale(1.0 - beta1, slot.grad, hint="m"),
            out=slot.out_states[0], hint="m",
        )  # fmt: skip
        new_part = m.scale(1.0 - beta2, m.mul(slot.grad, slot.grad, hint="g2"), hint="v")  # as in Adam.update
        exp_avg_sq = m.add(m.scale(beta2, slot.states[1], hint="v"), new_part, out=slot.out_states[1], hint="v")
        step_size = m.shared(("hf_step_size",), self._hf_step_size) if self._bias_correction else m.lr()
        denom = m.add(m.sqrt(exp_avg_sq, hint="sqrt_v"), m.const(self._eps, "eps"), hint="denom")
        delta = m.mul(step_size, m.div(exp_avg, denom, hint="ratio"), hint="delta")
        if not self.weight_decay_of(slot.name, self._weight_decay):
            return Update(m.sub(slot.param, delta, out=slot.out_param, hint="p"), (exp_avg, exp_avg_sq))
        updated = m.sub(slot.param, delta, hint="p")
        keep = m.shared(("decay",), self._decay)
        return Update(m.mul(updated, keep, out=slot.out_param, hint="decayed"), (exp_avg, exp_avg_sq))

    def _hf_step_size(self, m: Math) -> str:
        """``lr * sqrt(1 - beta2**t) / (1 - beta1**t)``."""
        beta1, beta2 = self._betas
        one, t = m.const(1.0), m.step()
        bc1 = m.sub(one, m.pow(m.const(beta1, "beta1"), t, hint="beta1_t"), hint="bias_correction1")
        bc2 = m.sub(one, m.pow(m.const(beta2, "beta2"), t, hint="beta2_t"), hint="bias_correction2")
        return m.div(m.mul(m.lr(), m.sqrt(bc2, hint="bias_correction2_sqrt"), hint="step_size"), bc1, hint="step_size")

    def _decay(self, m: Math) -> str:
        """``1 - lr * weight_decay``."""
        return m.sub(m.const(1.0), m.mul(m.lr(), m.const(self._weight_decay, "weight_decay")), hint="decay")
