"""``onnxtrain train``: train an artifact directory on data from a file, with checkpoints and exact resumes.

Besides the loss, each epoch reports the accuracy where the loss implies
classes; options add validation data from a file, a learning-rate schedule
and early stopping that keeps the best state (docs/cli.md).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onnxtrain.cli.common import (
    INTERRUPTED,
    CommandError,
    Parser,
    UsageError,
    count,
    fraction,
    non_negative,
)

if TYPE_CHECKING:
    from onnxtrain.loop import Settings

#: ``--schedule`` choices: ``constant`` and ``onnxtrain.loop.schedule.KINDS`` (not imported, to keep --help fast).
SCHEDULES = ("constant", "linear", "cosine", "step", "exponential")


def add_parser(subcommands: Any) -> None:
    """Add ``train`` to the ``onnxtrain`` parser's subcommands."""
    parser: Parser = subcommands.add_parser(
        "train",
        help="train the artifacts in a directory on data from an .npz or a .csv",
        description="Train the artifacts in DIR on the data in FILE; the state goes to DIR/trained_checkpoint "
        "(DIR/checkpoint stays the initial state). An .npz holds arrays named after the training model's inputs "
        "(or X and y); a .csv holds numbers, the target in the last column (or --target-column).",
    )
    parser.add_argument("directory", metavar="DIR", type=Path, help="the artifacts, from `onnxtrain generate`")
    parser.add_argument("--data", required=True, type=Path, metavar="FILE", help="FILE.npz or FILE.csv")
    parser.add_argument("--epochs", required=True, type=count(1), metavar="N", help="epochs of the whole run")
    parser.add_argument("--batch-size", required=True, type=count(1), metavar="B", help="the last batch may be smaller")
    parser.add_argument(
        "--accumulate", type=count(1), default=1, metavar="K",
        help="accumulate the gradients of K batches into each optimizer step, each batch weighted by what its loss "
        "averages (its samples; for ce and nll its labels not --ignore-index): the step of a batch of K*B samples "
        "in the memory of one of B (default 1)",
    )  # fmt: skip
    validation = parser.add_mutually_exclusive_group()
    validation.add_argument(
        "--val-split", type=fraction, metavar="F", help="hold out this fraction of the samples for validation"
    )
    validation.add_argument(
        "--val-data", type=Path, metavar="FILE", help="validation data from FILE.npz or FILE.csv (as --data)"
    )
    parser.add_argument(
        "--checkpoint-every", type=count(1), metavar="N",
        help="save every N optimizer steps (default: after every epoch); always at the end",
    )  # fmt: skip
    again = parser.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help="continue the run in DIR/trained_checkpoint")
    again.add_argument("--restart", action="store_true", help="start again from DIR/checkpoint, replacing the run")
    parser.add_argument(
        "--lr", type=non_negative, metavar="LR",
        help="the learning rate (default: the one `generate --lr` stored, or the resumed run's, else 1e-3)",
    )  # fmt: skip
    parser.add_argument(
        "--schedule", choices=SCHEDULES, default="constant",
        help="how the learning rate changes with the optimizer steps: linear or cosine decay over the run (after "
        "--warmup-steps), step (times --gamma every --step-size steps), exponential (times --gamma every step)",
    )  # fmt: skip
    parser.add_argument("--warmup-steps", type=count(0), metavar="N", help="linear, cosine: warm-up from 0 (0)")
    parser.add_argument("--min-lr", type=non_negative, metavar="LR", help="cosine: the rate at the end (0)")
    parser.add_argument("--step-size", type=count(1), metavar="N", help="step: steps between decays")
    parser.add_argument("--gamma", type=non_negative, metavar="G", help="step (default 0.1), exponential: the factor")
    parser.add_argument(
        "--early-stopping", type=count(1), metavar="PATIENCE",
        help="stop after PATIENCE epochs without a lower validation loss; the best state goes to "
        "DIR/best_checkpoint (needs --val-split or --val-data)",
    )  # fmt: skip
    parser.add_argument("--seed", type=count(0), default=0, metavar="S", help="fixes the split and the order (0)")
    parser.add_argument(
        "--device", default="cpu", type=device_option, metavar="DEVICE", help="cpu (default), cuda or cuda:N"
    )
    parser.add_argument(
        "--target-column", nargs="+", action="extend", metavar="NAME_OR_INDEX",
        help="the .csv column(s) holding the target (default: the last, or as many last ones as the target takes "
        "values per sample)",
    )  # fmt: skip
    parser.add_argument(
        "--reshape", action="store_true",
        help="reshape each sample's row of values to the input's shape, in C order (a .csv for an image model)",
    )  # fmt: skip
    parser.add_argument("--prefix", default="", help="the artifacts' file-name prefix (as given to generate)")
    parser.add_argument(
        "--distributed", action="store_true",
        help="under mpiexec: each rank trains on its part of every batch, gradients averaged (needs onnxtrain[mpi])",
    )  # fmt: skip
    parser.set_defaults(run=run, prog=parser.prog)


