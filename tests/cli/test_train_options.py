"""``onnxtrain train``'s accuracy, --val-data, --schedule, --early-stopping and --reshape, through the command."""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxtrain.onnxblock as onnxblock
from onnxtrain import checkpoint
from onnxtrain.loop import RunRecord, split
from onnxtrain.training import Module
from tests.cli.helpers import CLASSES, FEATURES, TinyMLP, assert_error, classification, cli

RUN = ["--epochs", "4", "--batch-size", "16", "--seed", "3"]
STOPPING = ["--epochs", "30", "--batch-size", "16", "--seed", "3", "--val-split", "0.2", "--early-stopping", "2"]


def _train(capsys, directory: Path, data: Path, *options: object) -> tuple[int, str, str]:
    return cli(capsys, "train", directory, "--data", data, *options)


def _state(path: Path) -> checkpoint.CheckpointState:
    return checkpoint.load(path)


def _record(path: Path) -> RunRecord:
    record = RunRecord.from_properties(checkpoint.load(path).properties)
    assert record is not None
    return record


def _history(path: Path) -> list[dict[str, float | None]]:
    return json.loads(str(checkpoint.load(path).properties["onnxtrain.run.history"]))


def _assert_same_parameters(a: checkpoint.CheckpointState, b: checkpoint.CheckpointState) -> None:
    assert a.trainable.keys() == b.trainable.keys()
    for name in a.trainable:
        np.testing.assert_array_equal(a.trainable[name], b.trainable[name])


def _scores(directory: Path, checkpoint_name: str, x: np.ndarray, tmp_path: Path, capsys) -> np.ndarray:
    """The scores of the model exported from ``directory / checkpoint_name`` on ``x``."""
    out = tmp_path / f"{directory.name}-{checkpoint_name}.onnx"
    assert cli(capsys, "export", directory, "-o", out, "--checkpoint", directory / checkpoint_name)[0] == 0
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


# ---------------------------------------------------------------- accuracy


def test_each_epoch_reports_the_accuracy_of_training_and_validation(capsys, artifacts: Path, data_path: Path):
    status, out, err = _train(capsys, artifacts, data_path, *RUN, "--val-split", "0.2")
    assert (status, err) == (0, "")
    lines = [line for line in out.splitlines() if line.startswith("epoch ")]
    assert len(lines) == 4 and all(", accuracy " in line and ", val accuracy " in line for line in lines)
    assert "accuracy" in out.splitlines()[-2]  # the done line
    history = _history(artifacts / "trained_checkpoint")
    assert all(0 <= entry["train_accuracy"] <= 1 and 0 <= entry["val_accuracy"] <= 1 for entry in history)
    assert history[-1]["val_accuracy"] > history[0]["val_accuracy"]


def test_the_accuracies_are_those_of_the_models_scores(capsys, artifacts: Path, data_path: Path, tmp_path: Path):
    """One step per epoch (96 training rows, batch 96): the training accuracy is the scores' before the step,
    the validation accuracy the trained model's on the held-out rows."""
    assert _train(capsys, artifacts, data_path, "--epochs", "1", "--batch-size", "96", "--val-split", "0.2")[0] == 0
    x, y = classification()
    train_rows, val_rows = split(len(x), 0.2, 0)
    (entry,) = _history(artifacts / "trained_checkpoint")
    before = _scores(artifacts, "checkpoint", x[train_rows], tmp_path, capsys).argmax(axis=1)
    after = _scores(artifacts, "trained_checkpoint", x[val_rows], tmp_path, capsys).argmax(axis=1)
    assert entry["train_accuracy"] == np.mean(before == y[train_rows])
    assert entry["val_accuracy"] == np.mean(after == y[val_rows])


