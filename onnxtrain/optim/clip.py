"""``ClipGradNorm``: scale all gradients down when their global L2 norm exceeds ``max_norm``.

As ``torch.nn.utils.clip_grad_norm_``::

    total_norm = sqrt(sum over gradients g of sum(g**2))
    coef = max_norm / (total_norm + 1e-6)
    g = g * min(coef, 1)            # applied only when coef < 1

The norm is accumulated in float64 when any gradient is float64, else in
float32 (also for float16 and bfloat16 gradients, which are scaled in float32
and cast back).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import onnx

from onnxtrain.blocks.block import Block
from onnxtrain.graph import ops
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

    def build(self, gradient_names: Sequence[str]) -> list[str]:
        """Emit ``g * min(max_norm / (||grads||_2 + 1e-6), 1)`` for each gradient ``g``."""
        if isinstance(gradient_names, str):
            gradient_names = [gradient_names]
        gradients = list(gradient_names)
        if not gradients:
            raise ValueError("ClipGradNorm.build() needs at least one gradient name")
        b = self.builder
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
        norm = b.add_node1("Sqrt", [total], hint="grad_norm")
        shifted = b.add_node1("Add", [norm, ops.constant(b, CLIP_EPSILON, acc, "clip_eps")], hint="grad_norm_eps")
        coef = b.add_node1("Div", [ops.constant(b, self._max_norm, acc, "max_norm"), shifted], hint="clip_coef")
        coef = b.add_node1("Min", [coef, ops.constant(b, 1.0, acc, "one")], hint="clip_coef_clamped")
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
