"""The model under construction: nodes appended with names and types tracked.

A :class:`GraphBuilder` owns a private copy of the base model. Blocks append
nodes, initializers and inputs through it; it hands out deterministic names,
infers the type of each new value from the operator's schema (one node at a
time, never the whole model again), and can roll everything back when a block
fails, so that a failed block leaves the model as it was.
"""

from __future__ import annotations

import contextlib
import difflib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from onnxtrain.graph import dtypes, versions
from onnxtrain.graph.io import checkable, inferred_skeleton, is_small
from onnxtrain.graph.naming import NameGenerator, names_in

#: A dimension is a size, a symbolic name (``"batch"``) or unknown (``None``).
Dim = int | str | None


def tensor_type(elem_type: int, shape: Sequence[Dim] | None) -> onnx.TypeProto:
    """A tensor ``TypeProto``; ``shape=None`` means the rank is unknown."""
    return helper.make_tensor_type_proto(elem_type, None if shape is None else list(shape))


def _tensor_type_of(tensor: onnx.TensorProto) -> onnx.TypeProto:
    return tensor_type(tensor.data_type, list(tensor.dims))


def _dims(type_proto: onnx.TypeProto) -> list[Dim] | None:
    if not type_proto.HasField("tensor_type") or not type_proto.tensor_type.HasField("shape"):
        return None
    dims: list[Dim] = []
    for dim in type_proto.tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(dim.dim_value)
        elif dim.HasField("dim_param"):
            dims.append(dim.dim_param)
        else:
            dims.append(None)
    return dims


def describe_type(type_proto: onnx.TypeProto | None) -> str:
    """``float[batch,3]``, ``int64[?]``, ``seq(float[2])``: a type for error messages."""
    if type_proto is None:
        return "<unknown type>"
    if type_proto.HasField("sequence_type"):
        return f"seq({describe_type(type_proto.sequence_type.elem_type)})"
    if not type_proto.HasField("tensor_type"):
        return str(type_proto.WhichOneof("value"))
    name = dtypes.dtype_name(type_proto.tensor_type.elem_type)
    dims = _dims(type_proto)
    if dims is None:
        return f"{name}[...]"
    return f"{name}[{','.join('?' if d is None else str(d) for d in dims)}]"


@dataclass(frozen=True)
class BuildMark:
    """Where a build stood (:meth:`GraphBuilder.mark`): the lengths of the graph's repeated fields, its outputs,
    its opset imports, the name generator's state and the builder's own records."""

    lengths: dict[str, int]
    outputs: list[onnx.ValueInfoProto]
    opsets: int
    names: tuple[int, int]
    tracked: tuple[int, int, tuple[int, int, int, int]]


def _integer_constant_hint(node: onnx.NodeProto, constants: dict[str, onnx.TensorProto]) -> str:
    """Where a node mixing types reads an integer constant of one value (``Constant(2)``, an int64 here where
    ONNX Runtime's block makes a float), how to write it as a float."""
    for name in node.input:
        tensor = constants.get(name)
        if tensor is None or not dtypes.is_integer(tensor.data_type) or math.prod(tensor.dims) != 1:
            continue
        value = numpy_helper.to_array(tensor)
        if value.size == 1:
            number = value.reshape(-1)[0].item()
            return f" {name!r} is the integer constant {number}: for a float, write Constant({float(number)!r})"
    return ""


