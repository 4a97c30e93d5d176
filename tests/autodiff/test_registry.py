"""The rule registry: registration, opset ranges, copies, freezing, the coverage document and its torch.nn table."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnxtrain.autodiff import GradientRegistry, RuleContext, builtin_registry, coverage_rows
from onnxtrain.autodiff.coverage import (
    COMMAND,
    LAYERS_HEADING,
    LayerRow,
    TrainingCheck,
    check_training,
    coverage_markdown,
    layers_markdown,
    split_document,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "gradient-coverage.md"


def _identity(ctx: RuleContext, grads: Sequence[str | None]) -> list[str | None]:
    """dx = g"""
    return [grads[0]]


def test_lookup_by_opset_range() -> None:
    registry = GradientRegistry()
    registry.rule("Foo", opsets=(13, 17))(_identity)
    registry.rule("Foo", opsets=(18, None))(_identity)
    assert registry.lookup("Foo", opset=12) is None
    assert registry.lookup("Foo", opset=13).until == 17  # type: ignore[union-attr]
    assert registry.lookup("Foo", opset=25).since == 18  # type: ignore[union-attr]
    assert registry.lookup("Foo", "ai.onnx", 14) is registry.lookup("Foo", "", 14)


def test_overlapping_rules_are_an_error_unless_replacing() -> None:
    registry = GradientRegistry()
    registry.rule("Foo", opsets=(13, None))(_identity)
    with pytest.raises(ValueError, match="exists already"):
        registry.rule("Foo", opsets=(15, 16))(_identity)
    registry.rule("Foo", opsets=(15, 16), replace=True)(_identity)
    assert [(r.since, r.until) for r in registry.rules()] == [(15, 16)]


def test_rule_and_non_differentiable_exclude_each_other() -> None:
    registry = GradientRegistry()
    registry.non_differentiable("Floor")
    with pytest.raises(ValueError, match="non-differentiable"):
        registry.rule("Floor")(_identity)
    registry.rule("Relu")(_identity)
    with pytest.raises(ValueError, match="has a gradient rule"):
        registry.non_differentiable("Relu")
    assert registry.is_non_differentiable("Floor") and registry.lookup("Floor") is None


def test_builtin_registry_is_frozen_and_copies_are_independent() -> None:
    builtin = builtin_registry()
    with pytest.raises(RuntimeError, match="copy"):
        builtin.rule("MyOp", domain="my.domain")(_identity)
    copy = builtin.copy()
    copy.rule("MyOp", domain="my.domain")(_identity)
    assert copy.lookup("MyOp", "my.domain") is not None
    assert builtin.lookup("MyOp", "my.domain") is None
    assert ("", "Relu") in copy.operators()


def test_builtin_declares_non_differentiable_operators() -> None:
    builtin = builtin_registry()
    for op in (
        "Shape",
        "Size",
        "Equal",
        "Less",
        "Greater",
        "ArgMax",
        "ArgMin",
        "Floor",
        "Ceil",
        "Round",
        "Sign",
        "NonZero",
        "Not",
        "And",
        "Or",
        "IsNaN",
        "IsInf",
        "RandomNormalLike",
    ):
        assert builtin.is_non_differentiable(op), op


def test_coverage_rows_name_differentiable_inputs() -> None:
    rows = {row.op_type: row for row in coverage_rows(builtin_registry()) if not row.domain}
    assert rows["Where"].inputs == ("X", "Y")
    assert rows["Gelu"].opsets == "20+"
    assert rows["Relu"].opsets == "13+"  # the oldest opset onnxtrain reads
    assert rows["Pow"].inputs == ("X", "Y")
    assert rows["ReduceSum"].inputs == ("data",)
    assert rows["Clip"].inputs == ("input", "min", "max")
    assert rows["Relu"].formula
    assert not rows["Shape"].differentiable


def test_committed_coverage_table_is_up_to_date() -> None:
    """The registry part of the document; regenerate the whole document with: python tools/gradient_coverage.py"""
    registry_part, layers_part = split_document(DOCS.read_text())
    assert registry_part == coverage_markdown(), (
        f"the rule table of docs/gradient-coverage.md is stale: run `{COMMAND}` (torch keeps the torch.nn part)"
    )
    assert layers_part.startswith(LAYERS_HEADING)


def test_the_readme_counts_the_operators_with_rules() -> None:
    """README.md's count, which drifted once (153 written, 155 there)."""
    count = re.search(r"(\d+) operators have gradient rules", coverage_markdown())
    readme = re.search(r"(\d+) operators have gradient rules", (DOCS.parents[1] / "README.md").read_text())
    assert count is not None and readme is not None and readme.group(1) == count.group(1)


