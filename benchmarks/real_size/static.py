"""Figures of the training graphs that do not depend on the machine, at a batch shape.

For each batch shape: :func:`onnxtrain.artifacts.step_memory.step_memory` on
the artifacts (the fused step of the steady loop and the first step, from
reset gradients): the held bytes, the static peak of live tensors in
onnxruntime's order, the node there, the bytes kept for the backward, and the
tensors alive at the peak grouped by producer and shape. Once per model:
the nodes onnxruntime runs per step after its graph optimizations
(:func:`ort_kernels`: the optimized fused model, as its session saves it).
"""

from __future__ import annotations

import tempfile
import warnings
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx

from benchmarks.real_size.launches import onnx_launches, operator_label
from onnxtrain.artifacts.accumulation import LAZY_RESET_GRAD, buffer_name
from onnxtrain.artifacts.fuse import FusedModel, fuse_update_and_train
from onnxtrain.artifacts.step_memory import LiveMemory, LiveTensor, step_memory, trainable_of, value_types
from onnxtrain.artifacts.vectorize import ParameterUpdate, views_in_place
from onnxtrain.graph.io import copy_model
from onnxtrain.graph.passes import fold_static_shapes
from onnxtrain.graph.passes.recompute import transformers_to_disable
from onnxtrain.losses.label_check import strip_label_checks
from onnxtrain.optim.loss_scaling import SCALER_STATE
from onnxtrain.sessions import inference_session, inferred_shapes
from onnxtrain.training import half_kernels
from onnxtrain.training.fused import packed_in_place
from onnxtrain.training.models import LoadedModel

MIB = float(1 << 20)
#: Tensors listed alive at the peak, and groups of them.
LISTED = 8


def user_inputs(training: onnx.ModelProto) -> list[str]:
    """The training model's inputs that the user feeds (the token ids, the labels)."""
    trainable = set(trainable_of(training))
    skip = trainable | {buffer_name(p) for p in trainable} | {LAZY_RESET_GRAD, *SCALER_STATE}
    return [value.name for value in training.graph.input if value.name not in skip]


def shapes_for(training: onnx.ModelProto, batch: int, seq: int) -> dict[str, tuple[int, ...]]:
    """The ids ``[batch, seq]`` and the labels ``[batch * seq]``, by the training model's input names."""
    ids, labels = user_inputs(training)
    return {ids: (batch, seq), labels: (batch * seq,)}


def grouped(tensors: Sequence[LiveTensor], listed: int = LISTED) -> list[dict[str, Any]]:
    """``tensors`` grouped by producer, phase and shape, the largest groups first."""
    groups: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    for tensor in tensors:
        key = (tensor.producer, tensor.phase, "x".join(map(str, tensor.dims or ())) or "scalar")
        groups[key][0] += 1
        groups[key][1] += tensor.nbytes / MIB
    ranked = sorted(groups.items(), key=lambda item: -item[1][1])[:listed]
    return [
        {"producer": producer, "phase": phase, "dims": dims, "count": int(count), "mib": mib}
        for (producer, phase, dims), (count, mib) in ranked
    ]


def summary(memory: LiveMemory) -> dict[str, Any]:
    """A :class:`LiveMemory` as JSON: MiB, the peak's node, the largest tensors and groups alive there, and the
    groups kept for the backward."""
    return {
        "order": memory.order,
        "nodes": memory.nodes,
        "held_mib": {k: v / MIB for k, v in memory.held.items()},
        "peak_mib": memory.peak / MIB,
        "peak_live_mib": memory.peak_live / MIB,
        "peak_at": memory.peak_at,
        "peak_node": memory.peak_node,
        "peak_phase": memory.peak_phase,
        "kept_for_backward_mib": memory.kept_for_backward / MIB,
        "phase_peaks_mib": {phase: value / MIB for phase, value in memory.phase_peaks.items()},
        "unknown": list(memory.unknown),
        "largest": [_tensor(t) for t in memory.at_peak[:LISTED]],
        "groups": grouped(memory.at_peak),
        "kept_groups": grouped(memory.kept, 2 * LISTED),
    }


