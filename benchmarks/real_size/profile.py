"""``python -m benchmarks.real_size.profile``: where a real-size onnxtrain step spends its time, operator by operator.

    python -m benchmarks.real_size.profile --workload gpt2-small --shapes 16x256 --device cuda --out DIR

Trains onnxtrain's step as :mod:`benchmarks.real_size.worker` does (the same
artifacts, options and batches) with onnxruntime's profiler on in every
session the runtime opens, then reads the fused step's profile (the session
that ran the most), leaving out its first ``--warmup`` runs:

- per run: the run's wall time, the sum of its nodes' times and how many
  nodes ran, on which provider;
- per operator type and provider: nodes per run, time per run, share;
- the slowest nodes, and the copies between host and device (``Memcpy``);

and, on CUDA with torch importable, the GPU's own side from torch's profiler
(CUPTI sees every kernel of the process, onnxruntime's too) over a few more
steps: kernels per step, their time per step, and the share of the step the
GPU was busy.

A node's time in onnxruntime's profile is the host's: on CUDA it is the time
to launch the node's kernels, not to run them, except where the node waits
for the device (a copy to the host, a kernel that reads a result back). So a
node far slower than its peers on CUDA is a synchronisation, and a step whose
node times add up to its wall time while the GPU is idle much of it is bound
by launches. Profiling slows each node a little: the times are for ranking,
not for the benchmark's tables.

Writes ``DIR/profile-<workload>.md`` and ``.json``; the raw profiles stay in
``--workdir``.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import itertools
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

#: How many of the slowest node kinds, nodes and kernels the report lists.
LISTED = 15


@contextlib.contextmanager
def profiled_sessions(folder: Path) -> Iterator[list[Path]]:
    """While open, every session onnxtrain's runtime opens profiles into ``folder`` (``session-<n>`` files, in
    the order opened); on leaving, each session's profile is ended and its file added to the list yielded."""
    import onnxruntime as ort

    from onnxtrain.training import binding

    folder.mkdir(parents=True, exist_ok=True)
    opened = binding.inference_session
    counter = itertools.count()
    sessions: list[ort.InferenceSession] = []
    files: list[Path] = []

    def profiling(source: Any, options: ort.SessionOptions | None = None, *args: Any, **kwargs: Any) -> Any:
        options = options if options is not None else ort.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = str(folder / f"session-{next(counter)}")
        sessions.append(opened(source, options, *args, **kwargs))
        return sessions[-1]

    binding.inference_session = profiling  # type: ignore[assignment]
    try:
        yield files
    finally:
        binding.inference_session = opened  # type: ignore[assignment]
        files.extend(Path(session.end_profiling()) for session in sessions)
        sessions.clear()


