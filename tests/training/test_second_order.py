"""Losses that contain derivatives of the model (``Gradient`` blocks) train through ``generate_artifacts`` and
``onnxtrain.api``: every parameter's gradient is the exact derivative of that loss, second order through the
network. Checked against central differences of the loss in float64, and against torch's double backward
(``create_graph=True``, float64; skipped without torch) at two batch sizes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import onnxtrain.onnxblock as onnxblock
from onnxtrain import blocks
from onnxtrain.artifacts import OptimType
from tests.blocks import networks
from tests.training import models
from tests.training.helpers import open_module

NU = 0.05  # Burgers' viscosity
PENALTY = 10.0  # the gradient penalty's weight (WGAN-GP's lambda)


def column(k: int, width: int = 2) -> blocks.Block:
    """A constant ``[width, 1]`` selecting column ``k`` by a product (``g @ e_k``)."""
    selector = np.zeros((width, 1))
    selector[k] = 1.0
    return blocks.Constant(selector)


class BurgersResidual(onnxblock.TrainingBlock):
    """``mean((u_t + u u_x - nu u_xx)**2)`` of a network ``u(x, t)`` whose input rows are ``(x, t)``."""

    def build(self, u: str) -> str:
        first = blocks.Gradient(wrt="x")(u)  # [N, 2]: u_x, u_t
        u_x = blocks.MatMul()(first, column(0)())
        u_t = blocks.MatMul()(first, column(1)())
        u_xx = blocks.MatMul()(blocks.Gradient(wrt="x")(u_x), column(0)())  # d/d(x, t) of u_x: u_xx, u_xt
        advection = blocks.Mul()(u, u_x)
        viscous = blocks.Mul()(blocks.Constant(np.float64(NU))(), u_xx)
        residual = blocks.Sub()(blocks.Add()(u_t, advection), viscous)
        return blocks.ReduceMean(keepdims=False)(blocks.Mul()(residual, residual))


class CriticWithGradientPenalty(onnxblock.TrainingBlock):
    """WGAN-GP's critic loss on points ``x``: ``mean(D(x)) + lambda * mean((||dD/dx|| - 1)**2)``."""

    def build(self, score: str) -> str:
        slope = blocks.Gradient(wrt="x")(score)  # [N, features]
        norm = blocks.Sqrt()(blocks.ReduceSum(axes=[1], keepdims=False)(blocks.Mul()(slope, slope)))
        gap = blocks.Sub()(norm, blocks.Constant(np.float64(1.0))())
        penalty = blocks.ReduceMean(keepdims=False)(blocks.Mul()(gap, gap))
        weighted = blocks.Mul()(blocks.Constant(np.float64(PENALTY))(), penalty)
        return blocks.Add()(blocks.ReduceMean(keepdims=False)(score), weighted)


def torch_burgers(u: Any, x: Any) -> Any:
    import torch

    (first,) = torch.autograd.grad(u.sum(), x, create_graph=True)
    u_x, u_t = first[:, :1], first[:, 1:]
    (second,) = torch.autograd.grad(u_x.sum(), x, create_graph=True)
    return ((u_t + u * u_x - NU * second[:, :1]) ** 2).mean()


def torch_critic(score: Any, x: Any) -> Any:
    import torch

    (slope,) = torch.autograd.grad(score.sum(), x, create_graph=True)
    return score.mean() + PENALTY * ((slope.pow(2).sum(dim=1).sqrt() - 1) ** 2).mean()


CASES = {
    "burgers": (networks.mlp([2, 8, 8, 1], seed=3), BurgersResidual, torch_burgers),
    "gradient-penalty": (networks.mlp([3, 8, 8, 1], seed=4), CriticWithGradientPenalty, torch_critic),
}


def _points(model: onnx.ModelProto, rows: int, seed: int) -> np.ndarray:
    features = model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    return np.random.default_rng(seed).uniform(-1, 1, size=(rows, features))


def _trained_gradients(tmp_path: Path, case: str, x: np.ndarray) -> tuple[float, dict[str, np.ndarray], Any]:
    model, loss, _ = CASES[case]
    paths = models.generate(tmp_path, model, loss=loss(), optimizer=OptimType.AdamW)
    state, module, optimizer = open_module(paths)
    value = float(np.asarray(module(x)))
    return value, {name: np.array(p.grad) for name, p in state.parameters}, (state, module, optimizer)


