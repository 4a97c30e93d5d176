"""Every gradient rule against central finite differences, on Hypothesis-drawn cases.

One parametrized test per spec of ``specs.SPECS``; the meta-test fails when a
registered rule has no spec. A check that fails because the installed
onnxruntime (or onnx) cannot run the operator under test itself, or runs it
otherwise than ``onnx.reference``, is skipped (the operator never loads) or its
example rejected (not on these inputs): ``gradcheck.forward_fault``.
"""

from __future__ import annotations

import onnx
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from onnxtrain.autodiff import builtin_registry
from tests.autodiff import (
    specs_contrib,
    specs_control_flow,
    specs_matrix_shape,
    specs_nn,
    specs_quantized,
    specs_recurrent,
)
from tests.autodiff.gradcheck import DIM_MODES, build_cached, check, excuse_forward_fault
from tests.autodiff.specs import SPECS as CORE_SPECS
from tests.autodiff.specs import Spec

#: Every spec: the core table plus one module per further operator family.
SPECS: list[Spec] = [
    *CORE_SPECS,
    *specs_matrix_shape.SPECS,
    *specs_nn.SPECS,
    *specs_contrib.SPECS,
    *specs_recurrent.SPECS,
    *specs_control_flow.SPECS,
    *specs_quantized.SPECS,
]


@pytest.mark.parametrize("spec", SPECS, ids=[spec.id for spec in SPECS])
@given(data=st.data())
def test_rule_matches_finite_differences(spec: Spec, data: st.DataObject) -> None:
    """<t, our gradient> equals the directional derivative along t, up to finite-difference error."""
    case = data.draw(spec.cases, label="case")
    mode = data.draw(st.sampled_from(getattr(spec, "dim_modes", DIM_MODES)), label="dims")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    try:
        compiled = build_cached(spec, case, mode)
        result = check(spec, case, mode, seed, compiled)
    except Exception:
        excuse_forward_fault(spec, case, mode, seed)  # an older release's kernel for the operator itself
        raise
    assert_gradient_nodes_standard(spec, compiled.model)
    assume(result is not None)
    assert result is not None
    if not result.ok:
        excuse_forward_fault(spec, case, mode, seed)
    assert result.ok, (
        f"{spec.id}: <t, grad> = {result.analytic!r}, finite difference = {result.numeric!r} "
        f"(tolerance {result.tolerance:.3g})"
    )


def assert_gradient_nodes_standard(spec: Spec, model: onnx.ModelProto) -> None:
    """Every node but the operator under test (named ``op``, of the spec's domain) is ``ai.onnx``: the
    loss and every node the rule emitted."""
    (op,) = [node for node in model.graph.node if node.name == "op"]
    assert (op.domain or "") == spec.domain, f"the node under test has domain {op.domain!r}, not {spec.domain!r}"
    foreign = sorted(
        {
            f"{node.domain}::{node.op_type}"
            for node in model.graph.node
            if node.name != "op" and node.domain not in ("", "ai.onnx")
        }
    )
    assert not foreign, f"{spec.id}: the gradient graph uses non-standard operators {foreign}"


def test_every_rule_has_a_spec() -> None:
    """A rule without a spec is untested: add one to tests/autodiff/specs*.py."""
    covered = {(spec.domain, spec.op_type) for spec in SPECS}
    missing = sorted(op for domain, op in builtin_registry().operators() if (domain, op) not in covered)
    assert not missing, f"rules without a spec in tests/autodiff/specs*.py: {missing}"


def test_specs_name_registered_rules() -> None:
    """A spec for an operator without a rule (a typo, or a rule that was removed) is an error too."""
    registered = builtin_registry().operators()
    stray = sorted({spec.op_type for spec in SPECS if (spec.domain, spec.op_type) not in registered})
    assert not stray, f"specs for operators without a rule: {stray}"