class GraphBuilder:
    """A base model being extended by blocks (what ``onnxblock.base`` yields).

    Attributes:
        model: the model being built, a private copy of the caller's.
        base_dir: the folder the model's external data lives in, or ``None``.
        names: the name generator of this build.
    """

    def __init__(self, model: onnx.ModelProto, base_dir: Path | None = None) -> None:
        self.model = model
        self.base_dir = base_dir
        versions.check_opset(model)
        self.names = NameGenerator(names_in(model.graph))
        self._values: dict[str, onnx.TypeProto | None] = {}
        self._constants: dict[str, onnx.TensorProto] = {}
        self._seen = (0, 0, 0, 0)
        #: The gradient rules of the training block being built (a ``GradientRegistry``; ``None``: the built-in
        #: ones), for the ``Gradient`` blocks of its loss.
        self.gradient_registry: Any = None
        self._seed_types()

    # ------------------------------------------------------------------ types

    @property
    def opset(self) -> int:
        """The ``ai.onnx`` opset version of the model."""
        version = versions.opset_version(self.model, "")
        assert version is not None  # checked in __init__
        return version

    def _seed_types(self) -> None:
        graph = self.model.graph
        try:
            inferred = inferred_skeleton(self.model).graph
        except (shape_inference.InferenceError, onnx.checker.ValidationError):
            inferred = graph
        for tensor in graph.initializer:
            self._record_tensor(tensor)
        for value in (*inferred.input, *inferred.value_info, *inferred.output):
            if value.HasField("type"):
                self._values[value.name] = value.type
        for node in graph.node:
            self._record_constant_node(node)
            for name in node.output:
                if name:
                    self._values.setdefault(name, None)
        self._seen = (len(graph.input), len(graph.initializer), len(graph.node), len(graph.value_info))

    def _record_constant_node(self, node: onnx.NodeProto) -> None:
        """Take in the value of a ``Constant`` node holding a small tensor, as a small initializer's."""
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.attribute) != 1:
            return
        attribute = node.attribute[0]
        if attribute.name == "value" and is_small(attribute.t):
            tensor = onnx.TensorProto()
            tensor.CopyFrom(attribute.t)
            tensor.name = node.output[0]
            self._constants[tensor.name] = tensor

    def _record_tensor(self, tensor: onnx.TensorProto) -> None:
        self._values[tensor.name] = _tensor_type_of(tensor)
        if is_small(tensor):
            self._constants[tensor.name] = tensor

    def sync(self) -> None:
        """Take in what was appended to ``self.model`` directly, not through the builder.

        ONNX Runtime's blocks append to ``self.base.graph`` by hand; those nodes,
        inputs and initializers get names reserved and types inferred here.
        """
        graph = self.model.graph
        n_inputs, n_inits, n_nodes, n_infos = self._seen
        for value in graph.input[n_inputs:]:
            self.names.reserve(value.name)
            self._values[value.name] = value.type if value.HasField("type") else None
        for tensor in graph.initializer[n_inits:]:
            self.names.reserve(tensor.name)
            self._record_tensor(tensor)
        for value in graph.value_info[n_infos:]:
            if value.HasField("type") and self._values.get(value.name) is None:
                self._values[value.name] = value.type
        for node in graph.node[n_nodes:]:
            for name in (*node.output, node.name):
                if name:
                    self.names.reserve(name)
            self._record_constant_node(node)
            self._values.update(self._infer_outputs(node))
            for name in node.output:
                if name:
                    self._values.setdefault(name, None)
        self._seen = (len(graph.input), len(graph.initializer), len(graph.node), len(graph.value_info))

    def _infer_outputs(self, node: onnx.NodeProto) -> dict[str, onnx.TypeProto]:
        """Output types of ``node`` from its schema; ``TypeError`` if its inputs cannot work."""
        version = versions.opset_version(self.model, node.domain)
        if version is None:
            return {}
        try:
            schema = onnx.defs.get_schema(node.op_type, version, node.domain)
        except onnx.defs.SchemaError:
            return {}  # a custom operator: its output types stay unknown
        input_types = {name: self._values.get(name) for name in node.input if name}
        if any(value is None for value in input_types.values()):
            return {}
        input_data = {name: self._constants[name] for name in node.input if name in self._constants}
        try:
            return dict(
                shape_inference.infer_node_outputs(
                    schema, node, input_types, input_data, opset_imports=list(self.model.opset_import)
                )
            )
        except (shape_inference.InferenceError, onnx.checker.ValidationError, RuntimeError) as error:
            inputs = ", ".join(f"{name!r}: {describe_type(input_types[name])}" for name in node.input if name)
            reason = str(error).strip()
            hint = (
                "Cast the inputs to the types the operator accepts (blocks.Cast) or choose another block."
                if "type" in reason.lower()
                else f"Give the node the inputs and attributes {node.op_type}'s schema at opset {version} asks for "
                "(onnx.defs.get_schema)."
            )
            reason = reason.rstrip(".")
            raise TypeError(
                f"{node.op_type} (opset {version}) cannot take the inputs {{{inputs}}}: {reason}. {hint}"
                f"{_integer_constant_hint(node, input_data)}"
            ) from error

    def has(self, name: str) -> bool:
        """Whether ``name`` is a value of the model (input, initializer or node output)."""
        self.sync()
        return name in self._values

    def require(self, name: str, *, role: str = "input") -> str:
        """Return ``name``; raise ``ValueError`` listing the model's values if it is not one."""
        if not isinstance(name, str):
            raise TypeError(f"the {role} must be a value name (str), not {type(name).__name__} {name!r}")
        if self.has(name):
            return name
        graph = self.model.graph
        inputs = [value.name for value in graph.input]
        outputs = [value.name for value in graph.output]
        close = difflib.get_close_matches(name, list(self._values), n=5)
        hint = f"; similar names: {close}" if close else ""
        raise ValueError(
            f"{name!r} ({role}) is not a value of the base model. Graph inputs: {inputs}; "
            f"graph outputs: {outputs}{hint}. Pass one of these names, or the name a block returned."
        )

    def type_of(self, name: str) -> onnx.TypeProto | None:
        """The type of value ``name``, or ``None`` when it cannot be inferred."""
        self.require(name)
        return self._values[name]

    def tensor_type_of(self, name: str) -> onnx.TypeProto:
        """The tensor type of ``name``; ``TypeError`` when unknown or not a tensor."""
        type_proto = self.type_of(name)
        if type_proto is None or not type_proto.HasField("tensor_type"):
            raise TypeError(
                f"the type of {name!r} is {describe_type(type_proto)}, but a tensor of known "
                "element type is needed here; declare it in graph.value_info or cast it"
            )
        return type_proto

    def declare_type(self, name: str, type_proto: onnx.TypeProto) -> None:
        """Record ``type_proto`` as the type of the value ``name``, where the caller knows it better than
        inference (a gradient has the type of its value, symbolic dimensions included)."""
        self.require(name)
        self._values[name] = type_proto

    def elem_type(self, name: str) -> int:
        """The ONNX element type of tensor ``name``."""
        return self.tensor_type_of(name).tensor_type.elem_type

    def elem_type_if_known(self, name: str) -> int | None:
        """:meth:`elem_type`, or ``None`` where ``name`` is no value, its type is unknown or it is no tensor."""
        type_proto = self.type_of(name) if self.has(name) else None
        if type_proto is None or not type_proto.HasField("tensor_type"):
            return None
        return type_proto.tensor_type.elem_type or None

    def shape(self, name: str) -> list[Dim] | None:
        """The dimensions of tensor ``name`` (``None`` entries are unknown), or ``None``."""
        return _dims(self.tensor_type_of(name))

    def shape_if_known(self, name: str) -> list[Dim] | None:
        """:meth:`shape`, or ``None`` where the type of ``name`` is unknown or no tensor (no ``TypeError``)."""
        type_proto = self.type_of(name)
        return None if type_proto is None else _dims(type_proto)

    def rank(self, name: str) -> int | None:
        """The rank of tensor ``name``, or ``None`` when unknown."""
        dims = self.shape(name)
        return None if dims is None else len(dims)

    def constant_value(self, name: str) -> np.ndarray | None:
        """The value of a small initializer or ``Constant`` node ``name``, or ``None``."""
        tensor = self._constants.get(name)
        return None if tensor is None else numpy_helper.to_array(tensor)

    # --------------------------------------------------------------- emitting

    def ensure_opset(self, domain: str) -> int:
        """Import ``domain`` if the model does not yet, and return its version."""
        version = versions.opset_version(self.model, domain)
        if version is None:
            version = versions.DEFAULT_ML_OPSET if domain == "ai.onnx.ml" else 1
            self.model.opset_import.append(helper.make_opsetid(domain, version))
        return version

    def add_node(
        self,
        op_type: str,
        inputs: Sequence[str],
        outputs: int | Sequence[str] = 1,
        *,
        domain: str = "",
        hint: str | None = None,
        **attributes: Any,
    ) -> list[str]:
        """Append one node and return its output names.

        ``outputs`` is a count (names are generated from ``hint``) or explicit
        names. Empty input names stand for omitted optional inputs.
        """
        self.sync()
        for name in inputs:
            if not isinstance(name, str) or name:  # "" is an omitted optional input
                self.require(name)
        if domain:
            self.ensure_opset(domain)
        stem = hint or op_type.lower()
        if isinstance(outputs, int):
            output_names = [self.names.fresh(stem) for _ in range(outputs)]
        else:
            output_names = [self._claim(name) for name in outputs]
        node = helper.make_node(
            op_type, list(inputs), output_names, name=self.names.fresh(op_type), domain=domain, **attributes
        )
        types = self._infer_outputs(node)
        self.model.graph.node.append(node)
        for name in output_names:
            self._values[name] = types.get(name)
        self.sync()
        return output_names

    def add_node1(
        self, op_type: str, inputs: Sequence[str], *, domain: str = "", hint: str | None = None, **attributes: Any
    ) -> str:
        """:meth:`add_node` for the common one-output case: returns the output name."""
        return self.add_node(op_type, inputs, 1, domain=domain, hint=hint, **attributes)[0]

    def _claim(self, name: str) -> str:
        """Use ``name`` for a new value: free, or handed out by ``names.fresh`` and not used yet."""
        if name in self._values:
            raise ValueError(f"the name {name!r} is already used in the model; choose another")
        self.names.reserve(name)
        return name

    def add_initializer(
        self, value: np.ndarray | onnx.TensorProto, hint: str = "const", *, name: str | None = None
    ) -> str:
        """Append an initializer holding ``value``; its name is ``name`` or a fresh one from ``hint``."""
        name = self.names.fresh(hint) if name is None else self._claim(name)
        if isinstance(value, onnx.TensorProto):
            tensor = onnx.TensorProto()
            tensor.CopyFrom(value)
            tensor.name = name
        else:
            tensor = numpy_helper.from_array(np.asarray(value), name)
        self.model.graph.initializer.append(tensor)
        self.sync()
        return name

    def add_input(self, name: str, type_proto: onnx.TypeProto) -> str:
        """Add graph input ``name``; an existing input of the same element type is reused."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"an input name must be a non-empty str, not {name!r}")
        self.sync()
        existing = {value.name: value for value in self.model.graph.input}
        if name in existing:
            have = existing[name].type
            if have.HasField("tensor_type") and have.tensor_type.elem_type == type_proto.tensor_type.elem_type:
                return name
            raise ValueError(
                f"graph input {name!r} exists with type {describe_type(have)}, but "
                f"{describe_type(type_proto)} is needed; pass another name"
            )
        if name in self._values:  # a name from names.fresh, not used yet, is fine
            raise ValueError(f"{name!r} already names a value of the model; pass another input name")
        value = onnx.ValueInfoProto(name=name)
        value.type.CopyFrom(type_proto)
        self.model.graph.input.append(value)
        self.sync()
        return name

    def set_outputs(self, names: Sequence[str]) -> None:
        """Make ``names`` the graph outputs, in order, replacing the existing ones."""
        values = []
        for name in names:
            type_proto = self.type_of(self.require(name, role="output"))
            if type_proto is None:
                type_proto = self.tensor_type_of(name)  # raises: an output needs a known type
            value = onnx.ValueInfoProto(name=name)
            value.type.CopyFrom(type_proto)
            values.append(value)
        del self.model.graph.output[:]
        self.model.graph.output.extend(values)

    def finalize(self) -> onnx.ModelProto:
        """A checked copy of the model with the IR version policy applied.

        The copy declares the type of every intermediate value the builder
        knows in ``graph.value_info``, so that a later build on it starts from
        the same types even where onnx's whole-model inference gives up.
        """
        self.sync()
        model = onnx.ModelProto()
        model.CopyFrom(self.model)
        graph = model.graph
        declared = {value.name for value in (*graph.input, *graph.output, *graph.value_info)}
        declared.update(tensor.name for tensor in graph.initializer)
        for node in graph.node:
            for name in node.output:
                type_proto = self._values.get(name)
                if name and name not in declared and type_proto is not None:
                    graph.value_info.append(helper.make_value_info(name, type_proto))
                    declared.add(name)
        versions.stamp_ir_version(model)
        try:
            onnx.checker.check_model(checkable(model))
        except onnx.checker.ValidationError as error:
            raise ValueError(f"the built model is not valid ONNX: {error}") from error
        return model

    # ------------------------------------------------------------ transactions

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Undo everything appended inside the ``with`` block if it raises."""
        mark = self.mark()
        try:
            yield
        except BaseException:
            self.rollback(mark)
            raise

    def mark(self) -> BuildMark:
        """Where the build stands: :meth:`rollback` undoes everything appended after it."""
        self.sync()
        graph = self.model.graph
        return BuildMark(
            {field: len(getattr(graph, field)) for field in ("input", "initializer", "node", "value_info")},
            list(graph.output),
            len(self.model.opset_import),
            self.names.state(),
            (len(self._values), len(self._constants), self._seen),
        )

    def rollback(self, mark: BuildMark) -> None:
        """Undo everything appended since ``mark`` (its nodes, initializers, names, types, outputs)."""
        graph = self.model.graph
        for field, length in mark.lengths.items():
            del getattr(graph, field)[length:]
        del graph.output[:]
        graph.output.extend(mark.outputs)
        del self.model.opset_import[mark.opsets :]
        self.names.restore(mark.names)
        n_values, n_constants, seen = mark.tracked
        for key in list(self._values)[n_values:]:
            del self._values[key]
        for key in list(self._constants)[n_constants:]:
            del self._constants[key]
        self._seen = seen
