"""The training loop over an artifact directory: epochs of shuffled batches, checkpoints, and exact resumes.

Each step is ONNX Runtime's ``loss = module(*batch); optimizer.step();
module.lazy_reset_grad()`` (with ``Settings.accumulate``, the train steps of
that many batches before each optimizer step,
:mod:`onnxtrain.training.batch_step`). The state goes to ``trained_checkpoint`` (the
initial ``checkpoint`` is never written): when the run starts, every
``checkpoint_every`` optimizer steps (by default after every epoch), at the
end, and when the run is interrupted (``KeyboardInterrupt``; Ctrl-C is taken
between steps, :mod:`onnxtrain.loop.interrupts`; after a second Ctrl-C, which
stops at once, the last checkpoint stands). With the
optimizer state and the run record (:mod:`onnxtrain.loop.record`) in it, a
resumed run takes the same steps on the same batches as an uninterrupted one,
with the same results bit for bit: the batches are a function of the seed and
the epoch (:mod:`onnxtrain.loop.batches`), and the optimizer continues from
its saved step count, moments and learning rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx

from onnxtrain import checkpoint
from onnxtrain.checkpoint.state import DEFAULT_LEARNING_RATE
from onnxtrain.distributed import DistributedOptimizer, batch_communicator, broadcast_parameters, session_options
from onnxtrain.loop.batches import batch_count, fingerprint, split, step_count
from onnxtrain.loop.data import fit_to_inputs, load_data
from onnxtrain.loop.files import ArtifactFiles
from onnxtrain.loop.metrics import Accuracy, accuracy_of
from onnxtrain.loop.record import RunRecord, stored_learning_rate
from onnxtrain.loop.settings import Settings
from onnxtrain.loop.steps import Echo, Loop, Measures, Rows, RunResult
from onnxtrain.training import Module, Optimizer, TrainingState
from onnxtrain.training.finite import check_finite_rows
from onnxtrain.training.model_io import ParameterInfo, eval_io, training_io
from onnxtrain.training.models import load_model
from onnxtrain.training.tensor_spec import TensorSpec


def parameter_infos(state: checkpoint.CheckpointState) -> dict[str, ParameterInfo]:
    """What the runtime checks the models against: each parameter's trainability, dtype and shape."""
    return {
        name: ParameterInfo(name in state.trainable, array.dtype, tuple(array.shape))
        for name, array in state.parameters.items()
    }


def user_inputs(files: ArtifactFiles, state: checkpoint.CheckpointState) -> tuple[TensorSpec, ...]:
    """The training model's user inputs (names, dtypes, dimensions), checked against the checkpoint."""
    model = load_model(files.training_model, "training model").proto
    return training_io(model, parameter_infos(state)).inputs.specs