def read_runs(path: Path) -> list[dict[str, Any]]:
    """The runs in one onnxruntime profile, in order: ``{"wall_us", "nodes": [(name, op, provider, us)]}``, each
    node event assigned to the ``model_run`` whose span holds it."""
    events = json.loads(Path(path).read_text())
    runs = sorted(
        ((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events if e.get("name") == "model_run"),
    )
    out: list[dict[str, Any]] = [{"wall_us": end - start, "nodes": []} for start, end in runs]
    starts = [start for start, _ in runs]
    for event in events:
        if event.get("cat") != "Node" or not str(event.get("name", "")).endswith("_kernel_time"):
            continue
        ts = float(event["ts"])
        index = bisect.bisect_right(starts, ts) - 1  # the last run that started at or before ts
        if index < 0 or ts > runs[index][1]:
            continue
        args = event.get("args", {})
        name = str(event["name"])[: -len("_kernel_time")]
        out[index]["nodes"].append((name, args.get("op_name", "?"), args.get("provider", "?"), float(event["dur"])))
    return out


def summarize_runs(runs: Sequence[dict[str, Any]], skip: int, tail: int = 0) -> dict[str, Any]:
    """The figures of the module docstring over the runs less the first ``skip`` and the last ``tail`` (all of
    them where that would leave none)."""
    kept = list(runs[skip : len(runs) - tail]) or list(runs)
    count = len(kept)
    if not count:
        return {"runs": 0}
    by_kind: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    by_node: dict[str, list[Any]] = defaultdict(lambda: ["", "", 0.0])
    providers: dict[str, int] = defaultdict(int)
    for run in kept:
        for name, op, provider, us in run["nodes"]:
            kind = by_kind[(op, provider)]
            kind[0] += 1
            kind[1] += us
            node = by_node[name]
            node[0], node[1] = op, provider
            node[2] += us
            providers[provider] += 1
    node_us = sum(us for _, us in by_kind.values()) / count
    kinds = sorted(by_kind.items(), key=lambda item: -item[1][1])
    slowest = sorted(by_node.items(), key=lambda item: -item[1][2])[:LISTED]
    copies = {f"{op} ({provider})": n / count for (op, provider), (n, _) in by_kind.items() if op.startswith("Memcpy")}
    return {
        "runs": count,
        "wall_ms": statistics.median(run["wall_us"] for run in kept) / 1e3,
        "node_ms": node_us / 1e3,
        "nodes_per_run": sum(providers.values()) / count,
        "nodes_per_run_by_provider": {p: n / count for p, n in sorted(providers.items())},
        "memcpy_per_run": copies,
        "kinds": [
            {
                "op": op,
                "provider": provider,
                "per_run": n / count,
                "ms_per_run": us / count / 1e3,
                "share": us / count / node_us if node_us else 0.0,
            }
            for (op, provider), (n, us) in kinds
        ],
        "slowest_nodes": [
            {"node": name, "op": op, "provider": provider, "ms_per_run": us / count / 1e3}
            for name, (op, provider, us) in slowest
        ],
    }


def fused_step_profile(files: Sequence[Path], skip: int, tail: int = 0) -> dict[str, Any]:
    """:func:`summarize_runs` of the profile with the most runs (the fused step's), and which file it was."""
    runs = {path: read_runs(path) for path in files}
    if not runs:
        return {"runs": 0, "error": "no profile was written"}
    chosen = max(runs, key=lambda path: len(runs[path]))
    return {"file": chosen.name, "sessions": len(runs), **summarize_runs(runs[chosen], skip, tail)}


#: The device's own activities in a Kineto trace (torch's profiler): what keeps the GPU busy.
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})


def gpu_kernels(step: Callable[[int], float], steps: int, first: int, folder: Path) -> dict[str, Any]:
    """torch's profiler over ``steps`` more steps (numbered from ``first``), its trace written to
    ``folder/kernels.json`` and summarized by :func:`kernel_summary`; ``{"error": ...}`` where torch or its CUDA
    profiler is missing."""
    import time

    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError as error:
        return {"error": f"torch is not importable: {error}"}
    if not torch.cuda.is_available():
        return {"error": "torch sees no CUDA device"}
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        start = time.perf_counter()
        for i in range(steps):
            step(first + i)
        wall = time.perf_counter() - start
    trace = folder / "kernels.json"
    profiler.export_chrome_trace(str(trace))
    return kernel_summary(json.loads(trace.read_text()), steps, wall)


def kernel_summary(trace: dict[str, Any] | list[dict[str, Any]], steps: int, wall_s: float) -> dict[str, Any]:
    """Per step, from a Kineto trace: the device's activities (kernels, copies, sets), their summed time, the
    time the device was busy with any (their spans' union) as a share of ``wall_s``, the longest kinds."""
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    device = [e for e in events if e.get("cat") in DEVICE_CATEGORIES and e.get("ph") == "X"]
    kinds: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    spans = []
    for event in device:
        start, duration = float(event["ts"]), float(event.get("dur", 0))
        kind = kinds[f"{event['cat']}: {event.get('name', '?')}"]
        kind[0] += 1
        kind[1] += duration
        spans.append((start, start + duration))
    busy, reach = 0.0, float("-inf")
    for start, end in sorted(spans):  # the union's length
        if end > reach:
            busy += end - max(start, reach)
            reach = end
    ranked = sorted(kinds.items(), key=lambda item: -item[1][1])[:LISTED]
    return {
        "steps": steps,
        "wall_ms_per_step": wall_s / steps * 1e3,
        "activities_per_step": len(device) / steps,
        "kernels_per_step": sum(1 for e in device if e["cat"] == "kernel") / steps,
        "device_ms_per_step": sum(us for _, us in kinds.values()) / steps / 1e3,
        "busy_ms_per_step": busy / steps / 1e3,
        "busy_share": busy / 1e6 / wall_s if wall_s else 0.0,
        "top": [
            {"kernel": name[:160], "per_step": n / steps, "ms_per_step": us / steps / 1e3} for name, (n, us) in ranked
        ],
    }