def _tensor(tensor: LiveTensor) -> dict[str, Any]:
    return {
        "name": tensor.name,
        "dims": list(tensor.dims or ()),
        "dtype": tensor.dtype,
        "mib": tensor.nbytes / MIB,
        "producer": tensor.producer,
        "phase": tensor.phase,
    }


def ort_optimized(model: onnx.ModelProto, providers: Sequence[str] = ("CPUExecutionProvider",)) -> onnx.ModelProto:
    """``model`` after onnxruntime's graph optimizations (all levels, less those the runtime's sessions disable),
    as its session saves it: the nodes onnxruntime runs, its constants as initializers."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        options.log_severity_level = 3
        with warnings.catch_warnings():  # a missing half kernel: its operator in float32, as the runtime runs it
            warnings.simplefilter("ignore", half_kernels.HalfPrecisionFallbackWarning)
            half_kernels.open_session(
                LoadedModel(model, model.SerializeToString()),
                "model",
                lambda loaded: inference_session(
                    loaded.source, options, list(providers), disabled_optimizers=transformers_to_disable(loaded.proto)
                ),
            )
        return onnx.load(options.optimized_model_filepath)


def in_index_order(original: onnx.ModelProto, optimized: onnx.ModelProto) -> onnx.ModelProto:
    """``optimized`` with its nodes listed as onnxruntime numbers them in its session: a node of ``original``
    keeps its index there (its place in the model loaded), a node the optimizers made comes after all of them
    (onnxruntime appends it), in the order the optimized model lists them."""
    index = {node.name: i for i, node in enumerate(original.graph.node) if node.name}
    nodes = list(optimized.graph.node)
    ranked = sorted(range(len(nodes)), key=lambda i: index.get(nodes[i].name, len(index) + i))
    del optimized.graph.node[:]
    optimized.graph.node.extend(nodes[i] for i in ranked)
    return optimized


def static_figures(
    artifacts: Path, shapes: Sequence[tuple[int, int]], providers: Sequence[str] = ("CPUExecutionProvider",)
) -> dict[str, dict[str, Any]]:
    """Per ``"BxT"``: the summaries of the fused and reset steps as written (``fused``, ``reset``) and as
    onnxruntime optimizes them for ``providers`` (``fused, optimized``, ``reset, optimized``); off the CPU, the
    fused step with its updates packed and its shapes folded first, as the runtime runs it there
    (:func:`fused_as_run`)."""
    training, optimizer = step_models(artifacts)
    fused = fused_step(training, optimizer)
    fused_nodes, updates = len(fused.model.graph.node), fused.parameter_updates(trainable_of(training))
    optimized: dict[tuple[int, tuple[int, int] | None], onnx.ModelProto] = {}
    fixed: dict[str, tuple[int, ...]] = {}
    shape: tuple[int, int] = (0, 0)

    def rewrite(model: onnx.ModelProto) -> onnx.ModelProto:  # the same two models at every shape: once each
        folds = folds_every_shape(providers) and len(model.graph.node) == fused_nodes
        key = (len(model.graph.node), shape if folds else None)
        if key not in optimized:
            run = as_run(model, updates, fixed)[0] if folds else model
            optimized[key] = in_index_order(run, ort_optimized(run, providers))
        return optimized[key]

    figures = {}
    for batch, seq in shapes:
        shape, fixed = (batch, seq), shapes_for(training, batch, seq)
        written = step_memory(training, optimizer, fixed, largest=1 << 30)
        run = step_memory(training, optimizer, fixed, largest=1 << 30, rewrite=rewrite)
        assert written.fused is not None and run.fused is not None
        figures[f"{batch}x{seq}"] = {
            "fused": summary(written.fused),
            "reset": summary(written.reset),
            "fused, optimized": summary(run.fused),
            "reset, optimized": summary(run.reset),
        }
    return figures


def fused_model(artifacts: Path) -> onnx.ModelProto:
    """The fused step's model, as the runtime builds it from the artifacts."""
    return fused_step(*step_models(artifacts)).model


