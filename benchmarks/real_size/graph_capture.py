"""``python -m benchmarks.real_size.graph_capture``: the fused step replayed as one CUDA graph, against launched.

    python -m benchmarks.real_size.graph_capture --workload gpt2-small --shapes 16x256 --device cuda --out DIR

An experiment, not a path of the runtime: whether onnxruntime captures
onnxtrain's fused step as a CUDA graph (the CUDA provider's
``enable_cuda_graph``), and how much faster the step is when its nodes are
replayed rather than launched one by one. The step on an H200 is about 2x
PyTorch's while its arithmetic alone would be faster (docs/benchmarks.md,
"On a GPU"); if the launches are the cost, a replayed step shows it.

The model is the fused step as the runtime runs it off the CPU: its update
packed, the batch's shapes folded (:func:`benchmarks.real_size.static.fused_as_run`).
Every input and output is bound once, by pointer, to a buffer of the
device: the parameters from the checkpoint, zero gradients and moments, the
rate and step number, a batch; each tensor the step updates is written in
place, as in the runtime. Each timed step copies a new batch, the rate and
the step number into their buffers, runs, and reads the loss back. Two
sessions of the same model, one launched and one captured (onnxruntime
captures at its first runs and replays after), each time ``--steps`` steps
after ``--warmup``; the values differ from a real training run's only in
where they start, which neither session's time depends on.

Reports each session's step time, their ratio, the nodes and the copies
between host and device onnxruntime placed, and onnxruntime's error where it
refuses to capture. Without CUDA (``--device cpu``), times the launched
session alone, to check the harness. Writes ``DIR/graph-capture-<workload>.md``
and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: The learning rate the timed steps record (AdamW's, as the benchmark's).
LEARNING_RATE = 1e-4


def step_model(
    artifacts: Path, batch: int, seq: int
) -> tuple[Any, dict[str, tuple[int, ...]], dict[str, str], list[str]]:
    """The fused step as the runtime runs it off the CPU, the shape to bind each input with, the outputs written
    in place (``{output: input}``) and the user inputs (the token ids, the labels)."""
    from benchmarks.real_size import static
    from onnxtrain.artifacts.step_memory import trainable_of

    training, optimizer = static.step_models(artifacts)
    fused = static.fused_step(training, optimizer)
    updates = fused.parameter_updates(trainable_of(training))
    model, views = static.as_run(fused.model, updates, static.shapes_for(training, batch, seq))
    shapes = {value.name: _declared(value) for value in model.graph.input}
    shapes.update(views)
    in_place = {out: name for name, out in static.in_place_pairs(updates).items()}
    return model, shapes, in_place, static.user_inputs(training)


def _declared(value: Any) -> tuple[int, ...]:
    return tuple(d.dim_value for d in value.type.tensor_type.shape.dim)


def initial_values(
    model: Any, shapes: Mapping[str, tuple[int, ...]], checkpoint: Path, batch: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Host arrays for every input of ``model``: the checkpoint's parameters, the ``batch`` (by input name), the
    rate and a step number of 1, zeros for the rest (gradients, moments)."""
    import onnx

    from onnxtrain.api import CheckpointState
    from onnxtrain.optim.emit import LEARNING_RATE as RATE_INPUT
    from onnxtrain.optim.emit import STEP

    state = CheckpointState.load_checkpoint(str(checkpoint))
    parameters = {name: np.asarray(parameter.data) for name, parameter in state.parameters}
    values = {}
    for value in model.graph.input:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        shape = shapes[value.name]
        if value.name in batch:
            values[value.name] = batch[value.name].astype(dtype).reshape(shape)
        elif value.name == RATE_INPUT:
            values[value.name] = np.full(shape, LEARNING_RATE, dtype)
        elif value.name == STEP:
            values[value.name] = np.ones(shape, dtype)
        elif value.name in parameters:
            values[value.name] = parameters[value.name].astype(dtype).reshape(shape)
        else:
            values[value.name] = np.zeros(shape, dtype)
    return values


