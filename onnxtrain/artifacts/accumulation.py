"""Gradient accumulation in the training model, in standard operators.

ONNX Runtime accumulates with ``com.microsoft::InPlaceAccumulatorV2``, which
writes into the buffer it is fed. Here the training model takes, after the
parameters, ``<p>_grad.accumulation.buffer`` for each trainable parameter and
the flag ``lazy_reset_grad`` (bool[1]), and outputs the accumulated gradient
``<p>_grad.accumulation.out = lazy_reset_grad ? <p>_grad : buffer + <p>_grad``;
the runtime feeds it back as the next buffer.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from onnxtrain.graph import ops
from onnxtrain.graph.builder import GraphBuilder, tensor_type

#: The flag input: true for the first train step after a gradient reset.
LAZY_RESET_GRAD = "lazy_reset_grad"


def buffer_name(param: str) -> str:
    """``w -> w_grad.accumulation.buffer``: the accumulated gradient fed in."""
    return f"{param}_grad.accumulation.buffer"


def accumulated_name(param: str) -> str:
    """``w -> w_grad.accumulation.out``: the accumulated gradient given back."""
    return f"{param}_grad.accumulation.out"


def add_gradient_accumulation(model: onnx.ModelProto, trainable: Sequence[str]) -> onnx.ModelProto:
    """``model`` (a training model with ``<p>_grad`` outputs) accumulating its gradients.

    Inputs gain the buffers (parameter order) and ``lazy_reset_grad``; each
    ``<p>_grad`` output becomes ``<p>_grad.accumulation.out``, in place.
    ``model`` is not changed.
    """
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    b = GraphBuilder(copy)
    buffers = [b.add_input(buffer_name(p), b.tensor_type_of(p)) for p in trainable]
    flag = b.add_input(LAZY_RESET_GRAD, tensor_type(onnx.TensorProto.BOOL, [1]))  # an input even when unused
    # bool[]: broadcasts against scalar parameters too; no node when nothing is trained
    reset = ops.squeeze(b, flag, [0], hint="reset") if trainable else flag
    accumulated = {}
    for param, buffer in zip(trainable, buffers, strict=True):
        grad = f"{param}_grad"
        summed = b.add_node1("Add", [buffer, grad], hint="grad_sum")
        accumulated[grad] = b.add_node("Where", [reset, grad, summed], [accumulated_name(param)])[0]
    b.set_outputs([accumulated.get(value.name, value.name) for value in copy.graph.output])
    return b.finalize()
