"""onnxruntime-training 1.19.2: its own ``generate_artifacts``, then ``onnxruntime.training.api``.

Runs with the Python of the onnxruntime-training environment
(``benchmarks/.venv-ort-training``), which has neither onnxtrain nor numpy 2.
The timed step is ``module(x, y); optimizer.step(); module.lazy_reset_grad()``
(on the epoch workloads too: this API has no pass over a data set). Its
``Module`` takes session options, which its ``Optimizer`` shares: ``--threads``
and ``--spinning on|off`` go there. The counted pass wraps the methods of the
native ``Module`` and ``Optimizer`` that run a model (``train_step``,
``optimizer_step``, ...) in stand-ins, after the timed repeats.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import Any

from benchmarks.measure import SPINNING_ENTRY, RunCounter, run_worker, worker_arguments
from benchmarks.workers.common import Stopwatch, load_batches, load_spec, time_ort_style_training


def generate(args: argparse.Namespace) -> dict[str, Any]:
    """ONNX Runtime's ``generate_artifacts`` with ``LossType``/``OptimType`` (its AdamW defaults)."""
    watch = Stopwatch()
    import onnx
    from onnxruntime.training import artifacts

    spec = load_spec(args.folder)
    watch.mark("import")
    losses = {"mse": artifacts.LossType.MSELoss, "ce": artifacts.LossType.CrossEntropyLoss}
    optimizers = {"sgd": artifacts.OptimType.SGD, "adamw": artifacts.OptimType.AdamW}
    args.artifacts.mkdir(parents=True, exist_ok=True)  # ORT requires an existing directory
    model = onnx.load(str(args.folder / "model.onnx"))
    try:
        artifacts.generate_artifacts(
            model,
            requires_grad=spec["requires_grad"],
            loss=losses[spec["loss"]],
            optimizer=optimizers[spec["optimizer"]],
            artifact_directory=str(args.artifacts),
        )
    except RuntimeError as error:
        raise RuntimeError(_explain(model, error)) from error
    watch.mark("generate")
    return {"framework": "onnxruntime-training", "workload": spec["name"], **watch.marks}


def _explain(model: Any, error: RuntimeError) -> str:
    """ORT's message, with the cause in words where it is a known one."""
    message = " ".join(str(error).split())
    where = re.search(r"([\w.]+\.(?:h|cc)):(\d+)", message)
    failed = re.search(r"\) const (.*) was false", message)
    if where and failed:  # an ORT_ENFORCE: keep the file, line and condition, drop the C++ signature
        message = f"{where.group(1)}:{where.group(2)}: {failed.group(1)} was false"
    single_output_layernorm = any(n.op_type == "LayerNormalization" and len(n.output) == 1 for n in model.graph.node)
    if "OutputDefs().size()" in message and single_output_layernorm:
        return (
            "no gradient for LayerNormalization as exported (one output): ORT's gradient builder reads its "
            f"Mean and InvStdDev outputs ({message})"
        )
    return message


def train(args: argparse.Namespace) -> dict[str, Any]:
    watch = Stopwatch()
    import onnxruntime
    from onnxruntime.training.api import CheckpointState, Module, Optimizer

    spec = load_spec(args.folder)
    batches = load_batches(args.folder)
    watch.mark("import")
    options = onnxruntime.SessionOptions()
    if args.threads:
        options.intra_op_num_threads = args.threads
    if args.spinning != "default":
        options.add_session_config_entry(SPINNING_ENTRY, "1" if args.spinning == "on" else "0")
    directory = args.artifacts
    state = CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module = Module(str(directory / "training_model.onnx"), state, str(directory / "eval_model.onnx"), "cpu", options)
    optimizer = Optimizer(str(directory / "optimizer_model.onnx"), module)
    versions = {"onnxruntime-training": onnxruntime.__version__}
    result = time_ort_style_training(
        args, spec, batches, watch, module, optimizer, versions, lambda counter: instrument(module, optimizer, counter)
    )
    return {"framework": "onnxruntime-training", **result}


#: The methods of the native objects that run a model (the others, ``lazy_reset_grad`` among them, do not).
MODULE_RUNS = ("train_step", "train_step_with_ort_values", "eval_step", "eval_step_with_ort_values")
OPTIMIZER_RUNS = ("optimizer_step",)


class Counted:
    """A stand-in for a native object of ``onnxruntime.training``: its ``methods`` counted and timed, the other
    attributes its own."""

    def __init__(self, native: Any, what: str, methods: Sequence[str], counter: RunCounter) -> None:
        self._native = native
        for name in methods:
            if hasattr(native, name):
                setattr(self, name, counter.wrap(f"{what}.{name}", getattr(native, name)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._native, name)


def instrument(module: Any, optimizer: Any, counter: RunCounter) -> None:
    """Replace the native objects behind ``module`` and ``optimizer`` (pybind11 objects, whose methods cannot be
    patched) by :class:`Counted` stand-ins: each of their calls that runs a model is a call into onnxruntime."""
    module._model = Counted(module._model, "Module", MODULE_RUNS, counter)
    optimizer._optimizer = Counted(optimizer._optimizer, "Optimizer", OPTIMIZER_RUNS, counter)


def main(args: argparse.Namespace) -> dict[str, Any]:
    return generate(args) if args.command == "generate" else train(args)


if __name__ == "__main__":
    sys.exit(run_worker(main, worker_arguments(__doc__ or "")))
