"""Blocks: ``Block``, ``ForwardBlock`` and the elementary blocks users stack on a model.

Every block of ONNX Runtime's ``onnxblock.blocks`` is here with the same
name and arguments, plus the ones losses and custom losses need.
"""

from __future__ import annotations

from onnxtrain.blocks.block import Block, ForwardBlock
from onnxtrain.blocks.elementwise import (
    Abs,
    Add,
    Cast,
    Clip,
    Div,
    Exp,
    Identity,
    Log,
    Max,
    Mean,
    Min,
    Mul,
    Neg,
    Pow,
    Relu,
    Sigmoid,
    Sqrt,
    Sub,
    Sum,
    Tanh,
    Where,
)
from onnxtrain.blocks.gradient import Gradient
from onnxtrain.blocks.nn import Gemm, Linear, LogSoftmax, MatMul, Softmax
from onnxtrain.blocks.reductions import ReduceAllL2, ReduceMax, ReduceMean, ReduceMin, ReduceSum
from onnxtrain.blocks.shape import Concat, Flatten, Reshape, Squeeze, Transpose, Unsqueeze
from onnxtrain.blocks.values import Constant, InputLike, LabelEncoder, PassThrough, SequenceConstruct

__all__ = [
    "Abs", "Add", "Block", "Cast", "Clip", "Concat", "Constant", "Div", "Exp", "Flatten",
    "ForwardBlock", "Gemm", "Gradient", "Identity", "InputLike", "LabelEncoder", "Linear", "Log",
    "LogSoftmax", "MatMul", "Max", "Mean", "Min", "Mul", "Neg", "PassThrough", "Pow",
    "ReduceAllL2", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceSum", "Relu", "Reshape",
    "SequenceConstruct", "Sigmoid", "Softmax", "Sqrt", "Squeeze", "Sub", "Sum", "Tanh",
    "Transpose", "Unsqueeze", "Where",
]  # fmt: skip
