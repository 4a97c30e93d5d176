"""onnxtrain on a CUDA GPU against PyTorch CUDA: step time, agreement, host transfers per step.

Usage (on a machine with onnxruntime-gpu and torch with CUDA)::

    python -m benchmarks.gpu --workloads mlp,cnn,transformer --out results.json

For each workload (:mod:`benchmarks.workloads`: the same torch model, initial
weights and batches as ``make bench``) it

- writes onnxtrain's artifacts (``generate_artifacts``, ``OptimType`` as the
  workload says) and trains them with ``onnxtrain.api`` on ``device="cuda"``,
  the batches fed once as NumPy arrays (copied to the GPU by the step) and
  once as CUDA ``OrtValue``s made beforehand;
- trains them with ``Module.train_epoch`` on ``device="cuda"``, one call per
  pass over the workload's batches repeated ``--epoch-repeat`` times, and
  compares its first losses with the per-step loop's on CUDA;
- trains the torch model on CUDA (eager, data on the GPU);
- times ``steps`` steps after ``warmup`` (median of ``repeats``, each repeat
  ended by a device synchronisation: for onnxtrain reading the last loss);
- compares the first losses of onnxtrain on CUDA with onnxtrain on the CPU
  and with torch on CUDA;
- counts, per steady step, the copies between host and device: the
  ``Memcpy`` nodes that onnxruntime's profiler records (nodes placed on the
  CPU inside a CUDA graph) and the host reads and writes of onnxtrain's own
  runtime (``onnxtrain.training.values``: the loss read back, the inputs
  written), with the bytes they move.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import glob
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.prepare import prepare
from benchmarks.workloads import ADAMW, WORKLOADS, Workload

LOSSES = {"mse": "MSELoss", "ce": "CrossEntropyLoss"}
OPTIMIZERS = {"sgd": "SGD", "adamw": "AdamW"}
CHECKED = 5  # first losses compared across runs


def _onnxtrain(folder: Path, device: str, profile: bool = False) -> tuple[Any, Any, Any]:
    import onnxruntime as ort

    from onnxtrain.api import CheckpointState, Module, Optimizer

    options = ort.SessionOptions()
    if profile:
        options.enable_profiling = True
        options.profile_file_prefix = str(folder / f"profile_{device}")
    state = CheckpointState.load_checkpoint(str(folder / "artifacts" / "checkpoint"))
    module = Module(str(folder / "artifacts" / "training_model.onnx"), state, device=device, session_options=options)
    optimizer = Optimizer(str(folder / "artifacts" / "optimizer_model.onnx"), module)
    return state, module, optimizer


def _median_step(
    step: Callable[[int], Any], sync: Callable[[Any], None], warmup: int, steps: int, repeats: int
) -> float:
    last = None
    for i in range(warmup):
        last = step(i)
    sync(last)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(steps):
            last = step(i)
        sync(last)
        times.append((time.perf_counter() - start) / steps)
    return statistics.median(times)


def _ort_step(module: Any, optimizer: Any, batches: list[tuple[Any, Any]]) -> Callable[[int], Any]:
    def step(i: int) -> Any:
        x, y = batches[i % len(batches)]
        loss = module(x, y)
        optimizer.step()
        module.lazy_reset_grad()
        return loss

    return step


def _on(array: np.ndarray, device: str) -> Any:
    import onnxruntime as ort

    return ort.OrtValue.ortvalue_from_numpy(array, device, 0)


def _read(loss: Any) -> float:
    return float(np.asarray(loss.numpy() if hasattr(loss, "numpy") and not isinstance(loss, np.ndarray) else loss))


def _device_of(value: Any) -> str:
    native = getattr(value, "_ortvalue", value)
    return str(native.device_name()).lower()


@contextlib.contextmanager
def _counting_host_copies() -> Iterator[Counter[str]]:
    """Count, over the session runs made while the block runs, the inputs and outputs bound in host memory
    (each crosses between host and device at every run of a CUDA session) and their bytes."""
    from onnxtrain.training import binding

    counts: Counter[str] = Counter()
    bound: dict[int, dict[str, tuple[str, int]]] = {}  # per binding object: name -> (direction, bytes)
    patched: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, name)
        patched.append((owner, name, original))
        setattr(owner, name, make(original))

    def record(io: Any, name: str, entry: tuple[str, int] | None) -> None:
        table = bound.setdefault(id(io), {})
        if entry is None:
            table.pop(name, None)
        else:
            table[name] = entry

    for cls in (binding._NativeBinding, binding._PublicBinding):
        patch(cls, "bind_cpu_input", lambda f: lambda io, n, a: (record(io, n, ("h2d", a.nbytes)), f(io, n, a))[1])
        patch(
            cls,
            "bind_ortvalue_input",
            lambda f: (
                lambda io, n, v: (
                    record(io, n, ("h2d", v.numpy().nbytes) if _device_of(v) == "cpu" else None),
                    f(io, n, v),
                )[1]
            ),
        )
        patch(
            cls,
            "bind_ortvalue_output",
            lambda f: lambda io, n, v: (record(io, n, ("d2h", 0) if _device_of(v) == "cpu" else None), f(io, n, v))[1],
        )
        patch(
            cls,
            "bind_output",
            lambda f: lambda io, n, d: (record(io, n, ("d2h", 0) if d.type == "cpu" else None), f(io, n, d))[1],
        )

        def run(f: Any) -> Any:
            def wrapped(io: Any) -> None:
                f(io)
                counts["session_runs"] += 1
                for direction, size in bound.get(id(io), {}).values():
                    counts[direction] += 1
                    counts[f"{direction}_bytes"] += size

            return wrapped

        patch(cls, "run", run)

    def update_inplace(f: Any) -> Any:
        def wrapped(value: Any, array: np.ndarray) -> None:
            f(value, array)
            if _device_of(value) != "cpu":  # a host array written into device memory
                counts["h2d_writes"] += 1
                counts["h2d_writes_bytes"] += array.nbytes

        return wrapped

    import onnxruntime as ort

    patch(ort.OrtValue, "update_inplace", update_inplace)
    try:
        yield counts
    finally:
        for owner, name, original in reversed(patched):
            setattr(owner, name, original)


def _memcpy_nodes(folder: Path, device: str) -> dict[str, int]:
    """Memcpy node executions and session runs in onnxruntime's profiles of ``device``."""
    runs = memcpy = 0
    for path in glob.glob(str(folder / f"profile_{device}*.json")):
        text = Path(path).read_text()
        if not text.strip():
            raise RuntimeError(f"{path} is empty: its session is still alive")
        for event in json.loads(text):
            name = str(event.get("name", ""))
            if event.get("cat") == "Session" and name == "model_run":
                runs += 1
            if event.get("cat") == "Node" and "Memcpy" in name and name.endswith("_kernel_time"):
                memcpy += 1
    return {"session_runs": runs, "memcpy_nodes": memcpy}


