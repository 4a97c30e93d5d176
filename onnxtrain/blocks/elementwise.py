"""Element-wise blocks: arithmetic, activations, selection, casts.

Each block appends one ONNX node of the same name (``Add`` appends ``Add``)
unless its docstring says otherwise. Constants a block creates take the
element type of its input, so the blocks work in float16, float32 and float64.
"""

from __future__ import annotations

from typing import Any

import onnx

from onnxtrain.blocks.block import Block
from onnxtrain.graph import dtypes, ops

#: The element types onnxruntime's CPU ``Mean`` kernel takes.
_MEAN_KERNEL_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16})


class _UnaryOp(Block):
    """``op(x)`` for a one-input, one-output operator with no attributes."""

    _op_type: str = ""

    def build(self, input_name: str) -> str:
        return self.builder.add_node1(self._op_type, [input_name])


class _BinaryOp(Block):
    """``op(a, b)`` with NumPy-style broadcasting."""

    _op_type: str = ""

    def build(self, input_name1: str, input_name2: str) -> str:
        return self.builder.add_node1(self._op_type, [input_name1, input_name2])


class _VariadicOp(Block):
    """``op(x1, x2, ...)`` over one or more inputs, broadcast together."""

    _op_type: str = ""

    def build(self, *input_names: str) -> str:
        if not input_names:
            raise ValueError(f"{type(self).__name__} needs at least one input name")
        return self.builder.add_node1(self._op_type, list(input_names))


class Add(_BinaryOp):
    """``a + b`` (ONNX ``Add``)."""

    _op_type = "Add"


class Sub(_BinaryOp):
    """``a - b`` (ONNX ``Sub``)."""

    _op_type = "Sub"


class Mul(_BinaryOp):
    """``a * b`` (ONNX ``Mul``)."""

    _op_type = "Mul"


class Div(_BinaryOp):
    """``a / b`` (ONNX ``Div``)."""

    _op_type = "Div"


class Pow(Block):
    """``x ** exponent`` (ONNX ``Pow``).

    With a number ``exponent`` (ONNX Runtime's form) the block takes one input
    and the exponent becomes a constant of the input's element type; with
    ``exponent=None`` it takes the base and the exponent as two inputs.
    """

    def __init__(self, exponent: float | None = None) -> None:
        super().__init__()
        self._exponent = exponent

    def build(self, pow_input_name: str, exponent_name: str | None = None) -> str:
        b = self.builder
        if self._exponent is not None:
            if exponent_name is not None:
                raise ValueError("Pow got an exponent both in the constructor and as an input; pass only one")
            exponent_name = ops.constant_like(b, self._exponent, pow_input_name, "pow_exponent")
        elif exponent_name is None:
            raise ValueError("Pow() without an exponent needs two inputs: build(base_name, exponent_name)")
        return b.add_node1("Pow", [pow_input_name, exponent_name])


class Sigmoid(_UnaryOp):
    """``1 / (1 + exp(-x))`` (ONNX ``Sigmoid``)."""

    _op_type = "Sigmoid"


class Log(_UnaryOp):
    """Natural logarithm (ONNX ``Log``)."""

    _op_type = "Log"


class Neg(_UnaryOp):
    """``-x`` (ONNX ``Neg``)."""

    _op_type = "Neg"


class Abs(_UnaryOp):
    """``|x|`` (ONNX ``Abs``)."""

    _op_type = "Abs"


class Exp(_UnaryOp):
    """``e ** x`` (ONNX ``Exp``)."""

    _op_type = "Exp"


class Sqrt(_UnaryOp):
    """Square root (ONNX ``Sqrt``)."""

    _op_type = "Sqrt"


class Tanh(_UnaryOp):
    """Hyperbolic tangent (ONNX ``Tanh``)."""

    _op_type = "Tanh"


class Relu(_UnaryOp):
    """``max(x, 0)`` (ONNX ``Relu``)."""

    _op_type = "Relu"


class Identity(_UnaryOp):
    """A copy of ``x`` under a new name (ONNX ``Identity``)."""

    _op_type = "Identity"


class Min(_VariadicOp):
    """Element-wise minimum of the inputs (ONNX ``Min``)."""

    _op_type = "Min"


class Max(_VariadicOp):
    """Element-wise maximum of the inputs (ONNX ``Max``)."""

    _op_type = "Max"


class Sum(_VariadicOp):
    """Element-wise sum of the inputs (ONNX ``Sum``)."""

    _op_type = "Sum"


class Mean(_VariadicOp):
    """Element-wise mean of the inputs (ONNX ``Mean``).

    onnxruntime has ``Mean`` kernels for float and float16 only; inputs of
    other types (double) get ``Sum`` divided by the number of inputs instead.
    """

    _op_type = "Mean"

    def build(self, *input_names: str) -> str:
        b = self.builder
        first = b.type_of(input_names[0]) if input_names else None
        if first is None or not first.HasField("tensor_type") or first.tensor_type.elem_type in _MEAN_KERNEL_TYPES:
            return super().build(*input_names)
        total = b.add_node1("Sum", list(input_names), hint="mean_sum")
        return b.add_node1("Div", [total, ops.constant_like(b, len(input_names), total, "mean_count")], hint="mean")


class Where(Block):
    """``condition ? x : y`` element-wise (ONNX ``Where``); ``condition`` is bool."""

    def build(self, condition_name: str, x_name: str, y_name: str) -> str:
        return self.builder.add_node1("Where", [condition_name, x_name, y_name])


class Clip(Block):
    """``min(max(x, clip_min), clip_max)`` (ONNX ``Clip``); a bound left ``None`` is open.

    The bounds become scalar constants of the input's element type.
    """

    def __init__(self, clip_min: float | None = None, clip_max: float | None = None) -> None:
        super().__init__()
        if clip_min is not None and clip_max is not None and clip_min > clip_max:
            raise ValueError(f"Clip needs clip_min <= clip_max, got {clip_min} > {clip_max}")
        self._min = clip_min
        self._max = clip_max

    def build(self, clip_input_name: str) -> str:
        b = self.builder
        bounds = [
            "" if bound is None else ops.constant_like(b, bound, clip_input_name, hint)
            for bound, hint in ((self._min, "clip_min"), (self._max, "clip_max"))
        ]
        while bounds and not bounds[-1]:
            bounds.pop()
        return b.add_node1("Clip", [clip_input_name, *bounds])


class Cast(Block):
    """``x`` converted to element type ``to`` (ONNX ``Cast``).

    ``to`` is an ``onnx.TensorProto`` value (``onnx.TensorProto.FLOAT``), a
    NumPy dtype (``np.float32``) or a name (``"float"``).
    """

    def __init__(self, to: Any) -> None:
        super().__init__()
        self._to = dtypes.to_elem_type(to)

    def build(self, cast_input_name: str) -> str:
        return self.builder.add_node1("Cast", [cast_input_name], to=self._to)