def test_split_document_finds_the_torch_section() -> None:
    text = coverage_markdown() + "\n" + LAYERS_HEADING + "\n\nrows\n"
    assert split_document(text) == (coverage_markdown(), LAYERS_HEADING + "\n\nrows\n")
    assert split_document("no section\n") == ("no section\n", "")


def _model(*nodes: onnx.NodeProto, opset: int = 17) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph(list(nodes), "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("my", 1)])


def test_check_training_builds_and_runs_a_training_model() -> None:
    check = check_training(_model(helper.make_node("Tanh", ["x"], ["y"])), feeds={"x": np.ones((2, 3), np.float32)})
    assert check.trains and check.operators == ("Tanh",) and not check.missing


def test_check_training_names_the_operators_without_a_rule() -> None:
    nodes = (helper.make_node("MyOp", ["x"], ["t"], domain="my"), helper.make_node("Tanh", ["t"], ["y"]))
    check = check_training(_model(*nodes))
    assert not check.trains
    assert check.missing == ("my::MyOp",)
    assert check.operators == ("Tanh", "my::MyOp")


def test_check_training_tells_a_model_onnxruntime_cannot_run_apart() -> None:
    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    model = _model(node)
    model.graph.initializer.append(numpy_helper.from_array(np.array([5, 7], np.int64), "shape"))
    check = check_training(model, feeds={"x": np.ones((2, 3), np.float32)})
    assert not check.trains and check.error.startswith("the model itself fails in onnxruntime")


def test_layers_markdown_rows() -> None:
    rows = [
        LayerRow("Good", TrainingCheck(("Gemm",))),
        LayerRow("Gap", TrainingCheck(("Foo", "Gemm"), ("Foo",))),
        LayerRow("Broken", None, "UnsupportedOperatorError: no | way"),
    ]
    text = layers_markdown(rows, "torch 0.0", {"Module": "a base class"})
    assert text.startswith(LAYERS_HEADING)
    assert "1 of 3 layers train; 1 do not export" in text and "1 export but do not train." in text
    assert "| Good | Gemm | yes |  |" in text
    assert "| Gap | Foo, Gemm | no | Foo |" in text
    assert "| Broken | | export fails | UnsupportedOperatorError: no \\| way |" in text
    assert "- `Module`: a base class" in text


@pytest.mark.slow
def test_committed_torch_layer_table_is_up_to_date() -> None:
    """Every torch.nn layer exported and checked again (about 10 s of CPU)."""
    torch = pytest.importorskip("torch")
    import onnxruntime

    from tools import gradient_coverage

    _, committed = split_document(DOCS.read_text())
    torch_version = torch.__version__.split("+")[0]
    releases = (f"from torch {torch_version} ", f"onnx {onnx.__version__} ", f"onnxruntime {onnxruntime.__version__};")
    if not all(release in committed for release in releases):
        pytest.skip("the committed torch.nn table comes from other releases of torch, onnx or onnxruntime")
    layers = gradient_coverage.catalog()
    gradient_coverage.check_catalog(layers)
    assert gradient_coverage.torch_section(layers) == committed, (
        f"the torch.nn table of docs/gradient-coverage.md is stale: run `{COMMAND}`"
    )
