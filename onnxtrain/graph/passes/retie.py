"""Tied weights that an exporter split into a weight and a constant transpose of it, tied again.

A language model whose output layer is its input embedding transposed (GPT-2,
and every model with ``tie_word_embeddings``) reads one parameter twice: the
embedding ``E`` by a ``Gather``, and ``E^T`` by the head's ``MatMul``. torch's
TorchScript exporter with constant folding (its default, and Hugging Face
Optimum's) computes that transpose at export time and stores it as a second
initializer (``onnx::MatMul_658``). Trained as exported, the embedding and the
head would be two parameters; torch trains one. :func:`tie_transposed_copies`
reads such a copy as ``Transpose(E)`` again, so that both uses train ``E``.

A copy is recognised by value: a 2-D initializer ``C`` that equals the
transpose of another, ``E``, of the same element type, at :data:`SAMPLES`
positions spread over it (bit for bit), the first elements included, where
those values are not all one number (two zero matrices are not tied). Of the
two, the copy is the one the exporter named (``onnx::...``), else the one
listed later. Random weights are never equal by chance at that many
positions; reading a few hundred elements keeps the check cheap for a model of
gigabytes, whose data stays in its file.

Equal copies are left alone: the exporter merges equal constants into one
read through ``Identity`` nodes (:mod:`onnxtrain.graph.passes.untie`), and two
initializers of equal values that it kept apart are two parameters that were
equal when exported (``nn.TransformerEncoder`` copies one layer to make its
layers), which torch trains apart.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from onnxtrain.graph import dtypes
from onnxtrain.graph.external import TensorData
from onnxtrain.graph.naming import GENERATED
from onnxtrain.graph.walk import all_nodes

#: Positions at which a copy must equal the transpose of its source.
SAMPLES = 256
#: The first elements of row 0 and of column 0 compared before any sample.
FIRST = 4

#: The first elements of a tensor's row 0 and of its column 0, as bytes.
Corner = tuple[tuple[bytes, ...], tuple[bytes, ...]]


def transposed_copies(model: onnx.ModelProto, data: TensorData | None = None) -> dict[str, str]:
    """``{copy: source}`` for each 2-D floating-point initializer of ``model`` that holds another one transposed
    (see the module docstring), both read by its nodes; ``data``: where the values are, for a light model
    (inline values by default). Each tensor is in one pair at most."""
    data = TensorData() if data is None else data
    graph = model.graph
    read = {name for node in all_nodes(graph) for name in node.input}
    tensors = [t for t in graph.initializer if len(t.dims) == 2 and dtypes.is_float(t.data_type) and t.name in read]
    shapes = {(t.data_type, *t.dims) for t in tensors}
    tensors = [t for t in tensors if (t.data_type, t.dims[1], t.dims[0]) in shapes]  # each with a partner to be
    tensors.sort(key=lambda t: t.name.startswith(GENERATED))  # the exporter's constants are the copies
    corners = {t.name: corner for t in tensors if (corner := _corner(t, data)) is not None}
    tensors = [t for t in tensors if t.name in corners]  # those whose values can be read
    found: dict[str, str] = {}
    paired: set[str] = set()
    for index, source in enumerate(tensors):
        for copy in tensors[index + 1 :]:
            if paired & {source.name, copy.name} or copy.data_type != source.data_type:
                continue
            if tuple(copy.dims) != tuple(source.dims[::-1]) or corners[copy.name] != corners[source.name][::-1]:
                continue  # the corners: row 0 and column 0 of one are column 0 and row 0 of the other
            if _transposes(copy, source, data):
                found[copy.name] = source.name
                paired.update((source.name, copy.name))
                break
    return found


def tie_transposed_copies(
    model: onnx.ModelProto, *, data: TensorData | None = None, copies: dict[str, str] | None = None
) -> onnx.ModelProto:
    """``model`` with each of ``copies`` (by default :func:`transposed_copies` of ``model``, its values read
    from ``data``) made ``Transpose(source)`` under its own name, in place: the node first in the graph, the
    copy's initializer removed."""
    copies = transposed_copies(model, data) if copies is None else copies
    if not copies:
        return model
    graph = model.graph
    for index in reversed(range(len(graph.initializer))):
        if graph.initializer[index].name in copies:
            del graph.initializer[index]
    for position, (copy, source) in enumerate(copies.items()):
        node = helper.make_node("Transpose", [source], [copy], name=f"{copy}.tied", perm=[1, 0])
        graph.node.insert(position, node)
    return model


def _corner(tensor: onnx.TensorProto, data: TensorData) -> Corner | None:
    """The first :data:`FIRST` elements of ``tensor``'s row 0 and of its column 0, as bytes; ``None`` where its
    values cannot be read (a light model's, without where they are; a file that is not there)."""
    if not data.reaches(tensor):
        return None
    rows, columns = tensor.dims
    row = list(range(min(FIRST, columns)))
    column = [i * columns for i in range(min(FIRST, rows))]
    itemsize = dtypes.to_numpy_dtype(tensor.data_type).itemsize
    try:
        elements = data.elements(tensor, row + column, itemsize)
    except ValueError:  # generation says what is wrong with the file, where it reads the weights
        return None
    return tuple(elements[: len(row)]), tuple(elements[len(row) :])


def _transposes(copy: onnx.TensorProto, source: onnx.TensorProto, data: TensorData) -> bool:
    """Whether ``copy`` equals ``source`` transposed at :data:`SAMPLES` positions, and those values of
    ``source`` are not all equal."""
    rows, columns = source.dims
    count = rows * columns
    drawn = np.random.default_rng(count).integers(0, count, size=SAMPLES)
    positions = np.unique(np.concatenate([np.arange(min(FIRST, count)), drawn]))
    at_copy = (positions % columns) * rows + positions // columns  # source[i, j] is copy[j, i]
    itemsize = dtypes.to_numpy_dtype(source.data_type).itemsize
    in_source = data.elements(source, positions.tolist(), itemsize)
    if len(set(in_source)) < 2:
        return False
    return data.elements(copy, at_copy.tolist(), itemsize) == in_source


__all__ = ["FIRST", "SAMPLES", "tie_transposed_copies", "transposed_copies"]
