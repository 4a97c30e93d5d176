"""One process per job: ``python -m benchmarks.real_size.worker {prepare,train} ...``; prints one result line.

``prepare`` exports the model (:func:`benchmarks.real_size.models.export`) and
writes onnxtrain's artifacts (every parameter trained, cross-entropy, AdamW as
ONNX Runtime's ``OptimType.AdamW``). ``train`` trains one framework on one
batch shape in a fresh process, so that its memory is its own:

- ``onnxtrain``: ``onnxtrain.api`` as an ONNX Runtime user writes it,
  ``module(x, y); optimizer.step(); module.lazy_reset_grad()``;
- ``pytorch-eager`` / ``pytorch-sdpa``: the same model in PyTorch eager with
  transformers' eager attention (the exported math) or its default, SDPA:
  ``loss.backward(); optimizer.step(); optimizer.zero_grad()``.

Each reports its step times (``--warmup`` steps, then ``--steps`` timed one
by one; on CUDA each ends synchronised), its losses, and its memory: the RSS
before the model is placed (the baseline), the peak of the set-up and of the
steps (``VmHWM``, set back between them), GPU memory by NVML (and PyTorch's
allocator), and the training state by kind (:mod:`benchmarks.real_size.memory`).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.measure import physical_cores, run_worker
from benchmarks.real_size import launches, memory, profile
from benchmarks.real_size.models import ADAMW, LEARNING_RATE, MODELS, Attention, RealModel, export

FRAMEWORKS = ("onnxtrain", "pytorch-eager", "pytorch-sdpa")
#: ``--profile`` on CUDA: the steps after the timed ones that torch's profiler watches for the GPU's kernels.
PROFILED_KERNEL_STEPS = 3


#: ``--precision``: the artifacts' (``generate_artifacts(precision=...)``) and PyTorch's autocast type.
PRECISIONS = ("fp32", "bf16", "fp16")


def artifact_folder(folder: Path, precision: str, checkpointing: bool = False) -> Path:
    """Where a workload's artifacts of ``precision`` are: ``artifacts``, ``artifacts-bf16``, ``artifacts-fp16``;
    with activation checkpointing, ``-checkpointed`` added."""
    name = "artifacts" if precision == "fp32" else f"artifacts-{precision}"
    return folder / (f"{name}-checkpointed" if checkpointing else name)


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("command", choices=["prepare", "train"])
    parser.add_argument("--workload", required=True, choices=list(MODELS))
    parser.add_argument("--folder", type=Path, required=True, help="the workload's folder (model, artifacts)")
    parser.add_argument("--framework", choices=FRAMEWORKS, default="onnxtrain")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps (onnxtrain's second makes its fused step)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps")
    parser.add_argument(
        "--precision", choices=PRECISIONS, default="fp32",
        help="onnxtrain: generate_artifacts(precision=...); PyTorch: torch.autocast to that type (and GradScaler "
        "for fp16)",
    )  # fmt: skip
    parser.add_argument(
        "--checkpointing",
        action="store_true",
        help="activation checkpointing: onnxtrain's artifacts with activation_checkpoints='auto'; PyTorch with "
        "transformers' gradient_checkpointing_enable() (every layer's input kept, the layer run again)",
    )
    parser.add_argument(
        "--no-memory-pattern",
        action="store_true",
        help="onnxtrain: every session with a large step's options, without onnxruntime's memory pattern or its "
        "planned reuse of buffers (otherwise each session's own: both on for small steps only)",
    )
    parser.add_argument(
        "--memory-reuse",
        action="store_true",
        help="onnxtrain: every session with onnxruntime's planned reuse of buffers (its default, which the "
        "runtime turns off for sessions of large or unfixed steps) and without the memory pattern",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="onnxtrain: onnxruntime's profiler on in every session, its files in this folder; the fused step's "
        "summary (and on CUDA, torch's view of the GPU's kernels over 3 more steps) in the result",
    )
    parser.add_argument(
        "--own-arenas",
        action="store_true",
        help="onnxtrain on CUDA: an arena per session growing to powers of two (onnxruntime's default), not the "
        "one arena its sessions share",
    )
    parser.add_argument(
        "--unpacked-update",
        action="store_true",
        help="onnxtrain off the CPU: the fused step runs the optimizer's per-parameter chains as built, not packed "
        "(FusedStep.pack_updates)",
    )
    parser.add_argument(
        "--split-unpack",
        action="store_true",
        help="onnxtrain off the CPU: the packed update writes the tensors back with one Split per role, not a Slice "
        "per tensor (FusedStep.split_unpack)",
    )
    return parser


def prepare(args: argparse.Namespace) -> dict[str, Any]:
    """Export the model and write onnxtrain's artifacts into ``args.folder/artifacts``."""
    import json

    from onnxtrain import artifacts

    start = time.perf_counter()
    folder = export(MODELS[args.workload], args.folder)
    exported = time.perf_counter()
    spec = json.loads((folder / "spec.json").read_text())
    artifacts.generate_artifacts(
        str(folder / "model.onnx"),
        requires_grad=spec["parameters"],
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=str(artifact_folder(folder, args.precision, args.checkpointing)),
        precision=args.precision,
        activation_checkpoints="auto" if args.checkpointing else None,
    )
    generated = time.perf_counter()
    return {
        "export_s": exported - start,
        "generate_s": generated - exported,
        "parameter_count": spec["parameter_count"],
    }


