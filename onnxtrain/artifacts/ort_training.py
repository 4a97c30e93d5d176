"""Artifacts for ONNX Runtime's on-device training runtime (``target="onnxruntime-training"``), and back.

ONNX Runtime's training build (1.19.2, the last) runs models whose
accumulation and optimizer are its own ``com.microsoft`` kernels, which write
in place and output bool flags:

- training model: each ``<x>_grad.accumulation.out = Where(reset, g, buffer +
  g)`` that onnxtrain writes becomes ``InPlaceAccumulatorV2(buffer, g,
  lazy_reset_grad)``, whose output is bool[1] (:func:`to_inplace_accumulation`);
  the gradient computation stays in standard operators;
- optimizer model: :mod:`onnxtrain.optim.sequence_model`'s ``SequenceOptimizer``
  with ``target="onnxruntime-training"``;
- every model: an IR version and ``ai.onnx`` opset that 1.19.2 loads
  (:func:`check_loadable`).

:func:`to_standard_accumulation` is the inverse, for onnxtrain's runtime on
stock onnxruntime; :func:`per_tensor_optimizer_model` rebuilds a sequence
optimizer model (ONNX Runtime's or onnxblock's) as onnxtrain's own.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper

from onnxtrain import optim
from onnxtrain.artifacts.accumulation import LAZY_RESET_GRAD, accumulated_name, buffer_name
from onnxtrain.graph import empty_base, versions
from onnxtrain.graph.naming import keep_or_tag, names_in
from onnxtrain.graph.passes import prune_unused_nodes
from onnxtrain.optim.emit import LEARNING_RATE, STEP
from onnxtrain.optim.sequence_model import MOMENTS, optimizer_of, sequence_optimizer

ACCUMULATOR = "InPlaceAccumulatorV2"
MS_DOMAIN = "com.microsoft"
#: The newest IR version and ``ai.onnx`` opset ONNX Runtime 1.19.2 loads.
ORT_TRAINING_MAX_IR = 10
ORT_TRAINING_MAX_OPSET = 21


def to_inplace_accumulation(model: onnx.ModelProto, gradients: Sequence[str]) -> onnx.ModelProto:
    """``model`` with ONNX Runtime's in-place accumulators instead of onnxtrain's ``Where``; a new model.

    ``gradients`` names the values whose gradients are accumulated (the
    trainable parameters, in order). Raises ``ValueError`` where an
    accumulation output is not the form onnxtrain writes.
    """
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    producers = {name: node for node in graph.node for name in node.output}
    flags = {}
    for name in gradients:
        out = accumulated_name(name)
        node = producers.get(out)
        if node is None or node.op_type != "Where" or len(node.input) != 3:
            raise ValueError(f"the training model's {out!r} is not the accumulation generate_artifacts writes")
        node.CopyFrom(
            helper.make_node(ACCUMULATOR, [buffer_name(name), node.input[1], LAZY_RESET_GRAD], [out],
                             name=node.name, domain=MS_DOMAIN)
        )  # fmt: skip
        flags[out] = helper.make_tensor_value_info(out, onnx.TensorProto.BOOL, [1])
    for value in graph.output:
        if value.name in flags:
            value.CopyFrom(flags[value.name])
    kept = [value for value in graph.value_info if value.name not in flags]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    prune_unused_nodes(copy)
    _import(copy, MS_DOMAIN, 1)
    versions.stamp_ir_version(copy)
    return copy


def to_standard_accumulation(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each ``InPlaceAccumulatorV2(buffer, g, flag)`` as ``Where(flag, g, buffer + g)``.

    The output then carries the accumulated gradient (the buffer's type and
    shape) instead of a bool: what onnxtrain's runtime reads on stock
    onnxruntime. Returns ``model`` itself when it has no such node.
    """
    if not any(_is_accumulator(node) for node in model.graph.node):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    fresh = keep_or_tag(names_in(graph), "standard")
    types = {value.name: value.type for value in graph.input}
    axes = fresh("reset_axes")
    reset = fresh("reset")
    graph.initializer.append(onnx.numpy_helper.from_array(np.zeros(1, np.int64), axes))
    nodes = [helper.make_node("Squeeze", [LAZY_RESET_GRAD, axes], [reset], name=fresh("Squeeze"))]
    outputs = {}
    for node in graph.node:
        if not _is_accumulator(node):
            nodes.append(node)
            continue
        buffer, gradient, _flag = node.input
        summed = fresh(f"{gradient}_sum")
        nodes.append(helper.make_node("Add", [buffer, gradient], [summed], name=fresh("Add")))
        nodes.append(helper.make_node("Where", [reset, gradient, summed], [node.output[0]], name=fresh("Where")))
        outputs[node.output[0]] = types.get(buffer)
    del graph.node[:]
    graph.node.extend(nodes)
    for value in graph.output:
        if outputs.get(value.name) is not None:
            value.type.CopyFrom(outputs[value.name])
    kept = [value for value in graph.value_info if value.name not in outputs]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    if not any(node.domain == MS_DOMAIN for node in graph.node):
        kept_imports = [o for o in copy.opset_import if o.domain != MS_DOMAIN]
        del copy.opset_import[:]
        copy.opset_import.extend(kept_imports)
    return copy


