"""The training model computes the right things: loss, gradients, accumulation, and a full training loop."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

import onnxtrain.onnxblock as onnxblock
from onnxtrain import artifacts, losses, optim
from onnxtrain.artifacts import LossType, OptimType
from tests.artifacts.models import (
    DOUBLE,
    FROZEN,
    REQUIRES_GRAD,
    TRAINABLE,
    dense,
    dense_values,
    flag,
    initial_states,
    load,
    names,
    run,
    session,
)
from tests.helpers import FLOAT, make_model


class LossOn(onnxblock.TrainingBlock):
    """A TrainingBlock with one loss on ``y``: the gradients generate_artifacts must reproduce."""

    def __init__(self, loss: onnxblock.Block) -> None:
        super().__init__()
        self.loss = loss

    def build(self, output_name: str) -> str:
        return self.loss(output_name)


def _training_block_model(model: onnx.ModelProto, loss: onnxblock.Block) -> onnx.ModelProto:
    block = LossOn(loss)
    for name in REQUIRES_GRAD:
        block.requires_grad(name)
    for name in FROZEN:
        block.requires_grad(name, False)
    with onnxblock.base(model):
        block("y")
    return block.gradient_models.training


def _data(loss: LossType, n: int, dtype, seed: int = 0) -> dict[str, np.ndarray]:
    """``x`` and a valid target (or labels) for ``loss`` on ``y: [n, 4]`` in (0, 1)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype(dtype)
    if loss in (LossType.CrossEntropyLoss, LossType.NLLLoss):
        labels = rng.integers(0, 4, size=n).astype(np.int64)
        return {"x": x, "labels" if loss is LossType.CrossEntropyLoss else "target": labels}
    if loss is LossType.KLDivLoss:
        t = rng.uniform(0.1, 1.0, size=(n, 4))
        return {"x": x, "target": (t / t.sum(axis=1, keepdims=True)).astype(dtype)}
    low = 0.0 if loss in (LossType.BCELoss, LossType.BCEWithLogitsLoss) else -1.0
    return {"x": x, "target": rng.uniform(low, 1.0, size=(n, 4)).astype(dtype)}


def _params(dtype) -> dict[str, np.ndarray]:
    values = dense_values(dtype)
    return {name: values[name] for name in ("W", "S", "B")}


def _buffers(params: dict[str, np.ndarray], fill: float | dict[str, np.ndarray] = 0.0) -> dict[str, np.ndarray]:
    if isinstance(fill, dict):
        return {f"{p}_grad.accumulation.buffer": fill[p] for p in TRAINABLE}
    return {f"{p}_grad.accumulation.buffer": np.full_like(params[p], fill) for p in TRAINABLE}


