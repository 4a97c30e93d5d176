"""One model for many steps: the fused step in an ONNX ``Scan``, one iteration per batch.

:meth:`onnxtrain.training.Module.train_epoch` runs it. Its body is the fused
step (:mod:`onnxtrain.artifacts.fuse`): the update recorded by the last
optimizer step, then a train step from reset gradients on the updated
parameters. Iteration ``j`` therefore applies the update of batch ``j - 1``
(for ``j = 0``, the update the optimizer had recorded before the run) and
trains on batch ``j``; the update of the last batch is left recorded, as
``optimizer.step()`` leaves it, for the next train step or whatever reads the
state next.

Inputs of :attr:`EpochModel.model`, in this order:

- per carried tensor (the parameters, moments and gradients the fused step
  updates, and the running statistics), its value before the run: the
  ``Scan``'s state variables;
- per user input ``u`` of the training model, its batches ``data[u]``,
  ``[M, B, ...]``: iteration ``j`` trains on ``data[u][j]``;
- ``learning_rates`` (``[M]``) and, where the update reads its step number,
  ``steps`` (int64 ``[M]``): the rate and the number of the update iteration
  ``j`` applies. The fused step takes each as a ``[1]`` tensor and squeezes
  it; where that ``Squeeze`` is its only reader, the body takes the scalar
  instead, else the outer graph unsqueezes the whole sequence once;
- the frozen parameters, under their own names (read from the outer scope).

The batch size ``B`` and the other sizes of a batch are fixed in the body,
so that onnxruntime knows its shapes; the number of batches ``M`` is not.
``Scan`` slices its inputs itself: the body is the fused step's nodes and a
``Reshape`` of the loss, nothing per iteration to pick the batch.

Outputs: per carried tensor its value after the run, then ``losses`` (``[M]``):
each batch's loss, its mean where the loss is not one number.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxtrain.graph.fold import drop_unread_initializers, fold_static_shapes
from onnxtrain.graph.naming import keep_or_tag, names_in

#: ``(body input, body output)``: a tensor the fused step reads and writes a new value of, carried by the scan.
Carried = tuple[str, str]


@dataclass(frozen=True)
class EpochModel:
    """The epoch model and the names of its inputs and outputs (see the module docstring)."""

    model: onnx.ModelProto
    carried: tuple[tuple[str, str], ...]  # (outer input, outer output), in the order given
    data: Mapping[str, str]  # user input -> its batches
    learning_rates: str
    steps: str | None  # None: the update does not read its step number
    losses: str


def epoch_scan_model(
    fused: onnx.ModelProto,
    carried: Sequence[Carried],
    batches: Mapping[str, Sequence[int]],
    loss: str,
    learning_rate: str,
    step: str,
) -> EpochModel:
    """A ``Scan`` over batches whose body is ``fused`` (see the module docstring).

    ``fused``: the fused step's model, whose inputs are the user inputs (the
    keys of ``batches``, each with the shape of one batch), the carried
    tensors' inputs, ``learning_rate`` and ``step`` (both ``[1]``) and the
    frozen parameters. Its computations that depend only on the shapes, now
    fixed, are folded into constants (:mod:`onnxtrain.graph.fold`). ``fused``
    is not changed.
    """
    source = fold_static_shapes(fused, batches).graph
    types = {value.name: value.type for value in (*source.input, *source.output)}
    unique = keep_or_tag(names_in(source), "epoch")
    read = {name for node in source.node for name in node.input}
    per_step = {*batches, *(name for name, _ in carried), learning_rate, step}
    frozen = [value for value in source.input if value.name not in per_step]
    numbers = [learning_rate, *([step] if step in read else [])]  # per iteration, [1] each
    squeezes = {name: _only_squeeze(source, name) for name in numbers}

    body = onnx.GraphProto()
    body.name = f"{source.name or 'fused'}_epoch_body"
    body.input.extend([helper.make_value_info(name, types[name]) for name, _ in carried])
    for name, shape in batches.items():
        body.input.append(helper.make_tensor_value_info(name, types[name].tensor_type.elem_type, shape))
    for name in numbers:
        squeeze = squeezes[name]
        elem = types[name].tensor_type.elem_type
        body.input.append(
            helper.make_tensor_value_info(
                name if squeeze is None else squeeze.output[0], elem, [1] if squeeze is None else []
            )
        )
    skipped = {id(node) for node in squeezes.values() if node is not None}
    body.node.extend(node for node in source.node if id(node) not in skipped)
    body.initializer.extend(source.initializer)
    body.sparse_initializer.extend(source.sparse_initializer)
    loss_type = types[loss].tensor_type
    batch_loss = unique("batch_loss")
    # [] or [1] -> [] (exact: a mean of one number); a loss of several numbers counts by its mean
    body.node.append(helper.make_node("ReduceMean", [loss], [batch_loss], name=unique("epoch_loss"), keepdims=0))
    body.output.extend([helper.make_value_info(out, types[name]) for name, out in carried])
    body.output.append(helper.make_tensor_value_info(batch_loss, loss_type.elem_type, []))
    drop_unread_initializers(body)  # the axes of the squeezes skipped

    graph = onnx.GraphProto()
    graph.name = f"{source.name or 'fused'}_epoch"
    pairs = [(unique(f"{name}.before"), unique(f"{name}.after")) for name, _ in carried]
    for (name, _), (before, after) in zip(carried, pairs, strict=True):
        graph.input.append(helper.make_value_info(before, types[name]))
        graph.output.append(helper.make_value_info(after, types[name]))
    data = {name: unique(f"{name}.batches") for name in batches}
    for name, shape in batches.items():
        elem = types[name].tensor_type.elem_type
        graph.input.append(helper.make_tensor_value_info(data[name], elem, ["batches", *shape]))
    sequences = {name: unique("learning_rates" if name == learning_rate else "steps") for name in numbers}
    scan_inputs = list(data.values())
    for name, sequence in sequences.items():
        graph.input.append(helper.make_tensor_value_info(sequence, types[name].tensor_type.elem_type, ["batches"]))
        if squeezes[name] is None:  # the body takes [1]: [M] -> [M, 1] once
            axes = unique("axes1")
            graph.initializer.append(helper.make_tensor(axes, TensorProto.INT64, [1], [1]))
            column = unique(f"{sequence}.column")
            graph.node.append(helper.make_node("Unsqueeze", [sequence, axes], [column], name=unique("epoch_column")))
            scan_inputs.append(column)
        else:
            scan_inputs.append(sequence)
    graph.input.extend(frozen)
    losses = unique("losses")
    graph.output.append(helper.make_tensor_value_info(losses, loss_type.elem_type, ["batches"]))
    graph.node.append(
        helper.make_node(
            "Scan",
            [*(before for before, _ in pairs), *scan_inputs],
            [*(after for _, after in pairs), losses],
            name=unique("epoch_scan"),
            body=body,
            num_scan_inputs=len(scan_inputs),
        )
    )
    model = helper.make_model(graph, opset_imports=list(fused.opset_import))
    model.ir_version = fused.ir_version
    model.functions.extend(fused.functions)
    return EpochModel(model, tuple(pairs), data, sequences[learning_rate], sequences.get(step), losses)


def _only_squeeze(graph: onnx.GraphProto, name: str) -> onnx.NodeProto | None:
    """The node reading ``name`` where it is the only one and a ``Squeeze`` of axis 0, else ``None``."""
    readers = [node for node in graph.node if name in node.input]
    if len(readers) != 1 or readers[0].op_type != "Squeeze" or readers[0].domain not in ("", "ai.onnx"):
        return None
    node = readers[0]
    if node.input[0] != name:
        return None
    axes = [list(a.ints) for a in node.attribute if a.name == "axes"]
    if len(node.input) > 1 and node.input[1]:
        found = [numpy_helper.to_array(t).tolist() for t in graph.initializer if t.name == node.input[1]]
        axes = found
    return node if axes in ([[0]], [[-1]], []) else None


__all__ = ["Carried", "EpochModel", "epoch_scan_model"]
