"""``python -m benchmarks.run``: steps per second and peak memory of onnxtrain, PyTorch and onnxruntime-training.

For each workload: export it once (:mod:`benchmarks.prepare`), let each ONNX
framework write its artifacts in a process of its own, then train each
framework in a fresh process of its own (so that each peak RSS is that
framework's on that workload alone). The training processes set up and warm up
one after the other, then take turns for their timed repeats (never two at
once; the order rotates from one repeat to the next), so that a drift of the
machine's speed hits all frameworks alike. Prints the report
(:mod:`benchmarks.report`) in Markdown; ``--markdown`` also writes it to a file.

Timings are only as good as the machine is quiet: the report records the load
average before and after the run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import os
import platform
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import ort_venv, report
from benchmarks.measure import (
    FINISH,
    GO,
    READY,
    REPEAT_PREFIX,
    RESULT_PREFIX,
    SPINNING,
    SPINNING_ENTRY,
    parse_result,
    physical_cores,
)
from benchmarks.workloads import WORKLOADS, Workload

ROOT = Path(__file__).resolve().parent.parent
WORKERS = {
    report.ONNXTRAIN: "benchmarks.workers.onnxtrain_worker",
    report.ORT: "benchmarks.workers.ort_training_worker",
    report.TORCH: "benchmarks.workers.torch_worker",
}
GENERATES = (report.ONNXTRAIN, report.ORT)
#: Seconds any one worker may take (an interleaved ``train`` worker: not counting its waits for the others).
TIMEOUT = 1800
#: Seconds of quiet before each interleaved repeat, so the threads of the worker that ran last have gone to
#: sleep (onnxruntime's and OpenMP's pools spin a while after their work) and each repeat starts alike.
SETTLE_S = 0.1


@dataclass(frozen=True)
class Settings:
    warmup: int
    repeats: int
    steps: int | None  # None: the workload's own
    quick: bool
    threads: int
    spinning: str = "default"  # one of measure.SPINNING

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
    parser.add_argument("--repeats", type=int, help="timed repeats; the median is reported (default 11, quick 2)")
    parser.add_argument("--steps", type=int, help="timed steps per repeat (default: per workload)")
    parser.add_argument(
        "--threads", type=int, default=0, help="intra-op threads for all (default 0: onnxruntime's own default)"
    )
    parser.add_argument(
        "--spinning",
        choices=SPINNING,
        default="default",
        help="intra-op threads of every onnxruntime session spin (on) or not (off); default: onnxtrain's "
        "(only its fused and epoch steps spin) and onnxruntime-training's (all spin)",
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


def _argv(
    python: Path, framework: str, command: str, folder: Path, artifacts: Path, settings: Settings, steps: int
) -> list[str]:
    return [
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
        "--spinning",
        settings.spinning,
    ]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT))


def _outcome(stdout: str, stderr: str, returncode: int | None, command: str) -> dict[str, Any]:
    """The result a worker printed, or ``{"error": ...}`` from the last line of its stderr."""
    result = parse_result(stdout)
    if result is None:
        lines = [line for line in stderr.strip().splitlines() if line.strip()]
        result = {"error": f"{command} exited with {returncode}: {lines[-1] if lines else 'no output'}"}
    elif "error" in result and command == "generate":
        result["error"] = f"generate_artifacts: {result['error']}"
    return result


def run_worker(
    python: Path, framework: str, command: str, folder: Path, artifacts: Path, settings: Settings, steps: int
) -> dict[str, Any]:
    """Run one worker process to its end and return its result, or ``{"error": reason}``."""
    argv = _argv(python, framework, command, folder, artifacts, settings, steps)
    try:
        done = subprocess.run(argv, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        return {"framework": framework, "workload": folder.name, "error": f"{command} ran over {TIMEOUT} s"}
    result = _outcome(done.stdout, done.stderr, done.returncode, command)
    result.update(framework=framework, workload=folder.name)
    return result


class Trainer:
    """A ``train`` worker run with ``--interleaved``: the parent's side of :class:`benchmarks.measure.Control`.

    Its stdout is read by a thread of its own (so that every wait has a
    timeout), its stderr goes to a temporary file. :data:`TIMEOUT` bounds the
    time spent waiting on this worker (set-up and warm-up, its repeats, its
    result), not the time it waits for the others. A worker that prints its
    result early (an error), ends or runs over drops out: ``alive`` turns false.
    """

    def __init__(
        self, python: Path, framework: str, folder: Path, artifacts: Path, settings: Settings, steps: int
    ) -> None:
        self.framework = framework
        self.workload = folder.name
        self.left = float(TIMEOUT)
        self.alive = True
        self.timed_out = False
        self.stdout: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        # closed by finish() (or, after an interruption, with the object)
        self._stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
        argv = [*_argv(python, framework, "train", folder, artifacts, settings, steps), "--interleaved"]
        self.process = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            encoding="utf-8",
            errors="replace",
        )
        self._reader = threading.Thread(target=self._read, name=f"{framework} stdout", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def expect(self, prefix: str) -> str | None:
        """The rest of the worker's next line that starts with ``prefix``; ``None`` when it dropped out instead."""
        if not self.alive:
            return None
        start = time.monotonic()
        try:
            while True:
                try:
                    line = self._lines.get(timeout=max(0.0, self.left - (time.monotonic() - start)))
                except queue.Empty:
                    self.timed_out = True
                    self.kill()
                    return None
                if line is None:  # it ended
                    self.alive = False
                    return None
                self.stdout.append(line)
                if line.startswith(prefix):
                    return line[len(prefix) :].strip()
                if line.startswith(RESULT_PREFIX):  # its error, printed before its turn came
                    self.alive = False
                    return None
        finally:
            self.left -= time.monotonic() - start

    def send(self, command: str) -> bool:
        """Write ``command`` to the worker's stdin; false (and dropped out) when it cannot be written."""
        if not self.alive:
            return False
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(command + "\n")
            self.process.stdin.flush()
        except (OSError, ValueError):  # BrokenPipeError: it ended
            self.alive = False
            return False
        return True

    def repeat(self) -> float | None:
        """Let the worker run one timed repeat; its microseconds per step, or ``None`` when it dropped out."""
        if not self.send(GO):
            return None
        reply = self.expect(REPEAT_PREFIX)
        if reply is None:
            return None
        try:
            return float(reply)
        except ValueError:
            self.alive = False
            return None

    def finish(self) -> dict[str, Any]:
        """Let the worker take its last step and print its result; wait for it to end; its result."""
        if self.send(FINISH):
            self.expect(RESULT_PREFIX)
        self.alive = False
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        try:
            self.process.wait(timeout=max(1.0, self.left))
        except subprocess.TimeoutExpired:
            self.timed_out = True
            self.kill()
        self._reader.join(timeout=10)
        while True:  # what it printed after the last line waited for
            try:
                line = self._lines.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.stdout.append(line)
        self._stderr.seek(0)
        stderr = self._stderr.read()
        self._stderr.close()
        stdout = "".join(self.stdout)
        if self.timed_out and parse_result(stdout) is None:
            result: dict[str, Any] = {"error": f"train ran over {TIMEOUT} s"}
        else:
            result = _outcome(stdout, stderr, self.process.returncode, "train")
        result.update(framework=self.framework, workload=self.workload)
        return result

    def kill(self) -> None:
        self.alive = False
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def train_interleaved(
    trainers: dict[str, tuple[Path, Path]], folder: Path, settings: Settings, steps: int
) -> dict[str, dict[str, Any]]:
    """Train each framework (``trainers[framework]``: its Python and its artifacts) with the repeats interleaved.

    The workers start one after the other, each once the one before has
    warmed up; then, for each repeat, each takes its turn (the order rotating
    by one from repeat to repeat), after :data:`SETTLE_S` seconds of quiet;
    then each takes its last step and prints its result, one after the other.
    A worker that fails or runs over is ended at once and keeps out of the
    turns. One result per framework.
    """
    results: dict[str, dict[str, Any]] = {}
    started: list[Trainer] = []
    try:
        for framework, (python, artifacts) in trainers.items():
            trainer = Trainer(python, framework, folder, artifacts, settings, steps)
            started.append(trainer)
            if trainer.expect(READY) is None:  # failed in its set-up: out before the next one starts
                results[framework] = trainer.finish()
        for r in range(settings.repeats):
            turn = started[r % len(started) :] + started[: r % len(started)] if started else []
            times = []
            for trainer in turn:
                if not trainer.alive:
                    continue
                time.sleep(SETTLE_S)
                us = trainer.repeat()
                times.append(f"{trainer.framework} " + (f"{us:.1f} µs" if us is not None else "dropped out"))
                if us is None:  # its end is not left to overlap the others' turns
                    results[trainer.framework] = trainer.finish()
            if times:
                _log(f"{folder.name} repeat {r + 1}/{settings.repeats}: {', '.join(times)}")
        for trainer in started:
            if trainer.framework not in results:
                results[trainer.framework] = trainer.finish()
    finally:
        for trainer in started:
            trainer.kill()
    return results