def _timed(step: Callable[[int], float], warmup: int, steps: int) -> dict[str, Any]:
    """Run ``warmup`` steps, then ``steps`` steps timed one by one; the losses, times and the RSS after each."""
    losses, times, rss = [], [], []
    for i in range(warmup + steps):
        start = time.perf_counter()
        losses.append(step(i))
        times.append(time.perf_counter() - start)
        rss.append(memory.rss_marks()["rss_mib"])
    timed = times[warmup:]
    return {
        "step_s": statistics.median(timed),
        "step_s_min": min(timed),
        "step_s_all": timed,
        "first_step_s": times[0],
        "warmup_s": times[:warmup],
        "losses": losses,
        "rss_after_step_mib": rss,
    }


def _onnxtrain(args: argparse.Namespace, batches: list[tuple[Any, Any]]) -> dict[str, Any]:
    import onnxruntime

    import onnxtrain
    from onnxtrain.api import CheckpointState, Module, Optimizer

    directory = artifact_folder(args.folder, args.precision, args.checkpointing)
    if args.device == "cuda":  # the CUDA context before the baseline: it is not the model's
        onnxruntime.OrtValue.ortvalue_from_shape_and_type([1], np.float32, "cuda", 0)
    baseline = {**memory.rss_marks(), "gpu": memory.gpu_used_mib()}
    memory.reset_peak_rss()
    state = CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    options = None
    if args.no_memory_pattern or args.memory_reuse:  # the options of a large fused step, for every session
        from onnxtrain.training.device import Device
        from onnxtrain.training.options import default_session_options

        options = default_session_options(
            spinning=True,
            update_first=True,
            shared_arena=Device.parse(args.device),
            memory_pattern=False,
            memory_reuse=args.memory_reuse,
        )
    providers = None
    if args.own_arenas:  # arena settings of the user's own: each session keeps its arena (training.device)
        cuda = {"device_id": "0", "use_tf32": "0", "arena_extend_strategy": "kNextPowerOfTwo"}
        providers = [("CUDAExecutionProvider", cuda), "CPUExecutionProvider"]
    training, evaluation = str(directory / "training_model.onnx"), str(directory / "eval_model.onnx")
    profiling = profile.profiled_sessions(args.profile) if args.profile else contextlib.nullcontext([])
    with profiling as profiles:
        module = Module(training, state, evaluation, args.device, session_options=options, providers=providers)
        optimizer = Optimizer(str(directory / "optimizer_model.onnx"), module)
        fused = optimizer.fused_step
        if args.unpacked_update and fused is not None:  # before its first session is made
            fused.pack_updates = False
        if args.split_unpack and fused is not None:
            fused.split_unpack = True
        optimizer.set_learning_rate(LEARNING_RATE)
        module.train()
        setup = {**memory.rss_marks(), "gpu": memory.gpu_used_mib()}
        memory.reset_peak_rss()

        def step(i: int) -> float:
            x, y = batches[i % len(batches)]
            loss = module(x, y)
            optimizer.step()
            module.lazy_reset_grad()
            return float(loss)  # on CUDA, the loss copied back: the step has ended

        timing = _timed(step, args.warmup, args.steps)
        steps = {**memory.rss_marks(), "gpu": memory.gpu_used_mib()}
        versions = {"onnxtrain": onnxtrain.__version__, "onnxruntime": onnxruntime.__version__}
        result = {
            **timing,
            "baseline": baseline,
            "setup": setup,
            "steps": steps,
            "state": memory.onnxtrain_state(module),
            "versions": versions,
            # for every session, or (None) the runtime's choice per session: both on for small steps only
            "memory_pattern": False if options is not None else None,
            "memory_reuse": args.memory_reuse if options is not None else None,
            "shared_arena": not args.own_arenas,
            "packed_update": fused is not None and fused.step_model is not fused.model,
        }
        kernel_steps = PROFILED_KERNEL_STEPS if args.profile and args.device == "cuda" else 0
        if kernel_steps:
            result["kernels"] = profile.gpu_kernels(step, kernel_steps, args.warmup + args.steps, args.profile)
    if args.profile:  # the fused step's runs: its first runs at the second step; the kernels' steps left out
        result["profile"] = profile.fused_step_profile(profiles, max(args.warmup - 1, 0), kernel_steps)
    return result


