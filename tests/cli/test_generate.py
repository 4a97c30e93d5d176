"""``onnxtrain generate``: artifacts from a model, the options mapped onto the library, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxtrain import checkpoint
from onnxtrain.artifacts import TARGETS
from onnxtrain.artifacts.generate import OPTIMIZER_KEY
from onnxtrain.artifacts.metadata import LOSS_KEY, MODEL_OUTPUTS_KEY, read_metadata
from onnxtrain.cli import generate
from onnxtrain.loop import LEARNING_RATE_PROPERTY
from tests.cli.helpers import assert_error, cli, corrupt
from tests.folders import visible_names

ARTIFACTS = {"training_model.onnx", "eval_model.onnx", "optimizer_model.onnx", "checkpoint"}


def _generate(capsys: pytest.CaptureFixture[str], model: Path, out: Path, *options: str) -> tuple[int, str, str]:
    return cli(capsys, "generate", model, "--requires-grad", "all-float", "--loss", "ce", "-o", out, *options)


def test_writes_the_artifacts_and_lists_them(capsys, model_path: Path, tmp_path: Path):
    status, out, err = _generate(capsys, model_path, tmp_path / "art")
    assert (status, err) == (0, "")
    assert set(visible_names(tmp_path / "art")) == ARTIFACTS
    assert str((tmp_path / "art").resolve()) in out
    assert all(name in out for name in ARTIFACTS)
    training = onnx.load(tmp_path / "art" / "training_model.onnx")
    assert read_metadata(training)[LOSS_KEY] == "CrossEntropyLoss"
    outputs = [o.name for o in onnx.load(model_path).graph.output]
    assert json.loads(read_metadata(training)[MODEL_OUTPUTS_KEY]) == outputs
    assert LEARNING_RATE_PROPERTY not in checkpoint.load(tmp_path / "art" / "checkpoint").properties


def test_all_float_selects_every_float_initializer(capsys, model_path: Path, tmp_path: Path):
    floats = [t.name for t in onnx.load(model_path).graph.initializer]
    assert _generate(capsys, model_path, tmp_path / "art")[0] == 0
    state = checkpoint.load(tmp_path / "art" / "checkpoint")
    assert sorted(state.trainable) == sorted(floats) and not state.frozen


def test_frozen_parameters_stay_out_of_all_float(capsys, model_path: Path, tmp_path: Path):
    first = onnx.load(model_path).graph.initializer[0].name
    assert _generate(capsys, model_path, tmp_path / "art", "--frozen", first)[0] == 0
    state = checkpoint.load(tmp_path / "art" / "checkpoint")
    assert list(state.frozen) == [first] and first not in state.trainable


def test_the_learning_rate_is_stored_in_the_checkpoint(capsys, model_path: Path, tmp_path: Path):
    assert _generate(capsys, model_path, tmp_path / "art", "--lr", "0.25")[0] == 0
    properties = checkpoint.load(tmp_path / "art" / "checkpoint").properties
    assert properties[LEARNING_RATE_PROPERTY] == pytest.approx(0.25)


def test_optimizer_options_build_the_library_optimizer(capsys, model_path: Path, tmp_path: Path):
    options = ["--optimizer", "sgd", "--momentum", "0.9", "--weight-decay", "0.01", "--max-grad-norm", "1.5"]
    assert _generate(capsys, model_path, tmp_path / "art", *options)[0] == 0
    description = read_metadata(onnx.load(tmp_path / "art" / "optimizer_model.onnx"))[OPTIMIZER_KEY]
    assert description.startswith("SGD(momentum=0.9,") and "weight_decay=0.01" in description
    assert "ClipGradNorm(max_norm=1.5)" in description


@pytest.mark.parametrize("loss", [name for name, kind in generate.LOSSES.items() if kind in ("MSELoss", "L1Loss")])
def test_regression_losses_take_a_float_target(capsys, model_path: Path, tmp_path: Path, loss: str):
    status, _, err = cli(capsys, "generate", model_path, "--requires-grad", "all-float", "--loss", loss, "-o", tmp_path)
    assert (status, err) == (0, "")


def test_the_prefix_and_the_loss_inputs(capsys, model_path: Path, tmp_path: Path):
    output = onnx.load(model_path).graph.output[0].name
    status, _, _ = _generate(capsys, model_path, tmp_path, "--prefix", "p_", "--loss-inputs", output)
    assert status == 0 and (tmp_path / "p_training_model.onnx").is_file()


def test_the_targets_are_the_librarys():
    assert generate.TARGETS == TARGETS


def test_the_onnxruntime_training_target_writes_onnx_runtimes_kernels(capsys, model_path: Path, tmp_path: Path):
    status, _, err = _generate(capsys, model_path, tmp_path / "art", "--target", "onnxruntime-training")
    assert (status, err) == (0, "")
    training = onnx.load(tmp_path / "art" / "training_model.onnx")
    assert {n.op_type for n in training.graph.node if n.domain == "com.microsoft"} == {"InPlaceAccumulatorV2"}


def test_an_optimizer_onnx_runtime_lacks_is_one_error_line(capsys, model_path: Path, tmp_path: Path):
    status, out, err = _generate(
        capsys, model_path, tmp_path / "art", "--target", "onnxruntime-training", "--optimizer", "sgd",
        "--momentum", "0.9",
    )  # fmt: skip
    assert status == 1 and out == ""
    assert_error(err, "generate", "SGD(momentum=0.9", "AdamW (without amsgrad)")
    assert not (tmp_path / "art").exists()


def test_an_unknown_loss_is_a_usage_error(capsys, model_path: Path, tmp_path: Path):
    status, _, err = cli(capsys, "generate", model_path, "--requires-grad", "a", "--loss", "hinge", "-o", tmp_path)
    assert status == 2
    assert_error(err, "generate", "--loss", "'hinge'")


def test_momentum_for_adam_is_a_usage_error(capsys, model_path: Path, tmp_path: Path):
    status, _, err = _generate(capsys, model_path, tmp_path / "art", "--optimizer", "adam", "--momentum", "0.9")
    assert status == 2
    assert_error(err, "generate", "--momentum", "adam")


@pytest.mark.parametrize("option", [["--lr", "-1"], ["--weight-decay", "nan"], ["--max-grad-norm", "0"]])
def test_bad_numbers_are_usage_errors(capsys, model_path: Path, tmp_path: Path, option: list[str]):
    status, _, err = _generate(capsys, model_path, tmp_path / "art", *option)
    assert status == 2
    assert_error(err, "generate", option[0])


def test_a_missing_model(capsys, tmp_path: Path):
    status, _, err = _generate(capsys, tmp_path / "nowhere.onnx", tmp_path / "art")
    assert status == 1
    assert_error(err, "generate", "nowhere.onnx")


def test_a_corrupt_model(capsys, tmp_path: Path):
    model = corrupt(tmp_path / "random.onnx")
    status, _, err = _generate(capsys, model, tmp_path / "art")
    assert status == 1
    assert_error(err, "generate", "random.onnx", "not a readable ONNX model")


def test_an_unknown_parameter_name(capsys, model_path: Path, tmp_path: Path):
    status, _, err = cli(capsys, "generate", model_path, "--requires-grad", "w9", "--loss", "ce", "-o", tmp_path / "a")
    assert status == 1
    assert_error(err, "generate", "w9")


def test_a_model_without_float_initializers(capsys, tmp_path: Path):
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 2])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 2])],
        [onnx.numpy_helper.from_array(np.array([1, 2], np.int64), "shape")],
    )  # fmt: skip
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    status, _, err = _generate(capsys, tmp_path / "m.onnx", tmp_path / "art")
    assert status == 1
    assert_error(err, "generate", "no floating-point initializers")
