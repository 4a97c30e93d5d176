"""NumPy reference implementations of one optimizer step, with ``torch.optim``'s semantics.

Each ``*_step(param, grad, states, *, lr, step, **hyper-parameters)`` returns
``(new_param, new_states)`` and never modifies its arguments. ``states`` are
the parameter's state tensors in the optimizer model's order (``momentum0``,
``momentum1``, ...; see each optimizer class), ``step`` is the 1-based number
of the step being taken. They compute as the optimizer models do: in the
parameter's dtype (float16 and bfloat16 in float32, rounded back at the end),
with the hyper-parameters and step-dependent scalars in that type, in the same
order of operations. :meth:`onnxtrain.optim.Optimizer.reference_step` applies
them to a whole set of parameters with an optimizer's hyper-parameters.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_HALF = frozenset({"float16", "bfloat16"})


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if dtype.name in _HALF else dtype


def _widen(param: np.ndarray, *others: np.ndarray | Sequence[np.ndarray]) -> tuple[np.dtype, np.dtype, list]:
    param = np.asarray(param)
    if param.dtype.kind != "f" and param.dtype.name != "bfloat16":
        raise TypeError(f"parameters must be float arrays, not {param.dtype}")
    compute = _compute_dtype(param.dtype)
    out: list = [param.astype(compute)]
    for other in others:
        if isinstance(other, np.ndarray) or np.isscalar(other):
            out.append(np.asarray(other).astype(compute))
        else:
            out.append([np.asarray(s).astype(compute) for s in other])
    return param.dtype, compute, out


def _narrow(dtype: np.dtype, param: np.ndarray, states: Sequence[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    return np.asarray(param, dtype=dtype), [np.asarray(s, dtype=dtype) for s in states]


def _check_states(name: str, states: Sequence[np.ndarray], expected: int) -> None:
    if len(states) != expected:
        raise ValueError(f"{name} needs {expected} state tensor(s) per parameter here, got {len(states)}")


def clip_grad_norm(grads: Sequence[np.ndarray], max_norm: float, norm_type: float = 2.0) -> list[np.ndarray]:
    """``g * min(max_norm / (||grads||_p + 1e-6), 1)`` for each gradient (``clip_grad_norm_``): ``p = norm_type``,
    the norm over all elements of all gradients (``inf``: their largest magnitude).

    The norm is accumulated in float64 if any gradient is float64, else in float32.
    """
    grads = [np.asarray(g) for g in grads]
    acc = np.dtype(np.float64) if any(g.dtype == np.float64 for g in grads) else np.dtype(np.float32)
    p = float(norm_type)
    magnitudes = [np.abs(g.astype(acc)) for g in grads]
    if np.isinf(p):
        norm = acc.type(max((np.max(m) if m.size else acc.type(-np.inf) for m in magnitudes), default=0.0))
    else:
        total = acc.type(0)
        for m in magnitudes:  # each gradient's share: sum(g**2), sum(|g|), sum(|g|**p)
            total = total + np.sum(np.square(m) if p == 2.0 else m if p == 1.0 else m ** acc.type(p), dtype=acc)
        norm = np.sqrt(total) if p == 2.0 else total if p == 1.0 else np.power(total, acc.type(1.0 / p))
    coef = np.minimum(acc.type(max_norm) / (norm + acc.type(1e-6)), acc.type(1.0))
    result = []
    for g in grads:
        compute = _compute_dtype(g.dtype)
        result.append(np.asarray(g.astype(compute) * compute.type(coef), dtype=g.dtype))
    return result


def clip_grad_value(grads: Sequence[np.ndarray], clip_value: float) -> list[np.ndarray]:
    """``clip(g, -clip_value, clip_value)`` for each gradient (``clip_grad_value_``); half types in float32."""
    result = []
    for g in (np.asarray(g) for g in grads):
        compute = _compute_dtype(g.dtype)
        bound = compute.type(clip_value)
        result.append(np.asarray(np.clip(g.astype(compute), -bound, bound), dtype=g.dtype))
    return result


def sgd_step(
    param: np.ndarray,
    grad: np.ndarray,
    states: Sequence[np.ndarray],
    *,
    lr: float,
    step: int,
    momentum: float = 0.0,
    dampening: float = 0.0,
    nesterov: bool = False,
    weight_decay: float = 0.0,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """SGD; ``states = [momentum_buffer]`` when ``momentum > 0``, else ``[]``.

    ``d = g + wd p``; ``buf = d`` at step 1, else ``momentum buf + (1 - dampening) d``;
    ``d = d + momentum buf`` (nesterov) or ``buf``; ``p = p - lr d``.
    """
    _check_states("SGD", states, 1 if momentum else 0)
    dtype, ct, (p, g, s) = _widen(param, grad, states)
    c = ct.type
    d = g + c(weight_decay) * p if weight_decay else g
    new_states = []
    if momentum:
        scaled = c(1.0 - dampening) * d if dampening else d
        buf = c(momentum) * s[0] + scaled
        if dampening and step == 1:
            buf = d
        new_states.append(buf)
        d = d + c(momentum) * buf if nesterov else buf
    p = p - c(lr) * d
    return _narrow(dtype, p, new_states)


def _adam(
    name: str,
    param: np.ndarray,
    grad: np.ndarray,
    states: Sequence[np.ndarray],
    *,
    lr: float,
    step: int,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    bias_correction: bool,
    amsgrad: bool,
    decoupled: bool,
    adam_mode: int = 0,
) -> tuple[np.ndarray, list[np.ndarray]]:
    _check_states(name, states, 3 if amsgrad else 2)
    dtype, ct, (p, g, s) = _widen(param, grad, states)
    c = ct.type
    beta1, beta2 = betas
    if adam_mode == 1:  # Hugging Face's AdamW: bias correction on the step size, weight decay after the update
        m = c(beta1) * s[0] + c(1.0 - beta1) * g
        v = c(beta2) * s[1] + c(1.0 - beta2) * (g * g)
        step_size = c(lr)
        if bias_correction:
            t = c(step)
            step_size = c(lr) * np.sqrt(c(1.0) - c(beta2) ** t) / (c(1.0) - c(beta1) ** t)
        p = p - step_size * (m / (np.sqrt(v) + c(eps)))
        p = p * (c(1.0) - c(lr) * c(weight_decay))
        return _narrow(dtype, p, [m, v])
    if weight_decay and decoupled:
        p = p * (c(1.0) - c(lr) * c(weight_decay))
    elif weight_decay:
        g = g + c(weight_decay) * p
    m = c(beta1) * s[0] + c(1.0 - beta1) * g
    v = c(beta2) * s[1] + c(1.0 - beta2) * (g * g)
    new_states = [m, v]
    v_hat = v
    if amsgrad:
        v_hat = np.maximum(s[2], v)
        new_states.append(v_hat)
    if bias_correction:
        t = c(step)
        step_size = c(lr) / (c(1.0) - c(beta1) ** t)
        denom = np.sqrt(v_hat) / np.sqrt(c(1.0) - c(beta2) ** t) + c(eps)
    else:
        step_size = c(lr)
        denom = np.sqrt(v_hat) + c(eps)
    p = p - step_size * (m / denom)
    return _narrow(dtype, p, new_states)


def adam_step(
    param: np.ndarray,
    grad: np.ndarray,
    states: Sequence[np.ndarray],
    *,
    lr: float,
    step: int,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    bias_correction: bool = True,
    amsgrad: bool = False,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Adam (L2 weight decay); ``states = [exp_avg, exp_avg_sq(, max_exp_avg_sq)]``.

    ``g = g + wd p``; ``m = b1 m + (1 - b1) g``; ``v = b2 v + (1 - b2) g**2``;
    ``vmax = max(vmax, v)`` (amsgrad, used instead of ``v`` below);
    ``p = p - lr / (1 - b1**t) m / (sqrt(v) / sqrt(1 - b2**t) + eps)``
    (without the two ``1 - b**t`` when ``bias_correction`` is false).
    """
    return _adam(
        "Adam", param, grad, states, lr=lr, step=step, betas=betas, eps=eps, weight_decay=weight_decay,
        bias_correction=bias_correction, amsgrad=amsgrad, decoupled=False,
    )  # fmt: skip


