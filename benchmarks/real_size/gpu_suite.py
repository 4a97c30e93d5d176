"""``python -m benchmarks.real_size.gpu_suite --out DIR``: the GPU runs of the real-size work, in one call.

The measurements of docs/benchmarks.md ("Real-size models", "Mixed
precision") on a GPU, each a run of its own, in this order (the most needed
first, so that a call cut short still brings it):

1. ``profile``: where gpt2-small's fp32 step at 16x256 spends its time
   (``python -m benchmarks.real_size.profile``): onnxruntime's profile of the
   fused step by operator and provider, the slowest nodes, the copies between
   host and device, and the GPU's kernels and busy share from torch's profiler;
   the step is about 2x PyTorch eager's there (2026-11-28), and this says why;
2. ``graph-capture`` (CUDA only): gpt2-small's fused step at 16x256 replayed
   as one CUDA graph against launched node by node
   (``python -m benchmarks.real_size.graph_capture``): whether onnxruntime
   captures it, and what the launches cost;
3. ``fp32``: gpt2-small and llama-125m at 16x256, onnxtrain against PyTorch
   eager and SDPA, two runs each: step time, tokens per second, NVML and
   PyTorch's peak memory, the breakdown;
4. ``bf16`` and ``fp16``: gpt2-small at 16x256, onnxtrain's mixed-precision
   artifacts against PyTorch under autocast (and GradScaler for fp16), one run;
5. ``checkpointed``: gpt2-small at 16x256 with activation checkpointing,
   onnxtrain's ``activation_checkpoints="auto"`` against transformers'
   ``gradient_checkpointing_enable()``, one run;
6. ``memory-reuse``: onnxtrain's fp32 step with onnxruntime's planned reuse of
   buffers, which the runtime turns off for large steps;
7. ``own-arenas`` (CUDA only): onnxtrain's fp32 step with an arena per session
   growing to powers of two (onnxruntime's defaults), against the default
   run's one arena shared by the sessions that grows by what is asked;
8. ``unpacked-update`` (CUDA only): onnxtrain's fp32 step with AdamW's per-parameter
   chains as built (12 nodes per tensor), against the default run's one
   chain over the packed tensors (``FusedStep.pack_updates``);
9. ``split-unpack`` (CUDA only): onnxtrain's fp32 step with the packed update
   written back by one ``Split`` per role, against the default run's ``Slice``
   per tensor (``FusedStep.split_unpack``).

6 to 9 change only how the sessions run: they skip the static figures, which
are the fp32 run's (``--no-static``).

Each writes ``DIR/<name>.md`` and ``DIR/<name>.json`` (the profile and the
graph capture: ``DIR/profile-gpt2-small.md``, ``DIR/graph-capture-gpt2-small.md``
and their ``.json``), and its output to ``DIR/<name>.log``; artifacts go to ``DIR/work`` (``--workdir`` to keep them
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
#: The module that makes the profile (the other runs are ``python -m benchmarks.real_size``'s).
PROFILE_MODULE = "benchmarks.real_size.profile"
#: The module of the graph-capture experiment.
GRAPH_CAPTURE_MODULE = "benchmarks.real_size.graph_capture"
#: The modules that write their reports into ``--out`` (the others take ``--markdown`` and ``--json``).
OUT_MODULES = frozenset({PROFILE_MODULE, GRAPH_CAPTURE_MODULE})
#: ``name: (module, its arguments)`` besides the batch shape, the device, the output files and the folder.
RUNS: dict[str, tuple[str, list[str]]] = {
    "profile": (PROFILE_MODULE, ["--workload", "gpt2-small"]),
    "graph-capture": (GRAPH_CAPTURE_MODULE, ["--workload", "gpt2-small"]),
    "fp32": ("benchmarks.real_size", ["--workload", "gpt2-small,llama-125m", "--runs", "2"]),
    "bf16": ("benchmarks.real_size", ["--workload", "gpt2-small", "--runs", "1", "--precision", "bf16"]),
    "fp16": ("benchmarks.real_size", ["--workload", "gpt2-small", "--runs", "1", "--precision", "fp16"]),
    "checkpointed": ("benchmarks.real_size", ["--workload", "gpt2-small", "--runs", "1", "--checkpointing"]),
    "memory-reuse": ("benchmarks.real_size", [*_SESSIONS_ONLY, "--memory-reuse"]),
    "own-arenas": ("benchmarks.real_size", [*_SESSIONS_ONLY, "--own-arenas"]),
    "unpacked-update": ("benchmarks.real_size", [*_SESSIONS_ONLY, "--unpacked-update"]),
    "split-unpack": ("benchmarks.real_size", [*_SESSIONS_ONLY, "--split-unpack"]),
}
SHAPES = "16x256"
#: Runs that only mean something on a GPU.
CUDA_ONLY = frozenset({"graph-capture", "own-arenas", "unpacked-update", "split-unpack"})


def commands(out: Path, workdir: Path, only: Sequence[str], device: str) -> list[tuple[str, list[str]]]:
    """``(name, command)`` of each run chosen, in :data:`RUNS`' order."""
    unknown = sorted(set(only) - set(RUNS))
    if unknown:
        raise ValueError(f"unknown runs {unknown}; choose from {list(RUNS)}")
    chosen = [name for name in RUNS if name in only] if only else list(RUNS)
    if device != "cuda":  # the CPU's sessions share onnxruntime's default arena: nothing to compare
        chosen = [name for name in chosen if name not in CUDA_ONLY]
    planned = []
    for name in chosen:
        module, arguments = RUNS[name]
        command = [sys.executable, "-m", module, "--shapes", SHAPES, "--device", device, *arguments]
        command += ["--workdir", str(workdir)]
        if module in OUT_MODULES:
            command += ["--out", str(out)]
        else:
            command += ["--markdown", str(out / f"{name}.md"), "--json", str(out / f"{name}.json")]
        planned.append((name, command))
    return planned


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
