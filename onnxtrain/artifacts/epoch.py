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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxtrain.artifacts.vectorize import Pack, ParameterUpdate, flatten_and_concat, pack_updates, split_and_reshape
from onnxtrain.graph.fold import ShapeInference, onnx_shapes
from onnxtrain.graph.io import copy_model
from onnxtrain.graph.naming import keep_or_tag, names_in
from onnxtrain.graph.passes import drop_unread_initializers, fold_static_shapes
from onnxtrain.graph.versions import is_standard
from onnxtrain.losses.label_check import LabelCheck, strip_label_checks, strippable_label_checks

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
    label_checks: tuple[LabelCheck, ...] = ()  # taken out of the body: the caller checks those labels first


#: Element-wise operators that a per-iteration scalar computation may be made of to be hoisted out of the body.
HOISTABLE = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Cast", "Neg", "Reciprocal", "Exp", "Log"})


def epoch_scan_model(
    fused: onnx.ModelProto,
    carried: Sequence[Carried],
    batches: Mapping[str, Sequence[int]],
    loss: str,
    learning_rate: str,
    step: str,
    updates: Sequence[ParameterUpdate] = (),
    shapes_of: ShapeInference = onnx_shapes,
    *,
    unpack_with_slices: bool = False,
) -> EpochModel:
    """A ``Scan`` over batches whose body is ``fused`` (see the module docstring).

    ``fused``: the fused step's model, whose inputs are the user inputs (the
    keys of ``batches``, each with the shape of one batch), the carried
    tensors' inputs, ``learning_rate`` and ``step`` (both ``[1]``) and the
    frozen parameters. Its computations that depend only on the shapes, now
    fixed, are folded into constants (:mod:`onnxtrain.graph.passes.static_shapes`), and those
    that depend only on the step number and the learning rate (an update's
    bias corrections and step size) are computed for every iteration at once,
    before the ``Scan``, and scanned in. The chains of ``updates`` (the
    optimizer's per-parameter updates) that are the same element-wise
    computation run once on packed tensors (:mod:`onnxtrain.artifacts.vectorize`),
    packed before the ``Scan`` and unpacked after it. The label checks of
    losses over the scanned labels (:mod:`onnxtrain.losses.label_check`) are
    taken out: :attr:`EpochModel.label_checks`, for the caller to run on the
    whole data first. ``shapes_of`` infers the shapes these steps need;
    ``unpack_with_slices`` unpacks with ``Slice`` nodes rather than ``Split``
    (for CUDA: :mod:`onnxtrain.artifacts.vectorize`). ``fused`` is not changed.
    """
    folded = fold_static_shapes(copy_model(fused), shapes=batches, shapes_of=shapes_of)
    checks = strippable_label_checks(folded, batches)
    strip_label_checks(folded, inputs=batches)
    unique = keep_or_tag(names_in(folded.graph), "epoch")
    packed_model, packs = (folded, [])
    if updates:
        packed_model, packs = pack_updates(folded, updates, unique, shapes_of, slices=unpack_with_slices)
    source = packed_model.graph
    packed_members = {member for pack in packs for member in pack.members}
    outer_carried = list(carried)  # the model's inputs and outputs: one per tensor
    carried = [pair for pair in carried if pair not in packed_members] + [pack.carried for pack in packs]
    types = {value.name: value.type for value in (*source.input, *source.output)}
    read = {name for node in source.node for name in node.input}
    per_step = {*batches, *(name for name, _ in carried), learning_rate, step}
    frozen = [value for value in source.input if value.name not in per_step]
    numbers = [learning_rate, *([step] if step in read else [])]  # per iteration, [1] each
    squeezes = {name: _only_squeeze(source, name) for name in numbers}
    skipped = {id(node) for node in squeezes.values() if node is not None}
    # per iteration, as the body reads it: [1], or the scalar its only Squeeze made
    scalars = {name: (name if squeezes[name] is None else squeezes[name].output[0]) for name in numbers}
    elem_types = {scalars[name]: types[name].tensor_type.elem_type for name in numbers}
    nodes = [node for node in source.node if id(node) not in skipped]
    constants = {t.name: t for t in source.initializer}
    rank0 = {scalars[name] for name in numbers if squeezes[name] is not None}
    hoisted, nodes = _hoistable(nodes, rank0, constants, elem_types)

    body = onnx.GraphProto()
    body.name = f"{source.name or 'fused'}_epoch_body"
    body.input.extend([helper.make_value_info(name, types[name]) for name, _ in carried])
    for name, shape in batches.items():
        body.input.append(helper.make_tensor_value_info(name, types[name].tensor_type.elem_type, shape))
    still_read = {name for node in nodes for name in node.input} | {out for _, out in carried} | {loss}
    hoisted_outputs = [node.output[0] for node in hoisted]  # scalars, as the squeezed rate and step
    per_iteration = [name for name in (*scalars.values(), *hoisted_outputs) if name in still_read]
    for name in per_iteration:
        rank0_or_1 = [] if name in rank0 or name in hoisted_outputs else [1]
        body.input.append(helper.make_tensor_value_info(name, elem_types[name], rank0_or_1))
    body.node.extend(nodes)
    body.initializer.extend(source.initializer)
    body.sparse_initializer.extend(source.sparse_initializer)
    loss_type = types[loss].tensor_type
    if loss_type.HasField("shape") and not loss_type.shape.dim:
        batch_loss = loss  # a scalar already
    else:  # [1] -> [] (exact: a mean of one number); a loss of several numbers counts by its mean
        batch_loss = unique("batch_loss")
        body.node.append(helper.make_node("ReduceMean", [loss], [batch_loss], name=unique("epoch_loss"), keepdims=0))
    body.output.extend([helper.make_value_info(out, types[name]) for name, out in carried])
    body.output.append(helper.make_tensor_value_info(batch_loss, loss_type.elem_type, []))
    body = drop_unread_initializers(onnx.ModelProto(graph=body)).graph  # the squeezes' axes, the constants hoisted

    graph = onnx.GraphProto()
    graph.name = f"{source.name or 'fused'}_epoch"
    tensor_types = {value.name: value.type for value in (*folded.graph.input, *folded.graph.output)}
    pairs = [(unique(f"{name}.before"), unique(f"{name}.after")) for name, _ in outer_carried]
    for (name, _), (before, after) in zip(outer_carried, pairs, strict=True):
        graph.input.append(helper.make_value_info(before, tensor_types[name]))
        graph.output.append(helper.make_value_info(after, tensor_types[name]))
    outer_of = dict(zip(outer_carried, pairs, strict=True))
    states = [outer_of[pair] for pair in carried if pair in outer_of]
    unpacking = [_pack_before(graph, pack, outer_of, states, unique, unpack_with_slices) for pack in packs]
    data = {name: unique(f"{name}.batches") for name in batches}
    for name, shape in batches.items():
        elem = types[name].tensor_type.elem_type
        graph.input.append(helper.make_tensor_value_info(data[name], elem, ["batches", *shape]))
    sequences = {name: unique("learning_rates" if name == learning_rate else "steps") for name in numbers}
    outer: dict[str, str] = {}  # a per-iteration value of the body -> its sequence over the iterations
    for name, sequence in sequences.items():
        graph.input.append(helper.make_tensor_value_info(sequence, types[name].tensor_type.elem_type, ["batches"]))
        if squeezes[name] is None:  # the body takes [1]: [M] -> [M, 1] once
            axes = unique("axes1")
            graph.initializer.append(helper.make_tensor(axes, TensorProto.INT64, [1], [1]))
            column = unique(f"{sequence}.column")
            graph.node.append(helper.make_node("Unsqueeze", [sequence, axes], [column], name=unique("epoch_column")))
            outer[name] = column
        else:
            outer[scalars[name]] = sequence
    for node in hoisted:  # the same element-wise operations, on [M] instead of []
        inputs = []
        for name in node.input:
            if name not in outer:
                copy = graph.initializer.add()
                copy.CopyFrom(constants[name])
                copy.name = outer[name] = unique(f"{name}.hoisted")
            inputs.append(outer[name])
        outer[node.output[0]] = unique(f"{node.output[0]}.per_batch")
        graph.node.append(
            helper.make_node(
                node.op_type,
                inputs,
                [outer[node.output[0]]],
                name=unique(f"{node.name or node.op_type}.hoisted"),
                domain=node.domain,
            )
        )
        graph.node[-1].attribute.extend(node.attribute)
    scan_inputs = [*data.values(), *(outer[name] for name in per_iteration)]
    graph.input.extend(frozen)
    losses = unique("losses")
    graph.output.append(helper.make_tensor_value_info(losses, loss_type.elem_type, ["batches"]))
    graph.node.append(
        helper.make_node(
            "Scan",
            [*(before for before, _ in states), *scan_inputs],
            [*(after for _, after in states), losses],
            name=unique("epoch_scan"),
            body=body,
            num_scan_inputs=len(scan_inputs),
        )
    )
    for nodes in unpacking:  # after the Scan: the packed tensors back into one output per tensor
        graph.node.extend(nodes)
    model = helper.make_model(graph, opset_imports=list(fused.opset_import))
    model.ir_version = fused.ir_version
    model.functions.extend(fused.functions)
    model.metadata_props.extend(fused.metadata_props)
    steps = sequences.get(step)
    return EpochModel(model, tuple(pairs), data, sequences[learning_rate], steps, losses, tuple(checks))


