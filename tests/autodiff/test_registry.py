"""The rule registry: registration, opset ranges, copies, freezing, and the coverage table."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from onnxtrain.autodiff import GradientRegistry, RuleContext, builtin_registry
from onnxtrain.autodiff.coverage import coverage_markdown

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
    rows = {row.op_type: row for row in builtin_registry().coverage()}
    assert rows["Where"].inputs == ("X", "Y")
    assert rows["Gelu"].opsets == "20+"
    assert rows["Relu"].opsets == "13+"  # the oldest opset onnxtrain reads
    assert rows["Pow"].inputs == ("X", "Y")
    assert rows["ReduceSum"].inputs == ("data",)
    assert rows["Clip"].inputs == ("input", "min", "max")
    assert rows["Relu"].formula
    assert not rows["Shape"].differentiable


def test_committed_coverage_table_is_up_to_date() -> None:
    """Regenerate with: python -m onnxtrain.autodiff.coverage > docs/gradient-coverage.md"""
    assert DOCS.read_text() == coverage_markdown(), (
        "docs/gradient-coverage.md is stale: run `python -m onnxtrain.autodiff.coverage > docs/gradient-coverage.md`"
    )
