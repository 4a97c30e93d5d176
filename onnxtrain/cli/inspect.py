"""``onnxtrain inspect``: what an artifact directory or an ONNX model holds."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onnxtrain.cli.common import Parser, size_text
from onnxtrain.cli.table import number, shape_text, table

if TYPE_CHECKING:
    import onnx

    from onnxtrain import checkpoint
    from onnxtrain.loop import ArtifactFiles


def add_parser(subcommands: Any) -> None:
    """Add ``inspect`` to the ``onnxtrain`` parser's subcommands."""
    parser: Parser = subcommands.add_parser(
        "inspect",
        help="describe an artifact directory or an ONNX model",
        description="For an artifact directory: its parameters, the training model's inputs and outputs, the "
        "loss, the optimizer and where training stands. For an .onnx model: its inputs, outputs, initializers "
        "and operators, and which operators have no gradient rule.",
    )
    parser.add_argument("path", metavar="DIR|MODEL", type=Path, help="an artifact directory or an .onnx file")
    parser.add_argument("--prefix", default="", help="the artifacts' file-name prefix (as given to generate)")
    parser.add_argument(
        "--memory",
        action="store_true",
        help="for an artifact directory: the static memory of a training step at --shapes (live tensor bytes)",
    )
    parser.add_argument(
        "--shapes",
        nargs="+",
        action="extend",
        default=[],
        metavar="NAME=DxD",
        help="with --memory: the user inputs' shapes (input_ids=4x128 labels=512) or symbolic dimensions (batch=4)",
    )
    parser.set_defaults(run=run, prog=parser.prog)


def run(args: argparse.Namespace) -> int:
    """Print the description of the directory or the model."""
    from onnxtrain.cli.model_report import model_report
    from onnxtrain.loop import ArtifactFiles

    path: Path = args.path
    if args.memory and not path.is_dir():
        raise ValueError(f"--memory takes an artifact directory; {path} is not one")
    if args.memory:
        lines = memory_report(ArtifactFiles.at(path, args.prefix), args.shapes)
    elif path.is_dir():
        lines = artifact_report(ArtifactFiles.at(path, args.prefix))
    elif path.is_file():
        lines = model_report(path)
    else:
        raise FileNotFoundError(f"{path} does not exist; give an artifact directory or an .onnx model")
    print("\n".join(lines))
    return 0


def artifact_report(files: ArtifactFiles) -> list[str]:
    """Parameters, training model inputs and outputs, loss, optimizer and progress of an artifact directory."""
    from onnxtrain import checkpoint
    from onnxtrain.loop.run import parameter_infos
    from onnxtrain.training.model_io import training_io
    from onnxtrain.training.models import load_model

    files.require(files.training_model, files.checkpoint)
    source = files.latest_checkpoint()
    state = checkpoint.load(source)
    training = load_model(files.training_model, "training model").proto
    io = training_io(training, parameter_infos(state))
    which = "the latest training run" if source == files.trained_checkpoint else "the initial state, not trained"
    lines = [f"artifacts in {files.directory.resolve()}", f"parameters, from {source.name} ({which}):"]
    lines += _parameters(state)
    lines.append("training model inputs:")
    lines += [f"  {spec.name}: {spec.describe()}" for spec in io.inputs.specs]
    lines.append("training model outputs:")
    lines += [
        f"  {spec.name}: {spec.describe()}" + (" (the loss)" if i == 0 else "")
        for i, spec in enumerate(io.output_specs)
    ]
    lines.append(_loss_line(training, io.outputs[0]))
    lines += _optimizer_lines(files, state)
    lines += _export_lines(files)
    return lines


def memory_report(files: ArtifactFiles, shapes: list[str]) -> list[str]:
    """The static memory of the fused step and of the first step at the user inputs' ``shapes``."""
    from onnxtrain.artifacts.step_memory import describe, parse_shapes, step_memory

    files.require(files.training_model)
    optimizer = files.optimizer_model if files.optimizer_model.is_file() else None
    result = step_memory(files.training_model, optimizer, parse_shapes(shapes))
    fixed = ", ".join(f"{name} {shape_text(list(dims))}" for name, dims in result.shapes.items())
    lines = [f"static memory of a training step at {fixed}: live tensors of the graphs, in onnxruntime's order"]
    if result.fused is not None:
        lines += ["fused step (the optimizer's update, then a train step: each step of the usual loop):"]
        lines += describe(result.fused)
    return [*lines, "first step (from reset gradients):", *describe(result.reset)]


