"""Bad input: an error naming the problem before anything is written; failed writes leave no partial set."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import onnxtrain.artifacts.generate as generate_module
from onnxtrain import artifacts, blocks, checkpoint, optim
from tests.artifacts.models import FROZEN, REQUIRES_GRAD, dense
from tests.folders import leftovers, visible_files


class ReturnsNothing(blocks.Block):
    """A loss block whose build forgets to return the loss."""

    def build(self, output_name: str) -> None:
        blocks.ReduceMean(keepdims=False)(output_name)


class TargetsOnly(blocks.Block):
    """A loss block wired to its target alone (``Sub()(t, t)`` where ``Sub()(y, t)`` was meant)."""

    def build(self, output_name: str) -> str:
        target = blocks.InputLike(output_name)("target")
        difference = blocks.Sub()(target, target)
        return blocks.ReduceMean(keepdims=False)(blocks.Mul()(difference, difference))


def _with_integer_initializer() -> onnx.ModelProto:
    model = dense()
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.arange(3), "steps"))
    return model


#: (id, generate_artifacts arguments besides the model and directory, exception, message fragments)
CASES: list[tuple[str, dict[str, Any], type[Exception], tuple[str, ...]]] = [
    ("unknown requires_grad", {"requires_grad": ["W", "nope"]}, ValueError,
     ("requires_grad", "'nope'", "'W', 'S', 'B', 'C'")),
    ("misspelt requires_grad", {"requires_grad": ["WW"]}, ValueError,
     ("requires_grad", "'WW'", "did you mean 'W'", "trainable_parameters(model)")),
    ("unknown frozen_params", {"requires_grad": ["W"], "frozen_params": ["gone"]}, ValueError,
     ("frozen_params", "'gone'", "'W', 'S', 'B', 'C'")),
    ("a graph input is no parameter", {"requires_grad": ["x"]}, ValueError, ("'x'", "initializers")),
    ("overlap", {"requires_grad": ["W", "B"], "frozen_params": ["S", "B"]}, ValueError,
     ("['B']", "requires_grad", "frozen_params")),
    ("requires_grad as one string", {"requires_grad": "W"}, TypeError, ("requires_grad", "list")),
    ("loss returns nothing", {"requires_grad": ["W"], "loss": ReturnsNothing()}, ValueError,
     ("ReturnsNothing", "returned None", "build()")),
    ("unknown LossType string", {"requires_grad": ["W"], "loss": "MSE"}, ValueError,
     ("'MSE'", "LossType", "MSELoss", "CrossEntropyLoss", "KLDivLoss")),
    ("loss of another type", {"requires_grad": ["W"], "loss": 3}, ValueError, ("loss=3", "LossType")),
    ("a loss that reads no parameter", {"requires_grad": ["W", "B"], "loss": TargetsOnly()}, ValueError,
     ("depends on none of the 2 values to train ('W', 'B')", "reads the inputs ['target']", "wiring")),
    ("unknown OptimType string", {"requires_grad": ["W"], "loss": "MSELoss", "optimizer": "adamw"}, ValueError,
     ("'adamw'", "OptimType", "AdamW", "SGD", "RMSprop")),
    ("a block that is no optimizer", {"requires_grad": ["W"], "loss": "MSELoss", "optimizer": blocks.Add()},
     TypeError, ("optimizer", "Add")),
    ("unknown loss_input_names", {"requires_grad": ["W"], "loss": "MSELoss", "loss_input_names": ["logits"]},
     ValueError, ("loss_input_names", "'logits'", "['y']")),
    ("an intermediate value as a loss input", {"requires_grad": ["W"], "loss": "MSELoss", "loss_input_names": ["h"]},
     ValueError, ("loss_input_names", "'h'")),
    ("unknown additional_output_names",
     {"requires_grad": ["W"], "loss": "MSELoss", "additional_output_names": ["y", "probs"]}, ValueError,
     ("additional_output_names", "'probs'")),
    ("an optimizer without trainable parameters", {"frozen_params": ["W"], "loss": "MSELoss", "optimizer": "SGD"},
     ValueError, ("optimizer", "trainable", "requires_grad")),
    ("an optimizer object without trainable parameters", {"loss": "MSELoss", "optimizer": optim.AdamW()},
     ValueError, ("optimizer", "trainable")),
    ("prefix with a separator", {"requires_grad": ["W"], "loss": "MSELoss", "prefix": f"sub{os.sep}run"},
     ValueError, ("prefix", "separator")),
    ("prefix that is no string", {"requires_grad": ["W"], "loss": "MSELoss", "prefix": None}, ValueError,
     ("prefix",)),
    ("unknown target", {"requires_grad": ["W"], "loss": "MSELoss", "target": "tensorrt"}, ValueError,
     ("'tensorrt'", "onnxruntime", "onnxruntime-training")),
    ("a non-scalar loss", {"requires_grad": ["W"], "loss": None}, ValueError, ("'y'", "scalar")),
    ("an integer parameter", {"requires_grad": ["steps"], "loss": "MSELoss"}, ValueError, ("'steps'", "int64")),
    ("a custom op library that does not load",
     {"requires_grad": ["W"], "loss": "MSELoss", "custom_op_library": "/no/such/library.so"}, ValueError,
     ("custom_op_library", "/no/such/library.so")),
]  # fmt: skip


@pytest.mark.parametrize(("arguments", "error", "fragments"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_raises_before_anything_is_written(tmp_path: Path, monkeypatch, arguments, error, fragments):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    with pytest.raises(error) as raised:
        artifacts.generate_artifacts(_with_integer_initializer(), artifact_directory=out, **arguments)
    message = str(raised.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert not out.exists()  # not even the directory
    assert os.listdir(tmp_path) == []  # and nothing in the working directory


def test_bad_input_leaves_an_existing_directory_as_it_was(tmp_path: Path):
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError):
        artifacts.generate_artifacts(dense(), ["W", "nope"], artifact_directory=tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]


def test_an_unknown_target_lists_the_known_ones(tmp_path: Path):
    with pytest.raises(ValueError, match=r"target='onnxruntime-mobile'.*\['onnxruntime', 'onnxruntime-training'\]"):
        artifacts.generate_artifacts(dense(), ["W"], loss="MSELoss", artifact_directory=tmp_path / "out",
                                     target="onnxruntime-mobile")  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_a_missing_model_file(tmp_path: Path):
    with pytest.raises(ValueError, match="no ONNX model"):
        artifacts.generate_artifacts(tmp_path / "missing.onnx", ["W"], artifact_directory=tmp_path / "out")
    with pytest.raises(TypeError, match="ModelProto or a path"):
        artifacts.generate_artifacts(b"bytes", ["W"], artifact_directory=tmp_path / "out")
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------------------------ atomicity

KWARGS = {"requires_grad": REQUIRES_GRAD, "frozen_params": FROZEN, "optimizer": "AdamW", "nominal_checkpoint": True}


def _snapshot(folder: Path) -> dict[str, bytes]:
    """The files a reader sees, by name; a writer that failed leaves nothing else behind."""
    assert leftovers(folder) == []
    return visible_files(folder)


@pytest.fixture
def earlier_set(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """A directory holding a complete artifact set (MSELoss), and its bytes."""
    folder = tmp_path / "artifacts"
    artifacts.generate_artifacts(dense(), loss="MSELoss", artifact_directory=folder, **KWARGS)
    snapshot = _snapshot(folder)
    assert sorted(snapshot) == ["checkpoint", "eval_model.onnx", "nominal_checkpoint", "optimizer_model.onnx",
                                "training_model.onnx"]  # fmt: skip
    return folder, snapshot


class Boom(RuntimeError):
    pass


def _fail_on_call(original, call: int, exception: BaseException, *, before: bool = False):
    """``original``, except that call number ``call`` (1-based) raises ``exception`` after writing
    (``before``: instead of running)."""
    count = 0

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nonlocal count
        count += 1
        if count == call and before:
            raise exception
        result = original(*args, **kwargs)
        if count == call:
            raise exception
        return result

    return wrapper


@pytest.mark.parametrize("call", [1, 2, 3])
def test_a_model_write_failing_leaves_the_earlier_set(earlier_set, monkeypatch, call: int):
    folder, snapshot = earlier_set
    monkeypatch.setattr(onnx, "save_model", _fail_on_call(onnx.save_model, call, Boom("disk full")))
    with pytest.raises(Boom):
        artifacts.generate_artifacts(dense(), loss="CrossEntropyLoss", artifact_directory=folder, **KWARGS)
    assert _snapshot(folder) == snapshot  # the same files, byte for byte; no staging directory


@pytest.mark.parametrize("exception", [Boom("disk full"), KeyboardInterrupt()], ids=["error", "interrupt"])
@pytest.mark.parametrize("call", [1, 2])
def test_a_checkpoint_write_failing_leaves_the_earlier_set(earlier_set, monkeypatch, call, exception):
    folder, snapshot = earlier_set
    monkeypatch.setattr(
        generate_module.checkpoint, "write_files", _fail_on_call(checkpoint.write_files, call, exception)
    )
    with pytest.raises(type(exception)):
        artifacts.generate_artifacts(dense(), loss="L1Loss", artifact_directory=folder, **KWARGS)
    assert _snapshot(folder) == snapshot


def test_a_failing_ort_conversion_leaves_the_earlier_set(earlier_set, monkeypatch):
    folder, snapshot = earlier_set

    def failing(*args: Any, **kwargs: Any) -> None:
        raise Boom("converter crashed")

    monkeypatch.setattr(generate_module, "_to_ort_format", failing)
    with pytest.raises(Boom):
        artifacts.generate_artifacts(dense(), loss="MSELoss", artifact_directory=folder, ort_format=True, **KWARGS)
    assert _snapshot(folder) == snapshot


@pytest.mark.parametrize("before", [True, False], ids=["before", "after"])
@pytest.mark.parametrize("call", range(1, 9))
def test_a_rename_failing_leaves_the_earlier_set_or_the_new_one(
    earlier_set, tmp_path: Path, monkeypatch, call: int, before: bool
):
    """A rename failing (or interrupted right after it ran) before the switch leaves the earlier set; after
    it, the new one; never a mix, and the next write leaves nothing else behind."""
    folder, snapshot = earlier_set
    new = visible_files(Path(artifacts.generate_artifacts(dense(), loss="L1Loss", artifact_directory=tmp_path / "new",
                                                          **KWARGS)["checkpoint"]).parent)  # fmt: skip
    exception = Boom("rename failed") if before else KeyboardInterrupt()
    monkeypatch.setattr(os, "replace", _fail_on_call(os.replace, call, exception, before=before))
    try:
        artifacts.generate_artifacts(dense(), loss="L1Loss", artifact_directory=folder, **KWARGS)
    except (Boom, KeyboardInterrupt) as raised:
        assert raised is exception
    monkeypatch.undo()
    assert visible_files(folder) in (snapshot, new)
    artifacts.generate_artifacts(dense(), loss="L1Loss", artifact_directory=folder, **KWARGS)
    assert _snapshot(folder) == new


def test_a_directory_where_an_artifact_goes_is_an_error_before_anything_moves(earlier_set):
    folder, snapshot = earlier_set
    (folder / "checkpoint").unlink()
    (folder / "checkpoint").mkdir()
    del snapshot["checkpoint"]
    with pytest.raises(IsADirectoryError, match=r"checkpoint is a directory.*move it away"):
        artifacts.generate_artifacts(dense(), loss="L1Loss", artifact_directory=folder, **KWARGS)
    assert (folder / "checkpoint").is_dir()
    assert visible_files(folder) == snapshot


def test_a_failed_write_into_a_new_directory_leaves_no_directory(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(
        generate_module.checkpoint, "write_files", _fail_on_call(checkpoint.write_files, 1, Boom("full"))
    )
    with pytest.raises(Boom):
        artifacts.generate_artifacts(dense(), loss="MSELoss", artifact_directory=tmp_path / "new", **KWARGS)
    assert os.listdir(tmp_path) == []


def test_a_successful_write_replaces_the_earlier_set(earlier_set):
    folder, snapshot = earlier_set
    artifacts.generate_artifacts(dense(), loss="L1Loss", artifact_directory=folder, **KWARGS)
    now = _snapshot(folder)
    assert sorted(now) == sorted(snapshot)
    assert now["training_model.onnx"] != snapshot["training_model.onnx"]
    assert now["checkpoint"] == snapshot["checkpoint"]  # same parameters, same bytes