def _torch_cuda(workload: Workload, folder: Path, x: np.ndarray, y: np.ndarray, args: argparse.Namespace) -> dict:
    import torch

    model = workload.build()
    with np.load(folder / "weights.npz") as weights:
        model.load_state_dict({name: torch.from_numpy(weights[name]) for name in weights.files})
    model = model.to(args.device).train()
    loss_fn = torch.nn.MSELoss() if workload.loss == "mse" else torch.nn.CrossEntropyLoss()
    params = list(model.parameters())
    if workload.optimizer == "sgd":
        optimizer: Any = torch.optim.SGD(params, lr=workload.learning_rate)
    else:
        optimizer = torch.optim.AdamW(params, lr=workload.learning_rate, **ADAMW)  # type: ignore[arg-type]
    batches = [(torch.from_numpy(x[i]).to(args.device), torch.from_numpy(y[i]).to(args.device)) for i in range(len(x))]

    def step(i: int) -> Any:
        bx, by = batches[i % len(batches)]
        loss = loss_fn(model(bx), by)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    losses = [float(step(i)) for i in range(CHECKED)]
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    seconds = _median_step(step, lambda loss: sync(), args.warmup, args.steps, args.repeats)
    return {"losses": losses, "step_ms": seconds * 1e3, "torch": torch.__version__}


