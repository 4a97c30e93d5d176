"""``onnxtrain export``: the inference model of a trained directory, checked, written atomically."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxtrain.artifacts.metadata import TRAINING_KEYS, read_metadata
from tests.cli.helpers import assert_error, classification, cli, corrupt


def _accuracy(model: Path) -> float:
    x, y = classification(samples=400, seed=5)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return float(np.mean(session.run(None, {"x": x})[0].argmax(axis=1) == y))


@pytest.fixture
def trained(capsys, artifacts: Path, data_path: Path) -> Path:
    assert cli(capsys, "train", artifacts, "--data", data_path, "--epochs", "30", "--batch-size", "16")[0] == 0
    return artifacts


def test_the_trained_model_predicts_better_than_the_untrained_one(capsys, trained: Path, tmp_path: Path):
    status, out, err = cli(capsys, "export", trained, "-o", tmp_path / "model.onnx")
    assert (status, err) == (0, "")
    assert "trained_checkpoint" in out and "x: float32[batch, 4]" in out
    status, _, _ = cli(capsys, "export", trained, "-o", tmp_path / "untrained.onnx", "--checkpoint",
                       trained / "checkpoint")  # fmt: skip
    assert status == 0
    assert _accuracy(tmp_path / "model.onnx") > max(0.8, _accuracy(tmp_path / "untrained.onnx") + 0.2)
    model = onnx.load(tmp_path / "model.onnx")
    assert [i.name for i in model.graph.input] == ["x"]  # the labels are gone with the loss
    assert not set(read_metadata(model)) & set(TRAINING_KEYS)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_untrained_directories_export_the_initial_checkpoint(capsys, artifacts: Path, tmp_path: Path):
    status, out, _ = cli(capsys, "export", artifacts, "-o", tmp_path / "model.onnx")
    assert status == 0 and f"{artifacts / 'checkpoint'}" in out


def test_named_outputs(capsys, trained: Path, tmp_path: Path):
    hidden = next(n.output[0] for n in onnx.load(trained / "eval_model.onnx").graph.node if n.op_type == "Relu")
    assert cli(capsys, "export", trained, "-o", tmp_path / "m.onnx", "--outputs", hidden)[0] == 0
    assert [o.name for o in onnx.load(tmp_path / "m.onnx").graph.output] == [hidden]


def test_an_unknown_output_leaves_the_earlier_file(capsys, trained: Path, tmp_path: Path):
    (tmp_path / "m.onnx").write_bytes(b"earlier")
    status, _, err = cli(capsys, "export", trained, "-o", tmp_path / "m.onnx", "--outputs", "nothing")
    assert status == 1
    assert_error(err, "export", "nothing")
    assert (tmp_path / "m.onnx").read_bytes() == b"earlier"


def test_an_unknown_output_lists_the_models_outputs(capsys, artifacts: Path, model_path: Path, tmp_path: Path):
    status, _, err = cli(capsys, "export", artifacts, "-o", tmp_path / "m.onnx", "--outputs", "output")
    assert status == 1
    assert_error(err, "export", "'output'", onnx.load(model_path).graph.output[0].name, "--outputs")
    loss = onnx.load(artifacts / "eval_model.onnx").graph.output[0].name
    assert loss not in err  # an inference model has no loss to output


def test_a_missing_directory(capsys, tmp_path: Path):
    status, _, err = cli(capsys, "export", tmp_path / "nowhere", "-o", tmp_path / "m.onnx")
    assert status == 1
    assert_error(err, "export", "nowhere")


def test_a_missing_output_folder(capsys, trained: Path, tmp_path: Path):
    status, _, err = cli(capsys, "export", trained, "-o", tmp_path / "no" / "m.onnx")
    assert status == 1
    assert_error(err, "export", "does not exist")


def test_an_output_path_ending_in_a_separator_names_a_folder(capsys, trained: Path, tmp_path: Path):
    """``-o out/`` wrote a file named ``out``."""
    status, _, err = cli(capsys, "export", trained, "-o", f"{tmp_path / 'out'}/")
    assert status == 2 and "names a folder; give the path of the .onnx file to write" in err
    assert not (tmp_path / "out").exists()


def test_a_corrupt_checkpoint(capsys, trained: Path, tmp_path: Path):
    corrupt(trained / "trained_checkpoint")
    status, _, err = cli(capsys, "export", trained, "-o", tmp_path / "m.onnx")
    assert status == 1
    assert_error(err, "export", "trained_checkpoint")
    assert not (tmp_path / "m.onnx").exists()


def test_a_missing_checkpoint_is_told_what_the_directory_holds(capsys, trained: Path, tmp_path: Path):
    status, _, err = cli(capsys, "export", trained, "-o", tmp_path / "m.onnx", "--checkpoint", tmp_path / "nope")
    assert status == 1
    assert_error(err, "export", "--checkpoint", "no such file", "trained_checkpoint")
    assert not (tmp_path / "m.onnx").exists()


def test_a_corrupt_eval_model(capsys, artifacts: Path, tmp_path: Path):
    corrupt(artifacts / "eval_model.onnx")
    status, _, err = cli(capsys, "export", artifacts, "-o", tmp_path / "m.onnx")
    assert status == 1
    assert_error(err, "export", "eval_model.onnx")


def test_the_output_is_required(capsys, artifacts: Path):
    status, _, err = cli(capsys, "export", artifacts)
    assert status == 2
    assert_error(err, "export", "-o/--out")


def test_the_model_is_written_with_default_permissions(capsys, artifacts: Path, tmp_path: Path):
    """Written through a temporary file and a rename, the model is as readable as a plain write makes it."""
    import os

    umask = os.umask(0o022)
    os.umask(umask)
    assert cli(capsys, "export", artifacts, "-o", tmp_path / "model.onnx")[0] == 0
    assert (tmp_path / "model.onnx").stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_custom_loss_blocks_other_outputs_are_left_out_by_default(capsys, model_path: Path, tmp_path: Path):
    """A loss file's block returning ``(loss, metric)``: export (and inspect's listing) kept the metric, so the
    inference model took the labels as an input. ``--outputs`` still exports it where asked."""
    (tmp_path / "metric_loss.py").write_text(
        "import onnxtrain.onnxblock as onnxblock\n\n\n"
        "class CEWithMetric(onnxblock.Block):\n"
        "    def build(self, scores):\n"
        "        loss = onnxblock.loss.CrossEntropyLoss()(scores, labels_name='labels')\n"
        "        return loss, onnxblock.blocks.Identity()(loss)\n"
    )
    argv = ["generate", model_path, "--requires-grad", "all-float", "-o", tmp_path / "art"]
    assert cli(capsys, *argv, "--loss", f"{tmp_path / 'metric_loss.py'}:CEWithMetric")[0] == 0
    scores = onnx.load(model_path).graph.output[0].name
    metric = onnx.load(tmp_path / "art" / "eval_model.onnx").graph.output[1].name
    status, out, _ = cli(capsys, "inspect", tmp_path / "art")
    assert status == 0 and f"export: outputs {scores} by default" in out
    assert cli(capsys, "export", tmp_path / "art", "-o", tmp_path / "m.onnx")[0] == 0
    model = onnx.load(tmp_path / "m.onnx")
    assert ([i.name for i in model.graph.input], [o.name for o in model.graph.output]) == (["x"], [scores])
    assert cli(capsys, "export", tmp_path / "art", "-o", tmp_path / "metric.onnx", "--outputs", metric)[0] == 0
    assert [i.name for i in onnx.load(tmp_path / "metric.onnx").graph.input] == ["x", "labels"]