def render(workload: str, shape: str, result: dict[str, Any]) -> str:
    """The markdown report of one profiled workload."""
    ort_side, gpu = result.get("profile", {}), result.get("kernels", {})
    lines = [f"## {workload}, {shape}, {result.get('device', '?')}", ""]
    if ort_side.get("runs"):
        providers = ", ".join(f"{p} {n:,.0f}" for p, n in ort_side["nodes_per_run_by_provider"].items())
        copies = ", ".join(f"{k} {n:,.0f}" for k, n in ort_side["memcpy_per_run"].items()) or "none"
        lines += [
            f"Fused step ({ort_side['runs']} runs profiled, {ort_side['sessions']} sessions): wall "
            f"{ort_side['wall_ms']:.1f} ms per run, nodes' own time {ort_side['node_ms']:.1f} ms; "
            f"{ort_side['nodes_per_run']:,.0f} nodes per run ({providers}); copies per run: {copies}.",
            "",
            "| operator | provider | nodes per run | ms per run | share |",
            "|---|---|---:|---:|---:|",
            *(
                f"| {k['op']} | {k['provider']} | {k['per_run']:,.0f} | {k['ms_per_run']:.2f} | {k['share']:.1%} |"
                for k in ort_side["kinds"][:LISTED]
            ),
            "",
            "| slowest node | operator | provider | ms per run |",
            "|---|---|---|---:|",
            *(
                f"| {n['node'][:60]} | {n['op']} | {n['provider']} | {n['ms_per_run']:.3f} |"
                for n in ort_side["slowest_nodes"]
            ),
            "",
        ]
    else:
        lines += [f"No onnxruntime profile: {ort_side.get('error', 'no runs')}", ""]
    if "error" in gpu or not gpu:
        lines += [f"GPU kernels: not measured ({gpu.get('error', 'not on CUDA')}).", ""]
    else:
        lines += [
            f"The GPU over {gpu['steps']} steps: {gpu['kernels_per_step']:,.0f} kernels per step "
            f"({gpu['activities_per_step']:,.0f} activities with the copies and sets), "
            f"{gpu['device_ms_per_step']:.1f} ms of them per step, busy {gpu['busy_ms_per_step']:.1f} ms of the "
            f"{gpu['wall_ms_per_step']:.1f} ms wall ({gpu['busy_share']:.0%}).",
            "",
            "| activity | per step | ms per step |",
            "|---|---:|---:|",
            *(f"| `{k['kernel'][:80]}` | {k['per_step']:,.0f} | {k['ms_per_step']:.2f} |" for k in gpu["top"]),
            "",
        ]
    return "\n".join(lines)


def arguments() -> argparse.ArgumentParser:
    from benchmarks.real_size.__main__ import add_one_shape_arguments
    from benchmarks.real_size.worker import PRECISIONS

    parser = argparse.ArgumentParser(prog="python -m benchmarks.real_size.profile", description=__doc__.splitlines()[0])
    add_one_shape_arguments(parser, device="cpu", report="profile-<workload>")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32")
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of the figures")
    parser.add_argument("--steps", type=int, default=5, help="profiled steps after the warm-up")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks.real_size.__main__ import _worker, one_shape, prepared

    parser = arguments()
    args = parser.parse_args(argv)
    batch, seq = one_shape(parser, args)
    folder, _ = prepared(args.workload, args.workdir, args.precision, args.checkpointing)
    profiles = args.workdir / "profiles" / f"{args.workload}-{batch}x{seq}-{args.device}"
    for old in profiles.glob("session-*.json"):
        old.unlink()
    argv = ["train", "--workload", args.workload, "--folder", str(folder), "--framework", "onnxtrain"]
    argv += ["--batch", str(batch), "--seq", str(seq), "--device", args.device, "--precision", args.precision]
    argv += ["--warmup", str(args.warmup), "--steps", str(args.steps), "--profile", str(profiles)]
    result = _worker(argv + (["--checkpointing"] if args.checkpointing else []))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"profile-{args.workload}.json").write_text(json.dumps(result, indent=1) + "\n")
    text = render(args.workload, f"{batch}x{seq}", result) if "error" not in result else f"error: {result['error']}"
    (args.out / f"profile-{args.workload}.md").write_text(text + "\n")
    print(text)
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(main())