def train(
    files: ArtifactFiles,
    data: str | Path | Sequence[np.ndarray],
    settings: Settings,
    *,
    resume: bool = False,
    restart: bool = False,
    device: str | None = None,
    target_column: str | Sequence[str] | None = None,
    echo: Echo | None = print,
    report_every: int = 1,
    val_label: str = "val",
    progress: bool | None = None,
    distributed: bool = False,
    val_data: str | Path | Sequence[np.ndarray] | None = None,
    reshape: bool = False,
) -> RunResult:
    """Train the artifacts in ``files`` on ``data`` (a file for :func:`~onnxtrain.loop.data.load_data`, or arrays).

    An existing ``trained_checkpoint`` is continued with ``resume`` (whose
    data, batch size, seed, split, validation data, schedule and early
    stopping must be the earlier run's) or replaced with ``restart`` (its
    best checkpoint too); otherwise it is an error. ``val_data`` (a file or
    arrays, as ``data``) is the validation data, instead of
    ``settings.val_split``; ``reshape`` reshapes rows of values to the
    inputs' shapes (:func:`~onnxtrain.loop.data.fit_to_inputs`). ``echo``
    gets one line per ``report_every`` epochs (and the first and last);
    ``progress`` draws bars (``None``: when standard output is a terminal).
    Raises :class:`~onnxtrain.loop.steps.TrainingInterrupted` after saving,
    on ``KeyboardInterrupt``; saves, then raises, on ``BrokenPipeError``
    from ``echo``. Error messages name the ``onnxtrain train`` options
    (``--resume``, ...). ``distributed``: under ``mpiexec``, every rank runs
    this with the same arguments and trains on its part of every batch
    (``batch_size`` a multiple of the number of ranks), averaging the
    gradients (:mod:`onnxtrain.distributed`); rank 0 alone writes
    checkpoints and echoes.
    """
    if val_data is not None and settings.val_split:
        raise ValueError("--val-data and --val-split exclude each other: give the validation data one way")
    if settings.early_stopping is not None and val_data is None and not settings.val_split:
        raise ValueError(
            "--early-stopping watches the validation loss: give validation data with --val-split F or --val-data FILE"
        )
    comm = batch_communicator(settings.batch_size, "--batch-size {}") if distributed else None
    if comm is not None and comm.Get_rank() != 0:
        echo, progress = None, False
    files.require(files.training_model, files.eval_model, files.optimizer_model, files.checkpoint)
    source = _starting_checkpoint(files, resume, restart)
    try:
        saved = checkpoint.load(source)
    except checkpoint.CheckpointError as error:
        if source == files.checkpoint:
            raise
        raise checkpoint.CheckpointError(
            f"{error}; the run cannot be resumed from it: pass --restart to start again from {files.checkpoint}"
        ) from None
    earlier = RunRecord.from_properties(saved.properties) if resume else None
    if resume and earlier is None:
        raise ValueError(f"{source} holds no training run to resume; pass --restart to start from {files.checkpoint}")
    if resume and saved.optimizer is None:  # re-saved without it: resuming would restart the optimizer's moments
        raise ValueError(
            f"{source} holds a training run ({earlier.position()}) but no optimizer state, so it cannot be resumed "
            "exactly: the optimizer's moments and step count would restart. Save it with "
            f"include_optimizer_state=True, or pass --restart to start from {files.checkpoint}"
        )
    inputs = user_inputs(files, saved)
    arrays = _arrays(data, inputs, target_column, reshape, "the data")
    train_rows, val_rows = split(len(arrays[0]), settings.val_split, settings.seed)
    per_rank = settings.batch_size if comm is None else settings.batch_size // comm.Get_size()
    _check_fixed_batch_axis(inputs, per_rank, len(train_rows) if comm is None else None)
    validation = Rows(arrays, val_rows)
    if val_data is not None:
        val_arrays = _arrays(val_data, inputs, target_column, reshape, "the validation data")
        validation = Rows(val_arrays, np.arange(len(val_arrays[0])))
    record = RunRecord(
        settings.epochs, settings.seed, settings.val_split, settings.batch_size, len(arrays[0]), fingerprint(arrays),
        learning_rate=DEFAULT_LEARNING_RATE, val_data="" if val_data is None else fingerprint(validation.arrays),
        schedule="" if settings.schedule is None else settings.schedule.to_json(),
        patience=settings.early_stopping or 0, accumulate=settings.accumulate,
    )  # fmt: skip
    if earlier is not None:
        differences = earlier.differences(record)
        if differences:
            raise ValueError(
                f"cannot resume the run in {source}: it used {'; '.join(differences)}; pass the same data, "
                "--batch-size, --accumulate, --seed, validation data (--val-split or --val-data), --schedule and "
                "--early-stopping, or --restart"
            )
        if earlier.epoch >= settings.epochs or earlier.stopped_early:
            return RunResult(earlier, source, 0)  # nothing left to do
        record = replace(earlier, epochs=settings.epochs)
    eval_model = load_model(files.eval_model, "eval model").proto  # read here, so that errors name the file
    load_model(files.optimizer_model, "optimizer model")
    state = TrainingState(saved)
    options = None if comm is None else session_options(comm)  # the machine's cores shared among its ranks
    module = Module(
        files.training_model, state, files.eval_model, device=device, session_options=options, seed=settings.seed
    )  # the random draws (Dropout) a function of the seed and the step, as the batches are: resumable
    _check_labels(module, arrays, "the data")  # every row before any step or checkpoint: errors name the row
    check_finite_rows(arrays, [spec.name for spec in inputs], "the data", eval_model)
    module.check_ids(arrays, "the data")
    if val_data is not None:
        _check_labels(module, validation.arrays, "the validation data")
        check_finite_rows(
            validation.arrays, [spec.name for spec in inputs], "the validation data", eval_model, trained=False
        )
        module.check_ids(validation.arrays, "the validation data")
    optimizer = Optimizer(files.optimizer_model, module)
    rate = settings.learning_rate
    if rate is None and earlier is None:  # a resumed run keeps the rate its optimizer state holds
        stored = stored_learning_rate(saved.properties)
        rate = DEFAULT_LEARNING_RATE if stored is None else stored
    total_steps = settings.epochs * step_count(len(train_rows), settings.batch_size, settings.accumulate)
    if settings.schedule is not None:  # the rate for the saved step count: a resumed run continues on it
        initial = optimizer.initial_learning_rate if rate is None else rate
        settings.schedule.scheduler(optimizer, initial, total_steps)  # attached to the optimizer, which steps it
    elif rate is not None:
        optimizer.set_learning_rate(rate)
    record = replace(record, learning_rate=optimizer.initial_learning_rate)
    if echo is not None:
        ranks = 1 if comm is None else comm.Get_size()
        echo(_start_line(record, source, len(train_rows), len(validation.rows), optimizer.step_count, earlier, ranks))
        if settings.schedule is not None:
            echo(f"learning rate: {settings.schedule.describe(total_steps)}")
    # the best state of the run this one replaces, removed when this one first saves
    replaced = [files.best_checkpoint] if earlier is None and files.best_checkpoint.exists() else []
    if comm is not None:
        broadcast_parameters(state, comm=comm)
        optimizer = DistributedOptimizer(optimizer, comm)  # type: ignore[assignment]
    measures = Measures(
        accuracy_of(module.train_model.proto, module.io.outputs, module.io.inputs.specs),
        _eval_accuracy(eval_model, saved) if len(validation.rows) else None,
    )
    best = files.best_checkpoint if settings.early_stopping is not None else None
    loop = Loop(
        module, optimizer, state, files.trained_checkpoint, record, (Rows(arrays, train_rows), validation), comm,
        measures=measures, best_path=best, replaced=replaced,
    )  # fmt: skip
    return loop.run(settings, echo, report_every, val_label, progress, fresh=earlier is None)


