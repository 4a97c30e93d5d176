"""``python -m benchmarks.run``: steps per second and peak memory of onnxtrain, PyTorch and onnxruntime-training.

For each workload: export it once (:mod:`benchmarks.prepare`), let each ONNX
framework write its artifacts in a process of its own, then train each
framework in a fresh process (so that each peak RSS is that framework's on that
workload alone), one after the other, never in parallel. Prints the report
(:mod:`benchmarks.report`) in Markdown; ``--markdown`` also writes it to a file.

Timings are only as good as the machine is quiet: the report records the load
average before and after the run.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import ort_venv, report
from benchmarks.measure import parse_result, physical_cores
from benchmarks.workloads import WORKLOADS, Workload

ROOT = Path(__file__).resolve().parent.parent
WORKERS = {
    report.ONNXTRAIN: "benchmarks.workers.onnxtrain_worker",
    report.ORT: "benchmarks.workers.ort_training_worker",
    report.TORCH: "benchmarks.workers.torch_worker",
}
GENERATES = (report.ONNXTRAIN, report.ORT)
#: Seconds any one worker may take.
TIMEOUT = 1800


@dataclass(frozen=True)
class Settings:
    warmup: int
    repeats: int
    steps: int | None  # None: the workload's own
    quick: bool
    threads: int

    def steps_for(self, workload: Workload) -> int:
        if self.steps is not None:
            return self.steps
        return workload.quick_steps if self.quick else workload.steps


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke mode: few steps, 2 repeats")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {list(WORKLOADS)}")
    parser.add_argument("--frameworks", default=",".join(report.FRAMEWORKS), help=f"of {list(report.FRAMEWORKS)}")
    parser.add_argument("--warmup", type=int, help="warm-up steps (default 20, quick 3)")
    parser.add_argument("--repeats", type=int, help="timed repeats; the median is reported (default 7, quick 2)")
    parser.add_argument("--steps", type=int, help="timed steps per repeat (default: per workload)")
    parser.add_argument(
        "--threads", type=int, default=0, help="intra-op threads for all (default 0: onnxruntime's own default)"
    )
    parser.add_argument("--ort-python", type=Path, help="Python of an onnxruntime-training 1.19.2 environment")
    parser.add_argument("--ort-venv", type=Path, default=ort_venv.DEFAULT_VENV, help="created when missing")
    parser.add_argument("--workdir", type=Path, help="where models and artifacts go (default: a temporary folder)")
    parser.add_argument("--markdown", type=Path, help="also write the report to this file")
    parser.add_argument("--json", type=Path, help="also write the raw results to this file")
    return parser


def machine() -> str:
    """CPU model and cores, from /proc/cpuinfo and the affinity mask."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    memory = ""
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f", {kib / 2**20:.0f} GiB memory"
    except (OSError, ValueError, IndexError):
        pass
    return f"{model}, {cpus} logical CPUs, {physical_cores()} physical cores{memory}, {platform.system()}"


