"""Whole models: the gradient of every parameter, not only the loss.

Four models (tests/autodiff/models.py): an MLP (Gemm, LayerNormalization,
Gelu), a CNN (Conv, training-mode BatchNormalization, Relu, MaxPool,
ReduceMean), a transformer block (Gather embedding, MatMul, Split, Reshape,
Transpose, Softmax, LayerNormalization) and a net of element-wise operators,
each under its loss, built into a training model with the onnxblock API.

Two families of checks:

- **finite differences** (never skipped): the hand-built float64 models, one
  directional check per parameter (``<t, dL/dp>`` against the central
  difference of the loss along a random ``t``). onnxruntime's CPU provider has
  no float64 kernel for Gelu, Erf, Conv, Softplus or Atan, so those float64
  training models run in ``onnx.reference``; the float32 training models always
  run in onnxruntime and must agree with the float64 gradients.
- **torch autograd** (where torch is importable): the same models written in
  torch, exported by ``torch.onnx.export(..., dynamo=False,
  training=TrainingMode.TRAINING, do_constant_folding=False)`` (see
  :func:`tests.autodiff.models.export_torch` for why the TorchScript exporter),
  trained by onnxtrain with the same loss; loss, every parameter gradient and
  BatchNormalization's running mean compared with torch.

Each training model is built once and run at batch sizes 1, 7 and 64 (its
batch dimension is symbolic).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from tests.autodiff import models, node_counts
from tests.autodiff.models import NAMES, ModelCase, Runner

BATCHES = (1, 7, 64)
DOC = Path(__file__).resolve().parents[2] / "docs" / "node-counts.md"


@dataclass(frozen=True)
class Built:
    """A training model, ready to run."""

    case: ModelCase
    training: onnx.ModelProto
    runner: Runner
    loss: str  # the loss output's name
    running_stats: dict[str, str]


@functools.cache
def _built(name: str, dtype: str) -> Built:
    case = models.build(name, np.dtype(dtype))
    block = models.training_block(case.model, case.loss, case.trainable, case.frozen)
    training = block.gradient_models.training
    runner = Runner(training, allow_reference=dtype == "float64")
    return Built(case, training, runner, training.graph.output[0].name, block.running_stats)


def _feeds(built: Built, data: dict[str, np.ndarray], params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    inputs = [value.name for value in built.training.graph.input]
    feeds = {**data, **params}
    missing = sorted(set(inputs) - set(feeds))
    assert not missing, f"no feeds for training-model inputs {missing}"
    return {name: feeds[name] for name in inputs}


def _assert_interface(built: Built) -> None:
    """Inputs: data, loss target, then every parameter; outputs: loss, gradients, running statistics."""
    case, graph = built.case, built.training.graph
    assert [v.name for v in graph.input][-len(case.params) :] == list(case.params)
    outputs = [v.name for v in graph.output]
    assert outputs[1:] == [f"{p}_grad" for p in case.trainable] + list(built.running_stats.values())
    first = graph.input[0].type.tensor_type.shape.dim[0]
    assert first.dim_param == "batch", f"the batch dimension is not symbolic: {first}"
    assert all(node.domain in ("", "ai.onnx") for node in graph.node), "only standard ONNX operators"


# ---------------------------------------------------------------- finite differences (never skipped)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("name", NAMES)
def test_gradients_match_finite_differences(name: str, batch: int) -> None:
    """float64: ``<t, dL/dp>`` equals the central difference of the loss along ``t``, for every parameter."""
    built = _built(name, "float64")
    _assert_interface(built)
    case = built.case
    rng = np.random.default_rng(batch)
    feeds = _feeds(built, case.data(rng, batch), case.params)
    out = built.runner(feeds)
    loss = float(out[built.loss])
    assert np.isfinite(loss)
    h = 1e-6
    for param in case.trainable:
        value, grad = case.params[param], out[f"{param}_grad"]
        assert grad.shape == value.shape and grad.dtype == value.dtype, f"{param}_grad: {grad.shape} {grad.dtype}"
        t = rng.normal(size=value.shape)
        analytic = float(np.sum(t * grad))
        scale = float(np.sum(np.abs(t * grad)))

        def f(step: float, param: str = param, value: np.ndarray = value, t: np.ndarray = t) -> float:
            return float(built.runner({**feeds, param: value + step * t}, [built.loss])[built.loss])

        numeric = (f(h) - f(-h)) / (2 * h)
        tolerance = 1e-6 * (abs(analytic) + scale) + 1e-9 * (1 + abs(loss))
        assert abs(analytic - numeric) <= tolerance, (
            f"{name}, batch {batch}, d loss / d {param} along t: ours {analytic!r}, finite differences "
            f"{numeric!r} ({built.runner.backend})"
        )


@pytest.mark.parametrize("name", NAMES)
def test_float32_training_model_runs_in_onnxruntime_and_agrees_with_float64(name: str) -> None:
    f32, f64 = _built(name, "float32"), _built(name, "float64")
    assert f32.runner.backend == "onnxruntime"
    _assert_interface(f32)
    data = f64.case.data(np.random.default_rng(1), 7)
    out64 = f64.runner(_feeds(f64, data, f64.case.params))
    data32 = {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in data.items()}
    out32 = f32.runner(_feeds(f32, data32, f32.case.params))
    np.testing.assert_allclose(out32[f32.loss], out64[f64.loss], rtol=1e-5)
    for param in f32.case.trainable:
        want = out64[f"{param}_grad"]
        got = out32[f"{param}_grad"]
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(want).max())), err_msg=param)


def _conv_numpy(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """A 3x3 convolution with padding 1."""
    windows = sliding_window_view(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3))
    return np.einsum("bchwij,fcij->bfhw", windows, weight) + bias[None, :, None, None]


@pytest.mark.parametrize("batch", BATCHES)
def test_cnn_running_statistics_follow_the_onnx_formula(batch: int) -> None:
    """``.updated = momentum * running + (1 - momentum) * batch statistic`` (ONNX: biased batch variance)."""
    built = _built("cnn", "float64")
    case = built.case
    assert built.running_stats == {
        "bn.running_mean": "bn.running_mean.updated",
        "bn.running_var": "bn.running_var.updated",
    }
    data = case.data(np.random.default_rng(batch), batch)
    out = built.runner(_feeds(built, data, case.params))
    conv = _conv_numpy(data["x"], case.params["conv.weight"], case.params["conv.bias"])
    m = float(np.float32(models.BN_MOMENTUM))  # a float attribute: 0.9 as the nearest float32
    want_mean = m * case.params["bn.running_mean"] + (1 - m) * conv.mean(axis=(0, 2, 3))
    want_var = m * case.params["bn.running_var"] + (1 - m) * conv.var(axis=(0, 2, 3))
    np.testing.assert_allclose(out["bn.running_mean.updated"], want_mean, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(out["bn.running_var.updated"], want_var, rtol=1e-12)


# ---------------------------------------------------------------- torch autograd


@dataclass(frozen=True)
class TorchBuilt:
    module: Any
    state: dict[str, Any]  # the parameter and buffer values the module starts every test from
    built: Built


@functools.cache
def _torch_built(name: str) -> TorchBuilt:
    module = models.torch_module(name)
    model = models.export_torch(module, name)
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    trainable = tuple(k for k, _ in module.named_parameters())
    initializers = [t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
    assert set(trainable) <= set(initializers), f"exported initializers {initializers} miss parameters {trainable}"
    frozen = tuple(k for k in initializers if k not in trainable and k in state)  # BatchNorm's running stats
    loss = "mse" if name == "elementwise" else "cross_entropy"
    block = models.training_block(model, loss, trainable, frozen)
    training = block.gradient_models.training
    params = {k: state[k].numpy() for k in initializers if k in trainable or k in frozen}  # graph-input order
    case = ModelCase(name, model, loss, params, frozen, np.dtype(np.float32))
    built = Built(case, training, Runner(training), training.graph.output[0].name, block.running_stats)
    return TorchBuilt(module, state, built)


def _torch_loss(torch: Any, name: str, module: Any, data: dict[str, np.ndarray]) -> Any:
    functional = torch.nn.functional
    if name == "elementwise":
        return functional.mse_loss(module(torch.from_numpy(data["x"])), torch.from_numpy(data["target"]))
    x = torch.from_numpy(data["ids" if name == "transformer" else "x"])
    return functional.cross_entropy(module(x), torch.from_numpy(data["labels"]).long())


def _run_both(name: str, batch: int) -> tuple[TorchBuilt, dict[str, np.ndarray], Any]:
    """One batch through onnxtrain's training model and through torch (forward in train mode, backward)."""
    torch = pytest.importorskip("torch")
    tb = _torch_built(name)
    module, built = tb.module, tb.built
    module.load_state_dict(tb.state)
    module.train()
    module.zero_grad(set_to_none=True)
    data = models.batch_data(name, np.random.default_rng(100 + batch), batch)
    out = built.runner(_feeds(built, data, built.case.params))
    loss = _torch_loss(torch, name, module, data)
    loss.backward()
    return tb, out, loss


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("name", NAMES)
def test_gradients_match_torch_autograd(name: str, batch: int) -> None:
    tb, out, loss = _run_both(name, batch)
    built = tb.built
    _assert_interface(built)
    np.testing.assert_allclose(out[built.loss], loss.item(), rtol=1e-5)
    for param, tensor in tb.module.named_parameters():
        want = tensor.grad.numpy()
        got = out[f"{param}_grad"]
        assert got.shape == want.shape, f"{param}_grad: {got.shape}, torch {want.shape}"
        np.testing.assert_allclose(
            got, want, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(want).max())), err_msg=f"{name}: {param}"
        )


