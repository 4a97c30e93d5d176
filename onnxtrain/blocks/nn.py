"""Neural-network blocks: matrix products, a dense layer and (log-)softmax."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from onnxtrain.blocks.block import Block
from onnxtrain.graph import dtypes


class MatMul(Block):
    """``a @ b`` with NumPy's batching rules (ONNX ``MatMul``)."""

    def build(self, input_name1: str, input_name2: str) -> str:
        return self.builder.add_node1("MatMul", [input_name1, input_name2])


class Gemm(Block):
    """``alpha * op(a) @ op(b) + beta * c`` (ONNX ``Gemm``); ``op`` transposes when asked."""

    def __init__(self, alpha: float = 1.0, beta: float = 1.0, transA: bool = False, transB: bool = False) -> None:
        super().__init__()
        self._attributes = {"alpha": float(alpha), "beta": float(beta), "transA": int(transA), "transB": int(transB)}

    def build(self, a_name: str, b_name: str, c_name: str | None = None) -> str:
        inputs = [a_name, b_name] if c_name is None else [a_name, b_name, c_name]
        return self.builder.add_node1("Gemm", inputs, **self._attributes)


class Linear(Block):
    """A dense layer ``alpha * x @ W + beta * b`` (ONNX ``Gemm``) with new parameters.

    ``W`` has shape ``(in_features, out_features)`` and ``b`` ``(out_features,)``,
    as in ONNX Runtime's block. Both are drawn from ``U(-k, k)``, ``k =
    1/sqrt(in_features)`` (PyTorch's default), with a generator seeded by
    ``seed`` or, when ``None``, by the weight's name: the same build gives the
    same values in any process, and two layers differ.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        alpha: float = 1.0,
        beta: float = 1.0,
        *,
        dtype: Any = np.float32,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        if in_features < 1 or out_features < 1:
            raise ValueError(f"Linear needs positive sizes, got in_features={in_features}, out_features={out_features}")
        self._in_features = int(in_features)
        self._out_features = int(out_features)
        self._bias = bias
        self._alpha = float(alpha)
        self._beta = float(beta)
        self._dtype = dtypes.to_numpy_dtype(dtypes.to_elem_type(dtype))
        self._seed = seed

    def build(self, linear_input_name: str) -> str:
        b = self.builder
        b.require(linear_input_name)
        weight_name = b.names.fresh("linear.weight")
        seed = zlib.crc32(weight_name.encode()) if self._seed is None else self._seed
        rng = np.random.default_rng(seed)
        bound = 1.0 / np.sqrt(self._in_features)

        def draw(*shape: int) -> np.ndarray:
            return rng.uniform(-bound, bound, size=shape).astype(self._dtype)

        weight = b.add_initializer(draw(self._in_features, self._out_features), name=weight_name)
        inputs = [linear_input_name, weight]
        if self._bias:
            inputs.append(b.add_initializer(draw(self._out_features), "linear.bias"))
        return b.add_node1("Gemm", inputs, hint="linear.output", alpha=self._alpha, beta=self._beta)


class Softmax(Block):
    """``exp(x) / sum(exp(x), axis)`` (ONNX ``Softmax``)."""

    def __init__(self, axis: int = -1) -> None:
        super().__init__()
        self._axis = int(axis)

    def build(self, input_name: str) -> str:
        return self.builder.add_node1("Softmax", [input_name], axis=self._axis)


class LogSoftmax(Block):
    """``x - log(sum(exp(x), axis))``, computed stably (ONNX ``LogSoftmax``)."""

    def __init__(self, axis: int = -1) -> None:
        super().__init__()
        self._axis = int(axis)

    def build(self, input_name: str) -> str:
        return self.builder.add_node1("LogSoftmax", [input_name], axis=self._axis)
