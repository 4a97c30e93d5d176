"""The Markdown tables of ``python -m benchmarks.real_size``, from the workers' results and the static figures.

- speed and peak memory per model, batch shape and framework (the median
  over runs of each run's median step; every run's figure listed);
- onnxtrain's figures over PyTorch's (eager attention, SDPA);
- the memory breakdown: parameters, gradients and AdamW's moments (with the
  buffers held of each), the activations kept for the backward (onnxtrain:
  the static analysis of its fused step as onnxruntime optimizes it;
  PyTorch: the tensors autograd saved), and the rest of the peak above the
  baseline;
- the static figures: nodes per step, held bytes, the static peak of live
  tensors, where it is, and what is alive there.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

ONNXTRAIN = "onnxtrain"
KINDS = ("parameters", "gradients", "moments")


def _mib(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value / 1024:.2f} GiB" if value >= 1024 else f"{value:.0f} MiB"


def _seconds(value: float) -> str:
    return f"{value:.2f} s" if value >= 1 else f"{value * 1e3:.0f} ms"


def peak_above_baseline(result: Mapping[str, Any]) -> float:
    """MiB of the process's peak RSS (set-up or steps, whichever is higher) above its RSS before the model."""
    peak = max(result["setup"]["peak_rss_mib"], result["steps"]["peak_rss_mib"])
    return peak - result["baseline"]["rss_mib"]


def gpu_above_baseline(result: Mapping[str, Any]) -> float | None:
    """MiB of GPU memory (NVML: the process's, else the device's) after the steps above the baseline."""
    after, before = result["steps"].get("gpu"), result["baseline"].get("gpu")
    if not after or not before:
        return None
    key = "process_mib" if "process_mib" in after and "process_mib" in before else "device_mib"
    return after[key] - before[key] if key in after and key in before else None


def grouped(results: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str, str], list[Mapping[str, Any]]]:
    """Results without errors by (model, ``BxT``, framework), in the order first seen."""
    groups: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for result in results:
        if "error" in result:
            continue
        key = (result["workload"], f"{result['batch']}x{result['seq']}", result["framework"])
        groups.setdefault(key, []).append(result)
    return groups


