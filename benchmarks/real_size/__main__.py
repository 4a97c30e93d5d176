"""``python -m benchmarks.real_size``: real-size models, onnxtrain against PyTorch eager; speed, memory, static memory.

    python -m benchmarks.real_size --workload gpt2-small --shapes 2x64,4x128 --device cpu --runs 2
    python -m benchmarks.real_size --workload gpt2-small --batch 16 --seq 256 --static-only

For each model (:mod:`benchmarks.real_size.models`): export it and write
onnxtrain's artifacts once (``--workdir``, kept for the next call), compute
the static figures at each batch shape (:mod:`benchmarks.real_size.static`),
then train each framework at each shape in a fresh process of its own
(:mod:`benchmarks.real_size.worker`), one process at a time (a real-size
process holds gigabytes), ``--runs`` times, the frameworks' order rotating
from run to run. Prints the tables (:mod:`benchmarks.real_size.report`);
``--markdown`` and ``--json`` also write them and the raw results.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import platform
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.measure import parse_result, physical_cores
from benchmarks.real_size.models import MODELS
from benchmarks.real_size.worker import FRAMEWORKS, PRECISIONS, artifact_folder
from benchmarks.run import ROOT, _versions, load_average, machine, revision

#: Seconds a worker may take.
TIMEOUT = 3600


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.real_size", description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="gpt2-small", help=f"comma-separated, of {list(MODELS)}")
    parser.add_argument("--shapes", help="comma-separated batch shapes BxT (default: --batch x --seq)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS), help=f"comma-separated, of {list(FRAMEWORKS)}")
    parser.add_argument("--runs", type=int, default=2, help="fresh processes per framework and shape")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--static-only", action="store_true", help="only the static figures (no training)")
    parser.add_argument(
        "--no-static", action="store_true",
        help="no static figures (a run that changes only session options: the run without them has the same)",
    )  # fmt: skip
    parser.add_argument(
        "--no-memory-pattern", action="store_true",
        help="onnxtrain's sessions, small steps' too, without it (and without the planned reuse of buffers)",
    )  # fmt: skip
    parser.add_argument(
        "--memory-reuse", action="store_true",
        help="onnxtrain's sessions with onnxruntime's planned reuse of buffers (off by default for large steps)",
    )  # fmt: skip
    parser.add_argument(
        "--checkpointing", action="store_true",
        help="activation checkpointing: onnxtrain's activation_checkpoints='auto', transformers' "
        "gradient_checkpointing_enable()",
    )  # fmt: skip
    parser.add_argument(
        "--own-arenas", action="store_true",
        help="CUDA: onnxtrain's sessions each with an arena growing to powers of two (onnxruntime's default)",
    )  # fmt: skip
    parser.add_argument(
        "--unpacked-update", action="store_true",
        help="onnxtrain off the CPU: the fused step with the optimizer's per-parameter chains as built, not packed",
    )  # fmt: skip
    parser.add_argument(
        "--split-unpack", action="store_true",
        help="onnxtrain off the CPU: the packed update writes the tensors back with one Split per role, not a Slice "
        "per tensor",
    )  # fmt: skip
    parser.add_argument(
        "--precision", choices=PRECISIONS, default="fp32",
        help="onnxtrain's artifacts generated with precision=...; PyTorch under torch.autocast (fp16: and GradScaler)",
    )  # fmt: skip
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "onnxtrain-real-size")
    parser.add_argument("--markdown", type=Path, help="also write the report here")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    return parser


def _choose(text: str, known: Sequence[str], what: str) -> list[str]:
    chosen = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in known]
    if unknown or not chosen:
        raise SystemExit(f"--{what}: {unknown or text!r} unknown; choose from {list(known)}")
    return chosen


def shapes_of(args: argparse.Namespace) -> list[tuple[int, int]]:
    """The batch shapes: ``--shapes`` (``2x64,4x128``) or ``--batch`` and ``--seq``."""
    if not args.shapes:
        return [(args.batch, args.seq)]
    try:
        return [(int(b), int(t)) for b, t in (s.lower().split("x") for s in args.shapes.split(","))]
    except ValueError:
        raise SystemExit(f"--shapes {args.shapes!r}: give batch shapes as BxT, comma-separated (2x64,4x128)") from None


def add_one_shape_arguments(parser: argparse.ArgumentParser, *, device: str, report: str) -> None:
    """A one-shape tool's common arguments: ``--workload``, ``--shapes`` (one ``BxT``), ``--device`` (``device``
    by default), ``--workdir`` and ``--out`` (the folder of ``report``)."""
    parser.add_argument("--workload", default="gpt2-small", choices=list(MODELS))
    parser.add_argument("--shapes", default="16x256", help="one batch shape BxT")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=device)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "onnxtrain-real-size")
    parser.add_argument("--out", type=Path, required=True, help=f"where {report}.md and .json go")


def one_shape(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[int, int]:
    """The one batch shape of a tool made with :func:`add_one_shape_arguments` (a parser error for more)."""
    args.batch, args.seq = None, None
    (batch, seq), *more = shapes_of(args)
    if more:
        parser.error("--shapes: one batch shape at a time")
    return batch, seq


def _worker(argv: list[str]) -> dict[str, Any]:
    """Run the worker with ``argv``; its result, or ``{"error": ...}``."""
    command = [sys.executable, "-m", "benchmarks.real_size.worker", *argv]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"ran over {TIMEOUT} s"}
    result = parse_result(done.stdout)
    if result is None:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        result = {"error": f"exited with {done.returncode}: {lines[-1] if lines else 'no output'}"}
    return result


def prepared(
    workload: str, workdir: Path, precision: str = "fp32", checkpointing: bool = False
) -> tuple[Path, dict[str, Any]]:
    """The workload's folder, exported and with onnxtrain's artifacts of ``precision`` (and ``checkpointing``):
    made now where missing, or where onnxtrain's sources are not those that wrote them (artifacts of other code
    measure that code)."""
    folder = workdir / workload
    artifacts = artifact_folder(folder, precision, checkpointing)
    written_by = artifacts.with_name(f"{artifacts.name}.sources")
    sources = onnxtrain_sources()
    if (artifacts / "checkpoint").exists() and (folder / "spec.json").exists():
        if written_by.exists() and written_by.read_text().strip() == sources:
            return folder, {"reused": True}
        _log(f"{workload}: the artifacts were written by other onnxtrain sources; writing them again")
    _log(f"{workload}: exporting and writing the artifacts ({precision}{', checkpointed' if checkpointing else ''})")
    argv = ["prepare", "--workload", workload, "--folder", str(folder), "--precision", precision]
    result = _worker(argv + (["--checkpointing"] if checkpointing else []))
    if "error" in result:
        raise SystemExit(f"{workload}: prepare failed: {result['error']}")
    written_by.write_text(sources + "\n")
    return folder, result


def onnxtrain_sources() -> str:
    """A digest of onnxtrain's Python sources (SHA-256 over their paths and contents, 16 hex digits)."""
    digest = hashlib.sha256()
    package = ROOT / "onnxtrain"
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments()
    args = parser.parse_args(argv)
    if args.own_arenas and args.device != "cuda":
        parser.error("--own-arenas is for --device cuda (on the CPU the sessions share onnxruntime's default arena)")
    if (args.unpacked_update or args.split_unpack) and args.device != "cuda":
        parser.error(
            "--unpacked-update and --split-unpack are for --device cuda (on the CPU the fused step does not "
            "pack the update)"
        )
    if args.no_static and args.static_only:
        parser.error("--no-static and --static-only leave nothing to do: choose one")
    from benchmarks.real_size import report, static

    workloads = _choose(args.workload, list(MODELS), "workload")
    frameworks = _choose(args.frameworks, FRAMEWORKS, "frameworks")
    shapes = shapes_of(args)
    started, load_before = datetime.datetime.now().astimezone(), load_average()
    figures: dict[str, dict[str, Any]] = {}
    kernels: dict[str, dict[str, Any]] = {}
    prepares: dict[str, dict[str, Any]] = {}
    results: list[dict[str, Any]] = []
    folders = {}
    for workload in workloads:
        folders[workload], prepares[workload] = prepared(workload, args.workdir, args.precision, args.checkpointing)
        artifacts = artifact_folder(folders[workload], args.precision, args.checkpointing)
        providers = ["CUDAExecutionProvider" if args.device == "cuda" else "CPUExecutionProvider"]
        if not args.no_static:
            figures[workload] = static.static_figures(artifacts, shapes, providers)
            sized = static.shapes_for(static.step_models(artifacts)[0], *shapes[0])  # the bytes moved, at shapes[0]
            run = static.fused_as_run(artifacts, shapes[0], providers)
            kernels[workload] = {**static.ort_kernels(run, providers, sized), "shape": "x".join(map(str, shapes[0]))}
            if not static.folds_every_shape(providers):  # and as a GPU would run it, optimized for this CPU
                on_gpu = static.fused_as_run(artifacts, shapes[0], ["CUDAExecutionProvider"])
                kernels[workload]["as on a GPU"] = static.ort_kernels(on_gpu, providers, sized)
    if not args.static_only:
        for run in range(args.runs):
            order = frameworks[run % len(frameworks) :] + frameworks[: run % len(frameworks)]
            for workload in workloads:
                for batch, seq in shapes:
                    for framework in order:
                        results.append(_train(args, workload, folders[workload], framework, batch, seq, run))
    header = [
        f"Measured {started:%Y-%m-%d %H:%M %Z} on {machine()}; load average before {load_before}, after "
        f"{load_average()}.",
        f"Python {platform.python_version()}; {_versions(results)}; onnxtrain at commit {revision()}.",
        f"Device {args.device}; threads: onnxruntime's default ({physical_cores()}, the physical cores), "
        f"torch.set_num_threads({physical_cores()}). {args.warmup} warm-up steps, then {args.steps} timed steps per "
        f"run; {args.runs} runs, each a fresh process, the frameworks' order rotated from run to run.",
    ]
    if args.checkpointing:
        header.append(
            "Activation checkpointing: onnxtrain's artifacts generated with activation_checkpoints='auto' (the "
            "layer boundaries kept); PyTorch with transformers' gradient_checkpointing_enable() (each layer's input)."
        )
    if args.precision != "fp32":
        header.append(
            f"Precision {args.precision}: onnxtrain's artifacts generated with precision={args.precision!r}; PyTorch "
            f"under torch.autocast to that type{', with GradScaler' if args.precision == 'fp16' else ''}."
        )
    text = report.render(results, figures, kernels, header)
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    if args.json:
        raw = {"results": results, "static": figures, "kernels": kernels, "prepare": prepares, "header": header}
        args.json.write_text(json.dumps(raw, indent=1))
    return 0 if all("error" not in r for r in results) else 1


