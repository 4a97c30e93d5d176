"""What each initializer of a model is, read from how its graph uses it: a weight, a constant, a running statistic.

An ONNX model does not say which of its initializers a framework trained.
torch's exports also store the attention scale, the mask's fill value and
Dropout's ratio as float initializers, and BatchNormalization's running mean
and variance beside its scale and bias. Training all float initializers
trains those too. The role of an initializer is read from the places the
graph reads it, after any ``Identity``, ``Cast`` or ``Transpose`` (an export
in training mode reads ``Linear``'s weight through a ``Transpose``):

- **running statistic**: the mean or variance input (3, 4) of a
  ``BatchNormalization``. Never trained by the optimizer; a training-mode
  BatchNormalization updates it at each train step.
- **weight**: a float tensor in a parameter slot: either input of ``MatMul``,
  ``Gemm``'s ``A``, ``B`` and ``C``, a convolution's weight and bias, a
  normalization's scale and bias, a recurrent layer's ``W``, ``R`` and ``B``,
  an embedding table (``Gather``'s data), ``PRelu``'s slope, the fused layers
  of ONNX Runtime's transformer optimizer; or a tensor of rank 1 or more added
  to, subtracted from, multiplied with or dividing a computed value (a bias
  after ``MatMul``, LayerNorm's decomposed scale and shift). A rank-0 tensor
  there is a constant (a scale, a fill value).
- **constant**: everything else: integer and boolean tensors, scalars used as
  constants, Dropout's ratio, shapes, scales of ``Resize``, tensors read only
  by other operators (a rotary embedding's frequencies through ``Unsqueeze``).

A running statistic wins over a weight slot, and a weight slot over any
other use.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Literal

import onnx

from onnxtrain.graph import dtypes
from onnxtrain.graph.walk import all_nodes

Role = Literal["weight", "constant", "running statistic"]

#: ``{(domain, operator): input positions that hold parameters}``; ``""`` is ai.onnx.
WEIGHT_SLOTS: Mapping[tuple[str, str], frozenset[int]] = {
    ("", "MatMul"): frozenset({0, 1}),
    ("", "Gemm"): frozenset({0, 1, 2}),
    ("", "Conv"): frozenset({1, 2}),
    ("", "ConvTranspose"): frozenset({1, 2}),
    ("", "BatchNormalization"): frozenset({1, 2}),
    ("", "LayerNormalization"): frozenset({1, 2}),
    ("", "InstanceNormalization"): frozenset({1, 2}),
    ("", "GroupNormalization"): frozenset({1, 2}),
    ("", "RMSNormalization"): frozenset({1}),
    ("", "RNN"): frozenset({1, 2, 3}),
    ("", "GRU"): frozenset({1, 2, 3}),
    ("", "LSTM"): frozenset({1, 2, 3, 7}),
    ("", "Gather"): frozenset({0}),
    ("", "PRelu"): frozenset({1}),
    ("com.microsoft", "FusedMatMul"): frozenset({0, 1}),
    ("com.microsoft", "Attention"): frozenset({1, 2}),
    ("com.microsoft", "MultiHeadAttention"): frozenset({3}),
    ("com.microsoft", "BiasGelu"): frozenset({1}),
    ("com.microsoft", "FastGelu"): frozenset({1}),
    ("com.microsoft", "SkipLayerNormalization"): frozenset({2, 3, 4}),
    ("com.microsoft", "SkipSimplifiedLayerNormalization"): frozenset({2, 3}),
    ("com.microsoft", "SimplifiedLayerNormalization"): frozenset({1}),
    ("com.microsoft", "LayerNormalization"): frozenset({1, 2}),
    ("com.microsoft", "EmbedLayerNormalization"): frozenset({2, 3, 4, 5, 6}),
}

#: Element-wise operators whose float tensor of rank 1 or more, beside a computed value, is a weight.
AFFINE = frozenset({"Add", "Sub", "Mul", "Div"})

#: Operators a weight may be read through before its slot (a view or a cast of it).
PASS_THROUGH = frozenset({"Identity", "Cast", "Transpose"})

#: BatchNormalization's inputs that hold its running statistics.
RUNNING_STATISTICS = frozenset({3, 4})


def initializer_roles(model: onnx.ModelProto | str | os.PathLike[str]) -> dict[str, Role]:
    """``{initializer: role}`` for every initializer of ``model`` (a path is read without external data)."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(os.fspath(model), load_external_data=False)
    graph = model.graph
    float_tensors = {t.name for t in graph.initializer if dtypes.is_float(t.data_type)}
    ranks = {t.name: len(t.dims) for t in graph.initializer}
    constants = {t.name for t in graph.initializer} | {
        o for n in all_nodes(graph) if n.op_type == "Constant" for o in n.output
    }
    statistics: set[str] = set()
    weights: set[str] = set()
    for origin, node, position, other in _uses(graph, float_tensors):
        domain = "" if node.domain == "ai.onnx" else node.domain
        if domain == "" and node.op_type == "BatchNormalization" and position in RUNNING_STATISTICS:
            statistics.add(origin)
        elif _weight_slot(domain, node.op_type, position, ranks[origin], other in constants):
            weights.add(origin)
    roles: dict[str, Role] = {}
    for tensor in graph.initializer:
        name = tensor.name
        roles[name] = "running statistic" if name in statistics else "weight" if name in weights else "constant"
    return roles


def _weight_slot(domain: str, op_type: str, position: int, rank: int, beside_constant: bool) -> bool:
    """Whether input ``position`` of the operator holds a weight (see the module docstring)."""
    if position in WEIGHT_SLOTS.get((domain, op_type), frozenset()):
        return True
    return domain == "" and op_type in AFFINE and rank > 0 and not beside_constant


def trainable_parameters(model: onnx.ModelProto | str | os.PathLike[str]) -> list[str]:
    """The initializers of ``model`` that are weights (:func:`initializer_roles`), in initializer order: what
    ``requires_grad`` should name to train the whole model."""
    return [name for name, role in initializer_roles(model).items() if role == "weight"]


def running_statistics(model: onnx.ModelProto) -> list[str]:
    """The initializers that are BatchNormalization running statistics, in initializer order."""
    return [name for name, role in initializer_roles(model).items() if role == "running statistic"]


def _uses(graph: onnx.GraphProto, tensors: set[str]) -> Iterator[tuple[str, onnx.NodeProto, int, str]]:
    """``(tensor, node, position, other)``: each place a node reads one of ``tensors``, directly or through
    :data:`PASS_THROUGH` operators; ``other`` is the other input of a two-input node (else ``""``)."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in all_nodes(graph):
        for name in dict.fromkeys(node.input):
            if name:
                readers.setdefault(name, []).append(node)
    for tensor in tensors:
        frontier, seen = [tensor], {tensor}
        while frontier:
            value = frontier.pop()
            for node in readers.get(value, ()):
                if node.op_type in PASS_THROUGH and node.domain in ("", "ai.onnx"):
                    for out in node.output:
                        if out and out not in seen:
                            seen.add(out)
                            frontier.append(out)
                    continue
                for position, name in enumerate(node.input):
                    if name == value:
                        other = node.input[1 - position] if len(node.input) == 2 and position < 2 else ""
                        yield tensor, node, position, other


__all__ = [
    "AFFINE",
    "PASS_THROUGH",
    "WEIGHT_SLOTS",
    "Role",
    "initializer_roles",
    "running_statistics",
    "trainable_parameters",
]
