"""One model for a whole step: the optimizer's update, then a train step on the updated parameters.

The runtime's fast path (docs/runtime.md, "The fused step"). ``optimizer.step()``
only records the update; the next train step that starts from reset
gradients applies it and trains in one onnxruntime run, updating the
parameters, moments and gradients in place. :func:`fuse_update_and_train`
builds that model from the two artifacts:

- the optimizer model first, as it is: it reads the parameters, the
  gradients of the last train step (``<p>_grad``), the moments,
  ``learning_rate`` and ``step``, and writes ``<p>.updated`` and
  ``<p>.momentumK.updated``;
- then the training model with ``lazy_reset_grad`` taken as true
  (:func:`~onnxtrain.artifacts.accumulation.remove_gradient_accumulation`:
  each gradient ``g`` is an output of its own, and neither the accumulation
  buffers nor the flag are inputs any more), reading ``<p>.updated`` wherever
  it read a trainable ``<p>``.

Outputs: the training model's (loss, additional outputs, gradients, running
statistics), then the optimizer model's. The optimizer model's nodes come
first, so that onnxruntime's priority-based order runs the whole update before
any node of the train step. Names of the optimizer model that the training
model already uses for something else are renamed; :class:`FusedModel` says
what each became. Both models must import the same opset version for every
domain they share (``generate_artifacts`` writes them so); otherwise
:class:`FusionError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import onnx

from onnxtrain.artifacts.accumulation import AccumulationFormError, remove_gradient_accumulation
from onnxtrain.artifacts.vectorize import ParameterUpdate
from onnxtrain.graph.naming import keep_or_tag, names_in
from onnxtrain.graph.passes.recompute import RECOMPUTED_KEY
from onnxtrain.graph.walk import names_read
from onnxtrain.optim.base import grad_name, state_name, updated_name


class FusionError(ValueError):
    """The training and optimizer models cannot be merged into one (the runtime then runs them apart)."""


@dataclass(frozen=True)
class FusedModel:
    """The merged model, and where each name of the two artifacts went.

    ``gradients[p]``: the output holding ``p``'s gradient. ``renamed``: the
    optimizer model's inputs and outputs whose names changed (absent: kept).
    """

    model: onnx.ModelProto
    gradients: Mapping[str, str]
    renamed: Mapping[str, str]

    def name_of(self, optimizer_name: str) -> str:
        """The fused model's name for an input or output of the optimizer model."""
        return self.renamed.get(optimizer_name, optimizer_name)

    def parameter_updates(self, trainable: Sequence[str]) -> list[ParameterUpdate]:
        """Per parameter of ``trainable``, the fused model's names for it, its moments (the optimizer model's
        ``<p>.momentumK``, K = 0, 1... while it has them) and its gradient, as read and written, and its shape."""
        declared = {value.name: value.type.tensor_type.shape for value in self.model.graph.input}
        updates = []
        for p in trainable:
            moments = []
            while (name := self.name_of(state_name(p, len(moments)))) in declared:
                moments.append((name, self.name_of(updated_name(state_name(p, len(moments))))))
            parameter, gradient = self.name_of(p), self.name_of(grad_name(p))
            shape = tuple(d.dim_value for d in declared[parameter].dim)
            pair = (parameter, self.name_of(updated_name(p)))
            updates.append(ParameterUpdate(pair, tuple(moments), (gradient, self.gradients[p]), shape))
        return updates


