"""``python -m benchmarks.real_size.gpu_suite --out DIR``: every GPU figure the real-size work still needs, in one call.

The measurements docs/benchmarks.md leaves open for a GPU ("Real-size
models", "Mixed precision"), each a ``python -m benchmarks.real_size`` run
of its own, in this order (the most needed first, so that a call cut short
still brings the main table):

1. ``fp32``: gpt2-small and llama-125m at 16x256, onnxtrain against PyTorch
   eager and SDPA, two runs each: step time, tokens per second, NVML and
   PyTorch's peak memory, the breakdown;
2. ``bf16`` and ``fp16``: gpt2-small at 16x256, onnxtrain's mixed-precision
   artifacts against PyTorch under autocast (and GradScaler for fp16), one run;
3. ``checkpointed``: gpt2-small at 16x256 with activation checkpointing,
   onnxtrain's ``activation_checkpoints="auto"`` against transformers'
   ``gradient_checkpointing_enable()``, one run;
4. ``memory-reuse``: onnxtrain's fp32 step with onnxruntime's planned reuse of
   buffers, which the runtime turns off for large steps (its cost on the CPU:
   about 1 GiB of peak at this shape; on a GPU it saves arena calls);
5. ``own-arenas`` (CUDA only): onnxtrain's fp32 step with an arena per session growing to
   powers of two (onnxruntime's defaults), against the default run's one
   arena shared by the sessions that grows by what is asked.

4 and 5 change only session options: they skip the static figures, which
are the fp32 run's (``--no-static``).

Each writes ``DIR/<name>.md`` and ``DIR/<name>.json``, and its output to
``DIR/<name>.log``; artifacts go to ``DIR/work`` (``--workdir`` to keep them
elsewhere). ``--dry-run`` prints the commands. ``--only fp32,bf16`` picks.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

#: A run of onnxtrain alone with other session options: the fp32 run's artifacts, so its static figures too (about
#: 25 s of the CPU's each, skipped).
_SESSIONS_ONLY = ["--workload", "gpt2-small", "--runs", "1", "--frameworks", "onnxtrain", "--no-static"]
#: ``name: the arguments of python -m benchmarks.real_size`` (besides the output files and the folder).
RUNS: dict[str, list[str]] = {
    "fp32": ["--workload", "gpt2-small,llama-125m", "--runs", "2"],
    "bf16": ["--workload", "gpt2-small", "--runs", "1", "--precision", "bf16"],
    "fp16": ["--workload", "gpt2-small", "--runs", "1", "--precision", "fp16"],
    "checkpointed": ["--workload", "gpt2-small", "--runs", "1", "--checkpointing"],
    "memory-reuse": [*_SESSIONS_ONLY, "--memory-reuse"],
    "own-arenas": [*_SESSIONS_ONLY, "--own-arenas"],
}
SHAPES = "16x256"
#: Runs that only mean something on a GPU.
CUDA_ONLY = frozenset({"own-arenas"})


def commands(out: Path, workdir: Path, only: Sequence[str], device: str) -> list[tuple[str, list[str]]]:
    """``(name, command)`` of each run chosen, in :data:`RUNS`' order."""
    unknown = sorted(set(only) - set(RUNS))
    if unknown:
        raise ValueError(f"unknown runs {unknown}; choose from {list(RUNS)}")
    chosen = [name for name in RUNS if name in only] if only else list(RUNS)
    if device != "cuda":  # the CPU's sessions share onnxruntime's default arena: nothing to compare
        chosen = [name for name in chosen if name not in CUDA_ONLY]
    base = [sys.executable, "-m", "benchmarks.real_size", "--shapes", SHAPES, "--device", device]
    return [
        (
            name,
            base
            + RUNS[name]
            + ["--workdir", str(workdir), "--markdown", str(out / f"{name}.md"), "--json", str(out / f"{name}.json")],
        )
        for name in chosen
    ]


def main(argv: Sequence[str] | None = None) -> int:
    prog = "python -m benchmarks.real_size.gpu_suite"
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where the reports and logs go")
    parser.add_argument("--workdir", type=Path, help="where the artifacts go (default: OUT/work)")
    parser.add_argument("--only", default="", help=f"comma-separated, of {list(RUNS)} (default: all)")
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu to try the suite without a GPU")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run none")
    args = parser.parse_args(argv)
    workdir = args.workdir or args.out / "work"
    try:
        planned = commands(args.out, workdir, [n for n in args.only.split(",") if n], args.device)
    except ValueError as error:
        parser.error(str(error))
    failed = 0
    for name, command in planned:
        print(f"{name}: {shlex.join(command)}", flush=True)
        if args.dry_run:
            continue
        args.out.mkdir(parents=True, exist_ok=True)
        with open(args.out / f"{name}.log", "w") as log:
            code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
        print(f"{name}: exit status {code}", flush=True)
        failed += code != 0
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
