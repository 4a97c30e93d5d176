"""The models' large constants, held once on the device for all the sessions that read them.

A model's initializers are constants, and onnxruntime gives each session its
own: a copy of each, or of what it prepacks for ``MatMul``, and of what it
folds. The runtime makes several sessions of the same graphs (the training
model, the step from reset gradients, the eval model, the fused step), and
kept the models themselves in memory too, so a model whose frozen weights
are initializers (LoRA adapters over a frozen base) held them about fifteen
times over: GPT-2 medium's shapes with 4 layers, 393 MB of constants, took
5.9 GB for a step.

:class:`SharedConstants` holds each initializer of at least
:data:`SHARED_CONSTANT_BYTES` once, as an OrtValue on the module's device.
:meth:`~SharedConstants.share` replaces its data in the runtime's copy of
the model by a *stub* (name, type and dims; its data marked external at
:data:`~onnxtrain.graph.external.SHARED_LOCATION`), so that the models the
runtime derives (the reset and fused steps, the epoch model) carry stubs and
no data. A session then gets the constants in one of two ways
(:meth:`~SharedConstants.prepare`):

- *as initializers* (:meth:`~SharedConstants.attach`): the shared OrtValues
  become the session's external initializers, read where they are.
  onnxruntime still prepacks and folds them, a copy per session, and computes
  as from the model's own initializers, bit for bit. On the CPU, while the
  constants take under :data:`LIFT_BYTES`.
- *as inputs* (:meth:`~SharedConstants.lift`): each stub becomes an input of
  the main graph, bound to the shared OrtValue in every binding. No copy at
  all; onnxruntime neither prepacks nor folds them, so a product with a
  frozen weight packs it at each run (the same arithmetic, rounded
  differently by a unit in the last place at most, and slower for products
  of few rows). From :data:`LIFT_BYTES` on, off the CPU (where nothing is
  prepacked and each session would copy the constants to the device), for
  the caller's session options (shared by every session, so never changed),
  and for stubs inside subgraphs.

GPT-2 medium's shapes with 4 layers, LoRA on ``c_attn``, 2 cores: a step
took 5.9 GB before, 1.3 GB as inputs; 1.15 s and 1.23 s for 4 x 128 tokens
(docs/benchmarks.md, "Artifacts of large models").

An initializer that is also a graph input (a default the caller may
override) stays in the model, as does one to which another model gives other
values under the same name. The smaller tensors of a model's data files are
read into the runtime's copy, which then needs no folder.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper
from onnx.external_data_helper import uses_external_data

from onnxtrain.graph import dtypes, external, walk
from onnxtrain.graph.io import copy_model
from onnxtrain.training import values
from onnxtrain.training.device import Device
from onnxtrain.training.models import LoadedModel

#: Initializers of at least this many bytes are shared (smaller ones, shapes and scalars, stay constants that
#: onnxruntime folds).
SHARED_CONSTANT_BYTES = 1 << 20


#: From this many bytes of shared constants on, the sessions on the CPU take them as inputs (one copy in all);
#: under it, as initializers, which onnxruntime prepacks for ``MatMul`` per session (a copy each, faster at few
#: rows: see the module docstring).
LIFT_BYTES = 256 << 20
#: The element types of constants that may be shared: numbers NumPy holds, and bfloat16 (``ml_dtypes``).
SHAREABLE_TYPES = dtypes.FLOAT_TYPES | dtypes.INTEGER_TYPES | {onnx.TensorProto.BOOL}


def is_shared_stub(tensor: onnx.TensorProto) -> bool:
    """Whether ``tensor`` stands for a constant of a :class:`SharedConstants` (made by its :meth:`share`)."""
    return uses_external_data(tensor) and external.location_of(tensor) == external.SHARED_LOCATION


def _stub(tensor: onnx.TensorProto) -> onnx.TensorProto:
    """``tensor``'s name, type and dims, its data marked external at the shared location."""
    stub = onnx.TensorProto()
    external.copy_fields(tensor, stub, external.DATA_FIELDS)
    stub.data_location = onnx.TensorProto.EXTERNAL
    stub.external_data.add(key="location", value=external.SHARED_LOCATION)
    return stub


