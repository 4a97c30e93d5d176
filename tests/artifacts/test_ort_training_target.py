"""``generate_artifacts(target="onnxruntime-training")``: ONNX Runtime's on-device conventions, run by onnxtrain too.

ONNX Runtime's own runtime trains them in ``tests/interop`` (skipped where
its environment is missing); these tests need only stock onnxruntime.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxtrain import api, optim
from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
from onnxtrain.artifacts.ort_training import to_inplace_accumulation, to_standard_accumulation
from onnxtrain.graph import versions
from onnxtrain.sessions import inference_session
from tests.interop.test_ort_runtime import batches, mlp

TRAINABLE = ["W1", "b1", "W2", "b2"]


def _generate(folder: Path, target: str, optimizer=OptimType.AdamW, **kwargs) -> dict[str, Path]:
    return generate_artifacts(
        mlp(False), requires_grad=TRAINABLE, loss=LossType.MSELoss, optimizer=optimizer, artifact_directory=folder,
        target=target, **kwargs,
    )  # fmt: skip


def test_the_training_model_accumulates_with_ort_kernels_and_computes_in_standard_operators(tmp_path: Path) -> None:
    paths = _generate(tmp_path, "onnxruntime-training")
    training = onnx.load(paths["training_model"])
    inputs = [i.name for i in training.graph.input]
    assert inputs == ["x", "target", *TRAINABLE, *(f"{p}_grad.accumulation.buffer" for p in TRAINABLE),
                      "lazy_reset_grad"]  # fmt: skip
    outputs = training.graph.output
    assert [o.name for o in outputs][1:] == [f"{p}_grad.accumulation.out" for p in TRAINABLE]
    assert all(o.type.tensor_type.elem_type == onnx.TensorProto.BOOL for o in outputs[1:])
    accumulators = [n for n in training.graph.node if n.domain == "com.microsoft"]
    assert {n.op_type for n in accumulators} == {"InPlaceAccumulatorV2"} and len(accumulators) == 4
    for node, param in zip(accumulators, TRAINABLE, strict=True):
        assert list(node.input) == [f"{param}_grad.accumulation.buffer", f"{param}_grad", "lazy_reset_grad"]
    for model in (training, onnx.load(paths["eval_model"]), onnx.load(paths["optimizer_model"])):
        assert model.ir_version <= 10 and versions.opset_version(model, "") <= 21
    (adamw,) = onnx.load(paths["optimizer_model"]).graph.node
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in adamw.attribute}
    assert adamw.op_type == "AdamWOptimizer" and attributes["adam_mode"] == 0  # torch's math, as OptimType.AdamW


@pytest.mark.parametrize("optimizer", [OptimType.AdamW, OptimType.SGD])
def test_onnxtrain_trains_them_as_its_own_artifacts(tmp_path: Path, optimizer: OptimType) -> None:
    """The same ten steps from the ORT-target artifacts and the default ones: the same losses and parameters."""
    results = []
    for target in ("onnxruntime", "onnxruntime-training"):
        paths = _generate(tmp_path / target, target, optimizer)
        state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
        module = api.Module(paths["training_model"], state, paths["eval_model"])
        opt = api.Optimizer(paths["optimizer_model"], module)
        opt.set_learning_rate(0.05)
        losses = []
        for x, target_values in batches(LossType.MSELoss, seed=1):
            losses.append(float(module(x, target_values)))
            opt.step()
            module.lazy_reset_grad()
        results.append((losses, {p: state.parameters[p].data.copy() for p in TRAINABLE}))
    (ours, our_params), (theirs, their_params) = results
    # AdamW's hyper-parameters travel as float32 attributes (ONNX Runtime's kernel reads them so): 1 - beta1
    # differs from the float64 one in the 7th digit
    np.testing.assert_allclose(theirs, ours, rtol=1e-5)
    start = api.CheckpointState.load_checkpoint(tmp_path / "onnxruntime" / "checkpoint")
    for name in TRAINABLE:
        np.testing.assert_allclose(their_params[name], our_params[name], rtol=1e-5, atol=1e-6)
        assert not np.allclose(their_params[name], start.parameters[name].data)


def test_an_optimizer_ort_lacks_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"AdamW \(without amsgrad\) and SGD \(without momentum or weight decay\)"):
        _generate(tmp_path / "out", "onnxruntime-training", optim.SGD(momentum=0.9))
    assert not (tmp_path / "out").exists()


def test_ort_format_says_why_stock_onnxruntime_cannot_convert(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"InPlaceAccumulatorV2.*training build's own converter"):
        _generate(tmp_path / "out", "onnxruntime-training", ort_format=True)
    assert not (tmp_path / "out").exists()


def test_a_base_model_newer_than_ort_loads_is_refused(tmp_path: Path) -> None:
    model = mlp(False)
    model.opset_import[0].version = 22
    with pytest.raises(ValueError, match=r"at most IR 10 and opset 21"):
        generate_artifacts(model, requires_grad=TRAINABLE, loss=LossType.MSELoss, artifact_directory=tmp_path / "o",
                           target="onnxruntime-training")  # fmt: skip


def test_standard_accumulation_undoes_the_inplace_one(tmp_path: Path) -> None:
    paths = _generate(tmp_path, "onnxruntime")
    ours = onnx.load(paths["training_model"])
    translated = to_standard_accumulation(to_inplace_accumulation(ours, TRAINABLE))
    assert not any(n.domain == "com.microsoft" for n in translated.graph.node)
    assert to_standard_accumulation(ours) is ours  # nothing to translate
    rng = np.random.default_rng(2)
    x, target = batches(LossType.MSELoss, seed=2)[0]
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    feeds = {"x": x, "target": target, **{p: state.parameters[p].data for p in TRAINABLE}}
    feeds |= {f"{p}_grad.accumulation.buffer": rng.normal(size=feeds[p].shape).astype(np.float32) for p in TRAINABLE}
    feeds["lazy_reset_grad"] = np.array([False])
    expected = inference_session(ours.SerializeToString()).run(None, feeds)
    actual = inference_session(translated.SerializeToString()).run(None, feeds)
    for a, e in zip(actual, expected, strict=True):
        np.testing.assert_array_equal(a, e)