def test_a_batch_larger_than_the_data_is_one_batch_of_the_data(capsys, artifacts: Path, data_path: Path):
    status, out, _ = _train(capsys, artifacts, data_path, "--epochs", "1", "--batch-size", "500", "--val-split", "0.2")
    assert status == 0
    assert "96 samples (24 more held out for validation), 1 batch of 96 per epoch" in out


def _generate(capsys, model: Path, out: Path, *options: str) -> Path:
    status, _, err = cli(capsys, "generate", model, "--requires-grad", "all-float", "-o", out, "--lr", "0.05", *options)
    assert (status, err) == (0, ""), err
    return out


def test_binary_cross_entropy_on_logits_reports_the_binary_accuracy(capsys, model_path: Path, tmp_path: Path):
    art = _generate(capsys, model_path, tmp_path / "bce", "--loss", "bce")
    x, labels = classification()
    targets = np.eye(CLASSES, dtype=np.float32)[labels]  # three yes-or-no answers per sample
    np.savez(tmp_path / "multi.npz", X=x, y=targets)
    status, out, _ = _train(capsys, art, tmp_path / "multi.npz", "--epochs", "2", "--batch-size", "30",
                            "--val-split", "0.25")  # fmt: skip
    assert status == 0 and "val accuracy" in out
    _, val_rows = split(len(x), 0.25, 0)
    scores = _scores(art, "trained_checkpoint", x[val_rows], tmp_path, capsys)
    expected = np.mean((scores > 0) == (targets[val_rows] > 0.5))  # per answer
    assert _history(art / "trained_checkpoint")[-1]["val_accuracy"] == expected


@pytest.mark.parametrize("options", [["--loss", "ce", "--no-scores"], ["--loss", "mse"]])
def test_no_accuracy_without_scores_or_classes(capsys, model_path: Path, tmp_path: Path, options: list[str]):
    art = _generate(capsys, model_path, tmp_path / "art", *options)
    x, labels = classification()
    target = labels if "ce" in options else np.eye(CLASSES, dtype=np.float32)[labels]
    np.savez(tmp_path / "d.npz", X=x, y=target)
    status, out, _ = _train(capsys, art, tmp_path / "d.npz", *RUN, "--val-split", "0.2")
    assert status == 0 and not [line for line in out.splitlines() if line.startswith("epoch ") and "accuracy" in line]
    assert all(e["train_accuracy"] is None and e["val_accuracy"] is None for e in _history(art / "trained_checkpoint"))
    outputs = [o.name for o in onnx.load(art / "training_model.onnx").graph.output]
    assert not any(name in outputs for name in (o.name for o in onnx.load(model_path).graph.output))


# ---------------------------------------------------------------- --val-data


def _split_files(folder: Path, val_split: float, seed: int) -> tuple[Path, Path]:
    """The samples --val-split would train on and hold out, as two files."""
    x, y = classification()
    train_rows, val_rows = split(len(x), val_split, seed)
    np.savez(folder / "train.npz", X=x[train_rows], y=y[train_rows])
    np.savez(folder / "val.npz", X=x[val_rows], y=y[val_rows])
    return folder / "train.npz", folder / "val.npz"


def test_validation_data_from_a_file_equals_the_same_rows_held_out(
    capsys, fresh_artifacts: Callable[[str], Path], data_path: Path, tmp_path: Path
):
    held_out, from_file = fresh_artifacts("held_out"), fresh_artifacts("from_file")
    train, val = _split_files(tmp_path, 0.2, 3)
    assert _train(capsys, held_out, data_path, *RUN, "--val-split", "0.2")[0] == 0
    status, out, err = _train(capsys, from_file, train, *RUN, "--val-data", val)
    assert (status, err) == (0, "")
    assert "96 samples (24 more for validation)" in out
    _assert_same_parameters(_state(held_out / "trained_checkpoint"), _state(from_file / "trained_checkpoint"))
    assert _history(held_out / "trained_checkpoint") == _history(from_file / "trained_checkpoint")


