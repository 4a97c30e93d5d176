"""Gradient clipping, as ``torch.nn.utils``: ``ClipGradNorm`` on the gradients' global norm, ``ClipGradValue``
on each element.

``ClipGradNorm(max_norm, norm_type=2.0)`` is ``clip_grad_norm_``::

    total_norm = (sum over gradients g of sum(|g| ** p)) ** (1 / p)   # p = norm_type
    total_norm = max over gradients g of max(|g|)                     # p = inf
    coef = max_norm / (total_norm + 1e-6)
    g = g * min(coef, 1)            # applied only when coef < 1

emitted as ``ReduceSumSquare`` then ``Sqrt`` (p = 2), ``ReduceL1`` (p = 1),
``ReduceMax(Abs(g))`` and ``Max`` (p = inf), ``ReduceSum(Pow(Abs(g), p))``
then ``Pow(total, 1 / p)`` (any other p > 0). The norm is accumulated in
float64 when any gradient is float64, else in float32 (also for float16 and
bfloat16 gradients, which are scaled in float32 and cast back).
``ClipGradValue(clip_value)`` is ``clip_grad_value_``: ``Clip(g, -clip_value,
clip_value)`` for each gradient (half ones in float32).

The gradients are a list of tensor names, or the name of one sequence of
tensors (as ONNX Runtime's ``onnxblock.optim.ClipGradNorm`` takes them); a
sequence, whose length is known only at run time, is read and rebuilt by
``Loop`` nodes (the norm, then the clipped copies), and the result is one
sequence name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import onnx
from onnx import helper

from onnxtrain.blocks.block import Block
from onnxtrain.graph import ops
from onnxtrain.graph.builder import GraphBuilder
from onnxtrain.optim import _checks

#: torch's guard against a division by zero in ``clip_grad_norm_``.
CLIP_EPSILON = 1e-6

_HALF_TYPES = frozenset({onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16})
_FLOAT_TYPES = (*_HALF_TYPES, onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)

#: One clipping of one gradient: ``(where it emits, value, compute type, hint) -> clipped``.
Scale = Callable[["_Emit", str, int, str], str]


class _Emit:
    """Where a clipping emits its nodes: into the model (a builder), or into a ``Loop`` body being written
    (``nodes``), with its constants as outer-scope initializers of the model either way."""

    def __init__(self, b: GraphBuilder, body: bool) -> None:
        self.b = b
        self.nodes: list[onnx.NodeProto] | None = [] if body else None

    def node(self, op_type: str, inputs: Sequence[str], hint: str, **attributes: object) -> str:
        if self.nodes is None:
            return self.b.add_node1(op_type, list(inputs), hint=hint, **attributes)
        output = self.b.names.fresh(hint)
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], **attributes))
        return output

    def reduce(self, op_type: str, value: str, hint: str) -> str:
        """``op_type`` over every axis, to a scalar (no axes: all of them, at any opset)."""
        return self.node(op_type, [value], hint, keepdims=0)

    def constant(self, value: float, elem_type: int, hint: str) -> str:
        return ops.constant(self.b, value, elem_type, hint)


class ClipGradNorm(Block):
    """Clip gradients on their global ``norm_type``-norm (2: L2, the default; ``math.inf``: the largest
    magnitude); pass it as an optimizer's ``clip_grad``.

    ``build(gradient_names)`` takes the names of the gradients and returns the
    names of the clipped gradients, in the same order, with the same types.
    """

    def __init__(self, max_norm: float, norm_type: float = 2.0) -> None:
        super().__init__()
        self._max_norm = _checks.number(
            "ClipGradNorm", "max_norm", max_norm, lambda v: v > 0.0, "a number > 0 (inf: never clip)"
        )
        self._norm_type = _checks.number(
            "ClipGradNorm", "norm_type", norm_type, lambda v: v > 0.0, "a number > 0 (2: L2; inf: the largest value)"
        )

    @property
    def max_norm(self) -> float:
        """The largest global norm left unchanged."""
        return self._max_norm

    @property
    def norm_type(self) -> float:
        """The ``p`` of the p-norm (``math.inf``: the largest magnitude)."""
        return self._norm_type

    def __repr__(self) -> str:
        norm = "" if self._norm_type == 2.0 else f", norm_type={self._norm_type!r}"
        return f"ClipGradNorm(max_norm={self._max_norm!r}{norm})"

    def build(self, gradient_names: Sequence[str] | str) -> list[str] | str:
        """Emit ``g * min(max_norm / (||grads||_p + 1e-6), 1)`` for each gradient ``g``.

        Returns the clipped names in order, or one name for a sequence.
        """
        b = self.builder
        gradients = _gradients(b, gradient_names, "ClipGradNorm")
        if isinstance(gradients, str):
            return self._clip_sequence(gradients)
        if math.isinf(self._max_norm):
            return gradients
        types = [b.elem_type(name) for name in gradients]
        acc = onnx.TensorProto.DOUBLE if onnx.TensorProto.DOUBLE in types else onnx.TensorProto.FLOAT
        emit = _Emit(b, body=False)
        parts = []
        for name, elem_type in zip(gradients, types, strict=True):
            value = name if elem_type == acc else b.add_node1("Cast", [name], to=acc, hint=f"{name}.as_acc")
            parts.append(self._part(emit, value, acc, f"{name}.sum_sq"))
        combine = "Max" if math.isinf(self._norm_type) else "Sum"
        total = parts[0] if len(parts) == 1 else b.add_node1(combine, parts, hint="grad_sum_sq")
        coef = self._coefficient(self._norm(total, acc), acc)
        coefs: dict[int, str] = {acc: coef}

        def scale(at: _Emit, value: str, compute: int, hint: str) -> str:
            if compute not in coefs:
                coefs[compute] = at.node("Cast", [coef], "clip_coef", to=compute)
            return at.node("Mul", [value, coefs[compute]], hint)

        pairs = zip(gradients, types, strict=True)
        return [_in_compute_type(emit, name, elem_type, scale) for name, elem_type in pairs]

    def _part(self, at: _Emit, value: str, acc: int, hint: str) -> str:
        """One gradient's share of the norm (``value`` in ``acc``): ``sum(g**2)``, ``sum(|g|)``, ``max(|g|)`` or
        ``sum(|g|**p)``."""
        p = self._norm_type
        if p == 2.0:
            return at.reduce("ReduceSumSquare", value, hint)
        if p == 1.0:
            return at.reduce("ReduceL1", value, hint)
        magnitude = at.node("Abs", [value], hint)
        if math.isinf(p):
            return at.reduce("ReduceMax", magnitude, hint)
        return at.reduce("ReduceSum", at.node("Pow", [magnitude, at.constant(p, acc, "norm_type")], hint), hint)

    def _norm(self, total: str, acc: int) -> str:
        """The norm from the combined parts: ``sqrt``, itself (p = 1, inf) or the ``1 / p``-th power."""
        b, p = self.builder, self._norm_type
        if p == 2.0:
            return b.add_node1("Sqrt", [total], hint="grad_norm")
        if p == 1.0 or math.isinf(p):
            return total
        return b.add_node1("Pow", [total, ops.constant(b, 1.0 / p, acc, "inverse_norm_type")], hint="grad_norm")

    def _coefficient(self, norm: str, acc: int) -> str:
        """``min(max_norm / (norm + 1e-6), 1)`` in ``acc``."""
        b = self.builder
        shifted = b.add_node1("Add", [norm, ops.constant(b, CLIP_EPSILON, acc, "clip_eps")], hint="grad_norm_eps")
        coef = b.add_node1("Div", [ops.constant(b, self._max_norm, acc, "max_norm"), shifted], hint="clip_coef")
        return b.add_node1("Min", [coef, ops.constant(b, 1.0, acc, "one")], hint="clip_coef_clamped")

    def _clip_sequence(self, sequence: str) -> str:
        """Clip the tensors of the sequence ``sequence``; return the name of the clipped sequence.

        ``Loop`` 1 combines each element's share of the norm (:meth:`_part`);
        ``Loop`` 2 inserts each element times the coefficient into a new sequence.
        """
        b = self.builder
        elem_type = _sequence_elem_type(b, sequence, "ClipGradNorm")
        if math.isinf(self._max_norm):
            return sequence
        acc = onnx.TensorProto.DOUBLE if elem_type == onnx.TensorProto.DOUBLE else onnx.TensorProto.FLOAT
        count = b.add_node1("SequenceLength", [sequence], hint="grad_count")
        start = ops.constant(b, -math.inf if math.isinf(self._norm_type) else 0.0, acc, "norm_start")
        combined = b.add_node1("Loop", [count, "", start], body=self._parts_body(sequence, acc), hint="grad_norm")
        coef = self._coefficient(self._norm(combined, acc), acc)

        def scale(at: _Emit, value: str, compute: int, hint: str) -> str:
            return at.node("Mul", [value, at.node("Cast", [coef], "coef_c", to=compute)], hint)

        return _clipped_sequence(b, sequence, elem_type, scale)

    def _parts_body(self, sequence: str, acc: int) -> onnx.GraphProto:
        """``(i, cond, total) -> (cond, combine(total, part(sequence[i])))``, in ``acc``."""
        b = self.builder
        i, cond, total, cond_out, g, g_acc, total_out = (
            b.names.fresh(hint) for hint in ("i", "cond", "total", "cond_out", "g", "g_acc", "total_out")
        )
        at = _Emit(b, body=True)
        part = self._part(at, g_acc, acc, "part")
        combine = "Max" if math.isinf(self._norm_type) else "Add"
        nodes = [
            helper.make_node("Identity", [cond], [cond_out]),
            helper.make_node("SequenceAt", [sequence, i], [g]),
            helper.make_node("Cast", [g], [g_acc], to=acc),
            *(at.nodes or []),
            helper.make_node(combine, [total, part], [total_out]),
        ]
        return helper.make_graph(
            nodes,
            "norm_parts",
            [_scalar(i, onnx.TensorProto.INT64), _scalar(cond, onnx.TensorProto.BOOL), _scalar(total, acc)],
            [_scalar(cond_out, onnx.TensorProto.BOOL), _scalar(total_out, acc)],
        )


class ClipGradValue(Block):
    """Clip each element of every gradient to ``[-clip_value, clip_value]`` (``clip_grad_value_``); pass it as an
    optimizer's ``clip_grad``."""

    def __init__(self, clip_value: float) -> None:
        super().__init__()
        self._clip_value = _checks.number(
            "ClipGradValue", "clip_value", clip_value, lambda v: v > 0.0, "a number > 0 (inf: never clip)"
        )

    @property
    def clip_value(self) -> float:
        """The largest magnitude an element keeps."""
        return self._clip_value

    def __repr__(self) -> str:
        return f"ClipGradValue(clip_value={self._clip_value!r})"

    def build(self, gradient_names: Sequence[str] | str) -> list[str] | str:
        """Emit ``Clip(g, -clip_value, clip_value)`` for each gradient ``g``; the clipped names in order, or one
        name for a sequence."""
        b = self.builder
        gradients = _gradients(b, gradient_names, "ClipGradValue")
        if isinstance(gradients, str):
            elem_type = _sequence_elem_type(b, gradients, "ClipGradValue")
            if math.isinf(self._clip_value):
                return gradients
            return _clipped_sequence(b, gradients, elem_type, self._clip)
        if math.isinf(self._clip_value):
            return gradients
        emit = _Emit(b, body=False)
        return [_in_compute_type(emit, name, b.elem_type(name), self._clip) for name in gradients]

    def _clip(self, at: _Emit, value: str, compute: int, hint: str) -> str:
        """``Clip(value, -clip_value, clip_value)`` in ``compute``."""
        low = at.constant(-self._clip_value, compute, "clip_min")
        high = at.constant(self._clip_value, compute, "clip_max")
        return at.node("Clip", [value, low, high], hint)