def run_workload(
    workload: Workload, workdir: Path, frameworks: Sequence[str], pythons: dict[str, Path | str], settings: Settings
) -> list[dict[str, Any]]:
    """Prepare ``workload``, then generate and train each framework; one result per framework.

    ``pythons[framework]`` is the interpreter to run it with, or (a string) the reason it cannot run.
    """
    from benchmarks.prepare import prepare

    folder = prepare(workload, workdir)
    steps = settings.steps_for(workload)
    results: dict[str, dict[str, Any]] = {}
    generate_s: dict[str, float] = {}
    trainers: dict[str, tuple[Path, Path]] = {}
    for framework in frameworks:
        python = pythons[framework]
        if isinstance(python, str):  # why the framework cannot run
            results[framework] = {"framework": framework, "workload": workload.name, "error": str(python)}
            continue
        artifacts = folder / f"artifacts-{framework}"
        if framework in GENERATES:
            generated = run_worker(python, framework, "generate", folder, artifacts, settings, steps)
            if "error" in generated:
                results[framework] = generated
                _log(f"{workload.name} / {framework}: {generated['error']}")
                continue
            generate_s[framework] = generated.get("generate_s", 0.0) - generated.get("import_s", 0.0)
        trainers[framework] = (python, artifacts)
    for framework, trained in train_interleaved(trainers, folder, settings, steps).items():
        if framework in generate_s:
            trained["generate_s"] = generate_s[framework]
        results[framework] = trained
        shown = trained.get("error") or f"{trained['us_per_step']:.1f} µs/step, peak {trained['peak_rss_mib']:.0f} MiB"
        _log(f"{workload.name} / {framework}: {shown}")
    return [results[framework] for framework in frameworks]


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
        repeats=args.repeats if args.repeats is not None else (2 if args.quick else 11),
        steps=args.steps,
        quick=args.quick,
        threads=args.threads,
        spinning=args.spinning,
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
        f"torch.set_num_threads({settings.threads or physical_cores()}). {_spinning(settings)}",
        f"Each figure: the median over {settings.repeats} repeats of N timed steps after {settings.warmup} warm-up "
        "steps, the frameworks' repeats taken in turns (order rotated each repeat); peak RSS of the training "
        "process (imports included). Epoch workloads: onnxtrain's repeat is whole passes (train_epoch) over the "
        "data, about N steps' worth, after at least 3 warm-up passes, and its figure is per batch.",
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


def _spinning(settings: Settings) -> str:
    """The header's sentence on the spinning of intra-op threads (``--spinning``)."""
    spinning = settings.spinning
    if spinning == "default" and settings.threads:
        return (
            "onnxtrain gets onnxruntime's default session options with that thread count (all its sessions "
            "spin), as onnxruntime-training does."
        )
    if spinning == "default":
        return (
            "Each runtime keeps its own session options otherwise (onnxtrain's fused and epoch steps spin their "
            "threads, its other sessions do not; onnxruntime-training's sessions spin)."
        )
    state = "spin" if spinning == "on" else "do not spin"
    return (
        f"--spinning {spinning}: the intra-op threads of every session of onnxtrain and of onnxruntime-training "
        f"(whose Module takes session options, shared by its Optimizer) {state} ({SPINNING_ENTRY} = "
        f"{'1' if spinning == 'on' else '0'}); onnxtrain's other defaults kept. PyTorch as it is."
    )


def _versions(results: Sequence[dict[str, Any]]) -> str:
    found: dict[str, str] = {}
    for result in results:
        found.update(result.get("versions", {}))
    return ", ".join(f"{k} {v}" for k, v in sorted(found.items())) or "no versions reported"


if __name__ == "__main__":
    sys.exit(main())