def _train(
    args: argparse.Namespace, workload: str, folder: Path, framework: str, batch: int, seq: int, run: int
) -> dict[str, Any]:
    argv = ["train", "--workload", workload, "--folder", str(folder), "--framework", framework]
    argv += ["--batch", str(batch), "--seq", str(seq), "--device", args.device]
    argv += ["--warmup", str(args.warmup), "--steps", str(args.steps), "--precision", args.precision]
    if args.no_memory_pattern:
        argv.append("--no-memory-pattern")
    if args.memory_reuse:
        argv.append("--memory-reuse")
    if args.checkpointing:
        argv.append("--checkpointing")
    if args.own_arenas:
        argv.append("--own-arenas")
    if args.unpacked_update:
        argv.append("--unpacked-update")
    if args.split_unpack:
        argv.append("--split-unpack")
    load = load_average()
    result = _worker(argv)
    result.update(workload=workload, framework=framework, batch=batch, seq=seq, run=run, load_before=load)
    shown = result.get("error") or f"{result['step_s']:.3f} s/step, peak RSS {result['steps']['peak_rss_mib']:.0f} MiB"
    _log(f"run {run + 1}: {workload} {batch}x{seq} {framework}: {shown} (load {load})")
    return result


if __name__ == "__main__":
    sys.exit(main())
