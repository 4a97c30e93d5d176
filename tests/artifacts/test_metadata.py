"""The loss and the forward model's outputs recorded in the training and eval models, and read back."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from onnxtrain import artifacts, checkpoint, losses
from onnxtrain.artifacts.metadata import (
    LOSS_INPUTS_KEY,
    LOSS_KEY,
    MODEL_OUTPUTS_KEY,
    TRAINING_KEYS,
    inference_outputs,
    loss_description,
    loss_inputs,
    read_metadata,
    set_metadata,
)
from tests.artifacts.models import FROZEN, REQUIRES_GRAD, dense


def _generate(folder: Path, **options: object) -> dict[str, onnx.ModelProto]:
    paths = artifacts.generate_artifacts(
        dense(), requires_grad=REQUIRES_GRAD, frozen_params=FROZEN, artifact_directory=folder, **options
    )
    return {name: onnx.load(paths[name]) for name in ("training_model", "eval_model")}


@pytest.mark.parametrize(
    ("loss", "recorded"),
    [(artifacts.LossType.MSELoss, "MSELoss"), ("BCELoss", "BCELoss"), (losses.L1Loss(), "L1Loss")],
)
def test_both_models_record_the_loss_and_the_outputs(tmp_path: Path, loss: object, recorded: str):
    for model in _generate(tmp_path, loss=loss).values():
        assert loss_description(model) == recorded
        assert loss_inputs(model) == ["y"]
        assert json.loads(read_metadata(model)[MODEL_OUTPUTS_KEY]) == ["y"]


def test_the_default_inference_outputs_leave_out_the_loss(tmp_path: Path):
    assert inference_outputs(_generate(tmp_path, loss="MSELoss")["eval_model"]) == ["y"]


def test_with_the_loss_in_the_model_the_other_outputs_are_exported(tmp_path: Path):
    base = dense()
    extra = onnx.helper.make_tensor_value_info("h", onnx.TensorProto.FLOAT, ["batch", 4])
    base.graph.output.insert(0, onnx.helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, []))
    base.graph.node.append(onnx.helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0))
    base.graph.output.append(extra)
    artifacts.generate_artifacts(base, requires_grad=REQUIRES_GRAD, loss=None, artifact_directory=tmp_path)
    eval_model = onnx.load(tmp_path / "eval_model.onnx")
    assert loss_description(eval_model) == "none"
    assert loss_inputs(eval_model) == ["loss", "y", "h"]
    assert inference_outputs(eval_model) == ["y", "h"]


def test_a_loss_blocks_other_outputs_are_left_out_and_the_additional_outputs_kept(tmp_path: Path):
    """A loss block returning ``(loss, metric, probabilities)``: the metric reads the labels, so exporting it made
    the inference model take them. The eval model's additional outputs (values of the forward model) stay."""
    import onnxtrain.onnxblock as onnxblock

    class LossAndExtras(onnxblock.Block):
        def __init__(self) -> None:
            super().__init__()
            self._loss = onnxblock.loss.MSELoss()

        def build(self, output: str) -> tuple[str, str, str]:
            loss = self._loss(output, target_name="target")
            return loss, onnxblock.blocks.Identity()(loss), onnxblock.blocks.Sigmoid()(output)

    artifacts.generate_artifacts(
        dense(), requires_grad=REQUIRES_GRAD, loss=LossAndExtras(), additional_output_names=["h"],
        artifact_directory=tmp_path,
    )  # fmt: skip
    eval_model = onnx.load(tmp_path / "eval_model.onnx")
    assert len(eval_model.graph.output) == 4 and "target" in [value.name for value in eval_model.graph.input]
    assert inference_outputs(eval_model) == ["y", "h"]
    state = checkpoint.load(tmp_path / "checkpoint")
    exported = artifacts.export_model_for_inferencing(eval_model, state, inference_outputs(eval_model))
    assert [value.name for value in exported.graph.input] == ["x"]
    extra = eval_model.graph.output[1].name  # explicitly named, a loss block's output still exports
    exported = artifacts.export_model_for_inferencing(eval_model, state, [extra])
    assert "target" in [value.name for value in exported.graph.input]


def test_models_without_the_metadata(tmp_path: Path):
    eval_model = _generate(tmp_path, loss="MSELoss")["eval_model"]
    del eval_model.metadata_props[:]
    assert loss_description(eval_model) is None and loss_inputs(eval_model) == []
    with pytest.raises(ValueError, match="outputs only the loss"):
        inference_outputs(eval_model)


def test_set_metadata_keeps_other_entries_and_damage_is_reported():
    model = onnx.ModelProto()
    set_metadata(model, {"a": "1", LOSS_KEY: "x"})
    set_metadata(model, {LOSS_KEY: "y", LOSS_INPUTS_KEY: "{"})
    assert read_metadata(model) == {"a": "1", LOSS_KEY: "y", LOSS_INPUTS_KEY: "{"}
    with pytest.raises(ValueError, match="not a JSON list of names"):
        loss_inputs(model)


def test_exported_models_drop_the_training_entries(tmp_path: Path):
    eval_model = _generate(tmp_path, loss="MSELoss")["eval_model"]
    set_metadata(eval_model, {"author": "me"})
    state = checkpoint.load(tmp_path / "checkpoint")
    exported = artifacts.export_model_for_inferencing(eval_model, state, ["y"])
    assert read_metadata(exported) == {"author": "me"}
    assert not set(read_metadata(exported)) & set(TRAINING_KEYS)


def test_every_output_of_the_loss_block_is_kept_after_the_loss_as_onnx_runtime_keeps_them(tmp_path: Path):
    """A loss block returning ``(loss, scores)`` kept only the loss; ``loss=None`` over a model whose outputs are
    ``[loss, y, h]`` kept only ``loss``. ONNX Runtime's artifacts output every one, the loss first."""
    import onnxtrain.onnxblock as onnxblock
    from onnxtrain import api

    class LossAndScores(onnxblock.Block):
        def __init__(self) -> None:
            super().__init__()
            self._loss = onnxblock.loss.MSELoss()

        def build(self, output: str) -> tuple[str, str]:
            return self._loss(output), onnxblock.blocks.Sigmoid()(output)

    paths = artifacts.generate_artifacts(
        dense(), requires_grad=REQUIRES_GRAD, loss=LossAndScores(), artifact_directory=tmp_path / "block"
    )
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state, paths["eval_model"])
    assert len(module.output_names()) == 2 and "sigmoid" in module.output_names()[1].lower()
    module.eval()
    assert len(module.output_names()) == 2
    base = dense()
    base.graph.output.insert(0, onnx.helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, []))
    base.graph.node.append(onnx.helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0))
    paths = artifacts.generate_artifacts(base, requires_grad=REQUIRES_GRAD, loss=None, artifact_directory=tmp_path)
    module = api.Module(paths["training_model"], api.CheckpointState.load_checkpoint(paths["checkpoint"]))
    assert module.output_names() == ["loss", "y"]
