"""onnxtrain: ``onnxtrain.artifacts.generate_artifacts``, then ``onnxtrain.api`` as an ORT user writes it.

The timed step is ``module(x, y); optimizer.step(); module.lazy_reset_grad()``;
on an epoch workload (``spec["epoch"]``) the timed call is
``module.train_epoch(optimizer, X, Y, batch)`` over the whole data set, and
the figure is its time per batch. The counted pass wraps the native
``run_with_iobinding`` behind every ``BoundSession`` (patched in this process
after the timed repeats, never in onnxtrain's code).
"""

from __future__ import annotations

import argparse
import gc
import math
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks.measure import RunCounter, control, run_worker, time_steps, worker_arguments
from benchmarks.workers.common import (
    Stopwatch,
    count_runs,
    load_batches,
    load_rows,
    load_spec,
    time_ort_style_training,
)

LOSSES = {"mse": "MSELoss", "ce": "CrossEntropyLoss"}
OPTIMIZERS = {"sgd": "SGD", "adamw": "AdamW"}
#: Warm-up passes at least: the first builds the epoch model and runs its first batch as a step of its own.
WARMUP_EPOCHS = 3
#: The label of a run whose session did not exist when the counted pass began.
NEW_SESSION = "a session made during the counted pass"


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


def session_options(threads: int, spinning: str) -> Any:
    """``None`` (onnxtrain's defaults: only the fused and epoch steps spin) for ``--spinning default`` without
    ``--threads``; else options for all sessions: onnxtrain's defaults with every session spinning (``on``) or
    none (``off``), or, for ``default`` with ``--threads``, onnxruntime's defaults (which spin)."""
    import onnxruntime

    from onnxtrain.training.device import Device
    from onnxtrain.training.options import default_session_options

    if spinning == "default":
        if not threads:
            return None
        options = onnxruntime.SessionOptions()
    else:
        # the config entry session.intra_op.allow_spinning, "1" or "0"
        options = default_session_options(spinning=spinning == "on", update_first=True, shared_arena=Device("cpu"))
    if threads:
        options.intra_op_num_threads = threads
    return options


def instrument(counter: RunCounter) -> None:
    """Count and time every model run of onnxtrain in this process: ``run`` of the bindings, which calls the
    native ``run_with_iobinding``, labelled with its ``BoundSession``'s ``what`` (the fused step, ...)."""
    from onnxtrain.training import binding

    labels = {}
    for candidate in gc.get_objects():
        if type(candidate) is binding.BoundSession:  # type(), not isinstance(): a dead weak proxy raises on the latter
            labels.update((id(layout.io), candidate.what) for layout in candidate._layouts.values())
    for kind in (binding._NativeBinding, binding._PublicBinding):
        kind.run = _counted_run(kind.run, labels, counter)  # type: ignore[method-assign]


def _counted_run(
    run: Callable[[Any, Any], None], labels: dict[int, str], counter: RunCounter
) -> Callable[[Any, Any], None]:
    clock, record = time.perf_counter, counter.record

    def counted(io: Any, options: Any) -> None:
        start = clock()
        try:
            run(io, options)
        finally:
            elapsed = clock() - start
            record(labels.get(id(io), NEW_SESSION), elapsed)

    return counted


def time_epochs(
    args: argparse.Namespace, spec: dict[str, Any], watch: Stopwatch, module: Any, optimizer: Any
) -> dict[str, Any]:
    """Time ``train_epoch`` over the whole data set, per batch; ``--warmup`` and ``--steps`` count batches (at
    least :data:`WARMUP_EPOCHS` warm-up passes, at least one timed pass per repeat)."""
    x, y = load_rows(args.folder)
    batches = int(spec["batches"])
    size = len(x) // batches
    optimizer.set_learning_rate(spec["learning_rate"])
    module.train()
    watch.mark("setup")

    def epoch(i: int) -> Any:
        return module.train_epoch(optimizer, x, y, size)

    warmup = max(WARMUP_EPOCHS, math.ceil(args.warmup / batches))
    calls = max(1, round(args.steps / batches))
    timing = time_steps(epoch, warmup, calls, args.repeats, control(args), per_call=batches)
    counted = count_runs(epoch, timing.pop("next_call"), calls, instrument, per_call=batches)
    return {
        "workload": spec["name"],
        "threads": args.threads or "onnxruntime default",
        "spinning": args.spinning,
        "timed_unit": f"train_epoch over {batches} batches of {size}",
        "warmup_epochs": warmup,
        "epochs_per_repeat": calls,
        **watch.marks,
        **timing,
        "peak_rss_mib": counted.pop("peak_rss_mib"),  # before the counted pass
        "counted": counted,
    }


def train(args: argparse.Namespace) -> dict[str, Any]:
    watch = Stopwatch()
    import onnxruntime

    import onnxtrain
    from onnxtrain.api import CheckpointState, Module, Optimizer

    spec = load_spec(args.folder)
    batches = [] if spec.get("epoch") else load_batches(args.folder)
    watch.mark("import")
    options = session_options(args.threads, args.spinning)
    directory = args.artifacts
    state = CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module = Module(
        str(directory / "training_model.onnx"), state, str(directory / "eval_model.onnx"), session_options=options
    )
    optimizer = Optimizer(str(directory / "optimizer_model.onnx"), module)
    versions = {"onnxtrain": onnxtrain.__version__, "onnxruntime": onnxruntime.__version__}
    if spec.get("epoch"):
        return {"framework": "onnxtrain", "versions": versions, **time_epochs(args, spec, watch, module, optimizer)}
    return {
        "framework": "onnxtrain",
        **time_ort_style_training(args, spec, batches, watch, module, optimizer, versions, instrument),
    }


def main(args: argparse.Namespace) -> dict[str, Any]:
    return generate(args) if args.command == "generate" else train(args)


if __name__ == "__main__":
    sys.exit(run_worker(main, worker_arguments(__doc__ or "")))
