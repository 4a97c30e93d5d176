"""Where an onnxtrain training step spends its time: ``python -m benchmarks.profile_step --workload mlp``.

For the ORT-style step ``module(x, y); optimizer.step(); module.lazy_reset_grad()``:

1. the split between onnxruntime's own run calls (the fused step's session,
   or the training and the optimizer sessions) and everything else in the
   step (Python: input checks, bindings, bookkeeping, output conversion), by
   timing each ``run`` of the runtime's sessions;
2. floors: the same two models run back to back by plain onnxruntime with a
   prepared ``IOBinding`` and nothing else per step (what a runtime with zero
   Python overhead would take with two sessions), and each model alone;
   then (``--fused``) the two merged into one model as the runtime's fused
   step merges them (:func:`onnxtrain.artifacts.fuse.fuse_update_and_train`),
   updating in place as the runtime does, with onnxruntime's intra-op threads
   spinning or not;
3. optionally (``--cprofile``) the functions with the most own time;
4. optionally (``--ort-profile``) onnxruntime's per-operator profile of both
   sessions: the kernels that dominate.

Measures; changes nothing in the runtime (it wraps the sessions' ``run`` of
one Module instance to time them).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.workers.common import load_batches, load_spec
from benchmarks.workloads import WORKLOADS


def _median_us(fn: Callable[[int], Any], steps: int, repeats: int = 5, warmup: int = 20) -> float:
    for i in range(warmup):
        fn(i)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(steps):
            fn(i)
        times.append((time.perf_counter() - start) / steps * 1e6)
    return statistics.median(times)


def _session_floor(
    paths: list[Any],
    feeds: list[dict[str, Any]],
    options: Any,
    steps: int,
    in_place: dict[str, str] | None = None,
) -> float:
    """µs per step of plain onnxruntime running ``paths`` (or serialized models) one after the other, pre-bound;
    ``in_place``: ``{output: input}`` written into the input's buffer, as the runtime's fused step does."""
    import onnxruntime as ort

    sources = [p if isinstance(p, bytes) else str(p) for p in paths]
    sessions = [ort.InferenceSession(s, sess_options=options, providers=["CPUExecutionProvider"]) for s in sources]
    bindings = []
    for session, feed in zip(sessions, feeds, strict=True):
        binding = session.io_binding()
        bound = {}
        for meta in session.get_inputs():
            bound[meta.name] = ort.OrtValue.ortvalue_from_numpy(feed[meta.name].copy())
            binding.bind_ortvalue_input(meta.name, bound[meta.name])
        for meta in session.get_outputs():  # preallocated, as the runtime's state
            binding.bind_output(meta.name, "cpu")
        session._sess.run_with_iobinding(binding._iobinding, None)
        outputs = binding.get_outputs()
        for meta, value in zip(session.get_outputs(), outputs, strict=True):
            source = (in_place or {}).get(meta.name)
            binding.bind_ortvalue_output(meta.name, bound[source] if source else value)
        bindings.append((session._sess, binding._iobinding))

    def step(_: int) -> None:
        for native, binding in bindings:
            native.run_with_iobinding(binding, None)

    return _median_us(step, steps)


def _feeds(directory: Path, batch: tuple[Any, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Inputs for the training and optimizer models: the batch, the checkpoint's parameters, zeros elsewhere."""
    import numpy as np
    import onnx

    from onnxtrain import checkpoint

    params = dict(checkpoint.load(directory / "checkpoint").parameters)
    feeds = []
    for name in ("training_model.onnx", "optimizer_model.onnx"):
        model = onnx.load(str(directory / name), load_external_data=False)
        feed: dict[str, Any] = {}
        user = iter(batch)
        for value in model.graph.input:
            tensor = value.type.tensor_type
            dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
            shape = [d.dim_value for d in tensor.shape.dim]
            if value.name in params:
                feed[value.name] = np.asarray(params[value.name])
            elif value.name == "lazy_reset_grad":
                feed[value.name] = np.array([True])
            elif value.name in ("learning_rate", "step"):
                feed[value.name] = np.array([1e-3 if value.name == "learning_rate" else 1], dtype=dtype)
            elif name.startswith("optimizer") or value.name.endswith("_grad.accumulation.buffer"):
                feed[value.name] = np.zeros(shape, dtype)  # gradients, moments
            else:
                feed[value.name] = next(user)
        feeds.append(feed)
    return feeds[0], feeds[1]


