"""torch's running variance from ONNX's: the update with the unbiased batch variance.

A training-mode ``BatchNormalization`` outputs ``momentum * var + (1 - momentum) * s2``
with ``s2`` the batch's biased variance over the ``n`` values of each channel
(ONNX's definition). torch updates its buffer with the unbiased one,
``s2 * n / (n - 1)``. From ONNX's output ``r`` and the variance ``var`` the node
read, torch's value is

    (n * r - momentum * var) / (n - 1)

per channel, in a few operations on ``[C]`` (``n = size(X) / C``, computed at
run time; ``max(n - 1, 1)`` where a channel holds one value, which torch
refuses to train). The models torch exported get it
(:func:`from_torch`): they train as torch trains them.
"""

from __future__ import annotations

import onnx
from onnx import helper

from onnxtrain.graph.naming import first_free

#: ONNX's default ``momentum`` of ``BatchNormalization``.
DEFAULT_MOMENTUM = 0.9


def from_torch(model: onnx.ModelProto) -> bool:
    """Whether torch's exporters wrote ``model`` (TorchScript's and dynamo's both name themselves so)."""
    return model.producer_name == "pytorch"


def torch_running_variance(
    node: onnx.NodeProto, updated: str, out: str, elem_type: int, taken: set[str]
) -> tuple[list[onnx.NodeProto], list[onnx.NodeProto]]:
    """Nodes computing ``out``, torch's new running variance, from ``updated``, the new running variance output
    of ``node`` (a training-mode ``BatchNormalization``), its input ``X`` and its ``input_var``: ``(before,
    after)``, to run before and after ``node``; names drawn from ``taken``.

    onnxruntime's kernel writes its new running statistics into the buffers of the ones it reads (its outputs
    alias its inputs), so ``node`` is made to read a copy of the variance (``before``: ``var + 0``, which no
    optimizer removes), and the variance itself is read intact after it.
    """
    x, old = node.input[0], node.input[4]
    momentum = next((a.f for a in node.attribute if a.name == "momentum"), DEFAULT_MOMENTUM)

    def name(hint: str) -> str:
        return first_free(f"{out}.{hint}", taken)

    def constant(hint: str, value: float) -> onnx.NodeProto:
        tensor = helper.make_tensor(hint, elem_type, [], [value])
        return helper.make_node("Constant", [], [name(hint)], value=tensor)

    zero_node = constant("zero", 0.0)
    copy = name("read")
    before = [zero_node, helper.make_node("Add", [old, zero_node.output[0]], [copy])]
    node.input[4] = copy
    momentum_node, one_node = constant("momentum", momentum), constant("one", 1.0)
    momentum_value, one = momentum_node.output[0], one_node.output[0]
    size, channels, count, n = name("size"), name("channels"), name("count"), name("n")
    scaled, kept, numerator = name("scaled"), name("kept"), name("numerator")
    less_one, denominator = name("less_one"), name("denominator")
    after = [
        momentum_node,
        one_node,
        helper.make_node("Size", [x], [size]),
        helper.make_node("Size", [old], [channels]),
        helper.make_node("Div", [size, channels], [count]),
        helper.make_node("Cast", [count], [n], to=elem_type),
        helper.make_node("Mul", [n, updated], [scaled]),
        helper.make_node("Mul", [momentum_value, old], [kept]),
        helper.make_node("Sub", [scaled, kept], [numerator]),
        helper.make_node("Sub", [n, one], [less_one]),
        helper.make_node("Max", [less_one, one], [denominator]),
        helper.make_node("Div", [numerator, denominator], [out]),
    ]
    return before, after


__all__ = ["DEFAULT_MOMENTUM", "from_torch", "torch_running_variance"]
