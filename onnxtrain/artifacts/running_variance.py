"""torch's running statistics from ONNX's: the update with the unbiased batch variance, none from one value.

A training-mode ``BatchNormalization`` outputs ``momentum * var + (1 - momentum) * s2``
with ``s2`` the batch's biased variance over the ``n`` values of each channel
(ONNX's definition). torch updates its buffer with the unbiased one,
``s2 * n / (n - 1)``. From ONNX's output ``r`` and the variance ``var`` the node
read, torch's value is

    (n * r - momentum * var) / (n - 1)

per channel, in a few operations on ``[C]`` (``n = size(X) / C``, computed at
run time). A batch with one value per channel (a last batch of one row
through ``BatchNorm1d``), which torch refuses to train ("Expected more than 1
value per channel"), leaves both statistics as they were: its unbiased
variance is undefined, and the update above would set the variance to 0, so
that every later eval step divides by ``sqrt(eps)``. The models torch
exported get it (:func:`from_torch`): they train as torch trains them.
"""

from __future__ import annotations

from typing import NamedTuple

import onnx
from onnx import helper

from onnxtrain.graph.attributes import attribute
from onnxtrain.graph.naming import first_free

#: ONNX's default ``momentum`` of ``BatchNormalization``.
DEFAULT_MOMENTUM = 0.9


class TorchUpdate(NamedTuple):
    """The nodes of torch's update around a ``BatchNormalization``: ``before`` it, ``after`` it, and the names
    of the new running ``mean`` and ``variance`` they compute."""

    before: list[onnx.NodeProto]
    after: list[onnx.NodeProto]
    mean: str
    variance: str


def from_torch(model: onnx.ModelProto) -> bool:
    """Whether torch's exporters wrote ``model`` (TorchScript's and dynamo's both name themselves so)."""
    return model.producer_name == "pytorch"


def torch_running_statistics(node: onnx.NodeProto, elem_type: int, taken: set[str]) -> TorchUpdate:
    """torch's new running mean and variance around ``node``, a training-mode ``BatchNormalization`` whose
    outputs 1 and 2 are named: from those outputs, its input ``X`` and the statistics it reads (inputs 3 and 4,
    of ``elem_type``); names drawn from ``taken``.

    onnxruntime's kernel writes its new running statistics into the buffers of the ones it reads (its outputs
    alias its inputs), so ``node`` is made to read copies (``before``: ``max(s, s)``; onnxruntime's optimizer
    removes an ``s + 0`` where ``s`` is computed, as a second call's statistics are), and the statistics
    themselves are read intact after it.
    """
    x, old_mean, old_var = node.input[0], node.input[3], node.input[4]
    updated_mean, updated_var = node.output[1], node.output[2]
    momentum = float(attribute(node, "momentum", DEFAULT_MOMENTUM))

    def name(hint: str) -> str:
        return first_free(f"{old_var}.{hint}", taken)

    def constant(hint: str, value: float) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [name(hint)], value=helper.make_tensor(hint, elem_type, [], [value]))

    momentum_node, one_node = constant("momentum", momentum), constant("one", 1.0)
    momentum_value, one = momentum_node.output[0], one_node.output[0]
    mean_copy, var_copy = name("mean_read"), name("read")
    before = [
        helper.make_node("Max", [old_mean, old_mean], [mean_copy]),
        helper.make_node("Max", [old_var, old_var], [var_copy]),
    ]
    node.input[3], node.input[4] = mean_copy, var_copy
    size, channels, count, n = name("size"), name("channels"), name("count"), name("n")
    scaled, kept, numerator = name("scaled"), name("kept"), name("numerator")
    less_one, denominator, unbiased = name("less_one"), name("denominator"), name("unbiased")
    several, mean, variance = name("several"), name("torch_mean"), name("torch")
    after = [
        momentum_node,
        one_node,
        helper.make_node("Size", [x], [size]),
        helper.make_node("Size", [old_var], [channels]),
        helper.make_node("Div", [size, channels], [count]),
        helper.make_node("Cast", [count], [n], to=elem_type),
        helper.make_node("Mul", [n, updated_var], [scaled]),
        helper.make_node("Mul", [momentum_value, old_var], [kept]),
        helper.make_node("Sub", [scaled, kept], [numerator]),
        helper.make_node("Sub", [n, one], [less_one]),
        helper.make_node("Max", [less_one, one], [denominator]),
        helper.make_node("Div", [numerator, denominator], [unbiased]),
        helper.make_node("Greater", [n, one], [several]),
        helper.make_node("Where", [several, updated_mean, old_mean], [mean]),
        helper.make_node("Where", [several, unbiased, old_var], [variance]),
    ]
    return TorchUpdate(before, after, mean, variance)


__all__ = ["DEFAULT_MOMENTUM", "TorchUpdate", "from_torch", "torch_running_statistics"]