def _ort_profile(paths: dict[str, Path]) -> dict[str, list[tuple[str, float, float]]]:
    """Per operator type: total µs and share of each session's node time, from onnxruntime's profile files."""
    tables = {}
    for what, path in paths.items():
        events = json.loads(Path(path).read_text())
        per_op: dict[str, float] = defaultdict(float)
        for event in events:
            if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
                per_op[event.get("args", {}).get("op_name", "?")] += float(event.get("dur", 0))
        total = sum(per_op.values()) or 1.0
        tables[what] = sorted(((op, us, us / total) for op, us in per_op.items()), key=lambda r: -r[1])
    return tables


def _fused_floors(
    directory: Path, train_feed: dict[str, Any], optimizer_feed: dict[str, Any], paths: list[Path], steps: int
) -> None:
    """Two sessions against one fused session, and the fused step's two parts alone, spinning threads or not: plain
    onnxruntime, all inputs pre-bound."""
    import onnx

    from onnxtrain.artifacts.accumulation import remove_gradient_accumulation
    from onnxtrain.artifacts.fuse import fuse_update_and_train
    from onnxtrain.optim.base import grad_name, updated_name

    training = onnx.load(str(directory / "training_model.onnx"))
    optimizer = onnx.load(str(directory / "optimizer_model.onnx"))
    suffix = "_grad.accumulation.buffer"
    trainable = [i.name[: -len(suffix)] for i in training.graph.input if i.name.endswith(suffix)]
    fused = fuse_update_and_train(training, optimizer, trainable)
    names = {i.name for i in fused.model.graph.input}
    feed = {k: v for k, v in train_feed.items() if k in names}
    feed.update({fused.name_of(k): v for k, v in optimizer_feed.items() if fused.name_of(k) in names})
    in_place = {fused.gradients[p]: fused.name_of(grad_name(p)) for p in trainable}
    in_place.update({fused.name_of(updated_name(n)): fused.name_of(n) for n in optimizer_feed if n in names})
    in_place = {out: source for out, source in in_place.items() if source in names}
    print("\nfloors by layout (plain onnxruntime, all inputs pre-bound), µs per step:")
    print(f"  {'layout':52s} {'no spinning':>12s} {'spinning':>10s}")
    # its two parts alone, each in place: the train step from reset gradients, and the update
    reset = remove_gradient_accumulation(training, trainable)
    reset_names = {i.name for i in reset.model.graph.input}
    reset_feed = {k: v for k, v in train_feed.items() if k in reset_names}
    updated = {o.name for o in optimizer.graph.output}
    update_in_place = {updated_name(n): n for n in optimizer_feed if updated_name(n) in updated}
    layouts: list[tuple[str, list[Any], list[dict[str, Any]], dict[str, str] | None]] = [
        ("two sessions", list(paths), [train_feed, optimizer_feed], None),
        ("one fused session, in place (the runtime's step)", [fused.model.SerializeToString()], [feed], in_place),
        ("  its train step alone (from reset gradients)", [reset.model.SerializeToString()], [reset_feed], None),
        ("  its update alone (the optimizer model, in place)", [paths[1]], [optimizer_feed], update_in_place),
    ]
    for what, sources, feeds, aliases in layouts:
        cells = [_session_floor(sources, feeds, _options(spinning), steps, aliases) for spinning in (False, True)]
        print(f"  {what:52s} {cells[0]:12.1f} {cells[1]:10.1f}")


def _options(spinning: bool) -> Any:
    """Session options as the runtime's defaults (all graph optimizations), with spinning chosen."""
    from onnxtrain.training.options import default_session_options

    return default_session_options(spinning=spinning, update_first=spinning)


