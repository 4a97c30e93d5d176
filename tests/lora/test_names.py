"""The names target patterns match: a whole name or its part after a dot; the module path of torch's exports."""

from __future__ import annotations

import onnx
import pytest
from onnx import helper

from onnxtrain.graph.torch_metadata import NAME_SCOPES_KEY, module_path
from onnxtrain.lora.names import matches


@pytest.mark.parametrize(
    ("pattern", "name", "expected"),
    [
        ("q_lin", "distilbert.transformer.layer.0.attention.q_lin", True),
        ("q_lin", "q_lin", True),
        ("attention.q_lin", "distilbert.transformer.layer.0.attention.q_lin", True),
        ("*.q_lin", "distilbert.transformer.layer.0.attention.q_lin", True),
        ("layer.1.*", "distilbert.transformer.layer.1.attention.q_lin", True),
        ("q_lin", "distilbert.transformer.layer.0.attention.q_lin.weight", False),
        ("q_lin.weight", "distilbert.transformer.layer.0.attention.q_lin.weight", True),
        ("lin", "distilbert.transformer.layer.0.attention.q_lin", False),
        ("q_lin", "distilbert.transformer.layer.0.attention.xq_lin", False),
        ("Q_LIN", "distilbert.transformer.layer.0.attention.q_lin", False),
        ("W*", "W1", True),
        ("W1", "W10", False),
    ],
)
def test_a_pattern_matches_a_whole_name_or_its_part_after_a_dot(pattern: str, name: str, expected: bool) -> None:
    assert matches(pattern, name) is expected


def _node(name: str, scopes: str | None = None) -> onnx.NodeProto:
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name=name)
    if scopes is not None:
        node.metadata_props.add(key=NAME_SCOPES_KEY, value=scopes)
    return node


@pytest.mark.parametrize(
    ("node", "module"),
    [
        (
            _node("/distilbert/transformer/layer.0/attention/q_lin/MatMul"),
            "distilbert.transformer.layer.0.attention.q_lin",
        ),
        (_node("/MatMul"), ""),
        (_node("MatMul_3"), ""),
        (_node(""), ""),
        (_node("model/dense/MatMul"), "model.dense"),
        (_node("node_MatMul_83", "['', 'model', 'model.layer.0.q_lin', 'linear']"), "model.layer.0.q_lin"),
        (_node("node_Gemm_2", "['', 'linear']"), ""),
        (_node("/a/MatMul", "not a list ["), "a"),
    ],
)
def test_module_path_of_torchs_node_names_and_scopes(node: onnx.NodeProto, module: str) -> None:
    assert module_path(node) == module
