"""``merge_adapters``: trained adapters folded into the base weights, for inference.

Every other value the checkpoint holds (a head trained in full, running
statistics the train steps updated) is written into the initializer of its
name first; then ``W <- W + (alpha / rank) A B`` (``(A B)^T`` when ``W`` is
stored ``[out, in]``: Gemm ``transB=1``, or read through a ``Transpose``; Gemm's
``alpha`` multiplies both terms, so it stays out), and the adapter's nodes,
initializers and record are removed and each product gives its output again.
The merged model is for inference: its Dropout and BatchNormalization nodes
run in inference mode, as in the eval model.
A quantized weight (``DequantizeLinear``, ``MatMulNBits``) is replaced by its
float value plus the update, and its product by a float ``MatMul``/``Gemm``:
requantizing would change the outputs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxtrain import checkpoint
from onnxtrain.artifacts.training_model import set_inference_mode
from onnxtrain.checkpoint import CheckpointState
from onnxtrain.graph import versions
from onnxtrain.graph.io import load_base_model
from onnxtrain.graph.walk import names_read
from onnxtrain.lora import record
from onnxtrain.lora.dequantize import dequantize_linear, matmul_nbits_weight
from onnxtrain.training.state import TrainingState


def merge_adapters(
    model: onnx.ModelProto | str | os.PathLike[str],
    checkpoint_state: CheckpointState | TrainingState | str | os.PathLike[str],
) -> onnx.ModelProto:
    """A copy of the adapted ``model`` (from ``add_adapters``) with its adapters folded in from the checkpoint.

    ``checkpoint_state``: a :class:`~onnxtrain.checkpoint.CheckpointState`, the
    runtime's state (``onnxtrain.api.CheckpointState``, as trained) or the path
    of a checkpoint, holding every adapter's ``A`` and ``B`` (trainable or
    frozen). The result has the base model's nodes and outputs (a quantized
    product made float), every other initializer the checkpoint holds a value
    of set to that value (trained parameters, updated running statistics), its
    adapted weights replaced by ``W + (alpha / rank) A B``, none of the
    adapters' nodes, initializers or Dropout, and its Dropout and BatchNormalization
    in inference mode (as in the eval model).
    """
    state = _state(checkpoint_state)
    merged, folder = load_base_model(model)
    adapters = record.adapters_of(merged)
    if not adapters:
        raise ValueError(
            "the model has no adapters to merge (no onnxtrain.lora record in its metadata_props); "
            "pass the model add_adapters returned"
        )
    values = state.parameters
    missing = sorted(name for a in adapters for name in (a.a, a.b) if name not in values)
    if missing:
        raise ValueError(
            f"the checkpoint lacks the adapters {missing}; it holds {sorted(values)}. Pass the checkpoint "
            "trained from this adapted model (generate_artifacts with requires_grad = add_adapters' names)"
        )
    graph = merged.graph
    nodes = list(graph.node)
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    _write_trained(initializers, values, {name for a in adapters for name in (a.a, a.b)}, folder)
    freed: set[str] = set()
    gone: set[str] = set()  # values the merged model no longer has
    for adapter in adapters:
        a, b = _checked(values, adapter)
        delta = adapter.scale * (a.astype(np.float64) @ b.astype(np.float64))  # [in, out]
        added = {name for placement in adapter.placements for name in placement.added}
        renames = {placement.base_output: placement.output for placement in adapter.placements}
        gone.update(renames)
        nodes = [node for node in nodes if node.name not in added]
        for node in nodes:
            node.output[:] = [renames.get(name, name) for name in node.output]
        freed.update((adapter.a, adapter.b, *adapter.constants))
        if adapter.kind in ("MatMul", "Gemm"):
            _fold(initializers[adapter.weight], adapter, delta, folder)
        else:
            for placement in adapter.placements:
                nodes, inputs = _float_product(nodes, initializers, placement.node, adapter, delta, folder)
                freed.update(inputs)
    nodes, flags = _inference_mode(nodes, {value.name for value in graph.output})
    freed.update(flags)
    del graph.node[:]
    graph.node.extend(nodes)
    produced = {name for node in graph.node for name in node.output}
    infos = [_copy_info(value) for value in graph.value_info if value.name not in gone and value.name in produced]
    del graph.value_info[:]
    graph.value_info.extend(infos)
    read = {name for node in nodes for name in names_read(node)} | {value.name for value in graph.output}
    kept = [_copy(tensor) for tensor in initializers.values() if tensor.name not in freed or tensor.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    record.write(merged, [])
    versions.stamp_ir_version(merged)
    return merged


def _inference_mode(nodes: list[onnx.NodeProto], outputs: set[str]) -> tuple[list[onnx.NodeProto], set[str]]:
    """``nodes`` with Dropout and BatchNormalization in inference mode, as in the eval model, less the
    ``Constant`` nodes that gave only the Dropouts' training flags; and the names of the flags no node reads now
    (initializers to drop)."""
    flags = {n.input[2] for n in nodes if n.op_type == "Dropout" and n.domain in ("", "ai.onnx") and len(n.input) > 2}
    model = onnx.ModelProto()
    model.graph.node.extend(nodes)
    set_inference_mode(model)
    read = {name for node in model.graph.node for name in names_read(node)} | outputs
    unread = {flag for flag in flags if flag and flag not in read}
    kept = [n for n in model.graph.node if not (n.op_type == "Constant" and set(n.output) <= unread)]
    return kept, unread


def _copy_info(value: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
    copy = onnx.ValueInfoProto()
    copy.CopyFrom(value)
    return copy


def _copy(tensor: onnx.TensorProto) -> onnx.TensorProto:
    copy = onnx.TensorProto()
    copy.CopyFrom(tensor)
    return copy


def _state(value: CheckpointState | TrainingState | str | os.PathLike[str]) -> CheckpointState:
    if isinstance(value, CheckpointState):
        state = value
    elif isinstance(value, TrainingState):
        if value.is_nominal:
            raise ValueError("the checkpoint state is nominal (no values); pass the trained state")
        state = value.to_checkpoint(include_optimizer_state=False)
    elif isinstance(value, (str, os.PathLike)):
        if not Path(value).is_file():
            raise ValueError(f"no checkpoint at {os.fspath(value)!r}: pass a checkpoint file or a CheckpointState")
        state = checkpoint.load(value)
    else:
        raise TypeError(
            "checkpoint_state must be an onnxtrain.checkpoint.CheckpointState, an onnxtrain.api.CheckpointState "
            f"or a path, not {type(value).__name__}"
        )
    if state.is_nominal:
        raise ValueError("the checkpoint is nominal (no values); pass the trained checkpoint")
    return state


def _checked(values: Mapping[str, np.ndarray], adapter: record.Adapter) -> tuple[np.ndarray, np.ndarray]:
    """The adapter's ``A`` and ``B`` from the checkpoint, with their shapes checked against each other."""
    a, b = np.asarray(values[adapter.a]), np.asarray(values[adapter.b])
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != adapter.rank or b.shape[0] != adapter.rank:
        raise ValueError(
            f"the checkpoint's {adapter.a} {a.shape} and {adapter.b} {b.shape} are not [in, {adapter.rank}] "
            f"and [{adapter.rank}, out]: the checkpoint belongs to another adapted model"
        )
    return a, b