def _accumulated(out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {p: out[f"{p}_grad.accumulation.out"] for p in TRAINABLE}


@pytest.mark.parametrize("loss", list(LossType), ids=lambda loss: loss.name)
def test_loss_and_gradients_match_the_eval_model_training_block_and_finite_differences(tmp_path: Path, loss):
    model = dense(DOUBLE)
    paths = artifacts.generate_artifacts(model, REQUIRES_GRAD, FROZEN, loss=loss, artifact_directory=tmp_path)
    training, evaluation = session(paths["training_model"]), session(paths["eval_model"])
    params, data = _params(np.float64), _data(loss, 5, np.float64)
    out = run(training, {**data, **params, **_buffers(params, np.nan), "lazy_reset_grad": flag(True)})
    loss_name = names(load(paths["training_model"]).graph.output)[0]
    (eval_loss,) = evaluation.run(None, {**data, **params})
    np.testing.assert_allclose(out[loss_name], eval_loss, rtol=1e-12)
    grads = _accumulated(out)  # NaN buffers: a reset never reads them

    reference = run(session(_training_block_model(model, getattr(losses, loss.name)())), {**data, **params})
    for p in TRAINABLE:
        np.testing.assert_allclose(grads[p], reference[f"{p}_grad"], rtol=1e-12, atol=1e-15)

    h = 1e-6
    for p in TRAINABLE:
        numeric = np.zeros_like(params[p])
        for index in np.ndindex(params[p].shape):
            plus, minus = params[p].copy(), params[p].copy()
            plus[index] += h
            minus[index] -= h
            f_plus = evaluation.run(None, {**data, **params, p: plus})[0]
            f_minus = evaluation.run(None, {**data, **params, p: minus})[0]
            numeric[index] = (f_plus - f_minus) / (2 * h)
        np.testing.assert_allclose(grads[p], numeric, rtol=1e-5, atol=1e-8)


@pytest.fixture(scope="module")
def mse(tmp_path_factory) -> dict[str, object]:
    """float32 MSELoss artifacts with AdamW, their sessions, and TrainingBlock's gradient model."""
    folder = tmp_path_factory.mktemp("mse")
    paths = artifacts.generate_artifacts(
        dense(), REQUIRES_GRAD, FROZEN, loss=LossType.MSELoss, optimizer=OptimType.AdamW, artifact_directory=folder
    )
    training = load(paths["training_model"])
    return {
        "paths": paths,
        "loss": names(training.graph.output)[0],
        "training": session(paths["training_model"]),
        "eval": session(paths["eval_model"]),
        "optimizer": session(paths["optimizer_model"]),
        "reference": session(_training_block_model(dense(), losses.MSELoss())),
    }


@settings(max_examples=15)
@given(
    n=st.integers(1, 4),
    seed=st.integers(0, 2**16),
    lazy_reset_grad=st.booleans(),
    scale=st.sampled_from([0.0, 1.0, 1e3]),
)
def test_accumulation_semantics(mse, n, seed, lazy_reset_grad, scale):
    rng = np.random.default_rng(seed)
    params = {k: (v + rng.normal(size=v.shape)).astype(np.float32) for k, v in _params(np.float32).items()}
    data = _data(LossType.MSELoss, n, np.float32, seed)
    buffers = {p: (scale * rng.normal(size=params[p].shape)).astype(np.float32) for p in TRAINABLE}
    out = run(
        mse["training"], {**data, **params, **_buffers(params, buffers), "lazy_reset_grad": flag(lazy_reset_grad)}
    )
    reference = run(mse["reference"], {**data, **params})
    np.testing.assert_allclose(out[mse["loss"]], reference[mse["loss"]], rtol=1e-6)  # the buffers change no loss
    for p, accumulated in _accumulated(out).items():
        grad = reference[f"{p}_grad"]
        expected = grad if lazy_reset_grad else buffers[p] + grad
        np.testing.assert_allclose(accumulated, expected, rtol=1e-5, atol=1e-6)


def test_two_half_batches_with_a_sum_reduction_accumulate_to_the_full_batch(tmp_path: Path):
    paths = artifacts.generate_artifacts(
        dense(DOUBLE), REQUIRES_GRAD, FROZEN, loss=losses.MSELoss(reduction="sum"), artifact_directory=tmp_path
    )
    training = session(paths["training_model"])
    loss_name = training.get_outputs()[0].name
    params, data = _params(np.float64), _data(LossType.MSELoss, 6, np.float64, seed=9)
    first = {k: v[:3] for k, v in data.items()}
    second = {k: v[3:] for k, v in data.items()}

    garbage = _buffers(params, 1e6)  # what the buffers held before the reset: ignored
    step1 = run(training, {**first, **params, **garbage, "lazy_reset_grad": flag(True)})
    step2 = run(training, {**second, **params, **_buffers(params, _accumulated(step1)), "lazy_reset_grad": flag(False)})
    full = run(training, {**data, **params, **garbage, "lazy_reset_grad": flag(True)})
    np.testing.assert_allclose(step1[loss_name] + step2[loss_name], full[loss_name], rtol=1e-12)
    for p in TRAINABLE:
        np.testing.assert_allclose(_accumulated(step2)[p], _accumulated(full)[p], rtol=1e-12, atol=1e-14)
        assert not np.allclose(_accumulated(step1)[p], _accumulated(full)[p])  # half a batch is not enough


def _train_step(mse, data, params):
    feeds = {**data, **params, **_buffers(params), "lazy_reset_grad": flag(True)}
    out = run(mse["training"], feeds)
    return float(out[mse["loss"]]), _accumulated(out)


def _optimizer_step(sess, params, grads, states, lr, step):
    feeds = {"learning_rate": np.array([lr], np.float32), "step": np.array([step], np.int64)}
    for p in TRAINABLE:
        feeds[p] = params[p]
        feeds[optim.grad_name(p)] = grads[p]
        feeds |= {optim.state_name(p, i): s for i, s in enumerate(states[p])}
    out = run(sess, feeds)
    new_params = {**params, **{p: out[optim.updated_name(p)] for p in TRAINABLE}}
    new_states = {
        p: [out[optim.updated_name(optim.state_name(p, i))] for i in range(len(states[p]))] for p in TRAINABLE
    }
    return new_params, new_states


def test_the_training_loop_by_hand_decreases_the_loss(mse):
    """train model -> accumulated gradients -> optimizer model -> new parameters, 25 times."""
    rng = np.random.default_rng(10)
    params = _params(np.float32)
    x = rng.normal(size=(16, 3)).astype(np.float32)
    teacher = {k: (v + rng.normal(size=v.shape)).astype(np.float32) for k, v in params.items()}
    h = (x @ teacher["W"]) * teacher["S"] + teacher["B"] + dense_values()["C"]
    data = {"x": x, "target": (1 / (1 + np.exp(-h))).astype(np.float32)}

    optimizer_model = load(mse["paths"]["optimizer_model"])
    states = initial_states(optimizer_model, {p: params[p] for p in TRAINABLE})
    history = []
    for step in range(1, 26):
        loss, grads = _train_step(mse, data, params)
        history.append(loss)
        params, states = _optimizer_step(mse["optimizer"], params, grads, states, lr=0.05, step=step)
    history.append(_train_step(mse, data, params)[0])
    assert history[-1] < 0.5 * history[0], history
    assert all(later < earlier for earlier, later in itertools.pairwise(history[:6])), history
    assert "S" not in names(optimizer_model.graph.input)  # frozen: the optimizer never sees it
    (eval_loss,) = mse["eval"].run(None, {**data, **params})
    np.testing.assert_allclose(eval_loss, history[-1], rtol=1e-6)


@pytest.mark.parametrize("optimizer", list(OptimType), ids=lambda o: o.name)
def test_optimizer_steps_equal_the_reference(tmp_path: Path, optimizer: OptimType):
    """Three steps of the optimizer model on the training model's gradients, as optim.reference computes them."""
    paths = artifacts.generate_artifacts(
        dense(), REQUIRES_GRAD, FROZEN, loss="MSELoss", optimizer=optimizer, artifact_directory=tmp_path
    )
    training, optimizer_session = session(paths["training_model"]), session(paths["optimizer_model"])
    loss_name = training.get_outputs()[0].name
    block = getattr(optim, optimizer.name)()
    params = _params(np.float32)
    states = initial_states(load(paths["optimizer_model"]), {p: params[p] for p in TRAINABLE})
    ref_params = {p: params[p] for p in TRAINABLE}
    ref_states = {p: list(s) for p, s in states.items()}
    for step, lr in enumerate((0.1, 0.05, 0.02), start=1):
        data = _data(LossType.MSELoss, 4, np.float32, seed=step)
        out = run(training, {**data, **params, **_buffers(params), "lazy_reset_grad": flag(True)})
        assert np.isfinite(out[loss_name])
        grads = _accumulated(out)
        params, states = _optimizer_step(optimizer_session, params, grads, states, lr, step)
        ref_params, ref_states = block.reference_step(lr, step, ref_params, grads, ref_states)
        for p in TRAINABLE:
            np.testing.assert_allclose(params[p], ref_params[p], rtol=1e-6, atol=1e-7)
            for mine, theirs in zip(states[p], ref_states[p], strict=True):
                np.testing.assert_allclose(mine, theirs, rtol=1e-6, atol=1e-7)
            ref_params[p] = params[p]  # continue from the model's values: no drift between the two
            ref_states[p] = list(states[p])
        assert not np.array_equal(params["W"], _params(np.float32)["W"])


@pytest.mark.parametrize("opset", [13, 17])
def test_gradient_outputs_have_the_parameter_shape_where_inference_loses_it(opset: int) -> None:
    """At opset 13 onnx infers no shape through Reshape's gradient (skl2onnx's linear models end in a
    Reshape to [-1, 1]); the accumulated gradient outputs are still declared with each parameter's type."""
    model = make_model(
        {"X": (FLOAT, ["batch", 3])},
        [
            helper.make_node("MatMul", ["X", "coef"], ["xw"]),
            helper.make_node("Add", ["xw", "intercept"], ["v"]),
            helper.make_node("Reshape", ["v", "shape"], ["variable"]),
        ],
        {"variable": (FLOAT, ["batch", 1])},
        [("coef", np.zeros((3, 1), np.float32)), ("intercept", np.zeros(1, np.float32)),
         ("shape", np.array([-1, 1], np.int64))],
        opset=opset,
    )  # fmt: skip
    training = artifacts.build_artifacts(model, ["coef", "intercept"], loss=artifacts.LossType.MSELoss).training_model
    declared = {
        value.name: [d.dim_value for d in value.type.tensor_type.shape.dim]
        for value in training.graph.output
        if value.type.tensor_type.HasField("shape")
    }
    assert declared["coef_grad.accumulation.out"] == [3, 1]
    assert declared["intercept_grad.accumulation.out"] == [1]