def test_val_data_and_val_split_exclude_each_other(capsys, artifacts: Path, data_path: Path):
    status, _, err = _train(capsys, artifacts, data_path, *RUN, "--val-split", "0.2", "--val-data", data_path)
    assert status == 2
    assert_error(err, "train", "--val-data", "--val-split")


def test_resume_with_other_validation_data_is_refused(capsys, artifacts: Path, tmp_path: Path):
    train, val = _split_files(tmp_path, 0.2, 3)
    assert _train(capsys, artifacts, train, "--epochs", "1", "--batch-size", "16", "--val-data", val)[0] == 0
    status, _, err = _train(capsys, artifacts, train, "--epochs", "2", "--batch-size", "16", "--val-data", train,
                            "--resume")  # fmt: skip
    assert status == 1
    assert_error(err, "train", "other validation data")
    status, _, err = _train(capsys, artifacts, train, "--epochs", "2", "--batch-size", "16", "--resume")
    assert_error(err, "train", "validation data from a file (now none)")


# ---------------------------------------------------------------- --schedule


def test_a_step_schedule_with_gamma_0_stops_after_the_first_step(capsys, fresh_artifacts, data_path: Path):
    """step_size 1, gamma 0: the rate is 0 from the second step on, so two more epochs change nothing."""
    once, scheduled = fresh_artifacts("once"), fresh_artifacts("scheduled")
    assert _train(capsys, once, data_path, "--epochs", "1", "--batch-size", "120")[0] == 0
    status, out, _ = _train(capsys, scheduled, data_path, "--epochs", "3", "--batch-size", "120", "--schedule", "step",
                            "--step-size", "1", "--gamma", "0")  # fmt: skip
    assert status == 0 and "learning rate: step schedule: times 0 every 1 steps" in out
    _assert_same_parameters(_state(once / "trained_checkpoint"), _state(scheduled / "trained_checkpoint"))
    assert _state(scheduled / "trained_checkpoint").optimizer.step == 3


def test_a_linear_warm_up_starts_at_rate_0(capsys, artifacts: Path, data_path: Path):
    status, _, _ = _train(capsys, artifacts, data_path, "--epochs", "1", "--batch-size", "120", "--schedule", "linear",
                          "--warmup-steps", "1")  # fmt: skip
    assert status == 0
    _assert_same_parameters(_state(artifacts / "checkpoint"), _state(artifacts / "trained_checkpoint"))


@pytest.mark.parametrize(
    ("options", "fragments"),
    [
        (["--warmup-steps", "3"], ["--warmup-steps", "need --schedule"]),
        (["--schedule", "cosine", "--gamma", "0.5"], ["--gamma applies to --schedule step and exponential"]),
        (["--schedule", "step"], ["--schedule step needs --step-size"]),
        (["--schedule", "exponential"], ["--schedule exponential needs --gamma"]),
        (["--schedule", "warm"], ["--schedule", "'warm'"]),
        (["--early-stopping", "3"], ["--early-stopping", "--val-split F or --val-data FILE"]),
        (["--early-stopping", "0", "--val-split", "0.2"], ["--early-stopping", "0 is less than 1"]),
    ],
)
def test_schedule_and_early_stopping_usage_errors(
    capsys, artifacts: Path, data_path: Path, options: list[str], fragments: list[str]
):
    status, out, err = _train(capsys, artifacts, data_path, *RUN, *options)
    assert status == 2 and out == ""
    assert_error(err, "train", *fragments)
    assert not (artifacts / "trained_checkpoint").exists()


def test_a_warm_up_longer_than_the_run(capsys, artifacts: Path, data_path: Path):
    status, _, err = _train(capsys, artifacts, data_path, *RUN, "--schedule", "cosine", "--warmup-steps", "100")
    assert status == 1
    assert_error(err, "train", "--warmup-steps 100 is more than the run's 32 optimizer steps")


