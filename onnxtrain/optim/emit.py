"""Emitting one optimizer model's arithmetic: shared scalars and per-parameter element-wise operators."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import onnx

from onnxtrain.graph import ops
from onnxtrain.graph.builder import GraphBuilder

#: The name of the learning-rate input (float32, shape [1]).
LEARNING_RATE = "learning_rate"
#: The name of the step input (int64, shape [1]; 1 for the first step).
STEP = "step"


def compute_type(elem_type: int) -> int:
    """The type a parameter's update is computed in: float32 for 16-bit floats, else its own."""
    if elem_type in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16):
        return onnx.TensorProto.FLOAT
    return elem_type


class Scalars:
    """Scalars shared by the whole optimizer model: learning rate, step and constants, per float type.

    Each is emitted once, when first asked for, and reused.
    """

    def __init__(self, builder: GraphBuilder, learning_rate: str, step: str, lr_scale: float = 1.0) -> None:
        self.builder = builder
        self._inputs = {LEARNING_RATE: learning_rate, STEP: step}
        self._lr_scale = lr_scale
        self._cache: dict[tuple[Any, ...], Any] = {}

    @property
    def step_input(self) -> str:
        """The int64 ``[1]`` value the step number is read from."""
        return self._inputs[STEP]

    def with_step(self, step: str) -> Scalars:
        """These scalars with the step read from ``step`` (int64 ``[1]``) instead."""
        return Scalars(self.builder, self._inputs[LEARNING_RATE], step, self._lr_scale)

    def with_lr_scale(self, factor: float) -> Scalars:
        """These scalars with the learning rate times ``factor`` (a group's: every scalar made from the rate is
        made again for it)."""
        return Scalars(self.builder, self._inputs[LEARNING_RATE], self._inputs[STEP], factor)

    def _get(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def shared(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        """``make()``, called once per ``key`` in this model: values all parameters share."""
        return self._get(("shared", *key), make)

    def const(self, value: float, elem_type: int, hint: str = "const") -> str:
        """A scalar constant of ``elem_type``: one per value and type (the first ``hint`` names it)."""
        return self._get(("const", float(value), elem_type), lambda: ops.constant(self.builder, value, elem_type, hint))

    def lr(self, elem_type: int) -> str:
        """The learning rate as a scalar of ``elem_type``."""
        b = self.builder
        scalar = self._get(("lr",), lambda: ops.squeeze(b, self._inputs[LEARNING_RATE], [0], hint="lr"))
        if self._lr_scale != 1.0:  # float32 as the rate itself: Mul(rate, factor)
            factor = self.const(self._lr_scale, onnx.TensorProto.FLOAT, "lr_scale")
            unscaled = scalar
            scalar = self._get(("lr scaled",), lambda: b.add_node1("Mul", [unscaled, factor], hint="lr"))
        if elem_type == onnx.TensorProto.FLOAT:
            return scalar
        return self._get(("lr", elem_type), lambda: b.add_node1("Cast", [scalar], to=elem_type, hint="lr"))

    def step_int(self) -> str:
        """The step as an int64 scalar."""
        return self._get(("step",), lambda: ops.squeeze(self.builder, self._inputs[STEP], [0], hint="t"))

    def step(self, elem_type: int) -> str:
        """The step as a scalar of ``elem_type``."""
        return self._get(
            ("step", elem_type), lambda: self.builder.add_node1("Cast", [self.step_int()], to=elem_type, hint="t")
        )

    def first_step(self) -> str:
        """A bool scalar: whether this is step 1."""
        return self._get(
            ("first",),
            lambda: self.builder.add_node1(
                "Equal", [self.step_int(), self.const(1, onnx.TensorProto.INT64, "one")], hint="first_step"
            ),
        )


class Math:
    """Emits the element-wise operators of one parameter's update, in one float type.

    Every method returns the name of its result. ``out`` names the result
    (for the last operator of an output); otherwise the name is made from the
    parameter's name and ``hint``.
    """

    def __init__(self, scalars: Scalars, elem_type: int, prefix: str) -> None:
        self.scalars = scalars
        self.builder = scalars.builder
        self.elem_type = elem_type
        self.prefix = prefix

    def _node(self, op_type: str, inputs: Sequence[str], out: str | None, hint: str, **attributes: Any) -> str:
        if out is not None:
            return self.builder.add_node(op_type, list(inputs), [out], **attributes)[0]
        stem = f"{self.prefix}.{hint}" if self.prefix else hint
        return self.builder.add_node1(op_type, list(inputs), hint=stem, **attributes)

    def shared(self, key: tuple[Any, ...], make: Callable[[Math], Any]) -> Any:
        """``make(math)`` once per ``key`` and float type, with unprefixed names: shared by all parameters."""
        return self.scalars.shared((*key, self.elem_type), lambda: make(Math(self.scalars, self.elem_type, "")))

    def const(self, value: float, hint: str = "const") -> str:
        """A scalar constant of this type."""
        return self.scalars.const(value, self.elem_type, hint)

    def lr(self) -> str:
        """The learning rate, a scalar of this type."""
        return self.scalars.lr(self.elem_type)

    def step(self) -> str:
        """The step number (1 for the first step), a scalar of this type."""
        return self.scalars.step(self.elem_type)

    def first_step(self) -> str:
        """A bool scalar: whether this is the first step."""
        return self.scalars.first_step()

    def add(self, a: str, b: str, out: str | None = None, hint: str = "add") -> str:
        return self._node("Add", [a, b], out, hint)

    def sub(self, a: str, b: str, out: str | None = None, hint: str = "sub") -> str:
        return self._node("Sub", [a, b], out, hint)

    def mul(self, a: str, b: str, out: str | None = None, hint: str = "mul") -> str:
        return self._node("Mul", [a, b], out, hint)

    def div(self, a: str, b: str, out: str | None = None, hint: str = "div") -> str:
        return self._node("Div", [a, b], out, hint)

    def max(self, a: str, b: str, out: str | None = None, hint: str = "max") -> str:
        return self._node("Max", [a, b], out, hint)

    def pow(self, a: str, b: str, out: str | None = None, hint: str = "pow") -> str:
        return self._node("Pow", [a, b], out, hint)

    def sqrt(self, a: str, out: str | None = None, hint: str = "sqrt") -> str:
        return self._node("Sqrt", [a], out, hint)

    def where(self, condition: str, a: str, b: str, out: str | None = None, hint: str = "where") -> str:
        return self._node("Where", [condition, a, b], out, hint)

    def cast(self, a: str, elem_type: int, out: str | None = None, hint: str = "cast") -> str:
        return self._node("Cast", [a], out, hint, to=elem_type)

    def axpy(self, alpha: float, x: str, y: str, out: str | None = None, hint: str = "axpy") -> str:
        """``y + alpha * x`` (``y`` alone when ``alpha == 0``, ``y + x`` when ``alpha == 1``)."""
        if alpha == 0.0:
            return y if out is None else self._node("Identity", [y], out, hint)
        term = x if alpha == 1.0 else self.mul(self.const(alpha), x, hint=hint)
        return self.add(y, term, out, hint)

    def scale(self, alpha: float, x: str, out: str | None = None, hint: str = "scale") -> str:
        """``alpha * x``."""
        return self.mul(self.const(alpha), x, out, hint)
