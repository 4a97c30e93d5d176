"""``onnxtrain train``: train an artifact directory on data from a file, with checkpoints and exact resumes."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from onnxtrain.cli.common import INTERRUPTED, CommandError, Parser, count, fraction, non_negative


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
        "--val-split", type=fraction, metavar="F", help="hold out this fraction of the samples for validation"
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
    parser.add_argument("--seed", type=count(0), default=0, metavar="S", help="fixes the split and the order (0)")
    parser.add_argument(
        "--device", default="cpu", type=device_option, metavar="DEVICE", help="cpu (default), cuda or cuda:N"
    )
    parser.add_argument(
        "--target-column", metavar="NAME_OR_INDEX", help="the .csv column holding the target (default: the last)"
    )
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
    from onnxtrain.loop import ArtifactFiles, Settings, TrainingInterrupted, train

    check_device(args.device)
    files = ArtifactFiles.at(args.directory, args.prefix)
    settings = Settings(args.epochs, args.batch_size, args.seed, args.val_split or 0.0, args.checkpoint_every, args.lr)
    try:
        result = train(
            files, args.data, settings, resume=args.resume, restart=args.restart, device=args.device,
            target_column=args.target_column, distributed=args.distributed,
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
        print(
            f"nothing to do: the run in {result.checkpoint} finished {record.epoch} epochs; pass --epochs with more "
            "to train further"
        )
        return 0
    last = record.history[-1] if record.history else None
    losses = "" if last is None else f", train loss {last.train_loss:.4f}"
    if last is not None and last.val_loss is not None:
        losses += f", val loss {last.val_loss:.4f}"
    print(f"done: {record.position()}{losses}; the state is in {result.checkpoint}")
    print(f"next: onnxtrain export {args.directory} -o model.onnx")
    return 0


def resume_command(args: argparse.Namespace) -> str:
    """The command line that continues this run."""
    words = ["onnxtrain", "train", str(args.directory), "--data", str(args.data)]
    words += ["--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--seed", str(args.seed)]
    if args.val_split:
        words += ["--val-split", repr(args.val_split)]
    if args.checkpoint_every is not None:
        words += ["--checkpoint-every", str(args.checkpoint_every)]
    if args.target_column is not None:
        words += ["--target-column", args.target_column]
    if args.prefix:
        words += ["--prefix", args.prefix]
    if args.device != "cpu":
        words += ["--device", args.device]
    if args.distributed:
        words += ["--distributed"]
    return shlex.join([*words, "--resume"])


__all__ = ["add_parser", "check_device", "device_option", "resume_command", "run"]
