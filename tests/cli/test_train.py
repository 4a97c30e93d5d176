"""``onnxtrain train``: data from .npz and .csv, checkpoints, refusals, and resumes equal to uninterrupted runs."""

from __future__ import annotations

import json
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxtrain.onnxblock as onnxblock
from onnxtrain import checkpoint
from onnxtrain.loop import RunRecord
from onnxtrain.training import Module, TrainingState
from tests.cli.helpers import FEATURES, TinyMLP, assert_error, assert_no_progress_bar, classification, cli, corrupt

RUN = ["--epochs", "4", "--batch-size", "16", "--val-split", "0.2", "--seed", "3"]


def _train(capsys, directory: Path, data: Path, *options: object) -> tuple[int, str, str]:
    return cli(capsys, "train", directory, "--data", data, *(options or RUN))


def _trained(directory: Path) -> checkpoint.CheckpointState:
    return checkpoint.load(directory / "trained_checkpoint")


def _history(state: checkpoint.CheckpointState) -> list[dict[str, float]]:
    return json.loads(str(state.properties["onnxtrain.run.history"]))


def _assert_same_run(a: checkpoint.CheckpointState, b: checkpoint.CheckpointState) -> None:
    """Parameters, moments, step and per-epoch losses equal bit for bit."""
    assert a.trainable.keys() == b.trainable.keys()
    for name in a.trainable:
        np.testing.assert_array_equal(a.trainable[name], b.trainable[name])
    assert a.optimizer is not None and b.optimizer is not None
    assert a.optimizer == b.optimizer
    assert _history(a) == _history(b)
    np.testing.assert_array_equal(
        [[e["train_loss"], e["val_loss"]] for e in _history(a)], [[e["train_loss"], e["val_loss"]] for e in _history(b)]
    )


def test_trains_from_an_npz_and_reports_each_epoch(capsys, artifacts: Path, data_path: Path):
    status, out, err = _train(capsys, artifacts, data_path)
    assert (status, err) == (0, "")
    lines = [line for line in out.splitlines() if line.startswith("epoch ")]
    assert [line.split(":")[0] for line in lines] == [f"epoch {e}/4" for e in range(1, 5)]
    assert all("train loss" in line and "val loss" in line for line in lines)
    assert_no_progress_bar(out)
    state = _trained(artifacts)
    record = RunRecord.from_properties(state.properties)
    assert record is not None and record.finished and (record.epoch, record.batch) == (4, 0)
    assert (record.seed, record.batch_size, record.samples) == (3, 16, 120)
    assert state.optimizer is not None and state.optimizer.step == 4 * 6  # 96 training samples, 6 batches
    history = _history(state)
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert checkpoint.load(artifacts / "checkpoint").optimizer is None  # the initial state is left alone


def test_the_trailing_partial_batch_is_trained(capsys, artifacts: Path, data_path: Path):
    assert _train(capsys, artifacts, data_path, "--epochs", "1", "--batch-size", "50")[0] == 0
    assert _trained(artifacts).optimizer.step == 3  # 120 samples: 50, 50, 20


def test_a_model_over_the_size_threshold_trains_data_whose_size_is_not_a_multiple_of_the_batch(capsys, tmp_path):
    """100 samples in batches of 32 (the last of each epoch 4 rows, or 26 after the validation split) on a model
    whose first weight passes training.options.SMALL_TENSOR (4 x 8,200 elements)."""
    net = TinyMLP(hidden=8200)
    with onnxblock.empty_base() as base:
        base.add_input("x", onnx.helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, ["batch", FEATURES]))
        net("x")
    onnx.save(net.to_model_proto(), tmp_path / "wide.onnx")
    x, y = classification(100)
    np.savez(tmp_path / "data.npz", X=x, y=y)
    generate = ["generate", tmp_path / "wide.onnx", "--requires-grad", "all-float", "--loss", "ce"]
    assert cli(capsys, *generate, "-o", tmp_path / "art")[0] == 0
    for run, options in {"all": [], "split": ["--val-split", "0.1"]}.items():
        directory = Path(shutil.copytree(tmp_path / "art", tmp_path / run))
        status, _, err = _train(capsys, directory, tmp_path / "data.npz", "--epochs", "3", "--batch-size", "32",
                                *options)  # fmt: skip
        assert (status, err) == (0, "")
        assert _trained(directory).optimizer.step == (3 * 4 if run == "all" else 3 * 3)  # 90 rows: 32, 32, 26


def test_the_stored_learning_rate_is_the_default_and_lr_overrides_it(capsys, fresh_artifacts, data_path: Path):
    stored, given = fresh_artifacts("stored"), fresh_artifacts("given")
    assert _train(capsys, stored, data_path, "--epochs", "1", "--batch-size", "60")[0] == 0
    assert _train(capsys, given, data_path, "--epochs", "1", "--batch-size", "60", "--lr", "0.125")[0] == 0
    assert _trained(stored).optimizer.initial_learning_rate == pytest.approx(0.05)
    assert _trained(given).optimizer.initial_learning_rate == 0.125