def fuse_update_and_train(
    training: onnx.ModelProto, optimizer: onnx.ModelProto, trainable: Sequence[str]
) -> FusedModel:
    """The optimizer model, then the training model (accumulation removed) on the updated parameters.

    ``trainable``: the parameters both models share, which the optimizer updates.
    Any other input of both that the optimizer writes as ``<name>.updated``
    (the loss scale of :mod:`onnxtrain.optim.loss_scaling`) is read updated by
    the training model too. Neither model is changed.
    """
    opsets = _merged_opsets(training, optimizer)
    try:
        reset = remove_gradient_accumulation(training, trainable)
    except AccumulationFormError as error:
        raise FusionError(str(error)) from error
    steps, gradients = reset.model.graph, reset.gradients
    unique = keep_or_tag(names_in(steps), "fused")  # the optimizer model's names the training model uses
    # what both models read and the optimizer updates: the parameters, and state such as the loss scale
    training_inputs = {value.name for value in training.graph.input}
    optimizer_outputs = {value.name for value in optimizer.graph.output}
    state = [
        value.name
        for value in optimizer.graph.input
        if value.name in training_inputs
        and value.name not in trainable
        and updated_name(value.name) in optimizer_outputs
    ]
    shared = set(trainable) | set(state)
    graph = onnx.GraphProto()
    graph.name = f"{training.graph.name or 'training'}_fused_step"
    graph.input.extend(steps.input)
    mapping: dict[str, str] = {p: p for p in shared}
    optimizer_inputs = {value.name for value in optimizer.graph.input}
    missing = [grad_name(p) for p in trainable if grad_name(p) not in optimizer_inputs]
    missing += [p for p in trainable if p not in optimizer_inputs]
    if missing:
        raise FusionError(f"the optimizer model lacks the input(s) {missing}")
    for value in optimizer.graph.input:
        if value.name in shared:
            continue
        mapping[value.name] = unique(value.name)
        copy = graph.input.add()
        copy.CopyFrom(value)
        copy.name = mapping[value.name]
    for tensor in optimizer.graph.initializer:
        copy_tensor = graph.initializer.add()
        copy_tensor.CopyFrom(tensor)
        copy_tensor.name = mapping[tensor.name] = unique(tensor.name)
    for node in optimizer.graph.node:  # in topological order: what a node reads is mapped already
        for name in node.output:
            if name and name not in mapping:
                mapping[name] = unique(name)
        copy_node = graph.node.add()
        copy_node.CopyFrom(node)
        copy_node.input[:] = [mapping.get(name, name) if name else name for name in node.input]
        copy_node.output[:] = [mapping[name] if name else name for name in node.output]
        if node.name:
            copy_node.name = unique(node.name)
    ends = [value.name for value in (*optimizer.graph.input, *optimizer.graph.output)]

    updated = {p: mapping[updated_name(p)] for p in [*trainable, *state]}
    for node in steps.node:
        if any(name in shared for name in names_read(node) - set(node.input)):
            raise FusionError(f"a subgraph of node {node.name or node.op_type!r} reads a trainable parameter")
        copy_node = graph.node.add()
        copy_node.CopyFrom(node)
        copy_node.input[:] = [updated.get(name, name) for name in node.input]
    graph.initializer.extend(steps.initializer)
    graph.value_info.extend(steps.value_info)
    graph.output.extend(steps.output)
    for value in optimizer.graph.output:
        copy = graph.output.add()
        copy.CopyFrom(value)
        copy.name = mapping[value.name]

    model = onnx.helper.make_model(graph, opset_imports=opsets)
    model.ir_version = max(training.ir_version, optimizer.ir_version)
    model.functions.extend(training.functions)
    model.functions.extend(optimizer.functions)
    # the record of recomputed values holds here too (the runtime's session keeps the copies apart)
    model.metadata_props.extend(prop for prop in training.metadata_props if prop.key == RECOMPUTED_KEY)
    return FusedModel(model, gradients, {name: mapping[name] for name in ends if mapping[name] != name})


def _merged_opsets(*models: onnx.ModelProto) -> list[onnx.OperatorSetIdProto]:
    versions: dict[str, int] = {}
    for model in models:
        for entry in model.opset_import:
            domain = "" if entry.domain == "ai.onnx" else entry.domain
            if versions.setdefault(domain, entry.version) != entry.version:
                raise FusionError(
                    f"the training and optimizer models import opset {versions[domain]} and {entry.version} of "
                    f"domain {domain or 'ai.onnx'!r}; one model needs one version"
                )
    return [onnx.helper.make_opsetid(domain, version) for domain, version in versions.items()]


__all__ = ["FusedModel", "FusionError", "fuse_update_and_train"]
