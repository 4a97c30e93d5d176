"""merge_adapters: the algebra of a Gemm with transA, transB and alpha; a base with external data; every trained
value the checkpoint holds besides the adapters (a head trained in full, BatchNorm running statistics)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from onnxtrain import api, artifacts
from onnxtrain.artifacts.training_model import set_inference_mode
from onnxtrain.checkpoint import CheckpointState
from onnxtrain.lora import add_adapters, merge_adapters
from tests.lora.helpers import (
    ALPHA,
    RANK,
    TARGETS,
    Base,
    BaseKind,
    fine_tune,
    generate,
    run,
    small_model,
    trained_values,
    with_values,
)
from tests.lora.models import batch_norm_mlp, toy_task
from tests.lora.test_finetune import _cross_entropy


def test_external_data_base_given_as_a_path(tmp_path: Path) -> None:
    model = small_model()
    path = tmp_path / "base.onnx"
    onnx.save(
        model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="base.data", size_threshold=0
    )
    adapted, names = add_adapters(path, ["W1", "W2"], 2, 4.0)
    assert next(t for t in adapted.graph.initializer if t.name == "W1").data_location == onnx.TensorProto.EXTERNAL
    adapted_path = tmp_path / "adapted.onnx"  # beside the base: its weights stay in base.data
    onnx.save(adapted, adapted_path)
    rng = np.random.default_rng(0)
    shapes = {t.name: list(t.dims) for t in adapted.graph.initializer}
    values = {name: rng.normal(size=shapes[name]).astype(np.float32) for name in names}
    merged = merge_adapters(adapted_path, CheckpointState(trainable=values))
    assert all(t.data_location != onnx.TensorProto.EXTERNAL for t in merged.graph.initializer if t.name in ("W1", "W2"))
    ids = np.array([1, 0, 4], np.int64)
    trained = onnx.load(adapted_path)
    for tensor in trained.graph.initializer:
        if tensor.name in values:
            tensor.CopyFrom(numpy_helper.from_array(values[tensor.name], tensor.name))
    onnx.save(trained, tmp_path / "trained.onnx")
    (expected,) = ort.InferenceSession(str(tmp_path / "trained.onnx")).run(None, {"ids": ids})
    onnx.save(merged, tmp_path / "merged.onnx")  # W1, W2 inline, E and b still in base.data
    (got,) = ort.InferenceSession(str(tmp_path / "merged.onnx")).run(None, {"ids": ids})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("trans_a", [0, 1])
def test_merge_of_the_gemm_with_trans_b_and_alpha(trans_a: int) -> None:
    """Gemm(u, W2, b, transA, transB=1, alpha=0.5) (u is square): the adapter reads u' (u^T for transA=1) and
    scales by alpha too; merging folds (A B)^T into W2."""
    model = small_model()
    gemm = model.graph.node[2]
    gemm.attribute.extend([helper.make_attribute("alpha", 0.5), helper.make_attribute("transA", trans_a)])
    adapted, names = add_adapters(model, ["W1", "W2"], 2, 3.0)
    rng = np.random.default_rng(1)
    values = {n: rng.normal(size=[*next(t.dims for t in adapted.graph.initializer if t.name == n)]) for n in names}
    values = {n: v.astype(np.float32) for n, v in values.items()}
    ids = np.array([0, 3, 4], np.int64)

    trained = onnx.ModelProto()
    trained.CopyFrom(adapted)
    for tensor in trained.graph.initializer:
        if tensor.name in values:
            tensor.CopyFrom(numpy_helper.from_array(values[tensor.name], tensor.name))
    (expected,) = ort.InferenceSession(trained.SerializeToString()).run(None, {"ids": ids})
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    h = weights["E"][ids]
    u = h @ (weights["W1"] + 1.5 * values["W1.lora_A"] @ values["W1.lora_B"])
    w2 = weights["W2"] + 1.5 * (values["W2.lora_A"] @ values["W2.lora_B"]).T
    np.testing.assert_allclose(expected, 0.5 * (u.T if trans_a else u) @ w2.T + weights["b"], rtol=1e-5, atol=1e-5)
    merged = merge_adapters(adapted, CheckpointState(trainable=values))
    (got,) = ort.InferenceSession(merged.SerializeToString()).run(None, {"ids": ids})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert [n.op_type for n in merged.graph.node] == ["Gather", "MatMul", "Gemm"]


def _eval_loss(folder: Path, state: api.CheckpointState, feeds: tuple[np.ndarray, ...]) -> float:
    """The loss of the eval model ``generate_artifacts`` wrote, run with the trained ``state``."""
    module = api.Module(folder / "training_model.onnx", state, folder / "eval_model.onnx")
    module.eval()
    return float(np.asarray(module(*feeds)))


def test_merge_keeps_a_head_trained_beside_the_adapters(bases: dict[BaseKind, Base], tmp_path: Path) -> None:
    """Adapters plus the lm_head trained in full (PEFT's ``modules_to_save``): the merged model is the trained
    one, head included: its logits are the eval model's with the trained checkpoint."""
    base = bases["float"]
    adapted, names = add_adapters(base.model, TARGETS[:3], RANK, ALPHA)
    head = ["lm_head.weight", "lm_head.bias"]
    folder = generate(adapted, [*names, *head], tmp_path)
    ids, labels = toy_task()
    losses, state = fine_tune(folder, ids, labels, 20)
    assert losses[-1] < 0.5 * losses[0]
    values = trained_values(state, [*names, *head])
    initial = {t.name: numpy_helper.to_array(t) for t in base.model.graph.initializer}
    assert all(np.abs(values[name] - initial[name]).max() > 1e-3 for name in head), "the head did not train"
    trained = with_values(adapted, values)
    set_inference_mode(trained)
    (expected,) = run(trained, {"input_ids": ids})

    merged = merge_adapters(adapted, state)
    (got,) = run(merged, {"input_ids": ids})
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    assert _cross_entropy(got, labels) == pytest.approx(_eval_loss(folder, state, (ids, labels)), rel=1e-4)
    assert [t.name for t in merged.graph.initializer] == [t.name for t in base.model.graph.initializer]


def test_merge_writes_the_running_statistics_training_updated(tmp_path: Path) -> None:
    """A training-mode BatchNormalization between two adapted Gemms: its running statistics (frozen parameters
    the train steps update) go into the merged model, which then gives the eval model's outputs."""
    pytest.importorskip("torch")
    model = batch_norm_mlp()
    adapted, names = add_adapters(model, ["0.weight", "3.weight"], 2, 4.0)
    statistics = ["1.running_mean", "1.running_var"]
    artifacts.generate_artifacts(
        adapted,
        requires_grad=names,
        frozen_params=statistics,
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=tmp_path,
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 6)).astype(np.float32)
    labels = rng.integers(0, 3, size=16).astype(np.int64)
    state = api.CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = api.Module(tmp_path / "training_model.onnx", state, tmp_path / "eval_model.onnx")
    optimizer = api.Optimizer(tmp_path / "optimizer_model.onnx", module)
    for _ in range(5):
        module(x, labels)
        optimizer.step()
        module.lazy_reset_grad()
    values = trained_values(state, [*names, *statistics])
    initial = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert all(np.abs(values[name] - initial[name]).max() > 1e-3 for name in statistics), "no statistic moved"
    trained = with_values(adapted, values)
    set_inference_mode(trained)
    (expected,) = run(trained, {"x": x})

    merged = merge_adapters(adapted, state)
    (got,) = run(merged, {"x": x})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert _cross_entropy(got, labels) == pytest.approx(_eval_loss(tmp_path, state, (x, labels)), rel=1e-5)
    merged_values = {t.name: numpy_helper.to_array(t) for t in merged.graph.initializer}
    for name in statistics:
        np.testing.assert_array_equal(merged_values[name], values[name])