def _csv(path: Path, header: str | None, label_first: bool = False) -> Path:
    x, y = classification()
    table = np.column_stack([y, x] if label_first else [x, y])
    np.savetxt(path, table, delimiter=",", header=header or "", comments="", fmt="%.9g")
    return path


@pytest.mark.parametrize("header", [None, "a,b,c,d,label"])
def test_a_csv_with_or_without_header_gives_the_npz_arrays(capsys, fresh_artifacts, tmp_path: Path, data_path, header):
    from_csv, from_npz = fresh_artifacts("csv"), fresh_artifacts("npz")
    status, _, err = _train(capsys, from_csv, _csv(tmp_path / "data.csv", header))
    assert (status, err) == (0, "")
    assert _train(capsys, from_npz, data_path)[0] == 0
    _assert_same_run(_trained(from_csv), _trained(from_npz))  # the same arrays once cast: the labels became int64


@pytest.mark.parametrize("column", ["label", "0"])
def test_the_target_column_by_name_or_index(capsys, artifacts: Path, tmp_path: Path, column: str):
    data = _csv(tmp_path / "data.csv", "label,a,b,c,d", label_first=True)
    status, _, err = _train(capsys, artifacts, data, *RUN, "--target-column", column)
    assert (status, err) == (0, "")


def test_an_unknown_target_column(capsys, artifacts: Path, tmp_path: Path):
    data = _csv(tmp_path / "data.csv", "a,b,c,d,label")
    status, _, err = _train(capsys, artifacts, data, *RUN, "--target-column", "klass")
    assert status == 1
    assert_error(err, "train", "klass", "'label'")


def test_labels_that_are_not_whole_numbers(capsys, artifacts: Path, tmp_path: Path):
    x, y = classification()
    np.savez(tmp_path / "bad.npz", X=x, y=y + 0.5)
    status, _, err = _train(capsys, artifacts, tmp_path / "bad.npz")
    assert status == 1
    assert_error(err, "train", "array 'y'", "input 'labels'", "whole number")


def _train_on_one_bad_file(
    capsys, artifacts: Path, tmp_path: Path, option: str, good: dict[str, np.ndarray], bad: dict[str, np.ndarray]
) -> tuple[int, str]:
    """``onnxtrain train`` on ``good`` and ``bad`` as the data and the validation data, ``bad`` the one ``option``
    (``--data`` or ``--val-data``) names; its exit status and standard error."""
    np.savez(tmp_path / "good.npz", **good)
    np.savez(tmp_path / "bad.npz", **bad)
    data, validation = ("bad", "good") if option == "--data" else ("good", "bad")
    files = ["--data", tmp_path / f"{data}.npz", "--val-data", tmp_path / f"{validation}.npz"]
    status, _, err = cli(capsys, "train", artifacts, *files, "--epochs", "1", "--batch-size", "16")
    return status, err


@pytest.mark.parametrize(("option", "what"), [("--data", "the data"), ("--val-data", "the validation data")])
def test_a_label_out_of_range_is_named_by_its_row_before_any_step(
    capsys, artifacts: Path, tmp_path: Path, option: str, what: str
):
    """Every row is checked before the first step: the error names the file's row (not a position in a shuffled
    batch), and no trained checkpoint is left for a corrected run to need --restart."""
    x, y = classification()
    bad = y.copy()
    bad[7] = -1
    status, err = _train_on_one_bad_file(capsys, artifacts, tmp_path, option, {"X": x, "y": y}, {"X": x, "y": bad})
    assert status == 1
    assert_error(err, "train", f"{what}: 1 label is out of range", "-1 at [7]", "--ignore-index LABEL")
    assert not (artifacts / "trained_checkpoint").exists()


@pytest.mark.parametrize(("option", "what"), [("--data", "the data"), ("--val-data", "the validation data")])
def test_rows_with_nan_or_infinite_values_are_named_before_any_step(
    capsys, artifacts: Path, tmp_path: Path, option: str, what: str
):
    """One NaN made the loss NaN, then every parameter: the run ended with exit 0 and a checkpoint of NaNs."""
    x, y = classification()
    bad = x.copy()
    bad[17, 2], bad[40, 0] = np.nan, np.inf
    status, err = _train_on_one_bad_file(capsys, artifacts, tmp_path, option, {"X": x, "y": y}, {"X": bad, "y": y})
    assert status == 1
    assert_error(err, "train", f"{what}: input 'x' has NaN or infinite values in 2 row(s) (17, 40;", "impute")
    assert not (artifacts / "trained_checkpoint").exists()


