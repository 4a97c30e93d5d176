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

import contextlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.external_data_helper import uses_external_data

from onnxtrain import checkpoint
from onnxtrain.artifacts.model_files import EXTERNAL_THRESHOLD
from onnxtrain.artifacts.training_model import set_inference_mode
from onnxtrain.checkpoint import CheckpointState
from onnxtrain.fileio import sync_directory, temporary_beside
from onnxtrain.graph import external, versions
from onnxtrain.graph.external import TensorData
from onnxtrain.graph.io import load_light
from onnxtrain.graph.walk import names_read
from onnxtrain.lora import record
from onnxtrain.lora.dequantize import dequantize_linear, matmul_nbits_weight
from onnxtrain.training.state import TrainingState


def merge_adapters(
    model: onnx.ModelProto | str | os.PathLike[str],
    checkpoint_state: CheckpointState | TrainingState | str | os.PathLike[str],
    *,
    data_location: str | None = None,
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

    Weights are read one at a time. The new values go into the result, or,
    with ``data_location`` (a file name, for a model given as a path), each
    into that file in the model's folder as soon as it is computed (those of
    1 KiB or more, as onnx moves them), which the result refers to, as it
    refers to the base's data files: save it in that folder. The file is
    replaced at once when the merge succeeds, and left as it was when it fails.
    """
    state = _state(checkpoint_state)
    merged, data = load_light(model)
    sink = _Sink.opened(data, data_location, merged)
    with sink:
        _merge(merged, state, data, sink)
    data.load_held(merged)
    return merged


def _merge(merged: onnx.ModelProto, state: CheckpointState, data: TensorData, sink: _Sink) -> None:
    """Fold the adapters of ``merged`` in, in place (see :func:`merge_adapters`)."""
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
    _write_trained(initializers, values, {name for a in adapters for name in (a.a, a.b)}, data, sink)
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
            _fold(initializers[adapter.weight], adapter, delta, data, sink)
        else:
            for placement in adapter.placements:
                nodes, inputs = _float_product(nodes, initializers, placement.node, adapter, delta, (data, sink))
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


class _Sink:
    """Where the merged values go: into the model (tensors holding their data), or into a data file in the model's
    folder, written beside it and renamed into place when the merge succeeds (a context manager)."""

    def __init__(self, target: Path | None = None, location: str = "") -> None:
        self.target = target
        self.location = location
        self.temporary = None if target is None else temporary_beside(target)
        self.file: BinaryIO | None = None if self.temporary is None else open(self.temporary, "wb")  # noqa: SIM115

    @classmethod
    def opened(cls, data: TensorData, location: str | None, model: onnx.ModelProto) -> _Sink:
        """The sink ``data_location`` asks for; ``ValueError`` for a location that cannot be written."""
        if location is None:
            return cls()
        if data.base_dir is None:
            raise ValueError(
                "data_location names a file in the model's folder, and a ModelProto has none: pass the path of the "
                "adapted model, or leave data_location out (the merged weights are then inside the result)"
            )
        if not isinstance(location, str) or not location or Path(location).name != location or location in ("..", "."):
            raise ValueError(f"data_location must be a file name (no folder), not {location!r}")
        used = {external.location_of(t) for t, _ in external.model_tensors(model) if uses_external_data(t)}
        if location in used:
            raise ValueError(
                f"data_location {location!r} is where the model keeps its own weights; choose another file name"
            )
        return cls(data.base_dir / location, location)

    def tensor(self, value: np.ndarray, name: str) -> onnx.TensorProto:
        """A tensor ``name`` of ``value``: holding it, or referring to it in the data file, where it is written now."""
        tensor = numpy_helper.from_array(value, name)
        if self.file is None or sys.getsizeof(b"") + len(tensor.raw_data) < EXTERNAL_THRESHOLD:
            return tensor
        offset = self.file.tell()
        self.file.write(tensor.raw_data)
        tensor.ClearField("raw_data")
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, entry in (("location", self.location), ("offset", offset), ("length", self.file.tell() - offset)):
            tensor.external_data.add(key=key, value=str(entry))
        return tensor

    def __enter__(self) -> _Sink:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if self.file is None or self.temporary is None or self.target is None:
            return
        try:
            with self.file:
                written = self.file.tell() > 0
                if kind is None:
                    self.file.flush()
                    os.fsync(self.file.fileno())
            if kind is None and written:  # no file where no merged weight reached the threshold
                os.replace(self.temporary, self.target)
                sync_directory(self.target.parent)
        finally:
            with contextlib.suppress(FileNotFoundError):
                self.temporary.unlink()


def _inference_mode(nodes: list[onnx.NodeProto], outputs: set[str]) -> tuple[list[onnx.NodeProto], set[str]]:
    """``nodes`` with Dropout and BatchNormalization in inference mode, as in the eval model, less the
    ``Constant`` nodes that gave only the Dropouts' training flags; and the names of the flags no node reads now
    (initializers to drop)."""
    flags = {n.input[2] for n in nodes if n.op_type == "Dropout" and versions.is_standard(n) and len(n.input) > 2}
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
    initializers: dict[str, onnx.TensorProto],
    values: Mapping[str, np.ndarray],
    skipped: set[str],
    data: TensorData,
    sink: _Sink,
) -> None:
    """Each value of the checkpoint but ``skipped`` into the initializer of its name, where the two differ.

    An unchanged value leaves its initializer as it is (external data stays in its file); a value the
    model has no initializer for (a parameter of a block stacked on it for training) has no place in it.
    """
    for name, value in values.items():
        if name in skipped or name not in initializers:
            continue
        tensor = initializers[name]
        stored = data.array(tensor)
        value = np.asarray(value)
        if value.shape != stored.shape or value.dtype != stored.dtype:
            raise ValueError(
                f"the checkpoint's {name} is {value.dtype}{list(value.shape)} and the model's "
                f"{stored.dtype}{list(stored.shape)}: the checkpoint belongs to another model; pass the one "
                "trained from this adapted model"
            )
        if value.tobytes() != stored.tobytes():
            tensor.CopyFrom(sink.tensor(value, name))


def _updated(weight: np.ndarray, update: np.ndarray, adapter: record.Adapter) -> np.ndarray:
    """``weight + update`` in the weight's type; ``ValueError`` when the shapes differ."""
    if weight.shape != update.shape:
        raise ValueError(
            f"the adapter of {adapter.weight} makes an update of shape {update.shape} for a weight of shape "
            f"{weight.shape}: the checkpoint belongs to another adapted model"
        )
    return (weight.astype(np.float64) + update).astype(weight.dtype)


