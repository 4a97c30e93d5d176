"""``ClipGradNorm``: scale all gradients down when their global L2 norm exceeds ``max_norm``.

As ``torch.nn.utils.clip_grad_norm_``::

    total_norm = sqrt(sum over gradients g of sum(g**2))
    coef = max_norm / (total_norm + 1e-6)
    g = g * min(coef, 1)            # applied only when coef < 1

The norm is accumulated in float64 when any gradient is float64, else in
float32 (also for float16 and bfloat16 gradients, which are scaled in float32
and cast back).

The gradients are a list of tensor names, or the name of one sequence of
tensors (as ONNX Runtime's ``onnxblock.optim.ClipGradNorm`` takes them); a
sequence, whose length is known only at run time, is read and rebuilt by two
``Loop`` nodes (the sum of squares, then the scaled copies), and the result is
one sequence name.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import onnx
from onnx import helper

from onnxtrain.blocks.block import Block
from onnxtrain.graph import ops
from onnxtrain.graph.builder import GraphBuilder
from onnxtrain.optim import _checks

#: torch's guard against a division by zero in ``clip_grad_norm_``.
CLIP_EPSILON = 1e-6

_HALF_TYPES = frozenset({onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16})


class ClipGradNorm(Block):
    """Clip gradients on their global L2 norm; pass it as an optimizer's ``clip_grad``.

    ``build(gradient_names)`` takes the names of the gradients and returns the
    names of the clipped gradients, in the same order, with the same types.
    """

    def __init__(self, max_norm: float) -> None:
        super().__init__()
        self._max_norm = _checks.number(
            "ClipGradNorm", "max_norm", max_norm, lambda v: v > 0.0, "a number > 0 (inf: never clip)"
        )

    @property
    def max_norm(self) -> float:
        """The largest global L2 norm left unchanged."""
        return self._max_norm

    def __repr__(self) -> str:
        return f"ClipGradNorm(max_norm={self._max_norm!r})"

    def build(self, gradient_names: Sequence[str] | str) -> list[str] | str:
        """Emit ``g * min(max_norm / (||grads||_2 + 1e-6), 1)`` for each gradient ``g``.

        Returns the clipped names in order, or one name for a sequence.
        """
        b = self.builder
        if isinstance(gradient_names, str):
            type_proto = b.type_of(b.require(gradient_names, role="gradient"))
            if type_proto is not None and type_proto.HasField("sequence_type"):
                return self._clip_sequence(gradient_names, type_proto)
            gradient_names = [gradient_names]
        gradients = list(gradient_names)
        if not gradients:
            raise ValueError("ClipGradNorm.build() needs at least one gradient name")
        if math.isinf(self._max_norm):
            for name in gradients:
                b.require(name, role="gradient")
            return gradients
        types = [b.elem_type(b.require(name, role="gradient")) for name in gradients]
        if not all(t in (*_HALF_TYPES, onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE) for t in types):
            raise TypeError(f"ClipGradNorm needs float gradients; got element types {types} for {gradients}")
        acc = onnx.TensorProto.DOUBLE if onnx.TensorProto.DOUBLE in types else onnx.TensorProto.FLOAT
        squares = []
        for name, elem_type in zip(gradients, types, strict=True):
            value = name if elem_type == acc else b.add_node1("Cast", [name], to=acc, hint=f"{name}.as_acc")
            squares.append(ops.reduce(b, "ReduceSumSquare", value, hint=f"{name}.sum_sq"))
        total = squares[0] if len(squares) == 1 else b.add_node1("Sum", squares, hint="grad_sum_sq")
        coef = self._coefficient(total, acc)
        coefs: dict[int, str] = {acc: coef}
        clipped = []
        for name, elem_type in zip(gradients, types, strict=True):
            compute = onnx.TensorProto.FLOAT if elem_type in _HALF_TYPES else elem_type
            if compute not in coefs:
                coefs[compute] = b.add_node1("Cast", [coef], to=compute, hint="clip_coef")
            value = name if compute == elem_type else b.add_node1("Cast", [name], to=compute, hint=f"{name}.f32")
            value = b.add_node1("Mul", [value, coefs[compute]], hint=f"{name}.clipped")
            if compute != elem_type:
                value = b.add_node1("Cast", [value], to=elem_type, hint=f"{name}.clipped")
            clipped.append(value)
        return clipped

    def _coefficient(self, sum_of_squares: str, acc: int) -> str:
        """``min(max_norm / (sqrt(sum_of_squares) + 1e-6), 1)`` in ``acc``."""
        b = self.builder
        norm = b.add_node1("Sqrt", [sum_of_squares], hint="grad_norm")
        shifted = b.add_node1("Add", [norm, ops.constant(b, CLIP_EPSILON, acc, "clip_eps")], hint="grad_norm_eps")
        coef = b.add_node1("Div", [ops.constant(b, self._max_norm, acc, "max_norm"), shifted], hint="clip_coef")
        return b.add_node1("Min", [coef, ops.constant(b, 1.0, acc, "one")], hint="clip_coef_clamped")

    def _clip_sequence(self, sequence: str, type_proto: onnx.TypeProto) -> str:
        """Clip the tensors of the sequence ``sequence``; return the name of the clipped sequence.

        ``Loop`` 1 sums ``ReduceSumSquare`` of each element; ``Loop`` 2 inserts
        each element times the coefficient into a new sequence.
        """
        b = self.builder
        element = type_proto.sequence_type.elem_type
        elem_type = element.tensor_type.elem_type if element.HasField("tensor_type") else 0
        if elem_type not in (*_HALF_TYPES, onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE):
            raise TypeError(f"ClipGradNorm needs a sequence of float tensors; {sequence!r} is not one")
        if math.isinf(self._max_norm):
            return sequence
        acc = onnx.TensorProto.DOUBLE if elem_type == onnx.TensorProto.DOUBLE else onnx.TensorProto.FLOAT
        count = b.add_node1("SequenceLength", [sequence], hint="grad_count")
        zero = ops.constant(b, 0.0, acc, "zero")
        summed = b.add_node1(
            "Loop", [count, "", zero], body=_sum_of_squares_body(b, sequence, elem_type, acc), hint="grad_sum_sq"
        )
        coef = self._coefficient(summed, acc)
        empty = b.add_node1("SequenceEmpty", [], dtype=elem_type, hint="clipped_empty")
        body = _scaled_copies_body(b, sequence, coef, elem_type, acc)
        return b.add_node1("Loop", [count, "", empty], body=body, hint="clipped_gradients")


def _sum_of_squares_body(b: GraphBuilder, sequence: str, elem_type: int, acc: int) -> onnx.GraphProto:
    """``(i, cond, total) -> (cond, total + sum(sequence[i] ** 2))``, in ``acc``."""
    names = [b.names.fresh(hint) for hint in ("i", "cond", "total", "cond_out", "g", "g_acc", "sq", "total_out")]
    i, cond, total, cond_out, g, g_acc, sq, total_out = names
    nodes = [
        helper.make_node("Identity", [cond], [cond_out]),
        helper.make_node("SequenceAt", [sequence, i], [g]),
        helper.make_node("Cast", [g], [g_acc], to=acc),
        helper.make_node("ReduceSumSquare", [g_acc], [sq], keepdims=0),
        helper.make_node("Add", [total, sq], [total_out]),
    ]
    return helper.make_graph(
        nodes,
        "sum_of_squares",
        [_scalar(i, onnx.TensorProto.INT64), _scalar(cond, onnx.TensorProto.BOOL), _scalar(total, acc)],
        [_scalar(cond_out, onnx.TensorProto.BOOL), _scalar(total_out, acc)],
    )


def _scaled_copies_body(b: GraphBuilder, sequence: str, coef: str, elem_type: int, acc: int) -> onnx.GraphProto:
    """``(i, cond, out) -> (cond, out + [sequence[i] * coef])``, scaled in float32 or float64."""
    compute = onnx.TensorProto.FLOAT if elem_type in _HALF_TYPES else elem_type
    names = [b.names.fresh(h) for h in ("i", "cond", "seq", "cond_out", "g", "g_c", "coef_c", "scaled", "g_out")]
    i, cond, seq, cond_out, g, g_c, coef_c, scaled, g_out = names
    seq_out = b.names.fresh("seq_out")
    nodes = [
        helper.make_node("Identity", [cond], [cond_out]),
        helper.make_node("SequenceAt", [sequence, i], [g]),
        helper.make_node("Cast", [g], [g_c], to=compute),
        helper.make_node("Cast", [coef], [coef_c], to=compute),
        helper.make_node("Mul", [g_c, coef_c], [scaled]),
        helper.make_node("Cast", [scaled], [g_out], to=elem_type),
        helper.make_node("SequenceInsert", [seq, g_out], [seq_out]),
    ]
    sequence_type = helper.make_tensor_sequence_value_info
    return helper.make_graph(
        nodes,
        "scaled_copies",
        [_scalar(i, onnx.TensorProto.INT64), _scalar(cond, onnx.TensorProto.BOOL), sequence_type(seq, elem_type, None)],
        [_scalar(cond_out, onnx.TensorProto.BOOL), sequence_type(seq_out, elem_type, None)],
    )


def _scalar(name: str, elem_type: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, [])