def _setup(workload_name: str, workdir: Path) -> tuple[Path, Path, Any, Any, list[tuple[Any, Any]]]:
    """Prepare the workload, write onnxtrain's artifacts, make the Module and Optimizer."""
    from benchmarks.prepare import prepare
    from onnxtrain import artifacts
    from onnxtrain.api import CheckpointState, Module, Optimizer

    folder = prepare(WORKLOADS[workload_name], workdir)
    spec = load_spec(folder)
    directory = folder / "artifacts-onnxtrain"
    losses = {"mse": artifacts.LossType.MSELoss, "ce": artifacts.LossType.CrossEntropyLoss}
    optimizers = {"sgd": artifacts.OptimType.SGD, "adamw": artifacts.OptimType.AdamW}
    artifacts.generate_artifacts(
        str(folder / "model.onnx"),
        requires_grad=spec["requires_grad"],
        loss=losses[spec["loss"]],
        optimizer=optimizers[spec["optimizer"]],
        artifact_directory=str(directory),
    )
    state = CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module = Module(str(directory / "training_model.onnx"), state, str(directory / "eval_model.onnx"))
    optimizer = Optimizer(str(directory / "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(spec["learning_rate"])
    return folder, directory, module, optimizer, load_batches(folder)


def _split(module: Any, optimizer: Any, step: Callable[[int], Any], steps: int) -> dict[str, float] | None:
    """µs per step inside each session's ``run`` (None: the runtime's layout changed)."""
    fused, reset = getattr(optimizer, "_fused", None), getattr(module, "_reset", None)
    sessions = {
        "fused step": getattr(fused, "session", None),
        "reset step": getattr(reset, "session", None),
        "training": getattr(module, "_train_session", None),
        "optimizer": getattr(optimizer, "_session", None),
    }
    sessions = {key: session for key, session in sessions.items() if session is not None}
    if not all(hasattr(session, "run") for session in sessions.values()):
        return None
    spent = dict.fromkeys(sessions, 0.0)
    for key, session in sessions.items():
        run = session.run

        def wrapper(run: Callable[[], None] = run, key: str = key) -> None:
            start = time.perf_counter()
            run()
            spent[key] += time.perf_counter() - start

        session.run = wrapper  # this instance only
    warmup, repeats = 20, 5
    _median_us(step, steps, repeats, warmup)
    for session in sessions.values():
        del session.run
    count = warmup + steps * repeats
    return {key: value / count * 1e6 for key, value in spent.items()}


def _cprofile(step: Callable[[int], Any], steps: int) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    for i in range(steps):
        step(i)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(18)
    print(f"\ncProfile of {steps} steps, by own time (cProfile inflates small calls):")
    print("\n".join(line for line in text.getvalue().splitlines()[4:] if line.strip()))


def _operator_profile(paths: list[Path], feeds: list[dict[str, Any]], workdir: Path, steps: int) -> None:
    import onnxruntime as ort

    runs = min(steps, 200)
    profiled = {}
    for what, path, feed in zip(("training", "optimizer"), paths, feeds, strict=True):
        options = _options(spinning=False)
        options.enable_profiling = True
        options.profile_file_prefix = str(workdir / f"ort-{what}")
        session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        for _ in range(runs):
            session.run(names, feed)
        profiled[what] = Path(session.end_profiling())
    for what, rows in _ort_profile(profiled).items():
        print(f"\nonnxruntime profile, {what} model, node time by operator type (profiling inflates small ops):")
        for op, us, share in rows[:10]:
            print(f"  {op:28s} {share:6.1%}  ({us / runs:8.1f} µs/run)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="mlp", choices=list(WORKLOADS))
    parser.add_argument("--steps", type=int, default=0, help="steps per timing (default: the workload's)")
    parser.add_argument("--cprofile", action="store_true", help="print the functions with the most own time")
    parser.add_argument("--ort-profile", action="store_true", help="print onnxruntime's per-operator times")
    parser.add_argument("--fused", action="store_true", help="floors of the fused model against the two models")
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args(argv)

    import onnxruntime as ort

    ort.set_default_logger_severity(3)  # the fused models' unused-initializer notices
    workload = WORKLOADS[args.workload]
    steps = args.steps or workload.steps
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="onnxtrain-profile-"))
    _, directory, module, optimizer, batches = _setup(workload.name, workdir)

    def step(i: int) -> None:
        x, y = batches[i % len(batches)]
        module(x, y)
        optimizer.step()
        module.lazy_reset_grad()

    total = _median_us(step, steps)
    split = _split(module, optimizer, step, steps)
    train_feed, optimizer_feed = _feeds(directory, batches[0])
    paths = [directory / "training_model.onnx", directory / "optimizer_model.onnx"]
    options = _options(spinning=False)
    floor_both = _session_floor(paths, [train_feed, optimizer_feed], options, steps)
    floor_train = _session_floor(paths[:1], [train_feed], options, steps)
    floor_optimizer = _session_floor(paths[1:], [optimizer_feed], options, steps)
    print(f"workload {workload.name}: {workload.title}; onnxruntime {ort.__version__}")
    print(f"  step (module + optimizer.step + lazy_reset_grad): {total:9.1f} µs")
    if split is not None:
        outside = max(total - sum(split.values()), 0.0)
        for key, value in split.items():
            print(f"    in the {key + ' session' + chr(39) + 's run:':41s} {value:9.1f} µs")
        print(f"    outside onnxruntime (Python, bindings, copies): {outside:9.1f} µs ({outside / total:.0%})")
    print(f"  floor, plain onnxruntime, both models pre-bound:  {floor_both:9.1f} µs")
    print(f"    training model alone:                           {floor_train:9.1f} µs")
    print(f"    optimizer model alone:                          {floor_optimizer:9.1f} µs")
    if args.fused:
        _fused_floors(directory, train_feed, optimizer_feed, paths, steps)
    if args.cprofile:
        _cprofile(step, steps)
    if args.ort_profile:
        _operator_profile(paths, [train_feed, optimizer_feed], workdir, steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