class SharedConstants:
    """Large constants by name, each held once on ``device``; see the module docstring."""

    def __init__(self, device: Device, min_bytes: int | None = None, lift_bytes: int | None = None) -> None:
        """``min_bytes``, ``lift_bytes``: :data:`SHARED_CONSTANT_BYTES` and :data:`LIFT_BYTES` where ``None``."""
        self._device = device
        self._min_bytes = SHARED_CONSTANT_BYTES if min_bytes is None else min_bytes
        self._lift_bytes = LIFT_BYTES if lift_bytes is None else lift_bytes
        self._values: dict[str, ort.OrtValue] = {}
        # the host copy of each constant, for comparing the same name in another model and for export; on a
        # device other than the CPU, dropped by release_host_copies
        self._host: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._values)

    def __contains__(self, name: object) -> bool:
        return name in self._values

    def value(self, name: str) -> ort.OrtValue:
        """The OrtValue every session binds for constant ``name``."""
        return self._values[name]

    def _shareable(self, tensor: onnx.TensorProto, inputs: set[str]) -> bool:
        if tensor.name in inputs or tensor.data_type not in SHAREABLE_TYPES:
            return False
        return (external.declared_nbytes(tensor) or 0) >= self._min_bytes

    def share(self, model: LoadedModel, what: str) -> LoadedModel:
        """``model`` with its large initializers held here and stubs in their place, and the smaller tensors of
        its data files inside it (``model`` itself when it has neither); ``what`` names the model in errors.
        The data of a model read from a path is read a tensor at a time."""
        inputs = {value.name for value in model.proto.graph.input}
        chosen = [i for i, tensor in enumerate(model.proto.graph.initializer) if self._shareable(tensor, inputs)]
        if not chosen and not external.has_external_data(model.proto):
            return model
        data = external.TensorData(base_dir=None if model.path is None else model.path.parent)
        proto = copy_model(model.proto) if model.path is None else model.proto  # a path's proto is ours
        for index in chosen:
            tensor = proto.graph.initializer[index]
            array = data.array(tensor, f"{what}: ")
            held = self._host.get(tensor.name)
            if tensor.name in self._values and (held is None or not _same(held, array)):
                continue  # different values under a shared name: this model keeps its own
            if tensor.name not in self._values:
                self._add(tensor.name, array)
            proto.graph.initializer[index].CopyFrom(_stub(tensor))
        for tensor, where in external.model_tensors(proto):  # the rest of the data files' tensors come inside
            if uses_external_data(tensor) and not is_shared_stub(tensor):
                data.load(tensor, f"{what}: {where}")
        # a copy: protobuf keeps the memory of data replaced in a message until the message itself goes
        light = copy_model(proto)
        return LoadedModel(light, light.SerializeToString())

    def _add(self, name: str, array: np.ndarray) -> None:
        array = np.asarray(array, order="C")  # contiguous, its shape kept (0-d too, unlike ascontiguousarray)
        self._host[name] = array
        if self._device.type == "cpu" and values.needs_ortvalue(array.dtype):  # bfloat16: its bits, typed
            bits = array.view(np.uint16)  # the same shape, 0-d too
            self._values[name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, onnx.TensorProto.BFLOAT16)
        elif self._device.type == "cpu":  # the array's memory, not a copy (external initializers must be the user's)
            self._values[name] = ort.OrtValue.ortvalue_from_numpy(array)
        else:
            self._values[name] = values.from_numpy(array, self._device)

    def release_host_copies(self) -> None:
        """Forget the host copies of constants held on another device (after the last :meth:`share`)."""
        if self._device.type != "cpu":
            self._host.clear()

    def lift(self, model: LoadedModel) -> tuple[LoadedModel, dict[str, ort.OrtValue]]:
        """``model`` as onnxruntime loads it: each stub (in the main graph or a subgraph) removed and made an
        input of the main graph; and the OrtValue to bind to each such input. ``model`` itself and ``{}`` where
        it has no stub."""
        if not any(is_shared_stub(t) for t, _ in external.model_tensors(model.proto)):
            return model, {}
        proto = copy_model(model.proto)
        lifted: dict[str, ort.OrtValue] = {}
        for graph in _graphs(proto.graph):
            kept = []
            for tensor in graph.initializer:
                if not is_shared_stub(tensor):
                    kept.append(tensor)
                    continue
                if tensor.name not in self._values:
                    raise ValueError(f"the model refers to shared constant {tensor.name!r}, which this module lacks")
                if tensor.name not in lifted:
                    lifted[tensor.name] = self._values[tensor.name]
                    proto.graph.input.append(
                        helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))
                    )
            del graph.initializer[:]
            graph.initializer.extend(kept)
        return LoadedModel(proto, proto.SerializeToString()), lifted

    @property
    def nbytes(self) -> int:
        """The bytes of the constants held."""
        return sum(int(math.prod(v.shape())) * values.dtype_of(v).itemsize for v in self._values.values())

    @property
    def as_inputs(self) -> bool:
        """Whether sessions take the constants as inputs (:meth:`lift`) rather than as initializers
        (:meth:`attach`): off the CPU, or from :data:`LIFT_BYTES` of them on."""
        return self._device.type != "cpu" or self.nbytes >= self._lift_bytes

    def prepare(
        self, model: LoadedModel, options: ort.SessionOptions, own_options: bool
    ) -> tuple[LoadedModel, dict[str, ort.OrtValue]]:
        """``model`` as a session loads it with ``options``, and the constants to bind as its inputs: attached
        to ``options`` where the module's constants are taken as initializers and ``options`` serve this
        session alone (``own_options``), else lifted."""
        if own_options and not self.as_inputs and self.attach(model, options):
            return model, {}
        return self.lift(model)

    def attach(self, model: LoadedModel, options: ort.SessionOptions) -> bool:
        """Give ``options`` (made for one session of ``model``, and for no other) the shared OrtValues of the
        stubs of ``model``'s main graph as its external initializers: the session reads them where they are,
        and may still fold and prepack them. ``False``, changing nothing, where ``model`` has stubs inside a
        subgraph (:meth:`lift` serves it)."""
        if any(is_shared_stub(t) for graph in _graphs(model.proto.graph)[1:] for t in graph.initializer):
            return False
        names = [t.name for t in model.proto.graph.initializer if is_shared_stub(t)]
        if names:
            options.add_external_initializers(names, [self._values[name] for name in names])
        return True

    def restore(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """A copy of ``model`` with each stub's data put back (for a model written out, as the export's)."""
        proto = copy_model(model)
        for tensor, _ in external.model_tensors(proto):
            if is_shared_stub(tensor):
                array = self._host.get(tensor.name)
                if array is None:
                    array = values.to_numpy(self._values[tensor.name])
                tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))
        return proto


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two constants hold the same bits (NaNs included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    bits = [np.asarray(x, order="C").reshape(-1).view(np.uint8) for x in (a, b)]
    return bool(np.array_equal(bits[0], bits[1]))


def _graphs(graph: onnx.GraphProto) -> list[onnx.GraphProto]:
    """``graph`` and every subgraph inside it."""
    return [graph] + [sub for node in walk.all_nodes(graph) for sub in walk.subgraphs(node)]


__all__ = ["LIFT_BYTES", "SHAREABLE_TYPES", "SHARED_CONSTANT_BYTES", "SharedConstants", "is_shared_stub"]
