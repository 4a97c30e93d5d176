"""onnxtrain: ``onnxtrain.artifacts.generate_artifacts``, then ``onnxtrain.api`` as an ORT user writes it.

The timed step is ``module(x, y); optimizer.step(); module.lazy_reset_grad()``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from benchmarks.measure import run_worker, worker_arguments
from benchmarks.workers.common import Stopwatch, load_batches, load_spec, time_ort_style_training

LOSSES = {"mse": "MSELoss", "ce": "CrossEntropyLoss"}
OPTIMIZERS = {"sgd": "SGD", "adamw": "AdamW"}


def generate(args: argparse.Namespace) -> dict[str, Any]:
    """Write the artifacts with onnxtrain's ``OptimType`` defaults (AdamW as ONNX Runtime's)."""
    watch = Stopwatch()
    from onnxtrain import artifacts

    spec = load_spec(args.folder)
    watch.mark("import")
    artifacts.generate_artifacts(
        str(args.folder / "model.onnx"),
        requires_grad=spec["requires_grad"],
        loss=getattr(artifacts.LossType, LOSSES[spec["loss"]]),
        optimizer=getattr(artifacts.OptimType, OPTIMIZERS[spec["optimizer"]]),
        artifact_directory=str(args.artifacts),
    )
    watch.mark("generate")
    return {"framework": "onnxtrain", "workload": spec["name"], **watch.marks}


def train(args: argparse.Namespace) -> dict[str, Any]:
    watch = Stopwatch()
    import onnxruntime

    import onnxtrain
    from onnxtrain.api import CheckpointState, Module, Optimizer

    spec = load_spec(args.folder)
    batches = load_batches(args.folder)
    watch.mark("import")
    options = None
    if args.threads:
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = args.threads
    directory = args.artifacts
    state = CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module = Module(
        str(directory / "training_model.onnx"), state, str(directory / "eval_model.onnx"), session_options=options
    )
    optimizer = Optimizer(str(directory / "optimizer_model.onnx"), module)
    versions = {"onnxtrain": onnxtrain.__version__, "onnxruntime": onnxruntime.__version__}
    return {
        "framework": "onnxtrain",
        **time_ort_style_training(args, spec, batches, watch, module, optimizer, versions),
    }


def main(args: argparse.Namespace) -> dict[str, Any]:
    return generate(args) if args.command == "generate" else train(args)


if __name__ == "__main__":
    sys.exit(run_worker(main, worker_arguments(__doc__ or "")))