def speed_table(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """Step time, tokens per second and peak memory above the baseline, per model, shape and framework."""
    gpu = any(r.get("device") == "cuda" for r in results if "error" not in r)
    head = "| model | batch x seq | framework | time/step | runs | tokens/s | peak RSS - baseline | runs |"
    head += " GPU (NVML) - baseline |" if gpu else ""
    lines = [head + " losses, steps 1-3 |", "|---|---|---|---:|---|---:|---:|---|" + ("---:|" if gpu else "") + "---|"]
    for (model, shape, framework), runs in grouped(results).items():
        times = [r["step_s"] for r in runs]
        peaks = [peak_above_baseline(r) for r in runs]
        median = statistics.median(times)
        tokens = runs[0]["batch"] * runs[0]["seq"] / median
        losses = ", ".join(f"{v:.5g}" for v in runs[0]["losses"][:3])
        row = (
            f"| {model} | {shape} | {framework} | {_seconds(median)} | {', '.join(_seconds(t) for t in times)} | "
            f"{tokens:,.0f} | {_mib(max(peaks))} | {', '.join(_mib(p) for p in peaks)} |"
        )
        if gpu:
            row += f" {_mib(max((g for r in runs if (g := gpu_above_baseline(r)) is not None), default=None))} |"
        lines.append(row + f" {losses} |")
    errors = [r for r in results if "error" in r]
    for r in errors:
        lines.append(f"\n{r.get('workload')} {r.get('batch')}x{r.get('seq')} {r.get('framework')}: {r['error']}")
    return lines


def ratio_table(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """onnxtrain's median step time and largest peak over each PyTorch variant's."""
    groups = grouped(results)
    lines = ["| model | batch x seq | vs | time | peak RSS - baseline |", "|---|---|---|---:|---:|"]
    for (model, shape, framework), runs in groups.items():
        ours = groups.get((model, shape, ONNXTRAIN))
        if framework == ONNXTRAIN or ours is None:
            continue
        time = statistics.median(r["step_s"] for r in ours) / statistics.median(r["step_s"] for r in runs)
        peak = max(map(peak_above_baseline, ours)) / max(map(peak_above_baseline, runs))
        lines.append(f"| {model} | {shape} | {framework} | {time:.2f}x | {peak:.2f}x |")
    return lines


def _state_cell(state: Mapping[str, Any], kind: str, parameters: int) -> str:
    entry = state.get(kind)
    if not entry:
        return "n/a"
    per = entry["tensors"] / max(parameters, 1)
    count = f" ({per:g} per parameter)" if kind == "moments" and per != 1 else ""
    return f"{_mib(entry['mib'])}{count} x {entry['copies']:g}"


def _activations(result: Mapping[str, Any], static: Mapping[str, Any] | None) -> float | None:
    if result["framework"] == ONNXTRAIN:  # the static figure of the fused step onnxruntime runs
        steps = (static or {}).get(f"{result['batch']}x{result['seq']}", {})
        fused = steps.get("fused, optimized", steps.get("fused"))
        return None if fused is None else fused["kept_for_backward_mib"]
    return result["state"].get("saved_for_backward", {}).get("mib")


def breakdown_table(results: Sequence[Mapping[str, Any]], static: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The peak above the baseline, taken apart (the run with the highest peak of each group)."""
    lines = [
        "| model | batch x seq | framework | parameters | gradients | AdamW moments | activations kept for the "
        "backward | rest | peak RSS - baseline |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for (model, shape, framework), runs in grouped(results).items():
        result = max(runs, key=peak_above_baseline)
        state = result["state"]
        parameters = state["parameters"]["tensors"]
        held = sum(state[k]["mib"] * state[k]["copies"] for k in KINDS if k in state)
        kept = _activations(result, static.get(model))
        peak = peak_above_baseline(result)
        rest = peak - held - (kept or 0.0)
        cells = [_state_cell(state, kind, parameters) for kind in KINDS]
        lines.append(
            f"| {model} | {shape} | {framework} | {' | '.join(cells)} | {_mib(kept)} | {_mib(rest)} | {_mib(peak)} |"
        )
    return lines


def static_table(static: Mapping[str, Mapping[str, Any]], kernels: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Per model, shape and step: nodes, held bytes, the static peak, where, what is kept and alive there, and how
    many values' sizes the analysis could not know (counted as 0: a figure with many is too low)."""
    lines = [
        "| model | batch x seq | step (order) | nodes (run by onnxruntime) | held: parameters, gradients, moments "
        "| static peak (of it live) | at | kept for the backward | largest alive at the peak | sizes unknown |",
        "|---|---|---|---:|---|---:|---|---:|---|---:|",
    ]
    for model, shapes in static.items():
        for shape, steps in shapes.items():
            for step, figures in steps.items():
                held = figures["held_mib"]
                held_text = ", ".join(_mib(held.get(k, 0.0)) for k in KINDS)
                run = kernels.get(model, {}).get("nodes") if step == "fused" else None
                nodes = f"{figures['nodes']:,}" + (f" ({run:,})" if run else "")
                largest = "; ".join(
                    f"{g['count']} x {g['producer']} [{g['dims']}] {_mib(g['mib'])}" for g in figures["groups"][:4]
                )
                lines.append(
                    f"| {model} | {shape} | {step} ({figures['order']}) | {nodes} | {held_text} | "
                    f"{_mib(figures['peak_mib'])} ({_mib(figures['peak_live_mib'])}) | {figures['peak_node']}, "
                    f"{figures['peak_phase']} | {_mib(figures['kept_for_backward_mib'])} | {largest} | "
                    f"{len(figures.get('unknown', ())):,} |"
                )
    return lines


def launches_table(results: Sequence[Mapping[str, Any]], kernels: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Per model, the operations one step launches on a device (:mod:`benchmarks.real_size.launches`):
    onnxtrain's fused step as run here (and as a GPU would run it, where this is not one), each PyTorch run's
    ATen operations, with the bytes each moves at a batch shape; the same on any machine."""
    lines = [
        "| model | step | launching operations | aliases or views | of them multi-tensor | bytes moved | at | "
        "most frequent |",
        "|---|---|---:|---:|---:|---:|---|---|",
    ]
    for model, counted in kernels.items():
        for label, figures in (
            ("onnxtrain, as run here", counted),
            ("onnxtrain, as on a GPU", counted.get("as on a GPU")),
        ):
            ops = (figures or {}).get("launches")
            if ops:
                top = ", ".join(f"{kind} {count:,}" for kind, count in ops["top"][:5])
                moved = _bytes(ops.get("bytes"), ops.get("unsized", 0))
                lines.append(
                    f"| {model} | {label} | {ops['launches']:,} | {ops['aliases']:,} | | {moved} | "
                    f"{counted.get('shape', 'n/a')} | {top} |"
                )
    seen: set[tuple[str, str]] = set()
    for result in results:
        ops = result.get("launches")
        key = (result["workload"], result["framework"])
        if ops and key not in seen:
            seen.add(key)
            top = ", ".join(f"{kind} {count:,}" for kind, count in ops["top"][:5])
            lines.append(
                f"| {result['workload']} | {result['framework']} | {ops['launches']:,} | {ops['views']:,} | "
                f"{ops['foreach']:,} | {_bytes(ops.get('bytes'))} | {result['batch']}x{result['seq']} | {top} |"
            )
    return lines if len(lines) > 2 else []


def _bytes(value: int | None, unsized: int = 0) -> str:
    """``value`` bytes in GB, MB or kB (powers of 10), with the count of the operations left out for a size not
    known."""
    if value is None:
        return "n/a"
    scale, unit = next(((s, u) for s, u in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")) if value >= s), (1.0, "B"))
    left_out = f" ({unsized:,} unsized)" if unsized else ""
    return f"{value / scale:.2f} {unit}{left_out}"


def render(
    results: Sequence[Mapping[str, Any]],
    static: Mapping[str, Mapping[str, Any]],
    kernels: Mapping[str, Mapping[str, Any]],
    header: Sequence[str],
) -> str:
    """The whole report."""
    parts = [*header, ""]
    if results:
        parts += ["Speed and peak memory:", "", *speed_table(results), ""]
        parts += ["onnxtrain over PyTorch:", "", *ratio_table(results), ""]
        parts += ["Memory breakdown:", "", *breakdown_table(results, static), ""]
    if static:
        parts += ["Static figures of the training graphs:", "", *static_table(static, kernels), ""]
    launched = launches_table(results, kernels)
    if launched:
        parts += ["Operations launched on a device per step (the same on any machine):", "", *launched, ""]
    return "\n".join(parts)


__all__ = [
    "breakdown_table",
    "launches_table",
    "peak_above_baseline",
    "ratio_table",
    "render",
    "speed_table",
    "static_table",
]