def test_a_model_that_imputes_nan_takes_them(tmp_path: Path):
    """A model reading NaN itself (an ``IsNaN``, as skl2onnx's imputers write) is given its rows as they are."""
    from onnxtrain.training.finite import check_finite_rows

    data = [np.array([[1.0, np.nan]], np.float32)]
    is_nan = onnx.helper.make_node("IsNaN", ["x"], ["m"])
    imputer = onnx.helper.make_model(onnx.helper.make_graph([is_nan], "g", [], []))
    check_finite_rows(data, ["x"], "the data", imputer)
    with pytest.raises(ValueError, match=r"input 'x' has NaN or infinite values in 1 row\(s\) \(0;"):
        check_finite_rows(data, ["x"], "the data", onnx.helper.make_model(onnx.helper.make_graph([], "g", [], [])))


def test_arrays_of_different_lengths(capsys, artifacts: Path, tmp_path: Path):
    x, y = classification()
    np.savez(tmp_path / "bad.npz", X=x, y=y[:-5])
    status, _, err = _train(capsys, artifacts, tmp_path / "bad.npz")
    assert status == 1
    assert_error(err, "train", "array 'y'", "115 samples", "120")


def test_arrays_named_neither_after_the_inputs_nor_x_and_y(capsys, artifacts: Path, tmp_path: Path):
    np.savez(tmp_path / "bad.npz", features=np.zeros((4, 4), np.float32))
    status, _, err = _train(capsys, artifacts, tmp_path / "bad.npz")
    assert status == 1
    assert_error(err, "train", "['features']", "x: float32[batch, 4]", "labels: int64[batch]")


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        (["--epochs", "-2", "--batch-size", "8"], "--epochs"),
        (["--epochs", "2", "--batch-size", "0"], "--batch-size"),
        (["--epochs", "2", "--batch-size", "8", "--val-split", "1.5"], "--val-split"),
        (["--epochs", "2", "--batch-size", "8", "--val-split", "0"], "--val-split"),
        (["--epochs", "2", "--batch-size", "8", "--resume", "--restart"], "--restart"),
        (["--epochs", "2"], "--batch-size"),
    ],
)
def test_bad_arguments_are_usage_errors(capsys, artifacts: Path, data_path: Path, options: list[str], fragment: str):
    status, out, err = _train(capsys, artifacts, data_path, *options)
    assert status == 2 and out == ""
    assert_error(err, "train", fragment)


def test_a_file_that_is_no_npz_archive_is_told_how_to_write_one(capsys, artifacts: Path, tmp_path: Path):
    text = tmp_path / "data.npz"
    text.write_text("x,y\n1,2\n")
    status, _, err = _train(capsys, artifacts, text, *RUN)
    assert status == 1 and "pickle" not in err
    assert_error(err, "train", "data.npz is not an .npz archive", "numpy.savez")


def test_missing_data_option(capsys, artifacts: Path):
    status, _, err = cli(capsys, "train", artifacts, *RUN)
    assert status == 2
    assert_error(err, "train", "--data")


def test_a_missing_data_file(capsys, artifacts: Path, tmp_path: Path):
    status, _, err = _train(capsys, artifacts, tmp_path / "nothing.npz")
    assert status == 1
    assert_error(err, "train", "nothing.npz")


def test_a_missing_artifact_directory(capsys, tmp_path: Path, data_path: Path):
    status, _, err = _train(capsys, tmp_path / "nowhere", data_path)
    assert status == 1
    assert_error(err, "train", "nowhere", "onnxtrain generate")


def test_a_corrupt_checkpoint(capsys, artifacts: Path, data_path: Path):
    corrupt(artifacts / "checkpoint")
    status, _, err = _train(capsys, artifacts, data_path)
    assert status == 1
    assert_error(err, "train", "checkpoint")


def test_a_corrupt_training_model(capsys, artifacts: Path, data_path: Path):
    corrupt(artifacts / "training_model.onnx")
    status, _, err = _train(capsys, artifacts, data_path)
    assert status == 1
    assert_error(err, "train", "training_model.onnx", "not a readable ONNX model")


def test_an_earlier_run_is_not_overwritten(capsys, artifacts: Path, data_path: Path):
    assert _train(capsys, artifacts, data_path)[0] == 0
    before = (artifacts / "trained_checkpoint").read_bytes()
    status, _, err = _train(capsys, artifacts, data_path)
    assert status == 1
    assert_error(err, "train", "holds an earlier run (epoch 4 of 4)", "--resume", "--restart", "checkpoint")
    assert (artifacts / "trained_checkpoint").read_bytes() == before


def test_restart_starts_again_from_the_initial_checkpoint(capsys, fresh_artifacts, data_path: Path):
    once, twice = fresh_artifacts("once"), fresh_artifacts("twice")
    assert _train(capsys, once, data_path)[0] == 0
    assert _train(capsys, twice, data_path, "--epochs", "2", "--batch-size", "7")[0] == 0
    assert _train(capsys, twice, data_path, *RUN, "--restart")[0] == 0
    _assert_same_run(_trained(once), _trained(twice))


