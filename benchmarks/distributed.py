"""Data-parallel throughput on MPI: 1 process x 2 threads against 2 processes x 1 thread.

Usage (needs torch to export the workloads, and the MPI extra)::

    python -m benchmarks.distributed --workloads mlp,cnn --out results.json

For each workload (:mod:`benchmarks.workloads`: the same model, weights and
batches as ``make bench``) it writes onnxtrain's artifacts once, then trains
the same global batch (the workload's batch size) for ``--steps`` steps after
``--warmup`` steps:

- ``1x2``: one process, onnxruntime's sessions on 2 intra-op threads, the
  plain ``Optimizer``;
- ``2x1``: ``mpiexec -n 2``, each rank on half of every batch with 1 thread,
  ``DistributedOptimizer`` (gradients averaged by one ``Allreduce`` per step).

It reports samples per second (global batch x steps / wall time, the slowest
rank's), the time per step, and for ``2x1`` the share of the step spent in
the all-reduce (copying the gradients out, ``Allreduce``, writing them back),
with the bytes each rank sends per step.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from benchmarks.prepare import prepare
from benchmarks.workloads import WORKLOADS

LOSSES = {"mse": "MSELoss", "ce": "CrossEntropyLoss"}
OPTIMIZERS = {"sgd": "SGD", "adamw": "AdamW"}


def train(
    folder: Path, threads: int, steps: int, warmup: int, device: str = "cpu", reduce_on_device: bool | None = None
) -> dict[str, Any]:
    """One process's (or rank's) timed training on ``device``: its part of every batch, ``threads`` intra-op
    threads; ``reduce_on_device``: the ``DistributedOptimizer``'s."""
    import onnxruntime as ort

    from onnxtrain import api

    spec = json.loads((folder / "spec.json").read_text())
    with np.load(folder / "data.npz") as data:
        x, y = data["x"], data["y"]
    ranks, rank = 1, 0
    distributed = comm = None
    if "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ:
        from onnxtrain import distributed

        comm = distributed.init()
        ranks, rank = distributed.size(), distributed.rank()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    artifacts = folder / "artifacts"
    state = api.CheckpointState.load_checkpoint(str(artifacts / "checkpoint"))
    module = api.Module(str(artifacts / "training_model.onnx"), state, device=device, session_options=options)
    optimizer: Any = api.Optimizer(str(artifacts / "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(spec["learning_rate"])
    if distributed is not None:
        optimizer = distributed.DistributedOptimizer(optimizer, reduce_on_device=reduce_on_device)
    part = len(x[0]) // ranks
    rows = slice(rank * part, (rank + 1) * part)

    def step(i: int) -> None:
        module(x[i % len(x)][rows], y[i % len(y)][rows])
        optimizer.step()
        module.lazy_reset_grad()

    for i in range(warmup):
        step(i)
    if comm is not None:
        comm.Barrier()
    reduce_start, sent_start = getattr(optimizer, "reduce_seconds", 0.0), getattr(optimizer, "reduced_bytes", 0)
    start = time.perf_counter()
    for i in range(steps):
        step(i)
    float(np.asarray(module(x[0][rows], y[0][rows])))  # the last update applied and read
    seconds = time.perf_counter() - start
    result = {
        "seconds": seconds,
        "reduce_seconds": getattr(optimizer, "reduce_seconds", 0.0) - reduce_start,
        "sent_bytes_per_step": (getattr(optimizer, "reduced_bytes", 0) - sent_start) / steps,
    }
    if comm is not None:
        gathered = comm.gather(result, root=0)
        if rank != 0:
            return {}
        result = {
            "seconds": max(r["seconds"] for r in gathered),
            "reduce_seconds": max(r["reduce_seconds"] for r in gathered),
            "sent_bytes_per_step": gathered[0]["sent_bytes_per_step"],
            "reduce_on_device": optimizer.reduces_on_device,
        }
    batch = len(x[0])
    result.update(
        {
            "processes": ranks,
            "threads": threads,
            "samples_per_s": batch * steps / result["seconds"],
            "step_ms": 1e3 * result["seconds"] / steps,
            "reduce_share": result["reduce_seconds"] / result["seconds"],
        }
    )
    return result


def run_workload(name: str, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    from onnxtrain import artifacts

    workload = WORKLOADS[name]
    folder = prepare(workload, workdir)
    spec = json.loads((folder / "spec.json").read_text())
    model = onnx.load(str(folder / "model.onnx"))
    for value in (*model.graph.input, *model.graph.output):  # exported for the whole batch: each rank takes part
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    del model.graph.value_info[:]
    artifacts.generate_artifacts(
        model,
        requires_grad=spec["requires_grad"],
        loss=getattr(artifacts.LossType, LOSSES[workload.loss]),
        optimizer=getattr(artifacts.OptimType, OPTIMIZERS[workload.optimizer]),
        artifact_directory=str(folder / "artifacts"),
    )
    spec["learning_rate"] = workload.learning_rate
    (folder / "spec.json").write_text(json.dumps(spec))
    steps = args.steps or workload.steps
    single = train(folder, 2, steps, args.warmup, args.device)
    mpiexec = shutil.which("mpiexec", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    if mpiexec is None:
        raise RuntimeError("no mpiexec: pip install -e '.[mpi]'")
    out = workdir / f"{name}-2x1.json"
    command = [mpiexec, "-n", "2", sys.executable, "-m", "benchmarks.distributed", "--rank-of", str(folder),
               "--steps", str(steps), "--warmup", str(args.warmup), "--rank-out", str(out), "--device", args.device,
               "--reduce-on-device", args.reduce_on_device]  # fmt: skip
    environment = os.environ | {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}  # Open MPI
    subprocess.run(command, check=True, timeout=1800, env=environment)
    double = json.loads(out.read_text())
    return {
        "workload": name,
        "title": workload.title,
        "steps": steps,
        "device": args.device,
        "1x2": single,
        "2x1": double,
        "speedup": double["samples_per_s"] / single["samples_per_s"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="mlp,cnn")
    parser.add_argument("--steps", type=int, default=0, help="timed steps (default: the workload's)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--device", default="cpu", help="where each process trains: cpu, cuda, cuda:1")
    parser.add_argument(
        "--reduce-on-device", choices=["auto", "yes", "no"], default="auto",
        help="DistributedOptimizer's reduce_on_device: None (auto), True, False",
    )  # fmt: skip
    parser.add_argument("--rank-of", type=Path, default=None, help=argparse.SUPPRESS)  # a rank of the 2x1 run
    parser.add_argument("--rank-out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank_of is not None:
        on_device = {"auto": None, "yes": True, "no": False}[args.reduce_on_device]
        result = train(args.rank_of, 1, args.steps, args.warmup, args.device, on_device)
        if result:
            args.rank_out.write_text(json.dumps(result))
        return 0
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.workloads.split(","):
            results.append(run_workload(name, Path(tmp), args))
            print(json.dumps(results[-1], indent=1), flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