def _pytorch(args: argparse.Namespace, model: RealModel, attention: Attention, batches: list[tuple[Any, Any]]) -> dict:
    import torch
    import transformers

    torch.set_num_threads(physical_cores())
    device = torch.device(args.device)
    data = [(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)) for x, y in batches]
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.init()
        torch.zeros(1, device=device)  # the CUDA context before the baseline
        torch.cuda.reset_peak_memory_stats()
    baseline = {**memory.rss_marks(), "gpu": memory.gpu_used_mib()}
    memory.reset_peak_rss()
    module = model.build(attention, checkpointing=args.checkpointing).to(device)
    optimizer = torch.optim.AdamW(module.parameters(), lr=LEARNING_RATE, **ADAMW)  # type: ignore[arg-type]
    loss_fn = torch.nn.CrossEntropyLoss()
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    scaler = torch.amp.GradScaler(args.device) if args.precision == "fp16" else None
    setup = {**memory.rss_marks(), "gpu": memory.gpu_used_mib()}
    memory.reset_peak_rss()
    state: dict[str, Any] = {}

    def step(i: int, optimizer: torch.optim.Optimizer = optimizer) -> float:
        x, y = data[i % len(data)]
        with torch.autocast(args.device, dtype=half, enabled=half is not None):
            loss = loss_fn(module(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        if i == 1:  # gradients and moments exist: their sizes
            state.update(memory.torch_state(module, optimizer))
        optimizer.zero_grad()
        if cuda:
            torch.cuda.synchronize()
        return float(loss.item())

    timing = _timed(step, max(args.warmup, 2), args.steps)
    steps = {**memory.rss_marks(), "gpu": memory.gpu_used_mib()}
    if cuda:
        steps["torch_max_allocated_mib"] = torch.cuda.max_memory_allocated() / memory.MIB
        steps["torch_max_reserved_mib"] = torch.cuda.max_memory_reserved() / memory.MIB
    counted = _counted_launches(step, module, cuda)
    x, y = data[0]
    saved = memory.torch_saved(module, lambda: loss_fn(module(x), y))
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    return {
        **timing,
        "baseline": baseline,
        "setup": setup,
        "steps": steps,
        "state": {**state, "saved_for_backward": saved},
        "launches": counted,
        "threads": torch.get_num_threads(),
        "versions": versions,
    }


def _counted_launches(step: Callable[..., float], module: Any, cuda: bool) -> dict[str, Any]:
    """The ATen operations of one more step (after the timed ones and the memory peaks), with the optimizer as
    PyTorch runs it on CUDA: multi-tensor (``foreach``), its default there; on the CPU, where its default is a
    loop over the parameters, a multi-tensor AdamW of the same settings, counted at its second step (the first
    makes its moments)."""
    import torch

    if cuda:
        return launches.torch_launches(lambda: step(0))
    multi_tensor = torch.optim.AdamW(module.parameters(), lr=LEARNING_RATE, **ADAMW, foreach=True)  # type: ignore[arg-type]
    step(0, multi_tensor)
    return launches.torch_launches(lambda: step(0, multi_tensor))


def train(args: argparse.Namespace) -> dict[str, Any]:
    model = MODELS[args.workload]
    ids, labels = model.batches(args.batch, args.seq)
    batches = [(ids[i], labels[i]) for i in range(len(ids))]
    if args.framework == "onnxtrain":
        result = _onnxtrain(args, batches)
    else:
        result = _pytorch(args, model, "eager" if args.framework == "pytorch-eager" else "sdpa", batches)
    tokens = args.batch * args.seq
    return {
        "framework": args.framework,
        "workload": args.workload,
        "batch": args.batch,
        "seq": args.seq,
        "device": args.device,
        "precision": args.precision,
        "checkpointing": args.checkpointing,
        "tokens_per_s": tokens / result["step_s"],
        **result,
    }


def main(args: argparse.Namespace) -> dict[str, Any]:
    return prepare(args) if args.command == "prepare" else train(args)


if __name__ == "__main__":
    sys.exit(run_worker(main, arguments()))
