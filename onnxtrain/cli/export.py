"""``onnxtrain export``: the inference model, from the eval model and the trained parameters."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onnxtrain.cli.common import Parser
from onnxtrain.graph.saving import replacing_model

#: ``--checkpoint`` value that names the best checkpoint of the artifact directory.
BEST = "best"

if TYPE_CHECKING:
    import onnx

    from onnxtrain.loop import ArtifactFiles


def add_parser(subcommands: Any) -> None:
    """Add ``export`` to the ``onnxtrain`` parser's subcommands."""
    parser: Parser = subcommands.add_parser(
        "export",
        help="write the inference model with the trained parameters",
        description="Write the inference model: the eval model of DIR, pruned to the outputs, with the "
        "parameters of DIR/trained_checkpoint (else DIR/checkpoint, or --checkpoint) baked in. The model is "
        "checked to load in onnxruntime before it replaces MODEL.onnx.",
    )
    parser.add_argument("directory", metavar="DIR", type=Path, help="the artifacts, from `onnxtrain generate`")
    parser.add_argument("-o", "--out", required=True, type=_file_path, metavar="MODEL.onnx", help="the model to write")
    parser.add_argument(
        "--outputs",
        nargs="+",
        action="extend",
        metavar="NAME",
        help="the values it outputs (default: the forward model's outputs)",
    )
    parser.add_argument(
        "--checkpoint", metavar="PATH|best",
        help=f"the parameters to use; {BEST}: DIR/best_checkpoint, the best state of a run with --early-stopping",
    )  # fmt: skip
    parser.add_argument("--prefix", default="", help="the artifacts' file-name prefix (as given to generate)")
    parser.add_argument(
        "--precision", choices=["fp32", "bf16", "fp16"],
        help="compute in float32 throughout, or in a half type where the autocast policy says with the weights "
        "stored in it (default: as the artifacts compute)",
    )  # fmt: skip
    parser.set_defaults(run=run, prog=parser.prog)


@dataclass(frozen=True)
class Exported:
    """An exported model: where it is, where its parameters came from, its inputs and outputs (``name: type``)."""

    path: Path
    checkpoint: Path
    inputs: list[str]
    outputs: list[str]


def run(args: argparse.Namespace) -> int:
    """Export; print what was written."""
    from onnxtrain.loop import ArtifactFiles

    exported = export_inference_model(
        ArtifactFiles.at(args.directory, args.prefix), args.out, args.outputs, args.checkpoint, args.precision
    )
    print(f"wrote {exported.path} with the parameters of {exported.checkpoint}")
    print(f"  inputs:  {', '.join(exported.inputs)}")
    print(f"  outputs: {', '.join(exported.outputs)}")
    return 0


def export_inference_model(
    files: ArtifactFiles,
    out: Path,
    outputs: list[str] | None = None,
    checkpoint_path: str | Path | None = None,
    precision: str | None = None,
) -> Exported:
    """Write the inference model of ``files`` to ``out`` atomically, once onnxruntime has loaded it.

    ``checkpoint_path``: the parameters' checkpoint (default: the latest);
    the text ``best`` names the artifact directory's best checkpoint (a file
    named ``best`` is ``./best``, or a ``Path``); ``precision``: as
    :func:`onnxtrain.artifacts.export.export_model_for_inferencing` takes it.
    """
    from onnxtrain import checkpoint
    from onnxtrain.artifacts.export import export_model_for_inferencing
    from onnxtrain.artifacts.metadata import inference_outputs
    from onnxtrain.training.models import load_model

    source = Path(checkpoint_path) if checkpoint_path is not None else files.latest_checkpoint()
    files.require(files.eval_model)
    if checkpoint_path is None:
        files.require(source)
    elif checkpoint_path == BEST:  # the text, not a Path: a file named best in the working directory is ./best
        source = files.best_checkpoint
        if not source.exists():
            raise FileNotFoundError(
                f"{files.directory} has no {source.name}: a run keeps its best state with `onnxtrain train "
                "--early-stopping PATIENCE` and validation data (--val-split or --val-data)"
            )
    elif not source.exists():
        found = [path.name for path in (files.latest_checkpoint(), files.best_checkpoint) if path.exists()]
        raise FileNotFoundError(
            f"--checkpoint {checkpoint_path}: no such file; give a checkpoint file, or `{BEST}`, or leave it out for "
            f"the latest state of {files.directory} (it holds {found or 'no checkpoint'})"
        )
    state = checkpoint.load(source)
    eval_model = load_model(files.eval_model, "eval model").with_data()
    names = outputs or inference_outputs(eval_model)
    if outputs:
        _check_outputs(eval_model, outputs)
    model = export_model_for_inferencing(eval_model, state, names, precision=precision)
    inputs, written = _write_checked(model, out)
    return Exported(out, source, inputs, written)


