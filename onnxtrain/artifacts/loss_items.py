"""What a loss is a mean over, written in the training and eval models for the runtime's gradient accumulation.

A loss that is a mean over its batch's rows weighs each row alike, so the
step of several batches accumulated is that of one batch of all their rows
when each batch's gradient is weighted by its rows
(:mod:`onnxtrain.training.batch_step`). A cross-entropy or NLL with
``reduction="mean"`` is a mean over its counted labels instead: those not
``ignore_index``, each weighted by its class's weight where the loss has
class weights (torch's and ONNX's ``NegativeLogLikelihoodLoss``). A language
model's batches of padded sequences count their tokens, not their rows (what
Hugging Face's ``num_items_in_batch`` counts). A loss summed over its batch
(``reduction="sum"``) is the sum over all the rows when the batches' gradients
are added as they are: no weights.

:func:`loss_items` reads that from a model that holds its loss's
``NegativeLogLikelihoodLoss`` (the eval model; the training model's autodiff
expands it): the one such node of ``reduction="mean"`` whose labels are a
graph input, read as they are or reshaped, squeezed, cast or passed through
the loss's label check, with its ``ignore_index`` and constant class
weights. ``generate_artifacts`` writes it as JSON under
:data:`~onnxtrain.artifacts.metadata.LOSS_ITEMS_KEY` in both models:
``{"labels": "labels", "ignore_index": -100, "class_weights": null}``; for a
loss summed over its batch (that NLL with ``reduction="sum"``, or one of
``onnxtrain.losses`` built with it), ``{"reduction": "sum"}``. Any other loss
writes nothing: rows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from onnxtrain.graph.attributes import attribute, text_attribute
from onnxtrain.graph.walk import all_nodes

#: Operators the labels may pass through on their way to the loss, with the position of the labels.
_LABEL_PATHS: Mapping[str, int] = {
    "Identity": 0, "Reshape": 0, "Squeeze": 0, "Unsqueeze": 0, "Flatten": 0, "Cast": 0, "Transpose": 0,
    "Where": 1,  # the label check's: Where(valid, labels, check)
}  # fmt: skip


def loss_items(model: onnx.ModelProto, reduction: str | None = None) -> dict[str, Any] | None:
    """``{"labels", "ignore_index", "class_weights"}`` of ``model``'s mean NLL, ``{"reduction": "sum"}`` for a
    summed one or where ``reduction`` (the loss block's, where known) is ``"sum"`` (module docstring), else
    ``None``."""
    graph = model.graph
    losses = [node for node in all_nodes(graph) if node.op_type == "NegativeLogLikelihoodLoss"]
    reductions = [text_attribute(node, "reduction", "mean") for node in losses]
    if reduction == "sum" or reductions == ["sum"]:
        return {"reduction": "sum"}
    if reductions != ["mean"]:
        return None
    node = losses[0]
    stored = {t.name for t in graph.initializer}
    labels = _graph_input(node.input[1], graph, {i.name for i in graph.input} - stored)
    if labels is None:
        return None
    weights = None
    if len(node.input) > 2 and node.input[2]:
        tensor = {t.name: t for t in graph.initializer}.get(node.input[2])
        if tensor is None:  # weights computed at run time: not known here
            return None
        weights = numpy_helper.to_array(tensor).astype(np.float64).reshape(-1).tolist()
    ignore = attribute(node, "ignore_index", None)
    return {"labels": labels, "ignore_index": None if ignore is None else int(ignore), "class_weights": weights}


def loss_items_entry(model: onnx.ModelProto, reduction: str | None = None) -> dict[str, str]:
    """The metadata entry for :func:`loss_items` of ``model``: ``{}`` where there is none."""
    from onnxtrain.artifacts.metadata import LOSS_ITEMS_KEY

    found = loss_items(model, reduction)
    return {} if found is None else {LOSS_ITEMS_KEY: json.dumps(found)}


def _graph_input(name: str, graph: onnx.GraphProto, inputs: set[str]) -> str | None:
    """The graph input among ``inputs`` that ``name`` is, through :data:`_LABEL_PATHS`; ``None`` otherwise."""
    producers = {output: node for node in graph.node for output in node.output}
    for _ in range(len(graph.node) + 1):
        if name in inputs:
            return name
        node = producers.get(name)
        position = None if node is None else _LABEL_PATHS.get(node.op_type)
        if node is None or position is None or len(node.input) <= position:
            return None
        name = node.input[position]
    return None


__all__ = ["loss_items", "loss_items_entry"]
