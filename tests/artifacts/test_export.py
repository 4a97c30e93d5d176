"""export_model_for_inferencing: the eval model with the current parameter values baked in."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxtrain import artifacts, checkpoint
from onnxtrain.checkpoint import CheckpointState
from tests.artifacts.models import (
    CONSTANT,
    FLOAT,
    FROZEN,
    REQUIRES_GRAD,
    batchnorm,
    dense,
    dense_values,
    load,
    names,
    run,
    session,
    signature,
)


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> dict[str, Path]:
    """CrossEntropyLoss artifacts of ``dense`` that also output ``y`` and the intermediate ``h``."""
    return artifacts.generate_artifacts(
        dense(), REQUIRES_GRAD, FROZEN, loss="CrossEntropyLoss", additional_output_names=["y", "h"],
        artifact_directory=tmp_path_factory.mktemp("export"),
    )  # fmt: skip


def _trained_values(seed: int = 1) -> dict[str, np.ndarray]:
    """Parameter values unlike the base model's: what a few steps of training would give."""
    rng = np.random.default_rng(seed)
    return {k: (v + rng.normal(size=v.shape)).astype(np.float32) for k, v in dense_values().items() if k != CONSTANT}


def _state(values: dict[str, np.ndarray]) -> CheckpointState:
    return CheckpointState(trainable={k: values[k] for k in ("W", "B")}, frozen={"S": values["S"]})


@pytest.mark.parametrize("as_state", [True, False], ids=["state", "dict"])
@pytest.mark.parametrize("outputs", [["y"], ["h", "y"]])
def test_outputs_equal_the_eval_models(generated, as_state: bool, outputs: list[str]):
    eval_model = load(generated["eval_model"])
    before = eval_model.SerializeToString()
    values = _trained_values()
    exported = artifacts.export_model_for_inferencing(eval_model, _state(values) if as_state else values, outputs)
    assert eval_model.SerializeToString() == before  # not changed

    assert signature(exported.graph.input) == [("x", FLOAT, ("batch", 3))]  # no labels, no parameters
    assert names(exported.graph.output) == outputs
    assert sorted(t.name for t in exported.graph.initializer) == ["B", "C", "S", "W"]
    assert not any(node.op_type in ("LogSoftmax", "NegativeLogLikelihoodLoss") for node in exported.graph.node)
    onnx.checker.check_model(exported, full_check=True)

    x = np.random.default_rng(2).normal(size=(7, 3)).astype(np.float32)
    labels = np.zeros(7, np.int64)
    expected = run(session(eval_model), {"x": x, "labels": labels, **values})
    got = run(session(exported), {"x": x})
    for name in outputs:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-6)
    base = run(session(dense()), {"x": x})["y"]
    assert not np.allclose(got["y"], base)  # the new values, not the base model's


def test_the_loss_can_be_exported_with_its_labels(generated):
    eval_model = load(generated["eval_model"])
    loss_name = names(eval_model.graph.output)[0]
    values = _trained_values()
    exported = artifacts.export_model_for_inferencing(eval_model, values, [loss_name])
    assert names(exported.graph.input) == ["x", "labels"]
    x, labels = np.ones((2, 3), np.float32), np.array([0, 3], np.int64)
    expected = run(session(eval_model), {"x": x, "labels": labels, **values})[loss_name]
    np.testing.assert_allclose(run(session(exported), {"x": x, "labels": labels})[loss_name], expected, rtol=1e-6)


def test_from_a_saved_checkpoint(generated, tmp_path: Path):
    values = _trained_values(seed=3)
    checkpoint.save(_state(values), tmp_path / "trained")
    exported = artifacts.export_model_for_inferencing(
        load(generated["eval_model"]), checkpoint.load(tmp_path / "trained"), ["y"]
    )
    x = np.ones((1, 3), np.float32)
    h = (x @ values["W"]) * values["S"] + values["B"] + dense_values()["C"]
    np.testing.assert_allclose(run(session(exported), {"x": x})["y"], 1 / (1 + np.exp(-h)), rtol=1e-6)


