"""What a gradient rule sees: the node, its values, and helpers for the common algebra.

The helpers emit one ONNX node each (``ctx.mul(a, b)`` appends ``Mul``) and
take value names or Python numbers; a number becomes a scalar constant of the
other operand's element type, so rules are written once for every float type::

    ctx.mul(g, ctx.sub(1.0, ctx.mul(y, y)))     # g * (1 - y**2)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from onnxtrain.graph import ops
from onnxtrain.graph.attributes import attributes as node_attributes
from onnxtrain.graph.builder import Dim, GraphBuilder
from onnxtrain.graph.naming import names_in
from onnxtrain.graph.versions import is_standard
from onnxtrain.graph.walk import subgraph_references, subgraphs

#: An operand of the algebra helpers: a value name or a Python number.
Operand = str | float | int
#: ``vjp(builder, seeds, wrt)``: the engine's vector-Jacobian product with its rules, which the context hands to
#: the subgraphs of control-flow rules (:meth:`RuleContext.subgraph`).
Vjp = Callable[[GraphBuilder, Mapping[str, str], Sequence[str]], dict[str, "str | None"]]
#: Zero tensors of more elements than this are made at run time (:meth:`RuleContext.zeros_shaped`).
FOLDED_ZEROS_LIMIT = 4096


@dataclass
class OutputRequest:
    """An optional output a rule declared on its forward node (:meth:`RuleContext.ensure_output`).

    The engine keeps it (and records its type in ``value_info``) when the gradient
    graph uses it, and otherwise puts the node's outputs back as they were.
    """

    node: onnx.NodeProto
    index: int
    name: str
    n_outputs: int  # how many outputs the node listed before
    value_info: onnx.ValueInfoProto

    def undo(self) -> None:
        """Omit the output again (other requests on the node stay)."""
        outputs = list(self.node.output)
        if self.index < len(outputs) and outputs[self.index] == self.name:
            outputs[self.index] = ""
        while len(outputs) > self.n_outputs and not outputs[-1]:
            outputs.pop()
        self.node.output[:] = outputs

    @property
    def names(self) -> tuple[str, ...]:
        """The forward outputs it declared."""
        return (self.name,)

    @property
    def value_infos(self) -> tuple[onnx.ValueInfoProto, ...]:
        """Their types, for ``graph.value_info``."""
        return (self.value_info,)

    @property
    def reserved(self) -> tuple[str, ...]:
        """Every name it adds to the model."""
        return (self.name,)


@dataclass
class NodeEdit:
    """A rewrite of a forward node by a rule (:meth:`RuleContext.extend_forward`): new attributes
    (e.g. a loop body that also outputs what the backward needs) and outputs appended.

    Like :class:`OutputRequest`, the engine keeps it when the gradient graph reads one of the new
    outputs, and otherwise puts the node back as it was.
    """

    node: onnx.NodeProto
    attributes: tuple[onnx.AttributeProto, ...]  # the node's attributes before the edit
    n_outputs: int  # how many outputs the node listed before
    names: tuple[str, ...]  # the outputs appended
    value_infos: tuple[onnx.ValueInfoProto, ...]

    def undo(self) -> None:
        """Restore the attributes and drop the appended outputs."""
        del self.node.attribute[:]
        self.node.attribute.extend(self.attributes)
        del self.node.output[self.n_outputs :]

    @property
    def reserved(self) -> tuple[str, ...]:
        """Every name it adds to the model: the new outputs and the names inside the new subgraphs."""
        inner = {name for graph in subgraphs(self.node) for name in names_in(graph)}
        return (*self.names, *sorted(inner))


#: Operators whose gradient to an input is infinite at some finite value of it: ``Sqrt``, ``Log`` at 0, the
#: inverse trigonometric functions at +-1, a norm of zeros (``Div`` and ``Pow`` are decided by :func:`_singular_at`).
SINGULAR = frozenset(
    {"Sqrt", "Log", "Reciprocal", "Acos", "Asin", "Atanh", "Acosh", "ReduceL2", "ReduceLogSum", "LpNormalization"}
)
#: Operators that pass a gradient back unchanged, rearranged, summed or scaled by the other operand: an infinite
#: gradient of their output stays infinite at the input positions that made it.
PASS_THROUGH = frozenset(
    {"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Slice", "Gather", "GatherElements"}
    | {"GatherND", "Concat", "Split", "Expand", "Tile", "Pad", "Cast", "Neg", "Add", "Sub", "Sum", "Mul"}
    | {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "Max", "Min", "Clip", "Relu", "Abs", "Mean"}
)
#: The most values :meth:`RuleContext.feeds_a_singularity` visits before it says ``True``.
SINGULARITY_SEARCH = 64


def _singular_at(node: onnx.NodeProto, position: int, constant_value: Any) -> bool:
    """Whether ``node``'s gradient to its input ``position`` can be infinite at a finite value of it."""
    if not is_standard(node):
        return False
    if node.op_type in SINGULAR:
        return position == 0
    if node.op_type == "Div":
        return position == 1
    if node.op_type == "Pow" and position == 0:
        exponent = constant_value(node.input[1])
        return exponent is None or bool(np.any(np.asarray(exponent) < 1))
    return False


