"""The constant pass: nodes computed from small constants become ``Constant`` nodes, for shape inference.

onnx's shape inference reads the values of ``Constant`` nodes and
initializers, but not of what is computed from them (data propagation only
follows integer shape vectors), so a ``Resize`` whose scales are
``Concat(Constant, Constant)`` (torch's TorchScript exporter in training
mode) would have an unknown output shape.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxtrain.graph.fold import FOLDABLE, MAX_ELEMENTS, folded_value
from onnxtrain.graph.versions import is_standard, opset_version


def fold_constants(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each node of :data:`FOLDABLE` whose inputs are all constants made a ``Constant``, in place.

    Constants are ``Constant`` nodes, initializers and the nodes folded before:
    only tensors stored in the model (not in external data) of at most
    :data:`MAX_ELEMENTS` elements are read, so the weights of a large model
    are never loaded. A folded node becomes ``Constant(value=...)`` with the
    same output name, in its place, when its value has at most
    :data:`MAX_ELEMENTS` elements; everything else is left as it is
    (subgraphs and nodes of other domains included). For shape inference:
    the graph computes what it computed, in the same order and IR version.
    """
    graph = model.graph
    opset = opset_version(model)
    constants = SmallConstants(graph.initializer)
    for node in graph.node:
        if node.op_type == "Constant" and is_standard(node):
            constants.add_constant_node(node)
            continue
        value = folded_value(node, {}, constants, opset) if node.op_type in FOLDABLE else None
        if value is None:
            continue
        try:
            tensor = numpy_helper.from_array(value, node.output[0])
        except (ValueError, TypeError, KeyError):  # an element type numpy_helper cannot write back
            continue
        constants.add_value(node.output[0], value)
        node.CopyFrom(helper.make_node("Constant", [], [node.output[0]], name=node.name, value=tensor))
    return model


class SmallConstants(Mapping[str, np.ndarray]):
    """The values of a graph's small constants (:func:`_small`): initializers, ``Constant`` nodes taken in with
    :meth:`add_constant_node`, values added; each converted to NumPy when first read."""

    def __init__(self, initializers: Iterable[onnx.TensorProto]) -> None:
        self._tensors = {tensor.name: tensor for tensor in initializers}
        self._values: dict[str, np.ndarray] = {}

    def add_constant_node(self, node: onnx.NodeProto) -> None:
        """Take in a ``Constant`` node's value (a sparse or string value is not a constant here)."""
        if len(node.output) != 1 or len(node.attribute) != 1:
            return
        attribute = node.attribute[0]
        if attribute.name == "value":
            self._tensors[node.output[0]] = attribute.t
        elif attribute.name in ("value_float", "value_floats", "value_int", "value_ints"):
            dtype = np.float32 if attribute.name.startswith("value_float") else np.int64
            self._values[node.output[0]] = np.array(helper.get_attribute_value(attribute), dtype)

    def add_value(self, name: str, value: np.ndarray) -> None:
        self._values[name] = value

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self:
            raise KeyError(name)
        if name not in self._values:
            self._values[name] = numpy_helper.to_array(self._tensors[name])
        return self._values[name]

    def __contains__(self, name: object) -> bool:
        if name in self._values:
            return True
        tensor = self._tensors.get(name) if isinstance(name, str) else None
        return tensor is not None and _small(tensor)

    def __iter__(self) -> Iterator[str]:
        return iter([name for name in {**self._tensors, **self._values} if name in self])

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _small(tensor: onnx.TensorProto) -> bool:
    """Whether ``tensor`` holds its values in the model and has at most :data:`MAX_ELEMENTS` elements."""
    return tensor.data_location != onnx.TensorProto.EXTERNAL and math.prod(tensor.dims) <= MAX_ELEMENTS


__all__ = ["SmallConstants", "fold_constants"]