def _check_fixed_batch_axis(inputs: Sequence[TensorSpec], batch_size: int, rows: int | None) -> None:
    """``ValueError`` before any step where an input takes a fixed number of rows (a model exported without a
    dynamic batch axis) that the batches of ``batch_size`` (and the last of ``rows``, where known) do not have: the
    run failed at the first batch of another size, the epoch's last."""
    last = None if rows is None else rows % batch_size or batch_size
    for spec in inputs:
        fixed = spec.dims[0] if spec.dims else None
        if not isinstance(fixed, int) or (batch_size == fixed and last in (None, fixed)):
            continue
        sizes = f"batches of {batch_size}" + ("" if last in (None, batch_size) else f" and a last one of {last}")
        raise ValueError(
            f"input {spec.name!r} takes a fixed batch of {fixed} row(s): the model was exported without a dynamic "
            f"batch axis, and the data's {sizes} do not fit. Export it with one (torch.onnx.export(..., "
            f"dynamic_axes={{{spec.name!r}: {{0: 'batch'}}}}), or dynamic_shapes with dynamo=True), or train with "
            f"--batch-size {fixed} on a number of samples that is a multiple of {fixed}"
        )


def _arrays(
    data: str | Path | Sequence[np.ndarray],
    inputs: Sequence[TensorSpec],
    target_column: str | Sequence[str] | None,
    reshape: bool,
    what: str,
) -> list[np.ndarray]:
    """One array per user input, from a file or from arrays."""
    if isinstance(data, (str, Path)):
        return load_data(data, inputs, target_column, reshape)
    named = [(f"array {i}", array) for i, array in enumerate(data)]
    return fit_to_inputs(named, inputs, what, reshape)