def _parameters(state: checkpoint.CheckpointState) -> list[str]:
    rows = [["name", "shape", "dtype", "elements", ""]]
    groups = (("trainable", state.trainable), ("frozen", state.frozen))
    rows += [
        [name, shape_text(array.shape), str(array.dtype), number(array.size), kind]
        for kind, group in groups
        for name, array in group.items()
    ]
    trainable = sum(array.size for array in state.trainable.values())
    frozen = sum(array.size for array in state.frozen.values())
    size = sum(array.nbytes for array in state.parameters.values())
    total = f"  total: {number(trainable + frozen)} elements ({number(trainable)} trainable, {number(frozen)} frozen)"
    return [*table(rows, right=[3]), f"{total}, {size_text(size)}"]


def _loss_line(training: onnx.ModelProto, output: str) -> str:
    from onnxtrain.artifacts.metadata import NO_LOSS, loss_description, loss_inputs

    loss = loss_description(training)
    if loss is None:
        return f"loss: {output}, the training model's first output (no loss recorded in its metadata)"
    inputs = loss_inputs(training)
    if loss == NO_LOSS:
        return f"loss: the forward model's first output ({', '.join(inputs[:1])}), as output {output}"
    return f"loss: {loss} of {', '.join(inputs)} (output {output})"


def _optimizer_lines(files: ArtifactFiles, state: checkpoint.CheckpointState) -> list[str]:
    from onnxtrain.artifacts.generate import OPTIMIZER_KEY
    from onnxtrain.artifacts.metadata import read_metadata
    from onnxtrain.checkpoint.state import DEFAULT_LEARNING_RATE
    from onnxtrain.loop import RunRecord, measured, stored_learning_rate
    from onnxtrain.loop.record import schedule_text
    from onnxtrain.training.models import load_model

    if not files.optimizer_model.is_file():
        return [f"optimizer: none ({files.optimizer_model.name} is missing)"]
    optimizer = read_metadata(load_model(files.optimizer_model, "optimizer model").proto).get(OPTIMIZER_KEY)
    lines = [f"optimizer: {optimizer or 'unknown (no metadata)'}"]
    record = RunRecord.from_properties(state.properties)
    if state.optimizer is not None:
        lines.append(f"learning rate: {state.optimizer.initial_learning_rate:g} (the run's)")
    elif (stored := stored_learning_rate(state.properties)) is not None:
        lines.append(f"learning rate: {stored:g} (stored by generate)")
    else:
        lines.append(f"learning rate: {DEFAULT_LEARNING_RATE:g} (the default; none stored)")
    if record is None:
        lines.append("training: not started")
        return lines
    step = 0 if state.optimizer is None else state.optimizer.step
    lines.append(
        f"training: {record.position()}, step {step}; {record.samples} samples, batch size {record.batch_size}, "
        f"seed {record.seed}"
        + (f", validation split {record.val_split:g}" if record.val_split else "")
        + (", validation data from a file" if record.val_data else "")
        + (f", schedule {schedule_text(record.schedule)}" if record.schedule else "")
    )
    if record.history:
        last = record.history[-1]
        lines.append(f"  last epoch ({last.epoch}): {measured(last)}")
    best = record.best
    if record.patience and best is not None:
        if record.stopped_early:
            lines.append(
                f"  stopped early: no lower validation loss for {record.patience} epoch"
                f"{'' if record.patience == 1 else 's'}; the best, epoch {best.epoch}, is in "
                f"{files.best_checkpoint.name}"
            )
        else:
            lines.append(f"  early stopping: the best so far, epoch {best.epoch}, is in {files.best_checkpoint.name}")
    return lines


def _export_lines(files: ArtifactFiles) -> list[str]:
    from onnxtrain.artifacts.metadata import inference_outputs
    from onnxtrain.training.models import load_model

    if not files.eval_model.is_file():
        return [f"export: not possible ({files.eval_model.name} is missing)"]
    try:
        outputs = inference_outputs(load_model(files.eval_model, "eval model").proto)
    except ValueError:
        return ["export: name the outputs (onnxtrain export DIR -o MODEL.onnx --outputs NAME ...)"]
    return [f"export: outputs {', '.join(outputs)} by default (onnxtrain export DIR -o MODEL.onnx)"]


__all__ = ["add_parser", "artifact_report", "memory_report", "run"]