def _is_accumulator(node: onnx.NodeProto) -> bool:
    return node.op_type == ACCUMULATOR and node.domain == MS_DOMAIN and len(node.input) == 3


def is_sequence_optimizer_model(model: onnx.ModelProto) -> bool:
    """Whether ``model`` takes ONNX Runtime's ``params`` and ``gradients`` sequences."""
    names = {value.name: value for value in model.graph.input}
    return all(n in names and names[n].type.HasField("sequence_type") for n in ("params", "gradients"))


def ort_training_optimizer_model(
    optimizer: optim.Optimizer, parameters: tuple[list[onnx.TensorProto], list[onnx.TensorProto]], opset: int
) -> onnx.ModelProto:
    """The ``com.microsoft`` optimizer model computing ``optimizer``'s step, as ONNX Runtime's runtime loads it.

    ``ValueError`` for an optimizer ONNX Runtime's runtime lacks (it names those it has).
    """
    block = sequence_optimizer(optimizer, "onnxruntime-training")
    with empty_base(opset_version=opset):
        block(parameters)
    return block.to_model_proto()


def per_tensor_optimizer_model(
    model: onnx.ModelProto, parameters: Sequence[optim.ParameterSpec], opset: int
) -> onnx.ModelProto:
    """onnxtrain's optimizer model (one input per tensor) computing the step a sequence model describes.

    ``ValueError`` when the model's optimizer cannot be read (neither ONNX
    Runtime's ``AdamWOptimizer``/``SGDOptimizerV2`` nor onnxblock's metadata).
    """
    optimizer = optimizer_of(model)
    if optimizer is None:
        raise ValueError(
            "the optimizer model takes sequences (params, gradients, ...), but it is neither ONNX Runtime's "
            "AdamWOptimizer or SGDOptimizerV2 nor an onnxtrain.onnxblock.optim model: its step is unknown"
        )
    with empty_base(opset_version=max(opset, versions.MIN_OPSET)):
        optimizer(list(parameters))
    per_tensor = optimizer.to_model_proto()
    kept = len(optimizer.state_specs())
    moments = sum(1 for value in model.graph.input if value.name in MOMENTS)
    return _with_unread_moments(per_tensor, parameters, range(kept, moments))