def test_resume_with_another_schedule_is_refused(capsys, artifacts: Path, data_path: Path):
    first = ["--epochs", "1", "--batch-size", "16", "--schedule", "cosine", "--warmup-steps", "2"]
    assert _train(capsys, artifacts, data_path, *first)[0] == 0
    status, _, err = _train(capsys, artifacts, data_path, "--epochs", "2", "--batch-size", "16", "--resume")
    assert status == 1
    assert_error(err, "train", "learning-rate schedule cosine (warmup_steps 2) (now constant)", "--schedule")


# ---------------------------------------------------------------- --early-stopping


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory, shared: Path) -> Path:
    """Artifacts trained with early stopping (a run that stops before its 30 epochs)."""
    directory = Path(shutil.copytree(shared / "art", tmp_path_factory.mktemp("stopped") / "art"))
    status, _, err = _quiet_train(directory, shared / "data.npz", *STOPPING)
    assert (status, err) == (0, ""), err
    return directory


def _quiet_train(directory: Path, data: Path, *options: str) -> tuple[int, str, str]:
    import contextlib
    import io

    from onnxtrain.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["train", str(directory), "--data", str(data), *options])
    return status, out.getvalue(), err.getvalue()


def test_early_stopping_stops_and_keeps_the_best_epoch(capsys, stopped: Path, data_path: Path, fresh_artifacts):
    record = _record(stopped / "trained_checkpoint")
    best = record.best
    assert record.stopped_early and record.epoch < 30 and best is not None
    assert record.epoch - best.epoch == 2
    history = _history(stopped / "trained_checkpoint")
    assert best.val_loss == min(entry["val_loss"] for entry in history)
    kept = _record(stopped / "best_checkpoint")
    assert (kept.epoch, kept.batch) == (best.epoch, 0)
    again = fresh_artifacts("again")  # a run of exactly the best epochs: the same parameters
    assert _train(capsys, again, data_path, *["--epochs", str(best.epoch), *STOPPING[2:-2]])[0] == 0
    _assert_same_parameters(_state(stopped / "best_checkpoint"), _state(again / "trained_checkpoint"))


def test_the_command_says_it_stopped_and_resume_has_nothing_to_do(capsys, fresh_artifacts, data_path: Path):
    directory = fresh_artifacts("art")
    status, out, _ = _train(capsys, directory, data_path, *STOPPING)
    assert status == 0
    assert "stopped early after epoch" in out and "best_checkpoint" in out and "--checkpoint best" in out
    before = (directory / "trained_checkpoint").read_bytes()
    status, out, _ = _train(capsys, directory, data_path, *STOPPING, "--resume")
    assert status == 0 and "nothing to do" in out and "stopped early" in out
    assert (directory / "trained_checkpoint").read_bytes() == before


def test_export_the_best_checkpoint(capsys, stopped: Path, tmp_path: Path):
    status, out, err = cli(capsys, "export", stopped, "-o", tmp_path / "best.onnx", "--checkpoint", "best")
    assert (status, err) == (0, "")
    assert str(stopped / "best_checkpoint") in out
    best = _state(stopped / "best_checkpoint").trainable
    exported = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(tmp_path / "best.onnx").graph.initializer}
    for name, array in best.items():
        np.testing.assert_array_equal(exported[name], array)


def test_export_best_without_a_best_checkpoint(capsys, artifacts: Path, tmp_path: Path):
    status, _, err = cli(capsys, "export", artifacts, "-o", tmp_path / "m.onnx", "--checkpoint", "best")
    assert status == 1
    assert_error(err, "export", "best_checkpoint", "--early-stopping")
    assert not (tmp_path / "m.onnx").exists()


