"""The traversal helpers the passes share: who reads a value."""

from __future__ import annotations

import onnx
from onnx import helper

from onnxtrain.graph.walk import all_nodes, inputs_read, names_read, readers_of
from tests.helpers import FLOAT, make_model


def _model() -> onnx.ModelProto:
    """``b = x * x`` (one node reading ``x`` twice), ``c = Clip(b, , m)`` (an input left out), and an ``If`` whose
    branch reads ``c`` from the outer graph."""
    branch = helper.make_graph(
        [helper.make_node("Neg", ["c"], ["d"], name="inner")],
        "branch",
        [],
        [helper.make_tensor_value_info("d", FLOAT, None)],
    )
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["b"], name="square"),
        helper.make_node("Clip", ["b", "", "m"], ["c"], name="clip"),
        helper.make_node("If", ["flag"], ["d"], name="branching", then_branch=branch, else_branch=branch),
    ]
    inputs = {"x": (FLOAT, [2]), "m": (FLOAT, []), "flag": (onnx.TensorProto.BOOL, [])}
    return make_model(inputs, nodes, {"d": (FLOAT, None)})


def test_each_node_reads_a_value_once_and_empty_inputs_are_no_values():
    graph = _model().graph
    assert inputs_read(graph.node[0]) == ["x"] and inputs_read(graph.node[1]) == ["b", "m"]
    readers = readers_of(graph.node)
    assert {name: [node.name for node in nodes] for name, nodes in readers.items()} == {
        "x": ["square"], "b": ["clip"], "m": ["clip"], "flag": ["branching"],
    }  # fmt: skip


def test_what_subgraphs_read_is_read_by_their_node_or_by_the_inner_node():
    graph = _model().graph
    assert [node.name for node in readers_of(graph.node, names_read)["c"]] == ["branching"]
    assert [node.name for node in readers_of(all_nodes(graph))["c"]] == ["inner", "inner"]  # both branches