def test_the_state_and_the_eval_model_are_taken_in_any_form_a_user_holds(generated, tmp_path: Path):
    """A checkpoint's path, the runtime's state (``api.CheckpointState``) or its ``parameters``, and the eval
    model's path: the same export as from the checkpoint and the loaded model."""
    from onnxtrain import api

    values = _trained_values(seed=5)
    checkpoint.save(_state(values), tmp_path / "trained")
    expected = artifacts.export_model_for_inferencing(load(generated["eval_model"]), _state(values), ["y"])
    runtime = api.CheckpointState.load_checkpoint(tmp_path / "trained")
    for state in (tmp_path / "trained", str(tmp_path / "trained"), runtime, dict(runtime.parameters)):
        exported = artifacts.export_model_for_inferencing(generated["eval_model"], state, ["y"])
        assert exported.SerializeToString() == expected.SerializeToString()
    with pytest.raises(TypeError, match=r"parameters must be a checkpoint .* not list"):
        artifacts.export_model_for_inferencing(generated["eval_model"], list(values.items()), ["y"])
    with pytest.raises(TypeError, match=r"eval_model must be an onnx\.ModelProto or the eval model's path, not int"):
        artifacts.export_model_for_inferencing(3, values, ["y"])  # type: ignore[arg-type]


def test_batchnorm_is_exported_in_inference_mode_with_the_running_statistics(tmp_path: Path):
    paths = artifacts.generate_artifacts(
        batchnorm(), ["scale", "bias"], ["mean", "var"], loss="MSELoss", additional_output_names=["y"],
        artifact_directory=tmp_path,
    )  # fmt: skip
    values = {t.name: onnx.numpy_helper.to_array(t) for t in batchnorm().graph.initializer}
    values["mean"] = values["mean"] + 1.0  # as the running statistics after training
    exported = artifacts.export_model_for_inferencing(load(paths["eval_model"]), values, ["y"])
    assert names(exported.graph.input) == ["x"]
    x = np.random.default_rng(4).normal(size=(1, 2, 3)).astype(np.float32)
    c = (slice(None), None)
    expected = (x - values["mean"][c]) / np.sqrt(values["var"][c] + 1e-5) * values["scale"][c] + values["bias"][c]
    np.testing.assert_allclose(run(session(exported), {"x": x})["y"], expected, rtol=1e-5, atol=1e-6)


def test_unknown_output_names(generated):
    eval_model = load(generated["eval_model"])
    with pytest.raises(ValueError, match=r"computes no 'nope'; its outputs are 'y', 'h': name those") as error:
        artifacts.export_model_for_inferencing(eval_model, _trained_values(), ["y", "nope"])
    assert names(eval_model.graph.output)[0] not in str(error.value)  # the loss is no output to export
    for bad in ([], "y"):
        with pytest.raises(ValueError, match="output_names"):
            artifacts.export_model_for_inferencing(load(generated["eval_model"]), _trained_values(), bad)


def test_a_nominal_state_has_no_values_to_export(generated):
    with pytest.raises(ValueError, match="nominal"):
        artifacts.export_model_for_inferencing(
            load(generated["eval_model"]), _state(_trained_values()).nominal(), ["y"]
        )


def test_values_of_another_type_or_shape(generated):
    values = _trained_values()
    with pytest.raises(TypeError, match=r"'W' is float64.*float\[3,4\].*float32"):
        doubled = values | {"W": values["W"].astype(np.float64)}
        artifacts.export_model_for_inferencing(load(generated["eval_model"]), doubled, ["y"])
    with pytest.raises(ValueError, match=r"'B' has shape \[3\].*float\[4\]"):
        artifacts.export_model_for_inferencing(load(generated["eval_model"]), values | {"B": values["B"][:3]}, ["y"])


def test_the_exported_model_keeps_the_lowest_ir_version(generated):
    exported = artifacts.export_model_for_inferencing(load(generated["eval_model"]), _trained_values(), ["y"])
    assert exported.ir_version == helper.find_min_ir_version_for(list(exported.opset_import)) == 8