def revision() -> str:
    """The checkout's commit, marked when onnxtrain/ has uncommitted changes ("unknown" outside git)."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "onnxtrain"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{commit} with uncommitted changes in onnxtrain/" if dirty else commit


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def run_worker(
    python: Path, framework: str, command: str, folder: Path, artifacts: Path, settings: Settings, steps: int
) -> dict[str, Any]:
    """Run one worker process and return its result, or ``{"error": reason}``."""
    argv = [
        str(python),
        "-m",
        WORKERS[framework],
        command,
        "--folder",
        str(folder),
        "--artifacts",
        str(artifacts),
        "--warmup",
        str(settings.warmup),
        "--steps",
        str(steps),
        "--repeats",
        str(settings.repeats),
        "--threads",
        str(settings.threads),
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    try:
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        return {"framework": framework, "workload": folder.name, "error": f"{command} ran over {TIMEOUT} s"}
    result = parse_result(done.stdout)
    if result is None:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        result = {"error": f"{command} exited with {done.returncode}: {lines[-1] if lines else 'no output'}"}
    elif "error" in result and command == "generate":
        result["error"] = f"generate_artifacts: {result['error']}"
    result.update(framework=framework, workload=folder.name)
    return result


def run_workload(
    workload: Workload, workdir: Path, frameworks: Sequence[str], pythons: dict[str, Path | str], settings: Settings
) -> list[dict[str, Any]]:
    """Prepare ``workload``, then generate and train each framework; one result per framework.

    ``pythons[framework]`` is the interpreter to run it with, or (a string) the reason it cannot run.
    """
    from benchmarks.prepare import prepare

    folder = prepare(workload, workdir)
    results = []
    for framework in frameworks:
        python = pythons[framework]
        if isinstance(python, str):  # why the framework cannot run
            results.append({"framework": framework, "workload": workload.name, "error": str(python)})
            continue
        artifacts = folder / f"artifacts-{framework}"
        steps = settings.steps_for(workload)
        result: dict[str, Any] = {}
        if framework in GENERATES:
            generated = run_worker(python, framework, "generate", folder, artifacts, settings, steps)
            if "error" in generated:
                results.append(generated)
                _log(f"{workload.name} / {framework}: {generated['error']}")
                continue
            result["generate_s"] = generated.get("generate_s", 0.0) - generated.get("import_s", 0.0)
        trained = run_worker(python, framework, "train", folder, artifacts, settings, steps)
        results.append({**trained, **result})
        shown = trained.get("error") or f"{trained['us_per_step']:.1f} µs/step, peak {trained['peak_rss_mib']:.0f} MiB"
        _log(f"{workload.name} / {framework}: {shown}")
    return results


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _choose(value: str, known: Sequence[str], what: str) -> list[str]:
    chosen = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in known]
    if unknown or not chosen:
        raise SystemExit(f"--{what}: {unknown or value!r} unknown; choose from {list(known)}")
    return chosen


def _ort_python(args: argparse.Namespace) -> Path | str:
    """The environment's Python, or the reason there is none (which the table reports)."""
    if args.ort_python is not None:
        return args.ort_python if args.ort_python.exists() else f"--ort-python {args.ort_python} does not exist"
    python, reason = ort_venv.ensure(args.ort_venv)
    return python if python is not None else f"onnxruntime-training unavailable: {reason}"


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments().parse_args(argv)
    if importlib.util.find_spec("torch") is None:
        raise SystemExit(
            "the benchmark builds and exports its models with torch, which is not installed here: "
            "make torch (or pip install torch==2.13.0, a CPU build)"
        )
    workloads = [WORKLOADS[name] for name in _choose(args.workloads, list(WORKLOADS), "workloads")]
    frameworks = _choose(args.frameworks, report.FRAMEWORKS, "frameworks")
    settings = Settings(
        warmup=args.warmup if args.warmup is not None else (3 if args.quick else 20),
        repeats=args.repeats if args.repeats is not None else (2 if args.quick else 7),
        steps=args.steps,
        quick=args.quick,
        threads=args.threads,
    )
    pythons: dict[str, Path | str] = {report.ONNXTRAIN: Path(sys.executable), report.TORCH: Path(sys.executable)}
    if report.ORT in frameworks:
        pythons[report.ORT] = _ort_python(args)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="onnxtrain-bench-"))
    started, load_before = datetime.datetime.now().astimezone(), load_average()
    results: list[dict[str, Any]] = []
    try:
        for workload in workloads:
            results += run_workload(workload, workdir, frameworks, pythons, settings)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    threads = settings.threads or f"onnxruntime's default ({physical_cores()}, the physical cores)"
    header = [
        f"Measured {started:%Y-%m-%d %H:%M %Z} on {machine()}; load average before {load_before}, "
        f"after {load_average()}.",
        f"Python {platform.python_version()}; {_versions(results)}; onnxtrain at commit {revision()}.",
        f"Threads: intra-op {threads} for onnxruntime and onnxruntime-training; "
        f"torch.set_num_threads({settings.threads or physical_cores()}). Each runtime keeps its own session "
        "options otherwise (onnxtrain's turn thread spinning off).",
        f"Each figure: the median over {settings.repeats} repeats of N timed steps after {settings.warmup} warm-up "
        "steps; peak RSS of the training process (imports included).",
    ]
    if args.quick:
        header.insert(0, "**Quick mode (smoke test): the figures are not measurements.**\n")
    text = report.render(results, [(w.name, w.title) for w in workloads], header)
    print(text, end="")
    if args.markdown:
        args.markdown.write_text(text)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


def _versions(results: Sequence[dict[str, Any]]) -> str:
    found: dict[str, str] = {}
    for result in results:
        found.update(result.get("versions", {}))
    return ", ".join(f"{k} {v}" for k, v in sorted(found.items())) or "no versions reported"


if __name__ == "__main__":
    sys.exit(main())
