"""The optimizer models against ``torch.optim``: same trajectories from the same gradients.

Each step sets ``.grad`` of torch's parameters to the gradients fed to the
optimizer model (clipped with ``torch.nn.utils.clip_grad_norm_`` where the
model clips), changes the learning rate as the model's input changes, and
compares the parameters and every state tensor (by ``torch.optim``'s state
names, which are the :class:`StateSpec` roles).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from onnxtrain.optim import SGD, Adagrad, Adam, AdamW, ClipGradNorm, ClipGradValue, Optimizer, RMSprop
from onnxtrain.optim.clip import GradientClipping
from tests.optim.runner import Clipped, clipped_in_onnx, learning_rates, onnx_trajectory, random_problem

torch = pytest.importorskip("torch")

STEPS = 20

#: (our optimizer, torch's optimizer for the same hyper-parameters, given params and lr).
CASES: list[tuple[Optimizer, Callable]] = [
    (SGD(), lambda p, lr: torch.optim.SGD(p, lr=lr)),
    (SGD(momentum=0.9), lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.9)),
    (
        SGD(momentum=0.8, dampening=0.3, weight_decay=0.01),
        lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.8, dampening=0.3, weight_decay=0.01),
    ),
    (
        SGD(momentum=0.9, nesterov=True, weight_decay=0.01),
        lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.9, nesterov=True, weight_decay=0.01),
    ),
    (Adam(), lambda p, lr: torch.optim.Adam(p, lr=lr)),
    (
        Adam(betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01),
        lambda p, lr: torch.optim.Adam(p, lr=lr, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01),
    ),
    (Adam(amsgrad=True, weight_decay=0.01), lambda p, lr: torch.optim.Adam(p, lr=lr, amsgrad=True, weight_decay=0.01)),
    (AdamW(), lambda p, lr: torch.optim.AdamW(p, lr=lr, eps=1e-6, weight_decay=0.0)),
    (AdamW(weight_decay=0.05), lambda p, lr: torch.optim.AdamW(p, lr=lr, eps=1e-6, weight_decay=0.05)),
    (
        AdamW(betas=(0.85, 0.95), weight_decay=0.01, amsgrad=True),
        lambda p, lr: torch.optim.AdamW(p, lr=lr, betas=(0.85, 0.95), eps=1e-6, weight_decay=0.01, amsgrad=True),
    ),
    (Adagrad(), lambda p, lr: torch.optim.Adagrad(p, lr=lr)),
    (
        Adagrad(lr_decay=0.05, weight_decay=0.01, initial_accumulator_value=0.1, eps=1e-8),
        lambda p, lr: torch.optim.Adagrad(
            p, lr=lr, lr_decay=0.05, weight_decay=0.01, initial_accumulator_value=0.1, eps=1e-8
        ),
    ),
    (RMSprop(), lambda p, lr: torch.optim.RMSprop(p, lr=lr)),
    (RMSprop(momentum=0.5, alpha=0.9), lambda p, lr: torch.optim.RMSprop(p, lr=lr, momentum=0.5, alpha=0.9)),
    (RMSprop(centered=True), lambda p, lr: torch.optim.RMSprop(p, lr=lr, centered=True)),
    (
        RMSprop(centered=True, momentum=0.9, weight_decay=0.01),
        lambda p, lr: torch.optim.RMSprop(p, lr=lr, centered=True, momentum=0.9, weight_decay=0.01),
    ),
]

#: float32 differs from torch by rounding, mostly in Adam's ``1 - beta2**t``: the model computes it in
#: float32 (as ONNX Runtime's own AdamW kernel does), where beta2 = 0.999 is off by 1.3e-8 and
#: ``1 - beta2`` by 1.3e-5 relative; torch computes the bias corrections in double.
TOLERANCE = {np.float32: {"rtol": 5e-5, "atol": 5e-6}, np.float64: {"rtol": 1e-12, "atol": 1e-14}}


def torch_trajectory(
    optimizer: Optimizer,
    make_torch: Callable,
    params: dict[str, np.ndarray],
    grads: list[dict[str, np.ndarray]],
    lrs: list[float],
    max_norm: float | None,
) -> list[tuple[dict[str, np.ndarray], dict[str, list[np.ndarray]]]]:
    tensors = {name: torch.nn.Parameter(torch.from_numpy(value.copy())) for name, value in params.items()}
    opt = make_torch(list(tensors.values()), lrs[0])
    result = []
    for step_grads, lr in zip(grads, lrs, strict=True):
        for name, tensor in tensors.items():
            tensor.grad = torch.from_numpy(step_grads[name].copy())
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(list(tensors.values()), max_norm)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        states = {
            name: [opt.state[tensor][spec.role].detach().numpy().copy() for spec in optimizer.state_specs()]
            for name, tensor in tensors.items()
        }
        result.append(({name: t.detach().numpy().copy() for name, t in tensors.items()}, states))
    return result


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("max_norm", [None, 1.0], ids=["no-clip", "clip"])
@pytest.mark.parametrize(("optimizer", "make_torch"), CASES, ids=[repr(case[0]) for case in CASES])
def test_trajectory_matches_torch(
    optimizer: Optimizer, make_torch: Callable, max_norm: float | None, dtype: type
) -> None:
    optimizer = type(optimizer)(
        **optimizer.hyperparameters(), clip_grad=None if max_norm is None else ClipGradNorm(max_norm)
    )
    shapes = {"w": ((3, 4), np.dtype(dtype)), "b": ((4,), np.dtype(dtype)), "s": ((), np.dtype(dtype))}
    params, grads = random_problem(shapes, STEPS, seed=11, grad_scale=2.0)
    lrs = learning_rates(0.05, STEPS)
    ours = onnx_trajectory(optimizer, params, grads, lrs)
    theirs = torch_trajectory(optimizer, make_torch, params, grads, lrs, max_norm)
    for t, ((p, s), (want_p, want_s)) in enumerate(zip(ours, theirs, strict=True), start=1):
        for name in params:
            np.testing.assert_allclose(p[name], want_p[name], **TOLERANCE[dtype], err_msg=f"{name} at step {t}")
            for spec, got, want in zip(optimizer.state_specs(), s[name], want_s[name], strict=True):
                np.testing.assert_allclose(got, want, **TOLERANCE[dtype], err_msg=f"{name} {spec.role} at step {t}")


def clip_in_onnx(grads: dict[str, np.ndarray], clip: GradientClipping) -> list[np.ndarray]:
    return clipped_in_onnx(Clipped(clip), grads)


def _torch_grads(grads: dict[str, np.ndarray]) -> list[Any]:
    tensors = [torch.zeros(g.shape, dtype=torch.from_numpy(g).dtype, requires_grad=True) for g in grads.values()]
    for tensor, g in zip(tensors, grads.values(), strict=True):
        tensor.grad = torch.from_numpy(g.copy())
    return tensors


def _gradients(dtype: type) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    grads = {name: rng.normal(size=shape).astype(dtype) for name, shape in [("a", (3, 4)), ("b", (5,)), ("c", ())]}
    grads["c"] = np.asarray(grads["c"])
    return grads


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("max_norm", [0.3, 5.0, 100.0])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf])
def test_clip_grad_norm_matches_torch(dtype: type, max_norm: float, norm_type: float) -> None:
    grads = _gradients(dtype)
    ours = clip_in_onnx(grads, ClipGradNorm(max_norm, norm_type))
    tensors = _torch_grads(grads)
    total = torch.nn.utils.clip_grad_norm_(tensors, max_norm, norm_type=norm_type)
    norms = {1.0: 15.0, 2.0: 4.19, 3.0: 2.86, math.inf: 1.73}  # of the 18 values: 0.3 clips each, 5 only L1
    assert (float(total) > max_norm) == (max_norm < norms[norm_type])
    assert float(total) == pytest.approx(norms[norm_type], abs=0.01)
    for got, tensor in zip(ours, tensors, strict=True):
        np.testing.assert_allclose(got, tensor.grad.numpy(), **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("clip_value", [0.1, 1.0, 10.0])
def test_clip_grad_value_matches_torch(dtype: type, clip_value: float) -> None:
    grads = _gradients(dtype)
    ours = clip_in_onnx(grads, ClipGradValue(clip_value))
    tensors = _torch_grads(grads)
    torch.nn.utils.clip_grad_value_(tensors, clip_value)
    for got, tensor in zip(ours, tensors, strict=True):
        np.testing.assert_array_equal(got, tensor.grad.numpy())


#: Optimizers with weight decay, the same with torch's parameter groups: the first parameter decays, the others
#: (a bias, a norm's weight) do not.
NO_DECAY = ["bias", "ln.*"]
GROUPED: list[tuple[Optimizer, Callable]] = [
    (
        SGD(momentum=0.9, weight_decay=0.05, no_decay=NO_DECAY),
        lambda groups, lr: torch.optim.SGD(groups, lr=lr, momentum=0.9, weight_decay=0.05),
    ),
    (Adam(weight_decay=0.05, no_decay=NO_DECAY), lambda groups, lr: torch.optim.Adam(groups, lr=lr, weight_decay=0.05)),
    (
        AdamW(weight_decay=0.1, no_decay=NO_DECAY),
        lambda groups, lr: torch.optim.AdamW(groups, lr=lr, eps=1e-6, weight_decay=0.1),
    ),
    (
        Adagrad(weight_decay=0.05, no_decay=NO_DECAY),
        lambda groups, lr: torch.optim.Adagrad(groups, lr=lr, weight_decay=0.05),
    ),
    (
        RMSprop(weight_decay=0.05, no_decay=NO_DECAY),
        lambda groups, lr: torch.optim.RMSprop(groups, lr=lr, weight_decay=0.05),
    ),
]


@pytest.mark.parametrize(("optimizer", "make_torch"), GROUPED, ids=[type(case[0]).__name__ for case in GROUPED])
def test_parameters_left_out_of_weight_decay_match_torchs_parameter_groups(
    optimizer: Optimizer, make_torch: Callable
) -> None:
    """``no_decay`` patterns: torch's two parameter groups, one with ``weight_decay=0``."""
    shapes = {"fc.weight": ((3, 4), np.dtype(np.float64)), "fc.bias": ((4,), np.dtype(np.float64))}
    shapes["ln.weight"] = ((4,), np.dtype(np.float64))
    assert [optimizer.decays(name) for name in shapes] == [True, False, False]
    params, grads = random_problem(shapes, STEPS, seed=3)
    lrs = learning_rates(0.05, STEPS)
    ours = onnx_trajectory(optimizer, params, grads, lrs)

    def grouped(tensors: list, lr: float) -> torch.optim.Optimizer:
        return make_torch([{"params": tensors[:1]}, {"params": tensors[1:], "weight_decay": 0.0}], lr)

    theirs = torch_trajectory(optimizer, grouped, params, grads, lrs, None)
    for t, ((p, _), (want_p, _)) in enumerate(zip(ours, theirs, strict=True), start=1):
        for name in params:
            np.testing.assert_allclose(p[name], want_p[name], **TOLERANCE[np.float64], err_msg=f"{name} at step {t}")
    decayed = type(optimizer)(**{**optimizer.hyperparameters(), "no_decay": []})
    assert not np.allclose(onnx_trajectory(decayed, params, grads, lrs)[-1][0]["fc.bias"], ours[-1][0]["fc.bias"])
