"""The results as Markdown tables: per framework, the ratios, the runs per step, and the targets."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

ONNXTRAIN = "onnxtrain"
ORT = "onnxruntime-training"
TORCH = "pytorch"
FRAMEWORKS = (ONNXTRAIN, ORT, TORCH)
#: µs per step; peak RSS; peak RSS above the RSS once the framework is imported.
Metric = Literal["time", "memory", "training memory"]


#: Where a target comes from: the list it is reported in.
ISSUE = "issue 5"
STEADY = "the steady step: per-step calls, and train_epoch on the epoch workloads"


@dataclass(frozen=True)
class Target:
    """``onnxtrain's <metric> <= bound x <peer>'s`` on ``workload`` (``None``: every workload), from ``source``."""

    workload: str | None
    metric: Metric
    peer: str
    bound: float
    source: str = ISSUE

    def describe(self, workload: str) -> str:
        what = {"time": "step time", "memory": "peak memory"}.get(self.metric, "peak memory above its imports")
        return f"{workload}: onnxtrain {what} <= {self.bound:g}x {self.peer}'s"


#: Issue 5, "Speed"; the last one reads its memory target without the imports (onnxruntime-training's
#: Python package imports torch, which alone is most of its peak). Then the steady step's: the per-step
#: calls, and the epoch workloads, where onnxtrain's step is a batch of train_epoch.
TARGETS = (
    Target("linreg", "time", ORT, 1.0),
    Target("mlp", "time", ORT, 1.0),
    Target("mlp", "time", TORCH, 0.6),
    Target(None, "memory", ORT, 1.2),
    Target(None, "training memory", ORT, 1.2),
    Target("linreg", "time", ORT, 0.9, STEADY),
    Target("mlp", "time", ORT, 0.9, STEADY),
    Target("linreg-epoch", "time", ORT, 0.33, STEADY),
    Target("digits-mlp-epoch", "time", ORT, 0.7, STEADY),
)


def _index(results: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["workload"], r["framework"]): r for r in results}


def _ok(result: dict[str, Any] | None) -> bool:
    return result is not None and "error" not in result and "us_per_step" in result


def _above_imports(result: dict[str, Any]) -> float:
    """Peak RSS above the RSS once the framework is imported: the memory training itself takes."""
    return float(result["peak_rss_mib"]) - float(result.get("rss_after_import_mib", math.nan))


def _metric(result: dict[str, Any], metric: Metric) -> float:
    """``time``: µs per step; ``memory``: peak RSS; ``training memory``: peak RSS above the imports."""
    if metric == "time":
        return float(result["us_per_step"])
    return float(result["peak_rss_mib"]) if metric == "memory" else _above_imports(result)


def ratio(results: Sequence[dict[str, Any]], workload: str, metric: Metric, peer: str) -> float | None:
    """onnxtrain's metric over ``peer``'s, or ``None`` when either did not run."""
    index = _index(results)
    ours, theirs = index.get((workload, ONNXTRAIN)), index.get((workload, peer))
    if not (_ok(ours) and _ok(theirs)):
        return None
    assert ours is not None and theirs is not None
    return _metric(ours, metric) / _metric(theirs, metric)


def paired_ratio(results: Sequence[dict[str, Any]], workload: str, peer: str) -> float | None:
    """The median over repeats of onnxtrain's time over ``peer``'s in the same repeat, or ``None``.

    The repeats are interleaved (:mod:`benchmarks.run`): repeat ``r`` of each
    framework ran in the same turn, so each pair shares the machine's state of
    that moment, and a slow spell divides out; the ratio of the medians mixes
    figures taken at different moments.
    """
    index = _index(results)
    ours, theirs = index.get((workload, ONNXTRAIN)), index.get((workload, peer))
    if not (_ok(ours) and _ok(theirs)):
        return None
    assert ours is not None and theirs is not None
    # a worker that dropped out reports an error instead, so both ran every turn; pair what there is
    pairs = list(zip(ours.get("us_per_step_repeats", []), theirs.get("us_per_step_repeats", []), strict=False))
    if not pairs:
        return None
    return statistics.median(a / b for a, b in pairs)


def _time(us: float) -> str:
    return f"{us / 1000:.3g} ms" if us >= 1000 else f"{us:.3g} µs"


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _failure(result: dict[str, Any] | None) -> str:
    if result is None:
        return "not run"
    return "failed: " + str(result.get("error", "no result")).replace("|", "\\|")


def framework_table(results: Sequence[dict[str, Any]], workloads: Sequence[tuple[str, str]]) -> str:
    """One row per workload and framework: time, rate, memory, the first losses."""
    lines = [
        "| workload | framework | time/step | best repeat | steps/s | peak RSS | RSS after imports | peak - imports "
        "| set-up | losses, steps 1-3 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    index = _index(results)
    for name, _ in workloads:
        for framework in FRAMEWORKS:
            result = index.get((name, framework))
            if result is None:
                continue
            if not _ok(result):
                lines.append(f"| {name} | {framework} | {_failure(result)} | | | | | | | |")
                continue
            losses = ", ".join(f"{v:.6g}" for v in result.get("first_losses", []))
            lines.append(
                f"| {name} | {framework} | {_time(result['us_per_step'])} "
                f"| {_time(result.get('us_per_step_min', math.nan))} | {result['steps_per_s']:,.0f} "
                f"| {result['peak_rss_mib']:.0f} MiB | {result.get('rss_after_import_mib', math.nan):.0f} MiB "
                f"| {_above_imports(result):.0f} MiB "
                f"| {result.get('setup_s', math.nan) - result.get('import_s', 0.0):.2f} s | {losses} |"
            )
    return "\n".join(lines)


def ratio_table(results: Sequence[dict[str, Any]], workloads: Sequence[tuple[str, str]]) -> str:
    """onnxtrain against each peer: time and peak-memory ratios (below 1: onnxtrain is faster or smaller)."""
    lines = [
        "| workload | time vs ORT-training | time vs PyTorch | peak RSS vs ORT-training | peak RSS vs PyTorch "
        "| peak - imports vs ORT-training | peak - imports vs PyTorch |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    metrics: tuple[Metric, ...] = ("time", "memory", "training memory")
    for name, _ in workloads:
        cells = [_ratio(ratio(results, name, metric, peer)) for metric in metrics for peer in (ORT, TORCH)]
        for i, peer in enumerate((ORT, TORCH)):
            paired = paired_ratio(results, name, peer)
            if paired is not None:
                cells[i] += f" (paired {paired:.2f}x)"
        lines.append(f"| {name} | {' | '.join(cells)} |")
    return "\n".join(lines)


def target_lines(
    results: Sequence[dict[str, Any]], workloads: Sequence[tuple[str, str]], targets: Sequence[Target] = TARGETS
) -> list[str]:
    """Each of ``targets``, on the workloads run, with the measured ratio and whether it is met."""
    names = [name for name, _ in workloads]
    index = _index(results)
    lines = []
    for target in targets:
        for name in [target.workload] if target.workload else names:
            if name not in names:
                continue
            value = ratio(results, name, target.metric, target.peer)
            paired = paired_ratio(results, name, target.peer) if target.metric == "time" else None
            if value is None:
                missing = [fw for fw in (ONNXTRAIN, target.peer) if not _ok(index.get((name, fw)))]
                states = [f"{fw} {'failed' if (name, fw) in index else 'not run'}" for fw in missing]
                verdict = f"not measured ({', '.join(states)})"
            elif paired is not None:  # a time: judged on the paired repeats (see paired_ratio)
                verdict = f"{paired:.2f}x paired (ratio of the medians {value:.2f}x): " + _verdict(paired, target)
            else:
                verdict = f"{value:.2f}x: " + _verdict(value, target)
            lines.append(f"- {target.describe(name)}: {verdict}")
    return lines


def target_sections(results: Sequence[dict[str, Any]], workloads: Sequence[tuple[str, str]]) -> list[str]:
    """The targets, one list per source, in the order of :data:`TARGETS`; a source none of whose workloads ran
    is left out."""
    parts: list[str] = []
    for source in dict.fromkeys(target.source for target in TARGETS):
        lines = target_lines(results, workloads, [t for t in TARGETS if t.source == source])
        if lines:
            parts += [f"Targets ({source}):", "", *lines, ""]
    return parts


def _per_step(value: float) -> str:
    """A count per step: ``2``, ``0.5``, or ``1/56`` for one call per pass of 56 batches."""
    if 0 < value < 1 and abs(1 / value - round(1 / value)) < 1e-6:
        return f"1/{round(1 / value)}"
    return f"{value:.3g}"


def _runs(label: str, per_step: float, inside: dict[str, float] | None) -> str:
    """``label runs``, and the µs per step inside them where there are several labels to tell apart."""
    text = f"{label} {_per_step(per_step)}"
    return f"{text} ({inside[label]:.3g} µs)" if inside and len(inside) > 1 and label in inside else text


def runs_table(results: Sequence[dict[str, Any]], workloads: Sequence[tuple[str, str]]) -> str:
    """Per step of the counted pass: the calls into onnxruntime that run a model, the time inside them and the
    time outside them, for each result that has one (the ONNX frameworks)."""
    lines = [
        "| workload | framework | calls into onnxruntime per step | which | µs per step inside them "
        "| Python µs per step outside onnxruntime | counted step |",
        "|---|---|---:|---|---:|---:|---:|",
    ]
    index = _index(results)
    for name, _ in workloads:
        for framework in FRAMEWORKS:
            result = index.get((name, framework))
            counted = result.get("counted") if result is not None and _ok(result) else None
            if not counted:
                continue
            which = ", ".join(
                _runs(label, v, counted.get("us_inside_by_label")) for label, v in counted["runs_by_label"].items()
            )
            lines.append(
                f"| {name} | {framework} | {_per_step(counted['runs_per_step'])} | {which} "
                f"| {counted['us_inside_runs_per_step']:.3g} | {counted['us_outside_runs_per_step']:.3g} "
                f"| {_time(counted['us_counted_step'])} |"
            )
    return "\n".join(lines) if len(lines) > 2 else ""


def _verdict(value: float, target: Target) -> str:
    return "met" if value <= target.bound else "**NOT met**"


def loss_check(results: Sequence[dict[str, Any]], workloads: Sequence[tuple[str, str]]) -> list[str]:
    """Same weights and data: the first step's loss must agree across frameworks."""
    lines = []
    index = _index(results)
    for name, _ in workloads:
        firsts = {
            fw: index[(name, fw)]["first_losses"][0]
            for fw in FRAMEWORKS
            if _ok(index.get((name, fw))) and index[(name, fw)].get("first_losses")
        }
        if len(firsts) < 2:
            continue
        spread = max(firsts.values()) - min(firsts.values())
        scale = max(abs(v) for v in firsts.values()) or 1.0
        verdict = "agree" if spread / scale < 1e-4 else "**DIFFER**"
        lines.append(f"- {name}: first-step losses {verdict} (relative spread {spread / scale:.1e})")
    return lines