@pytest.mark.parametrize("batch", BATCHES)
def test_batchnorm_running_statistics_match_torch(batch: int) -> None:
    """The running mean and variance equal torch's.

    Both update ``running = (1 - momentum_torch) * running + momentum_torch * batch_stat``; torch takes the
    unbiased batch variance (``n / (n - 1)`` times ONNX's biased one, ``n = N * H * W``), and so do the artifacts
    of a model torch exported (``onnxtrain.artifacts.running_variance``): at batch size 1 with a 6x6 map,
    ``n = 36``, the two updates differ by 1/35 of the batch's term.
    """
    tb, out, _ = _run_both("cnn", batch)
    bn = tb.module.bn
    old_mean = tb.state["bn.running_mean"].numpy()
    np.testing.assert_allclose(out["bn.running_mean.updated"], bn.running_mean.numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(out["bn.running_var.updated"], bn.running_var.numpy(), rtol=1e-6)
    assert np.all(out["bn.running_mean.updated"] != old_mean)


# ---------------------------------------------------------------- graph size


def test_mlp_training_graph_is_at_most_3_5_times_its_forward_plus_loss_graph() -> None:
    """The classic MLP with cross-entropy (Gemm and Relu layers, symbolic batch)."""
    counts = node_counts.counts("relu_mlp")
    assert counts.training <= node_counts.MLP_RATIO_BOUND * counts.forward, (
        f"the MLP's training graph has {counts.training} nodes, {counts.ratio:.2f} times the {counts.forward} "
        f"nodes of its forward-plus-loss graph; backward nodes: {dict(counts.backward_ops)}"
    )


def test_committed_node_counts_are_current() -> None:
    """Regenerate with: python -m tests.autodiff.node_counts > docs/node-counts.md"""
    assert DOC.read_text() == node_counts.markdown(), (
        "docs/node-counts.md is stale: run `python -m tests.autodiff.node_counts > docs/node-counts.md`"
    )


@pytest.mark.parametrize("name", ["transformer"])
def test_no_transpose_of_a_transpose_or_of_a_gemm_in_the_gradient(name: str) -> None:
    """Weights used as ``MatMul(x, Transpose(W))`` (PyTorch's nn.Linear on 3-D input): the engine folds the
    ``Transpose(Transpose(W))`` and ``Transpose(Gemm(...))`` the MatMul and Transpose rules stack up."""
    graph = _built(name, "float32").training.graph
    producer = {out: node for node in graph.node for out in node.output}
    for node in graph.node:
        if node.op_type == "Transpose":
            source = producer.get(node.input[0])
            assert source is None or source.op_type not in ("Transpose", "Gemm"), (
                f"{node.name}: Transpose of {source.op_type} {source.name}"
            )