def _pack_before(
    graph: onnx.GraphProto,
    pack: Pack,
    outer_of: Mapping[Carried, tuple[str, str]],
    states: list[tuple[str, str]],
    unique: Callable[[str], str],
    slices: bool,
) -> list[onnx.NodeProto]:
    """Pack the members' inputs into the pack's state before the ``Scan`` (nodes added to ``graph``, the state
    to ``states``); the nodes that unpack its final value into the members' outputs, to add after it (by
    ``Slice`` nodes with ``slices``)."""
    packed_before, packed_after = unique(f"{pack.carried[0]}.before"), unique(f"{pack.carried[0]}.after")
    befores = [outer_of[member][0] for member in pack.members]
    graph.node.extend(flatten_and_concat(befores, pack.shapes, packed_before, unique, graph.initializer))
    states.append((packed_before, packed_after))
    afters = [outer_of[member][1] for member in pack.members]
    return split_and_reshape(packed_after, pack.shapes, afters, unique, graph.initializer, slices=slices)


def _hoistable(
    nodes: Sequence[onnx.NodeProto],
    scalars: set[str],
    constants: Mapping[str, onnx.TensorProto],
    elem_types: dict[str, int],
) -> tuple[list[onnx.NodeProto], list[onnx.NodeProto]]:
    """``(hoisted, kept)``: the nodes of :data:`HOISTABLE` computing a scalar from ``scalars`` (per-iteration
    scalars) and scalar constants only, in order, and the others. Records the hoisted outputs' element types
    in ``elem_types``."""
    hoisted, kept = [], []
    per_iteration = set(scalars)
    for node in nodes:
        inputs = [name for name in node.input if name]
        takes = all(name in per_iteration or (name in constants and not constants[name].dims) for name in inputs)
        if (
            node.op_type in HOISTABLE
            and is_standard(node)
            and len(node.output) == 1
            and takes
            and any(name in per_iteration for name in inputs)
        ):
            hoisted.append(node)
            per_iteration.add(node.output[0])
            first = inputs[0]
            cast_to = next((a.i for a in node.attribute if a.name == "to"), None)
            elem_types[node.output[0]] = (
                cast_to
                if cast_to is not None
                else elem_types.get(first, constants[first].data_type if first in constants else 0)
            )
        else:
            kept.append(node)
    return hoisted, kept


def _only_squeeze(graph: onnx.GraphProto, name: str) -> onnx.NodeProto | None:
    """The node reading ``name`` where it is the only one and a ``Squeeze`` of axis 0, else ``None``."""
    readers = [node for node in graph.node if name in node.input]
    if len(readers) != 1 or readers[0].op_type != "Squeeze" or not is_standard(readers[0]):
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