def test_restart_replaces_the_best_checkpoint_and_a_new_run_keeps_it(
    capsys, fresh_artifacts, data_path: Path, tmp_path: Path
):
    directory = fresh_artifacts("art")
    assert _train(capsys, directory, data_path, *STOPPING)[0] == 0
    (directory / "trained_checkpoint").rename(tmp_path / "kept_elsewhere")
    status, _, err = _train(capsys, directory, data_path, *RUN)
    assert status == 1
    assert_error(err, "train", "best_checkpoint", "--restart")
    assert (directory / "best_checkpoint").exists()
    assert _train(capsys, directory, data_path, *RUN, "--restart")[0] == 0
    assert not (directory / "best_checkpoint").exists()
    assert not [p.name for p in directory.iterdir() if "best_checkpoint" in p.name]  # its hidden files too


def _at_step(monkeypatch: pytest.MonkeyPatch, step: int, error: BaseException) -> None:
    """Make the ``step``-th train step (counted from 1) raise ``error``."""
    original = Module.__call__
    steps = [0]

    def call(self: Module, *args: object, **kwargs: object) -> object:
        if self.training:
            steps[0] += 1
            if steps[0] == step:
                raise error
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Module, "__call__", call)


def test_a_run_with_every_option_resumes_exactly_after_a_crash(
    capsys, monkeypatch: pytest.MonkeyPatch, fresh_artifacts, tmp_path: Path
):
    train, val = _split_files(tmp_path, 0.25, 1)
    options = ["--epochs", "12", "--batch-size", "16", "--val-data", val, "--schedule", "cosine", "--warmup-steps",
               "5", "--min-lr", "0.001", "--early-stopping", "3", "--checkpoint-every", "5"]  # fmt: skip
    whole, crashed = fresh_artifacts("whole"), fresh_artifacts("crashed")
    assert _train(capsys, whole, train, *options)[0] == 0
    steps = _state(whole / "trained_checkpoint").optimizer.step
    with monkeypatch.context() as patch:
        _at_step(patch, steps - 4, RuntimeError("the machine went away"))
        with pytest.raises(RuntimeError, match="went away"):
            _train(capsys, crashed, train, *options)
    status, out, err = _train(capsys, crashed, train, *options, "--resume")
    assert (status, err) == (0, "") and "resuming" in out
    for name in ("trained_checkpoint", "best_checkpoint"):
        a, b = _state(whole / name), _state(crashed / name)
        _assert_same_parameters(a, b)
        assert a.properties == b.properties
    assert _state(whole / "trained_checkpoint").optimizer == _state(crashed / "trained_checkpoint").optimizer


# ---------------------------------------------------------------- --accumulate


