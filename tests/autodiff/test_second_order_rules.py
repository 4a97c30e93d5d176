"""Second derivatives through the rules: the closure table of docs/gradient-coverage.md is current, the
common layers' rules are closed, and their Hessian-vector products match central differences in float64."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from onnxtrain.autodiff.coverage import SECOND_ORDER_HEADING, second_order_section
from tests.autodiff.closure import (
    COMMON_LAYERS,
    OperatorKey,
    check_second_order,
    closed_operators,
    closure_fault,
    closure_markdown,
    closure_rows,
    committed_rows,
    operator_key,
    releases,
    table_row,
)
from tests.autodiff.gradcheck import DIM_MODES, excuse_forward_fault
from tests.autodiff.models import Erf, Gelu
from tests.autodiff.specs import Spec
from tests.autodiff.test_rules import SPECS

DOCS = Path(__file__).resolve().parents[2] / "docs" / "gradient-coverage.md"


@dataclass(frozen=True)
class Float64Reference(Spec):
    """A float32 spec (onnxruntime has no float64 kernel for its operator) run in float64 in onnx.reference,
    with Erf and Gelu in float64 (onnx.reference's own compute in float32)."""

    backend: str = "onnx.reference"
    reference_ops: tuple[type, ...] = (Erf, Gelu)


#: Float32 specs checked in float64 in onnx.reference instead (whose Conv and Pad cannot run the gradients of
#: grouped, dilated or cropping convolutions: Conv stays in onnxruntime, in float32).
IN_FLOAT64 = {"Erf", "Gelu", "Softplus"}


def in_float64(spec: Spec) -> Spec:
    """The float64 copy of ``spec``, run in onnx.reference, where :data:`IN_FLOAT64` names its operator."""
    if spec.op_type not in IN_FLOAT64 or np.dtype(spec.dtype) == np.float64:
        return spec
    return Float64Reference(**{f.name: getattr(spec, f.name) for f in fields(Spec)} | {"dtype": np.float64})


#: The common layers' specs, whose second derivatives are checked numerically.
COMMON_SPECS = [spec for spec in SPECS if spec.op_type in COMMON_LAYERS and not spec.domain]
CHECKED = [in_float64(spec) for spec in COMMON_SPECS]

#: Closed rules whose second derivatives cannot be checked numerically here, and why.
UNCHECKABLE = {
    "RNN-all-inputs-layout1": "onnx.reference's Scan cannot run the reversed scan outputs of its gradient",
    "RNN-x-w-r-layout1": "onnx.reference's Scan cannot run the reversed scan outputs of its gradient",
    "GRU-all-inputs-layout1": "onnx.reference's Scan cannot run the reversed scan outputs of its gradient",
    "GRU-x-w-r-layout1": "onnx.reference's Scan cannot run the reversed scan outputs of its gradient",
    "LSTM-all-inputs-layout1": "onnx.reference's Scan cannot run the reversed scan outputs of its gradient",
    "LSTM-x-w-r-layout1": "onnx.reference's Scan cannot run the reversed scan outputs of its gradient",
    "Gelu-com.microsoft": "no onnx.reference implementation, no onnxruntime float64 kernel",
}
#: The operators the committed table marks closed (the table tests below keep it current).
COMMITTED = second_order_section(DOCS.read_text())
CLOSED = closed_operators(COMMITTED)
#: The other specs of closed rules: their second derivatives are checked with fewer examples each.
OTHERS = [
    in_float64(spec)
    for spec in SPECS
    if spec not in COMMON_SPECS and spec.id not in UNCHECKABLE and operator_key(spec) in CLOSED
]


#: The table's rows: every operator a spec of tests/autodiff/test_rules.py covers, each with its specs.
ROWS: dict[OperatorKey, list[Spec]] = {
    key: [spec for spec in SPECS if operator_key(spec) == key] for key in sorted({operator_key(s) for s in SPECS})
}
STALE = (
    f"the '{SECOND_ORDER_HEADING}' table of docs/gradient-coverage.md is stale: run python tools/gradient_coverage.py"
)


def skip_unless_made_with_these_releases() -> None:
    """The table depends on the releases of onnx and onnxruntime it was made with (a spec whose operator one
    cannot run cannot be built): with others, its checks are skipped."""
    if f"(generated with {releases()})" not in COMMITTED:
        pytest.skip(f"the committed table comes from other releases than {releases()}")


def test_the_second_order_table_has_a_row_per_rule_and_its_text() -> None:
    """The table's prose, count and rows, as :func:`closure_markdown` writes them from the committed rows."""
    skip_unless_made_with_these_releases()
    rows = committed_rows(COMMITTED)
    assert set(rows) == set(ROWS), STALE
    assert closure_markdown(rows) == COMMITTED, STALE


@pytest.mark.parametrize("key", ROWS, ids=["/".join(key) for key in ROWS])
def test_the_second_order_table_row_is_current(key: OperatorKey) -> None:
    """Each operator's row, from its specs' :func:`closure_fault` (regenerate the table with
    python tools/gradient_coverage.py)."""
    skip_unless_made_with_these_releases()
    specs = ROWS[key]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # onnxruntime's and the rules' warnings about the cases themselves
        expected = closure_rows(specs, [closure_fault(spec) for spec in specs])[key]
    committed = committed_rows(COMMITTED)
    assert key in committed, f"{STALE} (no row for {key})"
    assert table_row(key, committed[key]) == table_row(key, expected), STALE


def test_the_common_layers_rules_are_closed() -> None:
    specced = {spec.op_type for spec in COMMON_SPECS}
    assert set(COMMON_LAYERS) <= specced, f"common layers without a spec: {set(COMMON_LAYERS) - specced}"
    assert {("ai.onnx", op) for op in COMMON_LAYERS} <= CLOSED, "docs/gradient-coverage.md: common layers not closed"


@pytest.mark.parametrize("spec", CHECKED, ids=[spec.id for spec in CHECKED])
@settings(max_examples=4)
@given(data=st.data())
def test_second_derivatives_match_finite_differences(spec: Spec, data: st.DataObject) -> None:
    """``<t, H s>`` (the rule's gradient differentiated by our engine) against central differences of
    ``<s, gradient>`` along ``t``."""
    check_drawn(spec, data)


@pytest.mark.parametrize("spec", OTHERS, ids=[spec.id for spec in OTHERS])
@settings(max_examples=1)  # one case per spec: about 200 specs, the suite's time budget
@given(data=st.data())
def test_every_closed_rule_differentiates_twice_correctly(spec: Spec, data: st.DataObject) -> None:
    check_drawn(spec, data)


def check_drawn(spec: Spec, data: st.DataObject) -> None:
    """One drawn case of :func:`check_second_order`."""
    case = data.draw(spec.cases, label="case")
    mode = data.draw(st.sampled_from(getattr(spec, "dim_modes", DIM_MODES)), label="dims")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    try:
        result = check_second_order(spec, case, mode, seed)
    except Exception:
        excuse_forward_fault(spec, case, mode, seed)
        raise
    assume(result is not None)
    assert result is not None
    if not result.ok:  # an older onnxruntime's kernel for the operator itself computes it wrong here
        excuse_forward_fault(spec, case, mode, seed)
    assert result.ok, (
        f"{spec.id}: <t, H s> = {result.analytic!r}, finite difference = {result.numeric!r} "
        f"(tolerance {result.tolerance:.3g})"
    )