def _write_trained(
    initializers: dict[str, onnx.TensorProto], values: Mapping[str, np.ndarray], skipped: set[str], folder: Path | None
) -> None:
    """Each value of the checkpoint but ``skipped`` into the initializer of its name, where the two differ.

    An unchanged value leaves its initializer as it is (external data stays in its file); a value the
    model has no initializer for (a parameter of a block stacked on it for training) has no place in it.
    """
    for name, value in values.items():
        if name in skipped or name not in initializers:
            continue
        tensor = initializers[name]
        stored = numpy_helper.to_array(tensor, os.fspath(folder) if folder else "")
        value = np.asarray(value)
        if value.shape != stored.shape or value.dtype != stored.dtype:
            raise ValueError(
                f"the checkpoint's {name} is {value.dtype}{list(value.shape)} and the model's "
                f"{stored.dtype}{list(stored.shape)}: the checkpoint belongs to another model; pass the one "
                "trained from this adapted model"
            )
        if value.tobytes() != stored.tobytes():
            tensor.CopyFrom(numpy_helper.from_array(value, name))


def _updated(weight: np.ndarray, update: np.ndarray, adapter: record.Adapter) -> np.ndarray:
    """``weight + update`` in the weight's type; ``ValueError`` when the shapes differ."""
    if weight.shape != update.shape:
        raise ValueError(
            f"the adapter of {adapter.weight} makes an update of shape {update.shape} for a weight of shape "
            f"{weight.shape}: the checkpoint belongs to another adapted model"
        )
    return (weight.astype(np.float64) + update).astype(weight.dtype)


def _fold(tensor: onnx.TensorProto, adapter: record.Adapter, delta: np.ndarray, folder: Path | None) -> None:
    """``W += delta`` (``delta^T`` when ``W`` is stored ``[out, in]``), in place in the copy's initializer."""
    weight = numpy_helper.to_array(tensor, os.fspath(folder) if folder else "")
    update = delta.T if adapter.transposed else delta
    tensor.CopyFrom(numpy_helper.from_array(_updated(weight, update, adapter), tensor.name))


def _float_product(
    nodes: list[onnx.NodeProto],
    initializers: dict[str, onnx.TensorProto],
    name: str,
    adapter: record.Adapter,
    delta: np.ndarray,
    folder: Path | None,
) -> tuple[list[onnx.NodeProto], list[str]]:
    """``nodes`` with the product ``name`` over a quantized weight made a float one over ``dequant(W) + delta``.

    Returns the new node list and the quantized inputs it no longer reads.
    """
    index = next(k for k, node in enumerate(nodes) if node.name == name)
    node = nodes[index]
    merged = f"{adapter.weight}.merged"
    if merged in initializers:
        raise ValueError(f"the model has an initializer named {merged!r} already; rename it before merging")
    if adapter.kind == "DequantizeLinear":
        producer = next(k for k, n in enumerate(nodes) if node.input[1] in n.output)
        dequantizer = nodes[producer]
        weight = dequantize_linear(dequantizer, initializers, folder)  # stored as the product reads it
        update = delta.T if adapter.transposed else delta
        initializers[merged] = numpy_helper.from_array(_updated(weight, update, adapter), merged)
        node.input[1] = merged
        return [n for k, n in enumerate(nodes) if k != producer], [i for i in dequantizer.input if i]
    # MatMulNBits(x, B, scales, zero_points, g_idx, bias) -> MatMul(x, W) (+ bias)
    weight = matmul_nbits_weight(node, initializers, folder)  # [K, N] = [in, out]
    initializers[merged] = numpy_helper.from_array(_updated(weight, delta, adapter), merged)
    inputs = list(node.input)
    bias = inputs[5] if len(inputs) > 5 else ""
    output = node.output[0]
    if bias:
        replacement = [
            helper.make_node("MatMul", [inputs[0], merged], [f"{output}.nobias"], name=node.name),
            helper.make_node("Add", [f"{output}.nobias", bias], [output], name=f"{node.name}/bias"),
        ]
    else:
        replacement = [helper.make_node("MatMul", [inputs[0], merged], [output], name=node.name)]
    return nodes[:index] + replacement + nodes[index + 1 :], [i for i in inputs[1:5] if i]