def device_option(text: str) -> str:
    """An argument type: ``cpu``, ``cuda`` or ``cuda:N``, in lower case."""
    kind, colon, index = text.strip().lower().partition(":")
    if (kind == "cpu" and not colon) or (kind == "cuda" and (not colon or index.isdigit())):
        return f"{kind}{colon}{index}"
    raise argparse.ArgumentTypeError(f"{text!r} is not a device: give cpu, cuda or cuda:N")


def check_device(device: str) -> None:
    """``CommandError`` when this onnxruntime cannot run on ``device`` (CUDA needs onnxruntime-gpu)."""
    if device == "cpu":
        return
    import onnxruntime as ort

    available = ort.get_available_providers()
    if "CUDAExecutionProvider" not in available:
        raise CommandError(
            f"--device {device}: this onnxruntime runs on the CPU only (its execution providers: "
            f"{', '.join(available)}); install onnxruntime-gpu for CUDA, or pass --device cpu (the default)"
        )


def run(args: argparse.Namespace) -> int:
    """Train; on Ctrl-C save the state and say how to resume (exit status 130)."""
    from onnxtrain.loop import ArtifactFiles, TrainingInterrupted, measured, stopped_line, train

    settings = run_settings(args)
    check_device(args.device)
    files = ArtifactFiles.at(args.directory, args.prefix)
    try:
        result = train(
            files, args.data, settings, resume=args.resume, restart=args.restart, device=args.device,
            target_column=args.target_column, distributed=args.distributed, val_data=args.val_data,
            reshape=args.reshape,
        )  # fmt: skip
    except TrainingInterrupted as stop:
        print(f"{args.prog}: interrupted at {stop.record.position()}; saved in {stop.checkpoint}", file=sys.stderr)
        print(f"continue with: {resume_command(args)}", file=sys.stderr)
        return INTERRUPTED
    if args.distributed:
        from onnxtrain import distributed

        if distributed.rank() != 0:  # the ranks hold the same run: rank 0 reports it
            return 0
    record = result.record
    if result.steps == 0 and args.resume:
        if record.stopped_early:
            print(f"nothing to do: the run in {result.checkpoint} {stopped_line(record, files.best_checkpoint)}")
        else:
            print(
                f"nothing to do: the run in {result.checkpoint} finished {record.epoch} epochs; pass --epochs with "
                "more to train further"
            )
        return 0
    last = record.history[-1] if record.history else None
    losses = "" if last is None else f", {measured(last)}"
    print(f"done: {record.position()}{losses}; the state is in {result.checkpoint}")
    if record.patience and record.best is not None:
        if not record.stopped_early:  # the line that says it stopped names the best state already
            print(f"the best state, epoch {record.best.epoch}, is in {files.best_checkpoint}")
        print(f"next: onnxtrain export {args.directory} -o model.onnx --checkpoint best")
    else:
        print(f"next: onnxtrain export {args.directory} -o model.onnx")
    return 0


def run_settings(args: argparse.Namespace) -> Settings:
    """The run's :class:`~onnxtrain.loop.Settings` from the options; ``UsageError`` for options that do not fit."""
    from onnxtrain.loop import Schedule, Settings

    values = {name: getattr(args, name) for name in ("warmup_steps", "min_lr", "step_size", "gamma")}
    if args.schedule == "constant":
        given = [f"--{name.replace('_', '-')}" for name, value in values.items() if value is not None]
        if given:
            raise UsageError(f"{', '.join(given)} need --schedule (linear, cosine, step or exponential)")
    if args.early_stopping is not None and args.val_split is None and args.val_data is None:
        raise UsageError("--early-stopping watches the validation loss: give --val-split F or --val-data FILE")
    try:
        schedule = None if args.schedule == "constant" else Schedule(args.schedule, **values)
    except ValueError as error:
        raise UsageError(str(error)) from None
    return Settings(
        args.epochs, args.batch_size, args.seed, args.val_split or 0.0, args.checkpoint_every, args.lr, schedule,
        args.early_stopping, args.accumulate,
    )  # fmt: skip


def resume_command(args: argparse.Namespace) -> str:
    """The command line that continues this run."""
    words = ["onnxtrain", "train", str(args.directory), "--data", str(args.data)]
    words += ["--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--seed", str(args.seed)]
    if args.accumulate != 1:
        words += ["--accumulate", str(args.accumulate)]
    if args.val_split:
        words += ["--val-split", repr(args.val_split)]
    if args.val_data is not None:
        words += ["--val-data", str(args.val_data)]
    if args.checkpoint_every is not None:
        words += ["--checkpoint-every", str(args.checkpoint_every)]
    if args.schedule != "constant":
        words += ["--schedule", args.schedule]
    for option in ("warmup_steps", "min_lr", "step_size", "gamma", "early_stopping"):
        if getattr(args, option) is not None:
            words += [f"--{option.replace('_', '-')}", str(getattr(args, option))]
    if args.target_column is not None:
        words += ["--target-column", *args.target_column]
    if args.reshape:
        words += ["--reshape"]
    if args.prefix:
        words += ["--prefix", args.prefix]
    if args.device != "cpu":
        words += ["--device", args.device]
    if args.distributed:
        words += ["--distributed"]
    return shlex.join([*words, "--resume"])


__all__ = ["SCHEDULES", "add_parser", "check_device", "device_option", "resume_command", "run", "run_settings"]