def _file_path(text: str) -> Path:
    """An argument type: the path of a file to write; a path ending in a separator names a folder."""
    if text.endswith(("/", os.sep)):
        folder = text.rstrip("/" + os.sep)
        raise argparse.ArgumentTypeError(
            f"{text!r} names a folder; give the path of the .onnx file to write ({folder}/model.onnx)"
        )
    return Path(text)


def _check_outputs(eval_model: onnx.ModelProto, names: list[str]) -> None:
    """``ValueError`` naming the model's outputs when the eval model computes none of some of ``names``."""
    from onnxtrain.artifacts.export import unknown_outputs

    message = unknown_outputs(eval_model, names)
    if message:
        raise ValueError(
            f"{message}: give those to --outputs (or the name of any value the eval model computes, or leave "
            "--outputs out for the model's outputs)"
        )


def _write_checked(model: onnx.ModelProto, out: Path) -> tuple[list[str], list[str]]:
    """Save ``model`` to a temporary file beside ``out``, load it in onnxruntime, then move it into place.

    Returns its inputs and outputs as onnxruntime sees them (``name: type[shape]``).
    """
    import onnx
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

    from onnxtrain.artifacts.generate import PROTOBUF_LIMIT
    from onnxtrain.sessions import inference_session

    with replacing_model(model, out, PROTOBUF_LIMIT) as temporary:
        try:
            session = inference_session(os.fspath(temporary))
        except ort_errors.NotImplemented as error:  # a kernel this machine's provider lacks (bfloat16 on a CPU)
            onnx.checker.check_model(os.fspath(temporary), full_check=True)
            print(
                f"note: onnxruntime's CPU provider cannot run {out.name} here ({str(error).split(' : ')[-1]}); "
                "it runs on a provider with those kernels (CUDA), or export it with --precision fp32",
                file=sys.stderr,
            )
            session = None
    if session is None:
        graph = model.graph
        return [_describe_value(v) for v in graph.input], [_describe_value(v) for v in graph.output]
    return [_describe(arg) for arg in session.get_inputs()], [_describe(arg) for arg in session.get_outputs()]


def _describe_value(value: Any) -> str:
    """``pixels: bfloat16[batch, 64]`` from a graph's ``ValueInfoProto``."""
    from onnxtrain.graph import dtypes

    tensor = value.type.tensor_type
    dims = [d.dim_param or (d.dim_value if d.HasField("dim_value") else None) for d in tensor.shape.dim]
    return _signature(value.name, dtypes.dtype_name(tensor.elem_type), dims)


def _describe(arg: Any) -> str:
    """``pixels: float32[batch, 64]`` from onnxruntime's ``NodeArg``."""
    return _signature(arg.name, str(arg.type).removeprefix("tensor(").removesuffix(")"), arg.shape)


def _signature(name: str, elem: str, dims: Any) -> str:
    """``name: elem[d0, d1]``, ONNX's ``float`` named ``float32``, an unknown size ``?``."""
    kind = "float32" if elem == "float" else elem
    return f"{name}: {kind}[{', '.join('?' if d is None else str(d) for d in dims)}]"


__all__ = ["BEST", "Exported", "add_parser", "export_inference_model", "run"]