def _epoch_on_device(folder: Path, host: list[tuple[np.ndarray, np.ndarray]], workload: Workload,
                     args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    """``train_epoch`` on the device: its first losses, host copies per epoch and time per batch."""
    x = np.concatenate([b[0] for b in host] * args.epoch_repeat)
    y = np.concatenate([b[1] for b in host] * args.epoch_repeat)
    batches = len(x) // workload.batch
    result: dict[str, Any] = {"batches_per_epoch": batches}
    _, module, optimizer = _onnxtrain(folder, args.device)
    optimizer.set_learning_rate(workload.learning_rate)
    result["losses"] = [float(v) for v in module.train_epoch(optimizer, x, y, workload.batch)[:CHECKED]]
    with _counting_host_copies() as counts:
        module.train_epoch(optimizer, x, y, workload.batch)
        result["host_copies_per_epoch"] = dict(counts)
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        module.train_epoch(optimizer, x, y, workload.batch)  # returns the losses: synchronised
        times.append((time.perf_counter() - start) / batches)
    result["step_ms"] = 1e3 * statistics.median(times)
    result["on_device"] = sorted({_device_of(t.value) for t in module.state.store.tensors.values()})
    return result


def run_workload(workload: Workload, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    import onnxruntime as ort

    from onnxtrain import artifacts

    folder = prepare(workload, workdir)
    spec = json.loads((folder / "spec.json").read_text())
    artifacts.generate_artifacts(
        str(folder / "model.onnx"),
        requires_grad=spec["requires_grad"],
        loss=getattr(artifacts.LossType, LOSSES[workload.loss]),
        optimizer=getattr(artifacts.OptimType, OPTIMIZERS[workload.optimizer]),
        artifact_directory=str(folder / "artifacts"),
    )
    with np.load(folder / "data.npz") as data:
        x, y = data["x"], data["y"]
    host = [(np.ascontiguousarray(x[i]), np.ascontiguousarray(y[i])) for i in range(len(x))]
    result: dict[str, Any] = {"workload": workload.name, "title": workload.title}

    # agreement: the first losses, CPU and CUDA, from the same checkpoint and batches
    for device in ("cpu", args.device):
        _, module, optimizer = _onnxtrain(folder, device)
        optimizer.set_learning_rate(workload.learning_rate)
        step = _ort_step(module, optimizer, host)
        result[f"onnxtrain_{device}_losses"] = [_read(step(i)) for i in range(CHECKED)]

    # host copies per steady step, and the Memcpy nodes onnxruntime inserted
    counted = 10
    with _counting_host_copies() as counts:  # from the start: what is bound once and stays bound counts too
        state, module, optimizer = _onnxtrain(folder, args.device, profile=True)
        optimizer.set_learning_rate(workload.learning_rate)
        step = _ort_step(module, optimizer, host)
        for i in range(3):
            _read(step(i))
        counts.clear()
        for i in range(counted):
            step(i)
        _read(step(counted))  # the loss read back, as a training loop that logs it does
        result["host_copies_per_step"] = {k: v / (counted + 1) for k, v in counts.items()}
        on_device = [(_on(a, args.device), _on(b, args.device)) for a, b in host]
        step = _ort_step(module, optimizer, on_device)
        _read(step(0))
        counts.clear()
        for i in range(counted):
            step(i)
        _read(step(counted))
        result["host_copies_per_step_device_inputs"] = {k: v / (counted + 1) for k, v in counts.items()}
    del state, module, optimizer, step
    gc.collect()  # onnxruntime writes a session's profile when the session goes
    result["profile"] = _memcpy_nodes(folder, args.device)

    # timing: NumPy batches (copied in by each step) and batches already on the GPU
    _, module, optimizer = _onnxtrain(folder, args.device)
    optimizer.set_learning_rate(workload.learning_rate)
    sync = _read
    result["onnxtrain_numpy_step_ms"] = 1e3 * _median_step(
        _ort_step(module, optimizer, host), sync, args.warmup, args.steps, args.repeats
    )
    on_gpu = [(_on(a, args.device), _on(b, args.device)) for a, b in host]
    result["onnxtrain_ortvalue_step_ms"] = 1e3 * _median_step(
        _ort_step(module, optimizer, on_gpu), sync, args.warmup, args.steps, args.repeats
    )
    del module, optimizer
    result["epoch"] = _epoch_on_device(folder, host, workload, args)
    result["torch"] = _torch_cuda(workload, folder, x, y, args)
    result["ratio_vs_torch"] = result["onnxtrain_ortvalue_step_ms"] / result["torch"]["step_ms"]
    result["versions"] = {"onnxruntime": ort.__version__, "providers": ort.get_available_providers()}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="mlp,cnn,transformer")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epoch-repeat", type=int, default=8, help="train_epoch's pass: the batches this many times")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a dry run of the script")
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        cwd = os.getcwd()
        os.chdir(tmp)  # onnxruntime writes its profiles next to the prefix given, the rest stays here
        try:
            for name in args.workloads.split(","):
                try:
                    results.append(run_workload(WORKLOADS[name], Path(tmp), args))
                except Exception as error:  # report the failure of one workload and go on
                    import traceback

                    results.append({"workload": name, "error": f"{type(error).__name__}: {error}",
                                    "traceback": traceback.format_exc()})  # fmt: skip
                print(json.dumps(results[-1], indent=1), flush=True)
        finally:
            os.chdir(cwd)
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1))
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
