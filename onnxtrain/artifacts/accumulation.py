"""Gradient accumulation in the training model, in standard operators.

ONNX Runtime accumulates with ``com.microsoft::InPlaceAccumulatorV2``, which
writes into the buffer it is fed. Here the training model takes, after the
parameters, ``<p>_grad.accumulation.buffer`` for each trainable parameter and
the flag ``lazy_reset_grad`` (bool[1]), and outputs the accumulated gradient
``<p>_grad.accumulation.out = lazy_reset_grad ? <p>_grad : buffer + <p>_grad``;
the runtime feeds it back as the next buffer.

:func:`remove_gradient_accumulation` undoes it for a step that starts from
reset gradients (``lazy_reset_grad`` true): each gradient becomes an output
of its own, which the runtime writes straight into the gradient's buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import onnx

from onnxtrain.graph import ops
from onnxtrain.graph.builder import GraphBuilder, tensor_type
from onnxtrain.graph.naming import keep_or_tag, names_in
from onnxtrain.graph.passes import prune_unused_nodes
from onnxtrain.graph.versions import is_standard
from onnxtrain.graph.walk import names_read

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


class AccumulationFormError(ValueError):
    """A training model whose accumulation is not the form :func:`add_gradient_accumulation` writes."""


@dataclass(frozen=True)
class ResetTrainingModel:
    """A training model as it runs from reset gradients; ``gradients[p]`` names the output of ``p``'s gradient."""

    model: onnx.ModelProto
    gradients: Mapping[str, str]


def remove_gradient_accumulation(model: onnx.ModelProto, trainable: Sequence[str]) -> ResetTrainingModel:
    """``model`` (from :func:`add_gradient_accumulation`) with ``lazy_reset_grad`` taken as true.

    Each output ``<p>_grad.accumulation.out = Where(reset, g, buffer + g)``
    becomes ``g`` itself (through an ``Identity`` where no node computes
    ``g``); the additions, the buffers and the flag go. Every other input
    stays, used or not, so that a runtime binds the same names. ``model`` is
    not changed. Raises :class:`AccumulationFormError` where an output is not
    that ``Where`` or a gradient is also another output.
    """
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    producers = {name: node for node in graph.node for name in node.output}
    unique = keep_or_tag(names_in(graph), "reset")
    gradients = {param: _raw_gradient(graph, producers, param, unique) for param in trainable}
    raw = {accumulated_name(p): g for p, g in gradients.items()}
    count = len(graph.output)
    for value in graph.output:
        value.name = raw.get(value.name, value.name)
    if len({value.name for value in graph.output}) != count:
        raise AccumulationFormError("a gradient of the training model is also another of its outputs")
    prune_unused_nodes(copy)
    _drop_unused_inputs(graph, {LAZY_RESET_GRAD, *(buffer_name(p) for p in trainable)})
    kept = {name for node in graph.node for name in node.output}
    values = [value for value in graph.value_info if value.name in kept]
    del graph.value_info[:]
    graph.value_info.extend(values)
    return ResetTrainingModel(copy, gradients)


def _raw_gradient(
    graph: onnx.GraphProto, producers: Mapping[str, onnx.NodeProto], param: str, unique: Callable[[str], str]
) -> str:
    """The tensor ``Where(reset, g, buffer + g)`` selects on reset, for ``param``'s accumulation output."""
    out = accumulated_name(param)
    node = producers.get(out)
    if node is None or node.op_type != "Where" or not is_standard(node) or len(node.input) != 3:
        raise AccumulationFormError(
            f"the training model's {out!r} is not the Where(reset, gradient, buffer + gradient) that "
            "generate_artifacts writes"
        )
    condition, gradient = node.input[0], node.input[1]
    squeeze = producers.get(condition)
    if squeeze is None or not squeeze.input or squeeze.input[0] != LAZY_RESET_GRAD:
        raise AccumulationFormError(f"the condition of {out!r} is not {LAZY_RESET_GRAD!r}")
    if gradient not in producers:  # a gradient that is an input or a constant: give it a node of its own
        gradient_output = unique(f"{param}_grad")
        graph.node.add().CopyFrom(onnx.helper.make_node("Identity", [gradient], [gradient_output]))
        return gradient_output
    return gradient


def _drop_unused_inputs(graph: onnx.GraphProto, names: set[str]) -> None:
    """Remove the inputs among ``names`` that nothing reads any more (the accumulation's)."""
    needed = {value.name for value in graph.output}
    for node in graph.node:
        needed.update(names_read(node))
    unused = [value.name for value in graph.input if value.name in names and value.name not in needed]
    kept = [value for value in graph.input if value.name not in unused]
    del graph.input[:]
    graph.input.extend(kept)


__all__ = [
    "LAZY_RESET_GRAD",
    "AccumulationFormError",
    "ResetTrainingModel",
    "accumulated_name",
    "add_gradient_accumulation",
    "buffer_name",
    "remove_gradient_accumulation",
]