def folds_every_shape(providers: Sequence[str]) -> bool:
    """Whether the runtime runs the fused step with its batch's shapes folded whatever its size on
    ``providers``' device: off the CPU (``FusedStep.fold_every_shape``)."""
    return any(provider != "CPUExecutionProvider" for provider in providers)


def fused_as_run(
    artifacts: Path, shape: tuple[int, int], providers: Sequence[str] = ("CPUExecutionProvider",)
) -> onnx.ModelProto:
    """The fused step's model as the runtime's session for a batch of ``shape`` gets it on ``providers``' device:
    off the CPU, with the optimizer's chains packed (:func:`onnxtrain.training.fused.packed_in_place`) and the
    shapes folded (:func:`onnxtrain.graph.passes.fold_static_shapes`); on the CPU, as built (a large step's
    session; a small one's is folded there too)."""
    training, optimizer = step_models(artifacts)
    fused = fused_step(training, optimizer)
    if not folds_every_shape(providers):
        return fused.model
    return as_run(fused.model, fused.parameter_updates(trainable_of(training)), shapes_for(training, *shape))[0]


def step_models(artifacts: Path) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The training and optimizer models of ``artifacts``, without their external data; the training model as
    the runtime runs it, without the label checks it runs on the host (:mod:`onnxtrain.training.labels`)."""
    training = onnx.load(str(artifacts / "training_model.onnx"), load_external_data=False)
    strip_label_checks(training, inputs=user_inputs(training))
    return training, onnx.load(str(artifacts / "optimizer_model.onnx"), load_external_data=False)


def fused_step(training: onnx.ModelProto, optimizer: onnx.ModelProto) -> FusedModel:
    """The fused step of ``training`` and ``optimizer`` (neither is changed)."""
    return fuse_update_and_train(training, optimizer, trainable_of(training))


def as_run(
    model: onnx.ModelProto, updates: Sequence[ParameterUpdate], fixed: dict[str, tuple[int, ...]]
) -> tuple[onnx.ModelProto, dict[str, tuple[int, int]]]:
    """A copy of the fused ``model`` as the runtime's session for fixed shapes gets it off the CPU: its
    ``updates`` packed in place, its user inputs' shapes ``fixed`` and what they make constant folded
    (``FusedStep.step_model``, ``FusedStep.session_for``); and the inputs the packing binds as rows, with the
    shapes they are bound with."""
    packed = packed_in_place(model, updates, in_place_pairs(updates))
    run, views = (model, {}) if packed is None else (packed[0], views_in_place(packed[1])[0])
    return fold_static_shapes(copy_model(run), shapes=fixed, shapes_of=inferred_shapes), views


def in_place_pairs(updates: Sequence[ParameterUpdate]) -> dict[str, str]:
    """``{input: output}`` of every tensor the fused step updates in place: each parameter, gradient, moment."""
    return {name: out for u in updates for name, out in (u.parameter, u.gradient, *u.moments)}


def ort_kernels(
    model: onnx.ModelProto,
    providers: Sequence[str] = ("CPUExecutionProvider",),
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, Any]:
    """The nodes of ``model`` and of :func:`ort_optimized` of it: their counts, the latter's ten most frequent
    operators, and those of its nodes that launch work on a device
    (:func:`~benchmarks.real_size.launches.onnx_launches`), with the bytes they move where the user inputs'
    ``shapes`` are given."""
    optimized = ort_optimized(model, providers)
    sizes = None
    if shapes is not None:
        sizes = {name: info.nbytes for name, info in value_types(optimized, shapes).items()}
    counts = Counter(operator_label(node) for node in optimized.graph.node)
    ranked = sorted(counts.items(), key=lambda item: -item[1])
    return {
        "nodes": len(optimized.graph.node),
        "emitted": len(model.graph.node),
        "top": ranked[:10],
        "launches": onnx_launches(optimized, sizes),
    }


__all__ = [
    "as_run",
    "folds_every_shape",
    "fused_as_run",
    "fused_model",
    "fused_step",
    "in_index_order",
    "in_place_pairs",
    "ort_kernels",
    "ort_optimized",
    "shapes_for",
    "static_figures",
    "step_models",
    "summary",
    "user_inputs",
]