def test_resume_without_an_earlier_run(capsys, artifacts: Path, data_path: Path):
    status, _, err = _train(capsys, artifacts, data_path, *RUN, "--resume")
    assert status == 1
    assert_error(err, "train", "no earlier run", "without --resume")


def test_resume_from_a_corrupt_trained_checkpoint(capsys, artifacts: Path, data_path: Path):
    corrupt(artifacts / "trained_checkpoint")
    status, _, err = _train(capsys, artifacts, data_path, *RUN, "--resume")
    assert status == 1
    assert_error(err, "train", "trained_checkpoint", "pass --restart to start again from")


def test_resume_with_other_settings_is_refused(capsys, artifacts: Path, data_path: Path, tmp_path: Path):
    assert _train(capsys, artifacts, data_path, "--epochs", "1", "--batch-size", "16", "--seed", "3")[0] == 0
    status, _, err = _train(capsys, artifacts, data_path, "--epochs", "2", "--batch-size", "8", "--resume")
    assert status == 1
    assert_error(err, "train", "batch size 16 (now 8)", "seed 3 (now 0)")
    x, y = classification(seed=1)
    np.savez(tmp_path / "other.npz", X=x, y=y)
    status, _, err = _train(capsys, artifacts, tmp_path / "other.npz", "--epochs", "2", "--batch-size", "16",
                            "--seed", "3", "--resume")  # fmt: skip
    assert status == 1
    assert_error(err, "train", "the data's values")


def test_resume_of_a_finished_run_has_nothing_to_do(capsys, artifacts: Path, data_path: Path):
    assert _train(capsys, artifacts, data_path)[0] == 0
    before = (artifacts / "trained_checkpoint").read_bytes()
    status, out, _ = _train(capsys, artifacts, data_path, *RUN, "--resume")
    assert status == 0 and "nothing to do" in out
    assert (artifacts / "trained_checkpoint").read_bytes() == before


def test_resume_with_more_epochs_continues_the_run(capsys, fresh_artifacts, data_path: Path):
    whole, parts = fresh_artifacts("whole"), fresh_artifacts("parts")
    assert _train(capsys, whole, data_path)[0] == 0
    assert _train(capsys, parts, data_path, *RUN[:1], "2", *RUN[2:])[0] == 0
    assert _train(capsys, parts, data_path, *RUN, "--resume")[0] == 0
    _assert_same_run(_trained(whole), _trained(parts))


def _at_step(monkeypatch: pytest.MonkeyPatch, step: int, action: Callable[[], None]) -> None:
    """Run ``action`` at the start of the ``step``-th train step (counted from 1)."""
    original = Module.__call__
    steps = [0]

    def call(self: Module, *args: object, **kwargs: object) -> object:
        if self.training:
            steps[0] += 1
            if steps[0] == step:
                action()
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Module, "__call__", call)


def _fail_at(monkeypatch: pytest.MonkeyPatch, step: int, error: BaseException) -> None:
    """Make the ``step``-th train step raise ``error``."""

    def fail() -> None:
        raise error

    _at_step(monkeypatch, step, fail)


@pytest.mark.parametrize("bad", [7, -1])
def test_token_ids_outside_the_embedding_are_refused_before_any_step(capsys, tmp_path: Path, bad: int):
    """An id as large as the table made onnxruntime fail in the middle of the epoch, with a traceback; a negative
    one read the table's last row without a word. torch refuses both."""
    from onnx import TensorProto, helper

    from tests.helpers import make_model

    rng = np.random.default_rng(0)
    model = make_model(
        {"ids": (TensorProto.INT64, ["batch", 3])},
        [helper.make_node("Gather", ["table", "ids"], ["vectors"]),
         helper.make_node("ReduceMean", ["vectors"], ["pooled"], axes=[1], keepdims=0),
         helper.make_node("MatMul", ["pooled", "head"], ["scores"])],
        {"scores": (TensorProto.FLOAT, ["batch", 2])},
        [("table", rng.normal(size=(7, 4)).astype(np.float32)), ("head", rng.normal(size=(4, 2)).astype(np.float32))],
        opset=13,
    )  # fmt: skip
    onnx.save(model, tmp_path / "bag.onnx")
    argv = ["generate", tmp_path / "bag.onnx", "--requires-grad", "weights", "--loss", "ce", "-o", tmp_path / "art"]
    assert cli(capsys, *argv)[0] == 0
    ids = rng.integers(0, 7, size=(41, 3))
    ids[29, 1] = bad
    np.savez(tmp_path / "data.npz", X=ids, y=rng.integers(0, 2, size=41))
    status, _, err = _train(capsys, tmp_path / "art", tmp_path / "data.npz", "--epochs", "1", "--batch-size", "8")
    assert status == 1
    assert_error(err, "train", "input 'ids' holds 1 id(s) outside the 7 rows of the table 'table'", f"{bad} at [29, 1]")
    assert not (tmp_path / "art" / "trained_checkpoint").exists()
    ids[29, 1] = 3
    np.savez(tmp_path / "data.npz", X=ids, y=rng.integers(0, 2, size=41))
    status, _, err = _train(capsys, tmp_path / "art", tmp_path / "data.npz", "--epochs", "1", "--batch-size", "8")
    assert (status, err) == (0, "")