def timed_session(
    model_bytes: bytes,
    values: Mapping[str, np.ndarray],
    shapes: Mapping[str, tuple[int, ...]],
    in_place: Mapping[str, str],
    user_inputs: Sequence[str],
    device: str,
    *,
    capture: bool,
    warmup: int,
    steps: int,
    optimized: Path,
) -> dict[str, Any]:
    """One session of the step, bound once; its step times (``{"error": ...}`` where onnxruntime refuses it)."""
    import onnxruntime as ort

    from onnxtrain.optim.emit import LEARNING_RATE as RATE_INPUT
    from onnxtrain.optim.emit import STEP
    from onnxtrain.training.device import Device
    from onnxtrain.training.options import default_session_options

    options = default_session_options(spinning=True, update_first=True, memory_pattern=False, memory_reuse=False)
    options.optimized_model_filepath = str(optimized)
    providers = Device.parse(device).providers()
    if capture:
        cuda, cuda_options = providers[0]  # type: ignore[misc]
        providers = [(cuda, {**cuda_options, "enable_cuda_graph": "1"}), *providers[1:]]
    try:
        session = ort.InferenceSession(model_bytes, options, providers=providers)
    except Exception as error:  # onnxruntime's own types: the refusal is the result
        return {"error": str(error).splitlines()[0]}
    kind = "cuda" if device.startswith("cuda") else "cpu"
    buffers = {name: ort.OrtValue.ortvalue_from_numpy(array, kind, 0) for name, array in values.items()}
    binding = session.io_binding()
    for name, value in buffers.items():
        binding.bind_input(name, kind, 0, value.element_type(), list(shapes[name]), value.data_ptr())
    outputs = {}
    for output in session.get_outputs():
        source = in_place.get(output.name)
        dims = [int(d) for d in output.shape]  # the folded model's: all fixed
        if source is not None:  # written in place, as the runtime does, with the shape the model declares
            target = buffers[source]
            binding.bind_output(output.name, kind, 0, target.element_type(), dims, target.data_ptr())
        else:
            dtype = np.float32 if output.type == "tensor(float)" else np.int64
            outputs[output.name] = ort.OrtValue.ortvalue_from_shape_and_type(dims, dtype, kind, 0)
            binding.bind_ortvalue_output(output.name, outputs[output.name])
    loss = outputs[session.get_outputs()[0].name]
    rate, step = values.get(RATE_INPUT), values.get(STEP)
    times = []
    try:
        for i in range(warmup + steps):
            start = time.perf_counter()
            for name in user_inputs:  # a new batch, rate and step number, as a training loop copies them
                buffers[name].update_inplace(values[name])
            if rate is not None:
                buffers[RATE_INPUT].update_inplace(rate)
            if step is not None:
                buffers[STEP].update_inplace(step + i)
            session.run_with_iobinding(binding)
            last = float(loss.numpy().reshape(-1)[0])  # read back: the step has ended
            times.append(time.perf_counter() - start)
    except Exception as error:
        return {"error": str(error).splitlines()[0], "runs": len(times)}
    timed = times[warmup:]
    return {"step_s": statistics.median(timed), "min_s": min(timed), "steps": len(timed), "loss": last}


def placed_nodes(optimized: Path) -> dict[str, int]:
    """How many nodes onnxruntime's optimized model has, and of them the copies between host and device."""
    import onnx

    model = onnx.load(str(optimized), load_external_data=False)
    kinds = Counter(node.op_type for node in model.graph.node)
    return {"nodes": len(model.graph.node), "memcpy": kinds["MemcpyFromHost"] + kinds["MemcpyToHost"]}


def render(workload: str, shape: str, device: str, result: Mapping[str, Any]) -> str:
    """The report's Markdown."""
    lines = [f"Graph capture of onnxtrain's fused step: {workload} at {shape}, {device}.", ""]
    lines += ["| session | step | nodes (copies host/device) | |", "|---|---:|---:|---|"]
    for name in ("launched", "captured"):
        run = result.get(name)
        if run is None:
            continue
        placed = run.get("placed", {})
        figures = f"{placed.get('nodes', '?')} ({placed.get('memcpy', '?')})"
        step = f"{run['step_s'] * 1e3:.1f} ms" if "step_s" in run else "-"
        lines.append(f"| {name} | {step} | {figures} | {run.get('error', '')} |")
    if "ratio" in result:
        lines += ["", f"Captured / launched: {result['ratio']:.2f}."]
    return "\n".join(lines)


def arguments() -> argparse.ArgumentParser:
    from benchmarks.real_size.__main__ import add_one_shape_arguments

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.real_size.graph_capture", description=__doc__.splitlines()[0]
    )
    add_one_shape_arguments(parser, device="cuda", report="graph-capture-<workload>")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps (the captured session captures there)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks.real_size.__main__ import one_shape, prepared
    from benchmarks.real_size.models import MODELS
    from benchmarks.real_size.worker import artifact_folder

    parser = arguments()
    args = parser.parse_args(argv)
    batch, seq = one_shape(parser, args)
    folder, _ = prepared(args.workload, args.workdir)
    artifacts = artifact_folder(folder, "fp32")
    model, shapes, in_place, user_inputs = step_model(artifacts, batch, seq)
    ids, labels = MODELS[args.workload].batches(batch, seq, 1)
    batch_values = dict(zip(user_inputs, (ids[0], labels[0]), strict=True))
    values = initial_values(model, shapes, artifacts / "checkpoint", batch_values)
    model_bytes = model.SerializeToString()
    result: dict[str, Any] = {"workload": args.workload, "shape": f"{batch}x{seq}", "device": args.device}
    sessions = ("launched", "captured") if args.device == "cuda" else ("launched",)
    for name in sessions:
        optimized = args.workdir / f"graph-capture-{args.workload}-{name}.onnx"
        run = timed_session(
            model_bytes, values, shapes, in_place, user_inputs, args.device,
            capture=name == "captured", warmup=args.warmup, steps=args.steps, optimized=optimized,
        )  # fmt: skip
        if optimized.exists():
            run["placed"] = placed_nodes(optimized)
        result[name] = run
    if "step_s" in result.get("captured", {}) and "step_s" in result["launched"]:
        result["ratio"] = result["captured"]["step_s"] / result["launched"]["step_s"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"graph-capture-{args.workload}.json").write_text(json.dumps(result, indent=1) + "\n")
    text = render(args.workload, f"{batch}x{seq}", args.device, result)
    (args.out / f"graph-capture-{args.workload}.md").write_text(text + "\n")
    print(text)
    return 0 if "step_s" in result["launched"] else 1


if __name__ == "__main__":
    sys.exit(main())