def _eval_accuracy(model: onnx.ModelProto, state: checkpoint.CheckpointState) -> Accuracy | None:
    """How to measure the accuracy from the eval model's outputs, if it outputs the class scores."""
    io = eval_io(model, parameter_infos(state))
    return accuracy_of(model, io.outputs, io.inputs.specs)


def _starting_checkpoint(files: ArtifactFiles, resume: bool, restart: bool) -> Path:
    """The checkpoint a run starts from; ``ValueError`` for an earlier run neither resumed nor restarted."""
    if resume and restart:
        raise ValueError("resume and restart exclude each other: choose one")
    trained = files.trained_checkpoint
    if resume:
        if not trained.is_file():
            raise FileNotFoundError(f"no earlier run to resume: {trained} does not exist; train without --resume")
        return trained
    if trained.exists() and not restart:
        try:
            record = RunRecord.from_properties(checkpoint.load(trained).properties)
            where = f" ({record.position()})" if record is not None else ""
        except ValueError:
            where = " (its run record cannot be read)"
        raise ValueError(
            f"{trained} holds an earlier run{where}: pass --resume to continue it or --restart to start again "
            f"from {files.checkpoint}"
        )
    if files.best_checkpoint.exists() and not restart:
        raise ValueError(
            f"{files.best_checkpoint} holds the best state of an earlier run: pass --restart to start again from "
            f"{files.checkpoint} (a new run replaces it), or move it elsewhere to keep it"
        )
    return files.checkpoint


def _check_labels(module: Module, arrays: Sequence[np.ndarray], what: str) -> None:
    """The module's label check, its error saying the command's option for a label to skip."""
    try:
        module.check_labels(arrays, what)
    except ValueError as error:
        raise ValueError(
            f"{error}; with this command, regenerate the artifacts with onnxtrain generate ... --ignore-index LABEL"
        ) from None


def _start_line(
    record: RunRecord, source: Path, train: int, val: int, step: int, earlier: RunRecord | None, ranks: int = 1
) -> str:
    """What the run is about to do (on ``ranks`` ranks, each taking an equal part of every batch)."""
    held_out = f" ({val} more {'for' if record.val_data else 'held out for'} validation)" if val else ""
    if train % ranks:  # batch_shares leaves them out, drawn anew each epoch
        left = train % ranks
        held_out += (
            f" ({left} left out of each epoch, drawn anew each time: the {ranks} ranks take equal parts; "
            f"{train - left} or {train - left + ranks} training samples train as one process does)"
        )
    count = batch_count(train, record.batch_size)
    batches = f"{count} batches of {record.batch_size}" if count > 1 else f"1 batch of {min(train, record.batch_size)}"
    if record.accumulate > 1:
        steps = step_count(train, record.batch_size, record.accumulate)
        batches += (
            f" accumulated {record.accumulate} to a step ({steps} optimizer step{'' if steps == 1 else 's'} of up to "
            f"{min(record.accumulate * record.batch_size, train)} samples)"
        )
    what = f"{train} samples{held_out}, {batches} per epoch, learning rate {record.learning_rate:g}"
    if earlier is not None:
        return f"resuming {source} at {record.position()} (step {step}): {what}"
    return f"training from {source}: {what}"


__all__ = ["parameter_infos", "train", "user_inputs"]