def _with_unread_moments(
    model: onnx.ModelProto, parameters: Sequence[optim.ParameterSpec], indices: range
) -> onnx.ModelProto:
    """``model`` with state tensors ``p.momentum<i>`` (``i`` in ``indices``) that the step passes on unchanged.

    ONNX Runtime keeps a ``first_order_moments`` sequence for SGD, which
    ``SGDOptimizerV2`` does not read; its checkpoints hold a ``momentum0`` per
    parameter, and its runtime needs one to resume. Each added state is an
    input ``p.momentum<i>`` and an output ``p.momentum<i>.updated`` (an
    ``Identity``), in the interface's order.
    """
    if not indices:
        return model
    graph = model.graph
    inputs = {value.name: value for value in graph.input}
    outputs = {value.name: value for value in graph.output}
    for spec in parameters:
        for index in indices:
            name = optim.state_name(spec.name, index)
            inputs[name] = _renamed(inputs[spec.name], name)
            outputs[optim.updated_name(name)] = _renamed(inputs[spec.name], optim.updated_name(name))
            graph.node.append(helper.make_node("Identity", [name], [optim.updated_name(name)], name=f"unread_{name}"))
    states = {spec.name: [optim.state_name(spec.name, i) for i in range(indices.stop)] for spec in parameters}
    input_order = [LEARNING_RATE, STEP] + [n for p, s in states.items() for n in (p, optim.grad_name(p), *s)]
    output_order = [optim.updated_name(n) for p, s in states.items() for n in (p, *s)]
    del graph.input[:]
    graph.input.extend(inputs[name] for name in input_order)
    del graph.output[:]
    graph.output.extend(outputs[name] for name in output_order)
    return model


def _renamed(value: onnx.ValueInfoProto, name: str) -> onnx.ValueInfoProto:
    copy = onnx.ValueInfoProto()
    copy.CopyFrom(value)
    copy.name = name
    return copy


def check_loadable(models: dict[str, onnx.ModelProto]) -> None:
    """``ValueError`` unless ONNX Runtime 1.19.2 loads each model's IR version and ``ai.onnx`` opset."""
    for name, model in models.items():
        opset = versions.opset_version(model, "") or 0
        if model.ir_version > ORT_TRAINING_MAX_IR or opset > ORT_TRAINING_MAX_OPSET:
            raise ValueError(
                f"the {name} needs IR version {model.ir_version} and ai.onnx opset {opset}, but ONNX Runtime's "
                f"training runtime (1.19.2) loads at most IR {ORT_TRAINING_MAX_IR} and opset "
                f"{ORT_TRAINING_MAX_OPSET}: export the base model at opset {ORT_TRAINING_MAX_OPSET} or older"
            )


#: ONNX Runtime's training kernels: only its training build has them, not the stock package.
TRAINING_KERNELS = ("InPlaceAccumulatorV2", "AdamWOptimizer", "SGDOptimizerV2", "InplaceClipGradNorm")


def check_ort_format(models: dict[str, onnx.ModelProto]) -> None:
    """``ValueError`` when stock onnxruntime's ``.ort`` converter cannot convert one of ``models``.

    The converter loads each model in stock onnxruntime, which has no kernel
    for ONNX Runtime's training operators.
    """
    for name, model in models.items():
        used = sorted({n.op_type for n in model.graph.node if n.domain == MS_DOMAIN and n.op_type in TRAINING_KERNELS})
        if used:
            raise ValueError(
                f"ort_format=True: the {name} uses com.microsoft {used}, kernels of ONNX Runtime's training build "
                "only, and the .ort converter of the stock onnxruntime package loads every model it converts, so "
                "it cannot convert these artifacts. Convert them with the training build's own converter "
                "(python -m onnxruntime.tools.convert_onnx_models_to_ort, in onnxruntime-training), or pass "
                "ort_format=False; target='onnxruntime' artifacts convert with stock onnxruntime"
            )


def _import(model: onnx.ModelProto, domain: str, version: int) -> None:
    if versions.opset_version(model, domain) is None:
        model.opset_import.append(helper.make_opsetid(domain, version))


__all__ = [
    "ACCUMULATOR",
    "ORT_TRAINING_MAX_IR",
    "ORT_TRAINING_MAX_OPSET",
    "TRAINING_KERNELS",
    "check_loadable",
    "check_ort_format",
    "is_sequence_optimizer_model",
    "ort_training_optimizer_model",
    "per_tensor_optimizer_model",
    "to_inplace_accumulation",
    "to_standard_accumulation",
]