def _runs_section(results: Sequence[dict[str, Any]], workloads: Sequence[tuple[str, str]]) -> list[str]:
    table = runs_table(results, workloads)
    if not table:
        return []
    return [
        "Calls into onnxruntime per steady step, from a counted pass after the timed repeats (one repeat's worth "
        "of steps with each call that runs a model wrapped, counted and timed; the timed repeats run unwrapped): "
        "onnxtrain's `run_with_iobinding` of its sessions, onnxruntime-training's native `Module.train_step` and "
        "`Optimizer.optimizer_step`. Epoch workloads: onnxtrain's calls per pass over the batches. Python µs "
        "outside onnxruntime: the counted step's wall time less the time inside those calls (and the wrappers' "
        "own): the framework's Python, and its native calls that run no model (binding, `lazy_reset_grad`).",
        "",
        table,
        "",
    ]


def render(results: Sequence[dict[str, Any]], workloads: Sequence[tuple[str, str]], header: Sequence[str]) -> str:
    """The whole report, in Markdown."""
    parts = [
        *header,
        "",
        "Workloads:",
        "",
        *[f"- `{name}`: {title}" for name, title in workloads],
        "",
        framework_table(results, workloads),
        "",
        "onnxtrain's figure over the peer's (below 1.00x: onnxtrain is faster or smaller; paired: the median of the "
        "per-repeat ratios, each of two repeats run in the same turn):",
        "",
        ratio_table(results, workloads),
        "",
        *_runs_section(results, workloads),
        *target_sections(results, workloads),
        "Same initial weights and batches: the loss of the first step (before any update) must agree:",
        "",
        *loss_check(results, workloads),
    ]
    return "\n".join(parts) + "\n"
