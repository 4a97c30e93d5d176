"""Parameters that an exporter merged because their values were equal, given back their own initializers.

torch's TorchScript exporter (``torch.onnx.export(..., dynamo=False)``, in
its default evaluation mode, and Hugging Face Optimum through it) stores
parameters of equal values once: each duplicate becomes an ``Identity`` of the
first, whose output keeps the duplicate's name. A freshly initialised model
has many (every zero bias of a layer, every unit LayerNorm scale), and
trained as exported they would be one tensor, the sum of their gradients
applied to all. torch trains them apart, so :func:`untie_identity_copies`
makes each such ``Identity`` output an initializer of its own, a copy of the
value under the name it has (a tensor stored outside the model is copied by
reference: both read the same bytes until training writes them).

An ``Identity`` of an initializer that nothing else reads (a converter's
``read`` of a variable) shares nothing and is left as it is. So is one the
exporter named as a constant it computed (``onnx::MatMul_17``): it merges
those by value too, and two equal constants computed from parameters are
the one parameter read twice (a layer applied twice, as ALBERT's, whose
weight's transpose is folded at each application) as often as two
parameters equal when exported (copies of one layer, as
``nn.TransformerEncoder`` makes); the graph keeps them tied, as exported.
"""

from __future__ import annotations

from collections import Counter

import onnx

from onnxtrain.graph import dtypes
from onnxtrain.graph.naming import GENERATED
from onnxtrain.graph.versions import is_standard
from onnxtrain.graph.walk import all_nodes


def identity_copies(model: onnx.ModelProto) -> dict[str, str]:
    """``{value: initializer}`` for each top-level ``Identity`` that copies a floating-point initializer which
    another node reads too (:func:`untie_identity_copies` unties them); the graph's outputs and the exporter's
    computed constants are left out."""
    graph = model.graph
    initializers = {t.name for t in graph.initializer if dtypes.is_float(t.data_type)}
    outputs = {value.name for value in graph.output}
    readers = Counter(name for node in all_nodes(graph) for name in set(node.input) if name in initializers)
    return {
        node.output[0]: node.input[0]
        for node in graph.node
        if node.op_type == "Identity"
        and is_standard(node)
        and len(node.input) == 1
        and node.input[0] in initializers
        and readers[node.input[0]] >= 2
        and node.output[0] not in outputs
        and not node.output[0].startswith(GENERATED)
    }


def untie_identity_copies(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each of :func:`identity_copies` an initializer of its own (see the module docstring), and
    without the initializers nothing reads any more, in place."""
    copies = identity_copies(model)
    if not copies:
        return model
    graph = model.graph
    tensors = {t.name: t for t in graph.initializer}
    nodes = [node for node in graph.node if not (node.op_type == "Identity" and node.output[0] in copies)]
    del graph.node[:]
    graph.node.extend(nodes)
    for name, source in copies.items():
        tensor = graph.initializer.add()
        tensor.CopyFrom(tensors[source])
        tensor.name = name
    read = {name for node in all_nodes(graph) for name in node.input} | {value.name for value in graph.output}
    unread = set(copies.values()) - read
    for index in reversed(range(len(graph.initializer))):  # in place: no tensor's data is copied
        if graph.initializer[index].name in unread:
            del graph.initializer[index]
    return model


__all__ = ["identity_copies", "untie_identity_copies"]