#: The clippings an optimizer's ``clip_grad`` takes.
GradientClipping = ClipGradNorm | ClipGradValue


def _gradients(b: GraphBuilder, gradient_names: Sequence[str] | str, owner: str) -> list[str] | str:
    """The gradient names (each checked to exist and be float), or the name of one sequence of them."""
    if isinstance(gradient_names, str):
        type_proto = b.type_of(b.require(gradient_names, role="gradient"))
        if type_proto is not None and type_proto.HasField("sequence_type"):
            return gradient_names
        gradient_names = [gradient_names]
    gradients = list(gradient_names)
    if not gradients:
        raise ValueError(f"{owner}.build() needs at least one gradient name")
    types = [b.elem_type(b.require(name, role="gradient")) for name in gradients]
    if not all(t in _FLOAT_TYPES for t in types):
        raise TypeError(f"{owner} needs float gradients; got element types {types} for {gradients}")
    return gradients


def _sequence_elem_type(b: GraphBuilder, sequence: str, owner: str) -> int:
    """The element type of the tensors of sequence ``sequence`` (``TypeError`` unless float)."""
    type_proto = b.type_of(sequence)
    element = type_proto.sequence_type.elem_type if type_proto is not None else None
    elem_type = element.tensor_type.elem_type if element is not None and element.HasField("tensor_type") else 0
    if elem_type not in _FLOAT_TYPES:
        raise TypeError(f"{owner} needs a sequence of float tensors; {sequence!r} is not one")
    return elem_type