@dataclass(frozen=True)
class GraphView:
    """Who produces and who reads each value of the forward graph, for rules that look around.

    Attributes:
        producers: ``{value: node}`` for every node output.
        readers: ``{value: number of nodes that read it}`` (subgraph reads included), of the nodes the loss
            depends on: the others pass it no gradient.
        outputs: the graph outputs.
        forward: the values that depend on a value being differentiated.
        consumers: ``{value: [(node, input position), ...]}``: the nodes of ``readers`` that read it as an input.
    """

    producers: dict[str, onnx.NodeProto]
    readers: dict[str, int]
    outputs: frozenset[str]
    forward: frozenset[str]
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = field(default_factory=dict)


class RuleContext:
    """The node being differentiated, as a rule sees it.

    Attributes:
        builder: the :class:`GraphBuilder` to emit nodes through.
        node: the forward node.
        inputs: its input names (``""`` for an omitted optional input).
        outputs: its output names.
        opset: the opset version of the node's domain in the model.
    """

    def __init__(
        self,
        builder: GraphBuilder,
        node: onnx.NodeProto,
        opset: int,
        needs: Sequence[bool],
        constants: dict[tuple[Any, ...], str],
        requests: list[OutputRequest | NodeEdit] | None = None,
        view: GraphView | None = None,
        vjp: Vjp | None = None,
    ) -> None:
        self.builder = builder
        self.node = node
        self.inputs: tuple[str, ...] = tuple(node.input)
        self.outputs: tuple[str, ...] = tuple(node.output)
        self.opset = opset
        self._needs = tuple(needs)
        self._constants = constants
        self._attrs = node_attributes(node)
        self._hint = f"{node.op_type.lower()}_grad"
        self._requests = requests
        self._view = view
        self._vjp = vjp
        #: Gradients this rule gives to values that are not its node's inputs (see :meth:`contribute`).
        self.contributed: list[tuple[str, str]] = []

    # ------------------------------------------------------------ inspection

    @property
    def onnx_opset(self) -> int:
        """The model's ``ai.onnx`` opset: which forms the emitted standard operators may take (``opset`` is
        the node's own domain's, e.g. ``com.microsoft``'s 1)."""
        return self.builder.opset

    def attr(self, name: str, default: Any = None) -> Any:
        """The value of attribute ``name`` (bytes decoded to str), or ``default``."""
        value = self._attrs.get(name, default)
        return value.decode() if isinstance(value, bytes) else value

    def needs(self, index: int) -> bool:
        """Whether the engine wants a gradient for input ``index`` (skip work when not)."""
        return index < len(self._needs) and self._needs[index]

    def has_input(self, index: int) -> bool:
        """Whether optional input ``index`` is present."""
        return index < len(self.inputs) and bool(self.inputs[index])

    def elem_type(self, name: str) -> int:
        """The ONNX element type of value ``name``."""
        return self.builder.elem_type(name)

    def shape(self, name: str) -> list[Dim] | None:
        """The dimensions of ``name`` (``None`` entries unknown), or ``None``."""
        return self.builder.shape(name)

    def rank(self, name: str) -> int | None:
        """The rank of ``name``, or ``None`` when unknown."""
        return self.builder.rank(name)

    def known_rank(self, name: str) -> int:
        """The rank of ``name``; ``ValueError`` naming the node when it is unknown."""
        rank = self.rank(name)
        if rank is None:
            graph = self.builder.model.graph
            unranked = [v.name for v in graph.input if not v.type.tensor_type.HasField("shape")]
            advice = (
                f"give the model's inputs {unranked} a known rank (dimensions may stay symbolic)"
                if unranked
                else "the inputs' ranks are known, and shape inference loses it on the way (a value built in a Loop "
                "or from a sequence, as torch's dynamo exporter writes nn.EmbeddingBag): export that layer another "
                "way (an Embedding then a sum or mean over the bag's axis), or with dynamo=False"
            )
            raise ValueError(
                f"the gradient of {self.node.op_type} node {self.node.name!r} needs the rank of {name!r}, which is "
                f"unknown; {advice}"
            )
        return rank

    def static_shape(self, name: str) -> list[int] | None:
        """The shape of ``name`` when every dimension is a known size, else ``None``."""
        dims = self.shape(name)
        if dims is None or not all(isinstance(d, int) for d in dims):
            return None
        return [int(d) for d in dims]  # type: ignore[arg-type]

    def constant_value(self, name: str) -> np.ndarray | None:
        """The value of ``name`` when it is a small initializer or ``Constant`` node, else ``None``."""
        return self.builder.constant_value(name) if name else None

    def producer(self, name: str) -> onnx.NodeProto | None:
        """The forward node that computes ``name`` (``None`` for inputs and initializers)."""
        return None if self._view is None else self._view.producers.get(name)

    def read_only_here(self, name: str) -> bool:
        """Whether this node is the only reader of ``name``, and ``name`` is no graph output.

        A rule may then differentiate ``name``'s producer together with its own
        node (see :meth:`contribute`): no other gradient flows into ``name``.
        """
        view = self._view
        return view is not None and view.readers.get(name, 0) == 1 and name not in view.outputs

    def read_only_by(self, name: str, nodes: Sequence[onnx.NodeProto]) -> bool:
        """Whether ``nodes`` (forward nodes, this one among them or not) are all that read ``name``, and ``name``
        is no graph output: a rule that differentiates them as one function gets every gradient of ``name``."""
        view = self._view
        if view is None or name in view.outputs:
            return False
        return view.readers.get(name, 0) == sum(1 for node in nodes if name in node.input)

    def depends_on_wrt(self, name: str) -> bool:
        """Whether ``name`` depends on a value being differentiated (so it wants a gradient)."""
        return self._view is not None and name in self._view.forward

    def captured(self) -> tuple[str, ...]:
        """The values the node's subgraphs read from the enclosing graph, sorted (``If``, ``Loop``, ``Scan``)."""
        return tuple(sorted(subgraph_references(self.node)))

    def contribute(self, value: str, grad: str) -> None:
        """Give ``grad`` as (a part of) the gradient of ``value``, an upstream value.

        For fused rules: a rule that differentiates its input's producer too
        (e.g. NegativeLogLikelihoodLoss after LogSoftmax) returns ``None`` for
        that input and contributes to the producer's input instead. Only valid
        when :meth:`read_only_here` holds for the skipped value.

        Control-flow rules give the gradients of the values their subgraphs
        read (:meth:`captured`) this way too: each is one more use of the value.
        """
        self.contributed.append((value, grad))

    @property
    def vjp(self) -> Vjp:
        """The vector-Jacobian product of the engine that calls this rule, with its rules: what a control-flow
        rule runs on its subgraphs (:class:`~onnxtrain.autodiff.subgraph.Subgraph`)."""
        if self._vjp is None:
            raise RuntimeError(f"{self.node.op_type}'s rule needs the engine's context; it was given a bare one")
        return self._vjp

    # --------------------------------------------------------------- emitting

    def op(self, op_type: str, *inputs: str, **attributes: Any) -> str:
        """Append ``op_type(*inputs)`` with ``attributes``; return its output."""
        return self.builder.add_node1(op_type, list(inputs), hint=self._hint, **attributes)

    def const(self, value: Any, like: str) -> str:
        """A constant ``value`` with the element type of ``like`` (cached per value)."""
        elem_type = self.elem_type(like)
        array = np.asarray(value, dtype=onnx.helper.tensor_dtype_to_np_dtype(elem_type))
        key = (elem_type, array.shape, array.tobytes())
        if key not in self._constants:
            self._constants[key] = ops.constant(self.builder, array, elem_type, hint="grad_const")
        return self._constants[key]

    def int64s(self, values: Sequence[int]) -> str:
        """A 1-D int64 constant (axes, shapes), cached per value."""
        key = ("int64s", tuple(int(v) for v in values))
        if key not in self._constants:
            self._constants[key] = ops.int64s(self.builder, list(values), hint="grad_axes")
        return self._constants[key]

    def _pair(self, a: Operand, b: Operand) -> tuple[str, str]:
        if isinstance(a, str) and isinstance(b, str):
            return a, b
        if isinstance(a, str):
            return a, self.const(b, a)
        if isinstance(b, str):
            return self.const(a, b), b
        raise TypeError(f"at least one operand must be a value name, not {a!r} and {b!r}")

    def _neutral(self, constant: str, other: str, value: float) -> bool:
        """Whether ``constant`` is ``value`` and combining it with ``other`` leaves ``other`` as it is."""
        array = self.constant_value(constant)
        if array is None or array.size != 1 or array.reshape(()).item() != value:
            return False
        rank = self.rank(other)
        return rank is not None and array.ndim <= rank and self.elem_type(constant) == self.elem_type(other)

    def _arith(self, op_type: str, a: Operand, b: Operand) -> str:
        """``op_type(a, b)`` with the trivial cases folded: two constants, ``x * 1``, ``x / 1``, ``x + 0``."""
        a, b = self._pair(a, b)
        left, right = self.constant_value(a), self.constant_value(b)
        if left is not None and right is not None and self.elem_type(a) == self.elem_type(b):
            folded = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}[op_type](left, right)
            return self.const(folded, a)
        neutral = {"Add": 0.0, "Sub": 0.0, "Mul": 1.0, "Div": 1.0}[op_type]
        if self._neutral(b, a, neutral):
            return a
        if op_type in ("Add", "Mul") and self._neutral(a, b, neutral):
            return b
        return self.op(op_type, a, b)

    def add(self, a: Operand, b: Operand) -> str:
        """``a + b``"""
        return self._arith("Add", a, b)

    def sub(self, a: Operand, b: Operand) -> str:
        """``a - b``"""
        return self._arith("Sub", a, b)

    def mul(self, a: Operand, b: Operand) -> str:
        """``a * b``"""
        return self._arith("Mul", a, b)

    def div(self, a: Operand, b: Operand) -> str:
        """``a / b``"""
        return self._arith("Div", a, b)

    def neg(self, a: str) -> str:
        """``-a``"""
        return self.op("Neg", a)

    def square(self, a: str) -> str:
        """``a * a``"""
        return self.op("Mul", a, a)

    def where(self, condition: str, a: Operand, b: Operand) -> str:
        """``a`` where ``condition`` holds, else ``b``."""
        return self.op("Where", condition, *self._pair(a, b))

    def keep(self, condition: str, g: str) -> str:
        """``g`` where ``condition`` holds, else 0: ``g * Cast(condition)``, about 8x faster on onnxruntime's CPU
        than ``Where(condition, g, 0)`` (its ``Where`` is a scalar loop: 1.1 ms against 9 ms for 2.4M floats on 2
        cores) and equal to it for a finite ``g`` (a zero kept where ``g`` is negative is ``-0.0``). Where ``g``
        may be infinite with the mask off, the product would be NaN: ``Where`` then, as for a clamp whose output
        reaches a function whose derivative is infinite at the clamp's bound (``sqrt(relu(x))``,
        ``acos(clip(x, -1, 1))``: :meth:`feeds_a_singularity`)."""
        if self.feeds_a_singularity(self.outputs[0]):
            return self.where(condition, g, 0.0)
        return self.mul(g, self.cast_like(condition, g))

    def feeds_a_singularity(self, name: str) -> bool:
        """Whether ``name`` reaches, through operators that pass a gradient on unchanged or scaled (reshapes,
        selections, sums, products), an input where a derivative can be infinite at a finite value (``Sqrt`` and
        ``Log`` at 0, a ``Div``'s denominator, ``Pow`` by an exponent below 1, ``Acos`` at 1, a norm of zeros...):
        the gradient arriving at ``name`` may then be infinite. Conservative: ``True`` past
        :data:`SINGULARITY_SEARCH` values."""
        view = self._view
        if view is None:
            return False
        seen, todo = {name}, [name]
        while todo:
            if len(seen) > SINGULARITY_SEARCH:
                return True
            for node, position in view.consumers.get(todo.pop(), ()):
                if _singular_at(node, position, self.constant_value):
                    return True
                if node.op_type in PASS_THROUGH and is_standard(node):
                    fresh = [out for out in node.output if out and out not in seen]
                    seen.update(fresh)
                    todo += fresh
        return False

    def compare(self, op_type: str, a: Operand, b: Operand) -> str:
        """``Greater``, ``Less``, ``Equal``, ... of ``a`` and ``b`` (a bool tensor)."""
        return self.op(op_type, *self._pair(a, b))

    def cast(self, a: str, elem_type: int) -> str:
        """``a`` cast to ONNX element type ``elem_type`` (no node when it already is)."""
        if self.elem_type(a) == elem_type:
            return a
        return self.op("Cast", a, to=elem_type)

    def cast_like(self, a: str, like: str) -> str:
        """``a`` cast to the element type of ``like``."""
        return self.cast(a, self.elem_type(like))

    def shape_of(self, name: str) -> str:
        """The shape of ``name`` as a 1-D int64 tensor: a constant when static, else ``Shape``."""
        static = self.static_shape(name)
        if static is not None:
            return self.int64s(static)
        return self.op("Shape", name)

    def zeros_like(self, name: str, *, after: str | None = None) -> str:
        """Zeros with the shape and element type of ``name`` (:meth:`zeros_shaped`)."""
        return self.zeros_shaped(self.shape_of(name), name, name, after=after)

    def flat_zeros_like(self, name: str, *, after: str | None = None) -> str:
        """Zeros of shape ``[size(name)]`` with the element type of ``name`` (:meth:`zeros_shaped`)."""
        static = self.static_shape(name)
        if static is not None:
            count = self.int64s([int(np.prod(static, dtype=np.int64))])
        else:
            count = self.op("Reshape", self.op("Size", name), self.int64s([1]))
        return self.zeros_shaped(count, name, name, after=after)

    def zeros_shaped(self, shape: str, like: str, count_of: str, *, after: str | None = None) -> str:
        """Zeros of ``shape`` (1-D int64) with the element type of ``like``; ``count_of`` has as many elements.

        ``ConstantOfShape(shape)``, but where ``count_of``'s shape is static and
        holds over :data:`FOLDED_ZEROS_LIMIT` elements, ``ConstantOfShape`` of
        ``Size(count_of)`` at run time, reshaped: onnxruntime folds a
        ``ConstantOfShape`` of a constant shape into an initializer, a copy of
        the whole tensor that each session running the model keeps (the
        runtime has up to three over one training model). Those made at run
        time wait for ``after`` (the gradient they will receive) where given:
        their size is ``Size(count_of) + 0 * Size(after)``, so that they are
        not made as soon as the run starts and held through the whole forward
        pass (GPT-2 small's embedding gradient: 147 MiB at every peak).
        """
        elem_type = self.elem_type(like)
        if not ops.constant_of_shape_makes(self.onnx_opset, elem_type):  # bfloat16 before opset 20: float32, cast
            made = elem_type
            elem_type = onnx.TensorProto.FLOAT
        else:
            made = None
        zero = onnx.helper.make_tensor("value", elem_type, [1], [0])
        static = self.static_shape(count_of)
        if static is None or int(np.prod(static, dtype=np.int64)) <= FOLDED_ZEROS_LIMIT:
            zeros = self.op("ConstantOfShape", shape, value=zero)
        else:
            size = self.op("Size", count_of)
            if after is not None:
                size = self.op("Add", size, self.op("Mul", self.op("Size", after), self.const(0, size)))
            count = self.op("Reshape", size, self.int64s([1]))
            zeros = self.op("Reshape", self.op("ConstantOfShape", count, value=zero), shape)
        return zeros if made is None else self.op("Cast", zeros, to=made)

    def expand_to(self, a: str, like: str) -> str:
        """``a`` broadcast to the shape of ``like`` (``Expand``)."""
        return self.op("Expand", a, self.shape_of(like))

    def op_n(self, op_type: str, n_outputs: int, *inputs: str, **attributes: Any) -> list[str]:
        """Append ``op_type(*inputs)`` with ``n_outputs`` outputs (``Split``, ``TopK``); return them."""
        return self.builder.add_node(op_type, list(inputs), n_outputs, hint=self._hint, **attributes)

    def ensure_output(self, index: int, hint: str | None = None) -> str:
        """The name of forward output ``index``, declared on the node first if it was omitted.

        For rules that reuse what the forward pass computes anyway (Dropout's mask,
        MaxPool's indices) instead of recomputing it. The engine keeps the new
        output only when the gradient graph uses it.
        """
        node = self.node
        if index < len(node.output) and node.output[index]:
            return node.output[index]
        if self._requests is None:
            raise RuntimeError(f"ensure_output needs the engine's context; {node.op_type} was given a bare one")
        original = list(node.output)
        name = self.builder.names.fresh(hint or f"{node.op_type.lower()}_output{index}")
        while len(node.output) <= index:
            node.output.append("")
        node.output[index] = name
        try:
            value = onnx.ValueInfoProto(name=name)
            value.type.CopyFrom(self._infer_output(name))
        except BaseException:
            node.output[:] = original
            raise
        self._requests.append(OutputRequest(node, index, name, len(original), value))
        self.builder.model.graph.value_info.append(value)
        self.builder.sync()
        self.outputs = tuple(node.output)
        return name

    def extend_forward(
        self, attributes: Mapping[str, Any], types: Sequence[onnx.TypeProto], hint: str | None = None
    ) -> list[str]:
        """Rewrite the forward node: set ``attributes`` and append one output per type in ``types``.

        For rules whose gradient needs what only the forward pass sees, such as
        a loop's state at every iteration (a ``Loop``/``Scan`` body given more
        scan outputs). Returns the new outputs' names. The engine keeps the
        rewrite only when the gradient graph reads one of them.
        """
        node = self.node
        if self._requests is None:
            raise RuntimeError(f"extend_forward needs the engine's context; {node.op_type} was given a bare one")
        before = tuple(_copy_attribute(a) for a in node.attribute)
        n_outputs = len(node.output)
        names = [self.builder.names.fresh(hint or f"{node.op_type.lower()}_saved") for _ in types]
        infos = []
        for name, type_proto in zip(names, types, strict=True):
            info = onnx.ValueInfoProto(name=name)
            info.type.CopyFrom(type_proto)
            infos.append(info)
        kept = [a for a in node.attribute if a.name not in attributes]
        del node.attribute[:]
        node.attribute.extend(kept)
        node.attribute.extend(helper.make_attribute(key, value) for key, value in attributes.items())
        node.output.extend(names)
        edit = NodeEdit(node, before, n_outputs, tuple(names), tuple(infos))
        self._requests.append(edit)
        for name in edit.reserved:
            self.builder.names.reserve(name)
        self.builder.model.graph.value_info.extend(infos)
        self.builder.sync()
        self.outputs = tuple(node.output)
        self._attrs = node_attributes(node)
        return names

    def _infer_output(self, name: str) -> onnx.TypeProto:
        """The type of output ``name`` of the forward node, from the operator's schema."""
        node = self.node
        inputs = {n: self.builder.type_of(n) for n in node.input if n}
        data = {}
        for n in inputs:
            value = self.constant_value(n)
            if value is not None:
                data[n] = numpy_helper.from_array(value, n)
        missing = [n for n, t in inputs.items() if t is None]
        if not missing:
            schema = onnx.defs.get_schema(node.op_type, self.opset, node.domain)
            try:
                types = shape_inference.infer_node_outputs(
                    schema, node, inputs, data, opset_imports=list(self.builder.model.opset_import)
                )
            except (shape_inference.InferenceError, onnx.checker.ValidationError, RuntimeError):
                types = {}
            if name in types:
                return types[name]
        raise TypeError(
            f"cannot infer the type of output {name!r} added to {node.op_type} {node.name!r} (inputs of unknown "
            f"type: {missing}); declare the types of the node's inputs in graph.value_info"
        )


def _copy_attribute(attribute: onnx.AttributeProto) -> onnx.AttributeProto:
    copy = onnx.AttributeProto()
    copy.CopyFrom(attribute)
    return copy