@pytest.mark.parametrize("case", sorted(CASES))
def test_parameter_gradients_match_central_differences_of_the_loss(tmp_path: Path, case: str) -> None:
    """``<t, grad>`` against the directional derivative of the loss along a random ``t`` over all parameters."""
    x = _points(CASES[case][0], 6, seed=11)
    loss, grads, (state, module, _) = _trained_gradients(tmp_path, case, x)
    rng = np.random.default_rng(12)
    start = {name: np.array(p.data) for name, p in state.parameters}
    direction = {name: rng.normal(size=value.shape) for name, value in start.items()}
    module.eval()

    def loss_at(h: float) -> float:
        for name, value in start.items():
            state.parameters[name].data = value + h * direction[name]
        return float(np.asarray(module(x)))

    assert loss_at(0.0) == pytest.approx(loss, rel=1e-14)
    h = 1e-4
    numeric = (8 * (loss_at(h) - loss_at(-h)) - (loss_at(2 * h) - loss_at(-2 * h))) / (12 * h)
    analytic = sum(float(np.sum(grads[name] * direction[name])) for name in grads)
    assert analytic == pytest.approx(numeric, rel=1e-7, abs=1e-9)


@pytest.mark.parametrize("rows", [3, 16])
@pytest.mark.parametrize("case", sorted(CASES))
def test_parameter_gradients_match_torch_double_backward(tmp_path: Path, case: str, rows: int) -> None:
    torch = pytest.importorskip("torch")
    model, _, torch_loss = CASES[case]
    x = _points(model, rows, seed=rows)
    loss, grads, _ = _trained_gradients(tmp_path, case, x)
    params, forward = networks.torch_mlp(model)
    inputs = torch.tensor(x, requires_grad=True)
    expected = torch_loss(forward(inputs), inputs)
    expected.backward()
    assert loss == pytest.approx(expected.item(), rel=1e-12)
    assert set(grads) == set(params)
    for name, tensor in params.items():
        want = np.zeros_like(grads[name]) if tensor.grad is None else tensor.grad.numpy()
        np.testing.assert_allclose(grads[name], want, rtol=1e-10, atol=1e-12, err_msg=name)


def test_training_through_the_residual_lowers_it(tmp_path: Path) -> None:
    """AdamW steps on Burgers' residual over fixed collocation points: the ORT-style loop, unchanged."""
    x = _points(CASES["burgers"][0], 32, seed=5)
    first, _, (_, module, optimizer) = _trained_gradients(tmp_path, "burgers", x)
    optimizer.step()
    module.lazy_reset_grad()
    optimizer.set_learning_rate(0.01)
    losses = []
    for _ in range(60):
        losses.append(float(np.asarray(module(x))))
        optimizer.step()
        module.lazy_reset_grad()
    assert losses[-1] < 0.5 * first


def test_the_readme_gradient_penalty_trains(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's WGAN-GP snippet, run as written on a float32 critic; its loss equals the float64 one here."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("### Derivatives inside a loss", 1)[1]
    snippet = section.split("```python\n", 1)[1].split("```", 1)[0]
    critic = networks.mlp([3, 8, 8, 1], seed=4, elem_type=onnx.TensorProto.FLOAT)
    onnx.save(critic, tmp_path / "critic.onnx")
    monkeypatch.chdir(tmp_path)
    from onnxtrain import artifacts

    exec(snippet, {"onnxblock": onnxblock, "artifacts": artifacts, "parameters": list(networks.parameters(critic))})
    paths = {name: tmp_path / "artifacts" / f"{name}.onnx" for name in ("training_model", "eval_model")}
    paths |= {"optimizer_model": tmp_path / "artifacts" / "optimizer_model.onnx"}
    paths["checkpoint"] = tmp_path / "artifacts" / "checkpoint"
    state, module, optimizer = open_module(paths)
    x = _points(critic, 5, seed=9)
    loss = float(np.asarray(module(x.astype(np.float32))))
    expected, _, _ = _trained_gradients(tmp_path / "float64", "gradient-penalty", x)
    assert loss == pytest.approx(expected, rel=1e-5)
    assert all(np.abs(p.grad).sum() > 0 for _, p in state.parameters)
    optimizer.step()