def adamw_step(
    param: np.ndarray,
    grad: np.ndarray,
    states: Sequence[np.ndarray],
    *,
    lr: float,
    step: int,
    bias_correction: bool = True,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-6,
    weight_decay: float = 0.0,
    amsgrad: bool = False,
    adam_mode: int = 0,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """AdamW (decoupled weight decay): ``p = p (1 - lr wd)`` first, then Adam's update without L2.

    ``adam_mode=1`` (Hugging Face's, ONNX Runtime's on-device default): ``p = p
    - lr sqrt(1 - b2**t) / (1 - b1**t) m / (sqrt(v) + eps)``, then ``p = p (1 -
    lr wd)``.
    """
    return _adam(
        "AdamW", param, grad, states, lr=lr, step=step, betas=betas, eps=eps, weight_decay=weight_decay,
        bias_correction=bias_correction, amsgrad=amsgrad, decoupled=True, adam_mode=adam_mode,
    )  # fmt: skip


def adagrad_step(
    param: np.ndarray,
    grad: np.ndarray,
    states: Sequence[np.ndarray],
    *,
    lr: float,
    step: int,
    lr_decay: float = 0.0,
    weight_decay: float = 0.0,
    initial_accumulator_value: float = 0.0,
    eps: float = 1e-10,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Adagrad; ``states = [sum]`` (which starts at ``initial_accumulator_value``, unused here).

    ``g = g + wd p``; ``clr = lr / (1 + (t - 1) lr_decay)``; ``sum = sum + g**2``;
    ``p = p - clr g / (sqrt(sum) + eps)``.
    """
    del initial_accumulator_value  # only the initial state depends on it
    _check_states("Adagrad", states, 1)
    dtype, ct, (p, g, s) = _widen(param, grad, states)
    c = ct.type
    if weight_decay:
        g = g + c(weight_decay) * p
    clr = c(lr) / (c(1.0) + (c(step) - c(1.0)) * c(lr_decay)) if lr_decay else c(lr)
    total = s[0] + g * g
    std = np.sqrt(total) + c(eps)
    p = p - clr * (g / std)
    return _narrow(dtype, p, [total])


def rmsprop_step(
    param: np.ndarray,
    grad: np.ndarray,
    states: Sequence[np.ndarray],
    *,
    lr: float,
    step: int,
    alpha: float = 0.99,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    momentum: float = 0.0,
    centered: bool = False,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """RMSprop; ``states = [square_avg(, momentum_buffer)(, grad_avg)]``.

    ``g = g + wd p``; ``sq = alpha sq + (1 - alpha) g**2``; centered:
    ``ga = alpha ga + (1 - alpha) g``, ``avg = sqrt(sq - ga**2) + eps``, else
    ``avg = sqrt(sq) + eps``; ``buf = momentum buf + g / avg``, ``p = p - lr buf``
    (momentum > 0) or ``p = p - lr g / avg``.
    """
    del step  # RMSprop does not depend on the step number
    _check_states("RMSprop", states, 1 + bool(momentum) + bool(centered))
    dtype, ct, (p, g, s) = _widen(param, grad, states)
    c = ct.type
    if weight_decay:
        g = g + c(weight_decay) * p
    square_avg = c(alpha) * s[0] + c(1.0 - alpha) * (g * g)
    new_states = [square_avg]
    if centered:
        grad_avg = c(alpha) * s[-1] + c(1.0 - alpha) * g
        avg = np.sqrt(square_avg - grad_avg * grad_avg)
    else:
        avg = np.sqrt(square_avg)
    avg = avg + c(eps)
    if momentum:
        buf = c(momentum) * s[1] + g / avg
        new_states.append(buf)
        p = p - c(lr) * buf
    else:
        p = p - c(lr) * (g / avg)
    if centered:
        new_states.append(grad_avg)
    return _narrow(dtype, p, new_states)