@pytest.mark.parametrize(("batch", "accumulate"), [(8, 3), (7, 3)])  # 120 samples: 15 batches; 17 and one of 1 row
def test_accumulated_batches_train_as_batches_as_large_as_their_group(
    capsys, fresh_artifacts, data_path: Path, batch: int, accumulate: int
):
    small, large = fresh_artifacts("small"), fresh_artifacts("large")
    options = ["--epochs", "3", "--seed", "3"]
    status, out, err = _train(capsys, small, data_path, *options, "--batch-size", batch, "--accumulate", accumulate)
    assert (status, err) == (0, "")
    batches = -(-120 // batch)
    steps = -(-batches // accumulate)  # the last group of 7 + 7 + 1 rows
    assert f"{batches} batches of {batch} accumulated {accumulate} to a step ({steps} optimizer steps of up to" in out
    assert _train(capsys, large, data_path, *options, "--batch-size", batch * accumulate)[0] == 0
    a, b = _state(small / "trained_checkpoint"), _state(large / "trained_checkpoint")
    assert a.optimizer.step == b.optimizer.step == 3 * steps
    for name in b.trainable:
        np.testing.assert_allclose(a.trainable[name], b.trainable[name], rtol=1e-4, atol=1e-6, err_msg=name)
    histories = _history(small / "trained_checkpoint"), _history(large / "trained_checkpoint")
    for mine, theirs in zip(*histories, strict=True):
        assert mine["train_loss"] == pytest.approx(theirs["train_loss"], rel=1e-5)
        assert mine["train_accuracy"] == theirs["train_accuracy"]
    assert _record(small / "trained_checkpoint").accumulate == accumulate


def test_a_crash_within_a_group_resumes_from_the_groups_start_exactly(
    capsys, monkeypatch: pytest.MonkeyPatch, fresh_artifacts, data_path: Path
):
    options = ["--epochs", "2", "--batch-size", "8", "--accumulate", "4", "--seed", "1", "--checkpoint-every", "1"]
    whole, crashed = fresh_artifacts("whole"), fresh_artifacts("crashed")
    assert _train(capsys, whole, data_path, *options)[0] == 0
    with monkeypatch.context() as patch:
        _at_step(patch, 7, RuntimeError("the machine went away"))  # the second group's third batch
        with pytest.raises(RuntimeError, match="went away"):
            _train(capsys, crashed, data_path, *options)
    record = _record(crashed / "trained_checkpoint")
    assert (record.epoch, record.batch, _state(crashed / "trained_checkpoint").optimizer.step) == (0, 4, 1)
    status, out, err = _train(capsys, crashed, data_path, *options, "--resume")
    assert (status, err) == (0, "") and "resuming" in out and "batch 4 (step 1)" in out
    a, b = _state(whole / "trained_checkpoint"), _state(crashed / "trained_checkpoint")
    _assert_same_parameters(a, b)
    assert a.optimizer == b.optimizer and a.properties == b.properties


def test_resume_with_another_accumulation_is_refused(capsys, artifacts: Path, data_path: Path):
    assert _train(capsys, artifacts, data_path, "--epochs", "1", "--batch-size", "16", "--accumulate", "3")[0] == 0
    status, _, err = _train(capsys, artifacts, data_path, "--epochs", "2", "--batch-size", "16", "--resume")
    assert status == 1
    assert_error(err, "train", "gradient accumulation 3 batches a step (now off)", "--accumulate")


# ---------------------------------------------------------------- --reshape


def test_rows_of_values_are_reshaped_only_with_reshape(capsys, tmp_path: Path):
    """A model of 2x2 images: a .csv of 4 values per row needs --reshape."""
    net = TinyMLP()
    with onnxblock.empty_base() as base:
        base.add_input("image", onnx.helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, ["batch", 2, 2]))
        net(onnxblock.blocks.Flatten(axis=1)("image"))
    onnx.save(net.to_model_proto(), tmp_path / "images.onnx")
    art = _generate(capsys, tmp_path / "images.onnx", tmp_path / "art", "--loss", "ce")
    x, y = classification()
    np.savetxt(tmp_path / "images.csv", np.column_stack([x, y]), delimiter=",", fmt="%.9g")
    status, _, err = _train(capsys, art, tmp_path / "images.csv", *RUN)
    assert status == 1
    assert_error(err, "train", "[120, 4]", "[2, 2] per sample", "--reshape")
    status, _, err = _train(capsys, art, tmp_path / "images.csv", *RUN, "--reshape")
    assert (status, err) == (0, "")
    assert FEATURES == 4


def test_the_resume_command_repeats_every_option():
    """What Ctrl-C prints to continue a run parses back to the same run, with --resume."""
    from onnxtrain.cli import build_parser
    from onnxtrain.cli.train import resume_command

    argv = ["train", "art", "--data", "a b.csv", "--epochs", "9", "--batch-size", "8", "--val-data", "v.csv",
            "--checkpoint-every", "5", "--schedule", "cosine", "--warmup-steps", "3", "--min-lr", "0.001",
            "--early-stopping", "2", "--target-column", "label", "--reshape", "--seed", "4",
            "--accumulate", "2"]  # fmt: skip
    args = build_parser().parse_args(argv)
    again = build_parser().parse_args(shlex.split(resume_command(args))[1:])
    assert again.resume and vars(again) == {**vars(args), "resume": True}