def test_a_step_that_onnxruntime_fails_is_a_one_line_error_and_other_runtime_errors_keep_their_traceback(
    capsys, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    """Ids the model computes itself (the absolute value of a category code, cast from a float column) escape the
    host check of ids (which follows selections and casts of an input, not arithmetic): the Gather failed in the
    middle of the epoch, and run_with_iobinding's plain RuntimeError was a traceback."""
    from onnx import TensorProto, helper

    from onnxtrain.training import binding
    from tests.helpers import make_model

    rng = np.random.default_rng(0)
    model = make_model(
        {"x": (TensorProto.FLOAT, ["batch", 2])},
        [helper.make_node("Abs", ["x"], ["magnitude"]),
         helper.make_node("Cast", ["magnitude"], ["ids"], to=TensorProto.INT64),
         helper.make_node("Gather", ["table", "ids"], ["vectors"]),
         helper.make_node("ReduceMean", ["vectors"], ["scores"], axes=[1], keepdims=0)],
        {"scores": (TensorProto.FLOAT, ["batch", 3])},
        [("table", rng.normal(size=(4, 3)).astype(np.float32))],
        opset=13,
    )  # fmt: skip
    onnx.save(model, tmp_path / "codes.onnx")
    argv = ["generate", tmp_path / "codes.onnx", "--requires-grad", "weights", "--loss", "ce", "-o", tmp_path / "art"]
    assert cli(capsys, *argv)[0] == 0
    codes = rng.integers(0, 4, size=(12, 2)).astype(np.float32)
    codes[9, 0] = 4  # one past the table's last row
    np.savez(tmp_path / "data.npz", X=codes, y=rng.integers(0, 3, size=12))
    status, _, err = _train(capsys, tmp_path / "art", tmp_path / "data.npz", "--epochs", "1", "--batch-size", "4")
    assert status == 1
    assert_error(err, "train", "Gather", "idx=4")

    def bug(self: object, options: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(binding._NativeBinding, "run", bug)
    monkeypatch.setattr(binding._PublicBinding, "run", bug)
    codes[9, 0] = 3
    np.savez(tmp_path / "data.npz", X=codes, y=rng.integers(0, 3, size=12))
    with pytest.raises(RuntimeError, match="a bug"):
        _train(capsys, tmp_path / "art", tmp_path / "data.npz", "--epochs", "1", "--batch-size", "4", "--restart")


def test_a_model_of_a_fixed_batch_is_told_to_be_exported_with_a_dynamic_one_before_any_step(capsys, tmp_path: Path):
    """Exported without a dynamic batch axis, x is [4, 8]: the run trained the epoch's batches of 4 and failed at
    its last, smaller one, the steps lost, saying only the two shapes."""
    from onnx import TensorProto, helper

    from tests.helpers import make_model

    rng = np.random.default_rng(1)
    model = make_model(
        {"x": (TensorProto.FLOAT, [4, 8])}, [helper.make_node("MatMul", ["x", "w"], ["y"])],
        {"y": (TensorProto.FLOAT, [4, 3])}, [("w", rng.normal(size=(8, 3)).astype(np.float32))],
    )  # fmt: skip
    onnx.save(model, tmp_path / "fixed.onnx")
    argv = ["generate", tmp_path / "fixed.onnx", "--requires-grad", "weights", "--loss", "ce", "-o", tmp_path / "art"]
    assert cli(capsys, *argv)[0] == 0
    for rows, batch, said in ((30, 4, "batches of 4 and a last one of 2"), (32, 8, "batches of 8 do not fit")):
        np.savez(tmp_path / "data.npz", X=rng.normal(size=(rows, 8)), y=rng.integers(0, 3, size=rows))
        status, _, err = _train(capsys, tmp_path / "art", tmp_path / "data.npz", "--epochs", "1", "--batch-size",
                                str(batch))  # fmt: skip
        assert status == 1
        advice = ("dynamic_axes={'x': {0: 'batch'}}", "--batch-size 4 on a number of samples that is a multiple of 4")
        assert_error(err, "train", "input 'x' takes a fixed batch of 4 row(s)", said, *advice)
        assert not (tmp_path / "art" / "trained_checkpoint").exists()
    np.savez(tmp_path / "data.npz", X=rng.normal(size=(32, 8)), y=rng.integers(0, 3, size=32))
    status, _, err = _train(capsys, tmp_path / "art", tmp_path / "data.npz", "--epochs", "1", "--batch-size", "4")
    assert (status, err) == (0, "")


def test_a_run_that_fails_before_its_first_save_leaves_the_earlier_run_or_nothing(
    capsys, monkeypatch: pytest.MonkeyPatch, fresh_artifacts: Callable[[str], Path], data_path: Path
):
    """The run wrote the starting state as its checkpoint first: a failure at the first step left a run of 0 steps
    (which the next run had to --resume or --restart) or, with --restart, had already replaced the earlier run and
    removed its best state."""
    stopping = ["--epochs", "3", "--batch-size", "16", "--seed", "3", "--val-split", "0.2", "--early-stopping", "2"]
    earlier, fresh = fresh_artifacts("earlier"), fresh_artifacts("fresh")
    assert _train(capsys, earlier, data_path, *stopping)[0] == 0
    before = {name: (earlier / name).read_bytes() for name in ("trained_checkpoint", "best_checkpoint")}
    for folder, options in ((earlier, [*stopping, "--restart"]), (fresh, RUN)):
        with monkeypatch.context() as patch:
            _fail_at(patch, 1, RuntimeError("a bad batch"))
            with pytest.raises(RuntimeError, match="a bad batch"):
                _train(capsys, folder, data_path, *options)
    assert {name: (earlier / name).read_bytes() for name in before} == before
    assert not (fresh / "trained_checkpoint").exists()
    status, _, err = _train(capsys, fresh, data_path, *RUN)  # no --resume nor --restart to say
    assert (status, err) == (0, "")
    assert _train(capsys, earlier, data_path, *stopping[:-2], "--restart")[0] == 0  # no early stopping now
    assert not (earlier / "best_checkpoint").exists()  # the earlier run's best went with its first save


@pytest.mark.parametrize("every", [4, 6])
def test_resume_after_a_crash_equals_an_uninterrupted_run(
    capsys, monkeypatch: pytest.MonkeyPatch, fresh_artifacts: Callable[[str], Path], data_path: Path, every: int
):
    whole, crashed = fresh_artifacts("whole"), fresh_artifacts("crashed")
    run = [*RUN, "--checkpoint-every", str(every)]
    assert _train(capsys, whole, data_path, *run)[0] == 0
    with monkeypatch.context() as patch:
        _fail_at(patch, 15, RuntimeError("the machine went away"))
        with pytest.raises(RuntimeError, match="went away"):
            _train(capsys, crashed, data_path, *run)
    saved = _trained(crashed)
    assert saved.optimizer.step == (14 // every) * every  # the last checkpoint before the crash
    status, out, err = _train(capsys, crashed, data_path, *run, "--resume")
    assert (status, err) == (0, "") and "resuming" in out
    _assert_same_run(_trained(whole), _trained(crashed))


def test_a_model_with_dropout_resumes_after_a_crash_as_if_uninterrupted(
    capsys, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    """Dropout's masks come from the seed and the step (Module's ``seed``): the resumed run draws what the
    uninterrupted one drew, and a second run from scratch equals the first."""
    from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
    from tests.training.test_random_draws import _dropout_mlp

    rng = np.random.default_rng(2)
    np.savez(tmp_path / "data.npz", X=rng.normal(size=(45, 5)).astype(np.float32),
             y=rng.normal(size=(45, 3)).astype(np.float32))  # fmt: skip
    folders = [tmp_path / name for name in ("whole", "again", "crashed")]
    for folder in folders:
        generate_artifacts(_dropout_mlp(), requires_grad=["W1", "W2"], loss=LossType.MSELoss,
                           optimizer=OptimType.AdamW, artifact_directory=folder)  # fmt: skip
    run = [*RUN, "--checkpoint-every", "4"]
    whole, again, crashed = folders
    assert _train(capsys, whole, tmp_path / "data.npz", *run)[0] == 0
    assert _train(capsys, again, tmp_path / "data.npz", *run)[0] == 0
    with monkeypatch.context() as patch:
        _fail_at(patch, 7, RuntimeError("the machine went away"))
        with pytest.raises(RuntimeError, match="went away"):
            _train(capsys, crashed, tmp_path / "data.npz", *run)
    assert _train(capsys, crashed, tmp_path / "data.npz", *run, "--resume")[0] == 0
    _assert_same_run(_trained(whole), _trained(again))
    _assert_same_run(_trained(whole), _trained(crashed))


def test_ctrl_c_saves_the_last_step_and_resumes_exactly(
    capsys, monkeypatch: pytest.MonkeyPatch, fresh_artifacts: Callable[[str], Path], data_path: Path
):
    whole, stopped = fresh_artifacts("whole"), fresh_artifacts("stopped")
    assert _train(capsys, whole, data_path)[0] == 0
    with monkeypatch.context() as patch:
        _fail_at(patch, 10, KeyboardInterrupt())
        status, _, err = _train(capsys, stopped, data_path)
    assert status == 130
    assert "interrupted at epoch 2 of 4, batch 3" in err and "--resume" in err and "Traceback" not in err
    assert _trained(stopped).optimizer.step == 9
    assert _train(capsys, stopped, data_path, *RUN, "--resume")[0] == 0
    _assert_same_run(_trained(whole), _trained(stopped))


def test_a_run_interrupted_before_its_first_step_resumes_from_the_start(
    capsys, monkeypatch: pytest.MonkeyPatch, fresh_artifacts: Callable[[str], Path], data_path: Path
):
    whole, stopped = fresh_artifacts("whole"), fresh_artifacts("stopped")
    assert _train(capsys, whole, data_path)[0] == 0
    with monkeypatch.context() as patch:
        _fail_at(patch, 1, KeyboardInterrupt())
        assert _train(capsys, stopped, data_path)[0] == 130
    assert _train(capsys, stopped, data_path, *RUN, "--resume")[0] == 0
    _assert_same_run(_trained(whole), _trained(stopped))


def _signal_at(monkeypatch: pytest.MonkeyPatch, step: int, times: int) -> None:
    """Send SIGINT ``times`` times at the start of the ``step``-th train step."""

    def interrupt() -> None:
        for _ in range(times):
            signal.raise_signal(signal.SIGINT)

    _at_step(monkeypatch, step, interrupt)


python_handler = pytest.mark.skipif(
    signal.getsignal(signal.SIGINT) is not signal.default_int_handler, reason="SIGINT has another handler here"
)


@python_handler
def test_a_real_ctrl_c_finishes_the_step_under_way(
    capsys, monkeypatch: pytest.MonkeyPatch, fresh_artifacts: Callable[[str], Path], data_path: Path
):
    whole, stopped = fresh_artifacts("whole"), fresh_artifacts("stopped")
    assert _train(capsys, whole, data_path)[0] == 0
    with monkeypatch.context() as patch:
        _signal_at(patch, 8, times=1)  # arrives in the middle of the step
        assert _train(capsys, stopped, data_path)[0] == 130
    assert _trained(stopped).optimizer.step == 8  # the step under way was completed, then saved
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    assert _train(capsys, stopped, data_path, *RUN, "--resume")[0] == 0
    _assert_same_run(_trained(whole), _trained(stopped))


@python_handler
def test_a_second_ctrl_c_stops_at_once_and_the_last_checkpoint_stands(
    capsys, monkeypatch: pytest.MonkeyPatch, fresh_artifacts: Callable[[str], Path], data_path: Path
):
    whole, stopped = fresh_artifacts("whole"), fresh_artifacts("stopped")
    assert _train(capsys, whole, data_path)[0] == 0
    with monkeypatch.context() as patch:
        _signal_at(patch, 9, times=2)
        status, _, err = _train(capsys, stopped, data_path)
    assert status == 130 and "interrupted at epoch 1 of 4;" in err and "--resume" in err
    assert _trained(stopped).optimizer.step == 6  # saved after the first epoch
    assert _train(capsys, stopped, data_path, *RUN, "--resume")[0] == 0
    _assert_same_run(_trained(whole), _trained(stopped))


def test_a_device_that_is_no_device_is_a_usage_error(capsys, artifacts: Path, data_path: Path):
    status, _, err = _train(capsys, artifacts, data_path, *RUN, "--device", "gpu")
    assert status == 2
    assert_error(err, "train", "--device", "'gpu'", "cpu, cuda or cuda:N")


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="this onnxruntime has CUDA")
def test_cuda_without_a_cuda_onnxruntime_is_said_in_options(capsys, artifacts: Path, data_path: Path):
    status, _, err = _train(capsys, artifacts, data_path, *RUN, "--device", "cuda:1")
    assert status == 1
    assert_error(err, "train", "--device cuda:1", "onnxruntime-gpu", "--device cpu")
    assert "device=" not in err and "providers" not in err.split("(")[0]
    assert not (artifacts / "trained_checkpoint").exists()


@pytest.mark.parametrize("what", ["eval model", "optimizer model"])
def test_a_corrupt_eval_or_optimizer_model_is_named_as_a_file(capsys, artifacts: Path, data_path: Path, what: str):
    name = what.replace(" ", "_") + ".onnx"
    corrupt(artifacts / name)
    status, _, err = _train(capsys, artifacts, data_path)
    assert status == 1
    assert_error(err, "train", f"{what}: ", name, "not a readable ONNX model")
    assert "_uri" not in err


def _token_model(vocabulary: int = 11, width: int = 4) -> onnx.ModelProto:
    """``input_ids [batch, seq] -> Gather(embedding) -> MatMul(head) -> logits.transpose(1, 2)``: a language
    model's scores with the classes on axis 1, ``[batch, vocabulary, seq]``."""
    from onnx import helper

    from tests.helpers import FLOAT, INT64, make_model

    rng = np.random.default_rng(5)
    nodes = [
        helper.make_node("Gather", ["embedding.weight", "input_ids"], ["h"]),
        helper.make_node("MatMul", ["h", "head.weight"], ["logits"]),
        helper.make_node("Transpose", ["logits"], ["scores"], perm=[0, 2, 1]),
    ]
    return make_model(
        {"input_ids": (INT64, ["batch", "seq"])},
        nodes,
        {"scores": (FLOAT, ["batch", vocabulary, "seq"])},
        [
            ("embedding.weight", rng.normal(size=(vocabulary, width)).astype(np.float32)),
            ("head.weight", rng.normal(size=(width, vocabulary)).astype(np.float32)),
        ],
    )


def _cross_entropy(scores: np.ndarray, labels: np.ndarray, ignore: int) -> float:
    """torch's cross-entropy with ``ignore_index``: the mean of ``-log softmax`` over the counted labels."""
    log_p = scores - scores.max(axis=1, keepdims=True)
    log_p = log_p - np.log(np.exp(log_p).sum(axis=1, keepdims=True))
    counted = labels != ignore
    picked = np.take_along_axis(log_p, np.where(counted, labels, 0)[:, None], axis=1)[:, 0]
    return float(-picked[counted].mean())


def test_a_language_model_trains_from_the_command_line_with_padded_labels(capsys, tmp_path: Path):
    """Token labels ``[batch, seq]`` (a row per sample, 37 of them in batches of 8), padding as ``-100``:
    ``--ignore-index -100`` leaves those positions out of the loss and the accuracy."""
    onnx.save(_token_model(), tmp_path / "lm.onnx")
    rng = np.random.default_rng(6)
    tokens = rng.integers(0, 11, size=(37, 6))
    labels = np.concatenate([tokens[:, 1:], np.full((37, 1), -100)], axis=1)  # the next token; none after the last
    labels[::3, 3:] = -100  # padded samples
    np.savez(tmp_path / "tokens.npz", input_ids=tokens, labels=labels)
    generate = ["generate", tmp_path / "lm.onnx", "--requires-grad", "weights", "--loss", "ce", "--ignore-index",
                "-100", "-o", tmp_path / "lm"]  # fmt: skip
    assert cli(capsys, *generate)[0] == 0
    status, out, err = _train(capsys, tmp_path / "lm", tmp_path / "tokens.npz", "--epochs", "2", "--batch-size", "8")
    assert (status, err) == (0, ""), err
    assert "epoch 2/2: train loss" in out and "accuracy" in out
    # the loss of the generated model, at its initial weights, is torch's with ignore_index
    state = checkpoint.load(tmp_path / "lm" / "checkpoint")
    module = Module(tmp_path / "lm" / "training_model.onnx", TrainingState(state))
    loss = float(np.asarray(module(tokens[:8], labels[:8])[0]))
    scores = state.trainable["embedding.weight"][tokens[:8]] @ state.trainable["head.weight"]  # [8, seq, classes]
    expected = _cross_entropy(scores.reshape(-1, 11), labels[:8].reshape(-1), -100)
    assert loss == pytest.approx(expected, rel=1e-5)
    status, _, err = cli(capsys, *generate[:5], "mse", "--ignore-index", "-100", "-o", tmp_path / "other")
    assert status == 2 and "--ignore-index is for --loss ce or nll, not mse" in err


def test_token_labels_for_flattened_scores_are_told_the_layout_the_command_trains(capsys, tmp_path: Path):
    """Scores flattened to ``[rows, classes]`` take labels ``[rows]``: the data's labels ``[N, seq]`` cannot be
    split by samples. The error said only that ``[23, 9]`` does not fit ``[]`` per sample."""
    from onnx import helper

    model = _token_model()
    model.graph.node[-1].CopyFrom(helper.make_node("Reshape", ["logits", "flat"], ["scores"]))
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array([-1, 11], np.int64), "flat"))
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("scores", onnx.TensorProto.FLOAT, ["rows", 11]))
    onnx.save(model, tmp_path / "flat.onnx")
    tokens = np.random.default_rng(6).integers(0, 11, size=(23, 9))
    np.savez(tmp_path / "tokens.npz", input_ids=tokens, labels=tokens)
    generate = ["generate", tmp_path / "flat.onnx", "--requires-grad", "weights", "--loss", "ce", "-o", tmp_path / "f"]
    assert cli(capsys, *generate)[0] == 0
    status, _, err = _train(capsys, tmp_path / "f", tmp_path / "tokens.npz", "--epochs", "1", "--batch-size", "4")
    assert status == 1
    assert_error(err, "train", "Its first axis (rows) is not the other inputs' (batch)", "logits.transpose(1, 2)")