def _copy(tensor: onnx.TensorProto) -> onnx.TensorProto:
    copied = onnx.TensorProto()
    copied.CopyFrom(tensor)
    return copied


def test_merge_leaves_unchanged_values_where_they_are(tmp_path: Path) -> None:
    """A frozen value the checkpoint holds unchanged keeps its external data; a changed one is written."""
    model = small_model()
    path = tmp_path / "base.onnx"
    onnx.save(
        model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="base.data", size_threshold=0
    )
    adapted, names = add_adapters(path, ["W1"], 2, 4.0)
    # of copies: onnx 1.23.0's to_array loads external data into the tensor it is given, which save would rewrite
    stored = {t.name: numpy_helper.to_array(_copy(t), os.fspath(tmp_path)) for t in adapted.graph.initializer}
    onnx.save(adapted, tmp_path / "adapted.onnx")  # beside the base: its weights stay in base.data
    values = {name: np.ones_like(stored[name]) for name in names}
    frozen = {"E": stored["E"], "b": stored["b"] + 1.0}
    merged = merge_adapters(tmp_path / "adapted.onnx", CheckpointState(trainable=values, frozen=frozen))
    tensors = {t.name: t for t in merged.graph.initializer}
    assert tensors["E"].data_location == onnx.TensorProto.EXTERNAL
    np.testing.assert_array_equal(numpy_helper.to_array(tensors["b"]), frozen["b"])
    np.testing.assert_allclose(numpy_helper.to_array(tensors["W1"]), stored["W1"] + 2.0 * 2.0, rtol=1e-6)
