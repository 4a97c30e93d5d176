"""The names a weight is known by, which ``add_adapters``' target patterns match.

A weight is known by its initializer's name, by the names of the nodes that
read it (through a ``Transpose`` or ``DequantizeLinear``: that node's and the
product's), and by the *module path* of those nodes, the name of the torch
module that computed them:

- torch's TorchScript exporter names nodes by their module scopes:
  ``/distilbert/transformer/layer.0/attention/q_lin/MatMul`` is module
  ``distilbert.transformer.layer.0.attention.q_lin`` (the scopes joined by
  ``.``, the last part, the operator, dropped; any name with a ``/``);
- torch's dynamo exporter writes the scopes in the node's ``metadata_props``
  (``pkg.torch.onnx.name_scopes``, a list whose last entry is the operation):
  the entry before the last is the module.

A pattern matches a name when it matches the whole name (``fnmatch``,
case-sensitive) or the part after one of its dots, as PEFT's
``target_modules`` match a module's name or its last parts: ``q_lin`` matches
module ``distilbert.transformer.layer.0.attention.q_lin``, ``q_lin.weight``
matches initializer ``distilbert.transformer.layer.0.attention.q_lin.weight``.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from onnxtrain.graph.naming import matches
from onnxtrain.graph.torch_metadata import module_path
from onnxtrain.graph.versions import is_standard
from onnxtrain.graph.walk import readers_of

#: The nodes whose output stands for the weight they read (their readers name the weight too).
_PASS_THROUGH = ("Transpose", "DequantizeLinear")


@dataclass(frozen=True)
class KnownAs:
    """The names of one initializer: its own, its readers' and their module paths."""

    initializer: str
    nodes: tuple[str, ...]
    modules: tuple[str, ...]

    def matched_by(self, pattern: str) -> bool:
        """Whether ``pattern`` matches one of the names (:func:`matches`)."""
        return any(matches(pattern, name) for name in (self.initializer, *self.nodes, *self.modules))


def names_of_initializers(graph: onnx.GraphProto) -> dict[str, KnownAs]:
    """``{initializer: the names it is known by}`` for the top-level graph."""
    readers = readers_of(graph.node)
    known: dict[str, KnownAs] = {}
    for tensor in graph.initializer:
        nodes = list(readers.get(tensor.name, []))
        for node in list(nodes):
            if node.op_type in _PASS_THROUGH and is_standard(node) and node.input[0] == tensor.name:
                nodes += readers.get(node.output[0], [])
        node_names = tuple(dict.fromkeys(node.name for node in nodes if node.name))
        modules = tuple(dict.fromkeys(path for path in map(module_path, nodes) if path))
        known[tensor.name] = KnownAs(tensor.name, node_names, modules)
    return known
