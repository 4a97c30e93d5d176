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
``read`` of a variable) shares nothing and is left as it is, and so is one
that a ``BatchNormalization`` reads as its running statistics: torch's
dynamo exporter writes a module called twice (SimCLR's head over two views)
so, and both calls update one buffer. The exporter
merges the constants it computes from parameters (``onnx::MatMul_17``, a
weight's transpose) the same way, and two equal ones are either one module
applied twice (ALBERT's shared layer: one parameter, which torch trains as
one) or two modules that were equal when exported (``nn.TransformerEncoder``
copies one layer to make its layers: torch trains them apart). The
exporter's node names tell which: they are the module's path and the
operator (``/layers.1/linear2/MatMul``), a module called again having a
``_N`` appended to its name (``/.../ffn_output_1/MatMul``). A computed
constant read by another module than its source is untied; one read by the
same module stays tied; one whose readers' names say neither stays tied, and
:func:`merged_constants` lists it (generation says so).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import onnx

from onnxtrain.graph import dtypes
from onnxtrain.graph.naming import GENERATED
from onnxtrain.graph.torch_metadata import module_path
from onnxtrain.graph.versions import is_standard
from onnxtrain.graph.walk import all_nodes, readers_of

#: The suffix the exporter appends to a module's name in its nodes' names when the module is called again.
_REPEATED = re.compile(r"_\d+$")


def identity_copies(model: onnx.ModelProto) -> dict[str, str]:
    """``{value: initializer}`` for each top-level ``Identity`` that copies a floating-point initializer which
    another node reads too, and which :func:`untie_identity_copies` unties (see the module docstring): the
    graph's outputs are left out, and the exporter's computed constants but those another module reads."""
    return {copy: source for copy, (source, apart) in _merged(model).items() if apart is True}


def merged_constants(model: onnx.ModelProto) -> dict[str, str]:
    """``{value: initializer}`` for each of the exporter's computed constants that an ``Identity`` copies from
    another and whose readers' names do not tell whether they are one module (see the module docstring): left
    tied."""
    return {copy: source for copy, (source, apart) in _merged(model).items() if apart is None}


def _running_statistic(value: str, readers: dict[str, list[onnx.NodeProto]]) -> bool:
    """Whether a ``BatchNormalization`` reads ``value`` as its running mean or variance (inputs 3 and 4)."""
    return any(
        node.op_type == "BatchNormalization" and is_standard(node) and value in node.input[3:5]
        for node in readers.get(value, ())
    )


def _merged(model: onnx.ModelProto) -> dict[str, tuple[str, bool | None]]:
    """``{value: (initializer, apart)}`` for each top-level ``Identity`` (not a graph output) that copies a
    floating-point initializer which another node reads too: ``apart`` whether the two are two parameters
    (``True``), one (``False``) or not known (``None``), from the value's name and the readers' names."""
    graph = model.graph
    initializers = {t.name for t in graph.initializer if dtypes.is_float(t.data_type)}
    outputs = {value.name for value in graph.output}
    readers = readers_of(all_nodes(graph))
    found: dict[str, tuple[str, bool | None]] = {}
    for node in graph.node:
        if node.op_type != "Identity" or not is_standard(node) or len(node.input) != 1:
            continue
        source, copy = node.input[0], node.output[0]
        if source not in initializers or len(readers.get(source, ())) < 2 or copy in outputs:
            continue
        if _running_statistic(copy, readers):  # one buffer that a module called twice reads (dynamo's copy)
            continue
        if not copy.startswith(GENERATED):  # a parameter of torch's, named so
            found[copy] = (source, True)
            continue
        theirs = _modules(r for r in readers[source] if r.op_type != "Identity")
        mine = _modules(readers.get(copy, ()))
        found[copy] = (source, None if not (theirs and mine) else theirs.isdisjoint(mine))
    return found


def _modules(nodes: Iterable[onnx.NodeProto]) -> set[str] | None:
    """The torch modules ``nodes`` belong to (:func:`~onnxtrain.graph.torch_metadata.module_path`:
    ``/layers.1/linear2/MatMul_1`` is ``layers.1.linear2``), each name's ``_N`` of a repeated call dropped;
    ``None`` where a node belongs to none or there is no node."""
    modules = {".".join(_REPEATED.sub("", part) for part in module_path(node).split(".")) for node in nodes}
    return None if not modules or "" in modules else modules


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


__all__ = ["identity_copies", "merged_constants", "untie_identity_copies"]