def _fold(tensor: onnx.TensorProto, adapter: record.Adapter, delta: np.ndarray, data: TensorData, sink: _Sink) -> None:
    """``W += delta`` (``delta^T`` when ``W`` is stored ``[out, in]``), in place in the copy's initializer."""
    weight = data.array(tensor)
    update = delta.T if adapter.transposed else delta
    tensor.CopyFrom(sink.tensor(_updated(weight, update, adapter), tensor.name))


def _float_product(
    nodes: list[onnx.NodeProto],
    initializers: dict[str, onnx.TensorProto],
    name: str,
    adapter: record.Adapter,
    delta: np.ndarray,
    into: tuple[TensorData, _Sink],
) -> tuple[list[onnx.NodeProto], list[str]]:
    """``nodes`` with the product ``name`` over a quantized weight made a float one over ``dequant(W) + delta``.

    Returns the new node list and the quantized inputs it no longer reads. ``into``: where the weights are read
    from, and where the merged one goes.
    """
    data, sink = into
    index = next(k for k, node in enumerate(nodes) if node.name == name)
    node = nodes[index]
    merged = f"{adapter.weight}.merged"
    if merged in initializers:
        raise ValueError(f"the model has an initializer named {merged!r} already; rename it before merging")
    if adapter.kind == "DequantizeLinear":
        producer = next(k for k, n in enumerate(nodes) if node.input[1] in n.output)
        dequantizer = nodes[producer]
        weight = dequantize_linear(dequantizer, initializers, data)  # stored as the product reads it
        update = delta.T if adapter.transposed else delta
        initializers[merged] = sink.tensor(_updated(weight, update, adapter), merged)
        node.input[1] = merged
        return [n for k, n in enumerate(nodes) if k != producer], [i for i in dequantizer.input if i]
    # MatMulNBits(x, B, scales, zero_points, g_idx, bias) -> MatMul(x, W) (+ bias)
    weight = matmul_nbits_weight(node, initializers, data)  # [K, N] = [in, out]
    initializers[merged] = sink.tensor(_updated(weight, delta, adapter), merged)
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