def _in_compute_type(at: _Emit, name: str, elem_type: int, scale: Scale) -> str:
    """``scale`` applied to gradient ``name`` in its own type, or in float32 for float16 and bfloat16 (cast back)."""
    compute = onnx.TensorProto.FLOAT if elem_type in _HALF_TYPES else elem_type
    value = name if compute == elem_type else at.node("Cast", [name], f"{name}.f32", to=compute)
    value = scale(at, value, compute, f"{name}.clipped")
    return value if compute == elem_type else at.node("Cast", [value], f"{name}.clipped", to=elem_type)


def _clipped_sequence(b: GraphBuilder, sequence: str, elem_type: int, scale: Scale) -> str:
    """A ``Loop`` that inserts ``scale(sequence[i])`` (in float32 for half types) into a new sequence."""
    i, cond, seq, cond_out, g, seq_out = (b.names.fresh(h) for h in ("i", "cond", "seq", "cond_out", "g", "seq_out"))
    at = _Emit(b, body=True)
    clipped = _in_compute_type(at, g, elem_type, scale)
    sequence_type = helper.make_tensor_sequence_value_info
    body = helper.make_graph(
        [
            helper.make_node("Identity", [cond], [cond_out]),
            helper.make_node("SequenceAt", [sequence, i], [g]),
            *(at.nodes or []),
            helper.make_node("SequenceInsert", [seq, clipped], [seq_out]),
        ],
        "clipped_copies",
        [_scalar(i, onnx.TensorProto.INT64), _scalar(cond, onnx.TensorProto.BOOL), sequence_type(seq, elem_type, None)],
        [_scalar(cond_out, onnx.TensorProto.BOOL), sequence_type(seq_out, elem_type, None)],
    )
    empty = b.add_node1("SequenceEmpty", [], dtype=elem_type, hint="clipped_empty")
    count = b.add_node1("SequenceLength", [sequence], hint="grad_count")
    return b.add_node1("Loop", [count, "", empty], body=body, hint="clipped_gradients")


def _scalar(name: str, elem_type: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, [])
