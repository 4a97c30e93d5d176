"""Base models of any opset ONNX Runtime accepts: converted up to the opset the rules need, imports merged."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

import onnxtrain.onnxblock as onnxblock
from onnxtrain import api, artifacts
from onnxtrain.graph import versions
from onnxtrain.graph.io import upgraded
from tests.helpers import FLOAT, MSETraining, make_model

RNG = np.random.default_rng(11)
WEIGHT, BIAS = RNG.normal(size=(4, 3)).astype(np.float32), RNG.normal(size=4).astype(np.float32)


def _mlp(opset: int, custom_domain: bool = True) -> onnx.ModelProto:
    """y = Relu(x @ W^T + B), with Gemm and an import of a custom-op domain as in ONNX Runtime's tests."""
    model = make_model(
        {"x": (FLOAT, ["batch", 3])},
        [helper.make_node("Gemm", ["x", "W", "B"], ["h"], transB=1), helper.make_node("Relu", ["h"], ["y"])],
        {"y": (FLOAT, ["batch", 4])},
        [("W", WEIGHT), ("B", BIAS)],
        opset=opset,
    )
    if custom_domain:
        model.opset_import.append(helper.make_opsetid("com.example.custom", 1))
    return model


def _train_step(paths: dict[str, Path], x: np.ndarray, target: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state, paths["eval_model"])
    loss = float(module(x, target))
    return loss, {name: parameter.grad for name, parameter in state.parameters}


def test_an_opset_7_model_trains_like_the_same_model_at_opset_13(tmp_path: Path):
    x, target = RNG.normal(size=(5, 3)).astype(np.float32), RNG.normal(size=(5, 4)).astype(np.float32)
    results = []
    for opset in (7, 13):
        paths = artifacts.generate_artifacts(_mlp(opset), ["W", "B"], loss="MSELoss", optimizer="AdamW",
                                             artifact_directory=tmp_path / str(opset))  # fmt: skip
        training = onnx.load(paths["training_model"])
        assert versions.opset_version(training, "") == 13
        assert versions.opset_version(training, "com.example.custom") == 1  # other domains kept
        results.append(_train_step(paths, x, target))
    (loss7, grads7), (loss13, grads13) = results
    assert loss7 == pytest.approx(loss13, rel=1e-6)
    assert sorted(grads7) == ["B", "W"]
    for name in grads7:
        np.testing.assert_allclose(grads7[name], grads13[name], rtol=1e-6, err_msg=name)


def test_an_import_appended_inside_the_with_block_is_merged(tmp_path: Path):
    """ONNX Runtime's users append a newer ai.onnx import to the model they build on; one import remains."""
    model = _mlp(7)
    model.opset_import.append(helper.make_opsetid("", 14))
    merged = upgraded(model)
    assert [(o.domain, o.version) for o in merged.opset_import] == [("", 14), ("com.example.custom", 1)]

    block = MSETraining()
    block.requires_grad("W")
    with onnxblock.base(_mlp(7)) as builder:
        builder.model.opset_import.append(helper.make_opsetid("", 14))
        block("y")
    training, _ = block.to_model_proto()
    assert [o.version for o in training.opset_import if o.domain in ("", "ai.onnx")] == [14]


def test_a_model_the_converter_cannot_convert_is_a_clear_error(tmp_path: Path):
    model = make_model({"x": (FLOAT, [2])}, [helper.make_node("NoSuchOp", ["x"], ["y"])], {"y": (FLOAT, [2])}, [],
                       opset=7)  # fmt: skip
    with pytest.raises(ValueError, match=r"opset 7, older than the gradient rules need \(13\).*version converter"):
        artifacts.generate_artifacts(model, None, artifact_directory=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _with_dropout(opset: int, **attributes: object) -> onnx.ModelProto:
    """:func:`_mlp` with a Dropout (and its mask, as torch's exporter writes it in training mode) after the Relu."""
    model = _mlp(opset, custom_domain=False)
    model.graph.node[-1].output[0] = "a"
    model.graph.node.append(helper.make_node("Dropout", ["a"], ["y", "mask"], name="/drop/Dropout", **attributes))
    return model


@pytest.mark.parametrize(("opset", "attributes", "warned"), [
    (11, {"ratio": 0.3}, True),
    (9, {}, True),  # ratio 0.5 by default
    (11, {"ratio": 0.0}, False),
    (12, {}, False),  # from opset 12 on Dropout takes a training flag: no conversion, and dropout drops
])  # fmt: skip
def test_dropout_before_opset_12_is_said_to_pass_its_input_through(
    tmp_path: Path, opset: int, attributes: dict, warned: bool
) -> None:
    model = _with_dropout(opset, **attributes)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        artifacts.generate_artifacts(model, ["W", "B"], loss="MSELoss", artifact_directory=tmp_path)
    said = [w for w in caught if issubclass(w.category, artifacts.OpsetConversionWarning)]
    assert len(said) == warned
    if warned:
        message = str(said[0].message)
        assert f"opset {opset} is converted to 13" in message and "'/drop/Dropout'" in message
        assert said[0].filename == __file__  # attributed to the caller's line


@pytest.mark.parametrize("batch", ["N", 5])
def test_a_conversion_that_needs_numbers_for_symbolic_dimensions_says_so(tmp_path: Path, batch: str | int) -> None:
    """Opset 6's Gemm with ``broadcast=1`` (IR 3, its initializers listed as inputs, as in the oldest model-zoo
    models): onnx's converter needs the batch as a number; given one, the model trains."""
    model = make_model(
        {"x": (FLOAT, [batch, 3]), "W": (FLOAT, [4, 3]), "B": (FLOAT, [4])},
        [helper.make_node("Gemm", ["x", "W", "B"], ["y"], transB=1, broadcast=1)],
        {"y": (FLOAT, [batch, 4])},
        [("W", WEIGHT), ("B", BIAS)],
        opset=6,
        ir_version=3,
    )
    if isinstance(batch, str):
        with pytest.raises(ValueError, match=r"opset 6.*'x' has one.*update_inputs_outputs_dims"):
            artifacts.generate_artifacts(model, ["W", "B"], loss="MSELoss", artifact_directory=tmp_path)
        return
    paths = artifacts.generate_artifacts(model, ["W", "B"], loss="MSELoss", artifact_directory=tmp_path)
    x, target = RNG.normal(size=(5, 3)).astype(np.float32), RNG.normal(size=(5, 4)).astype(np.float32)
    loss, grads = _train_step(paths, x, target)
    residual = x @ WEIGHT.T + BIAS - target
    assert loss == pytest.approx(float(np.mean(residual**2)), rel=1e-5)
    np.testing.assert_allclose(grads["B"], 2 * residual.sum(axis=0) / residual.size, rtol=1e-5, atol=1e-6)
