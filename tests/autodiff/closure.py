"""Second derivatives through the gradient rules: which rules' own output can be differentiated again.

For a spec and a case, :func:`build_second_order` takes the model of
:func:`tests.autodiff.gradcheck.build` (the operator, ``loss = sum_u <c_u, y_u>``
and our gradients ``g_i = d loss / d x_i``) and differentiates
``loss2 = sum_i <s_i, g_i>`` by the inputs again: ``d loss2 / d x_i`` is the
Hessian of the loss times ``s``. A rule is *closed under differentiation*
when that second build succeeds: every operator its gradient emits on the way
from the inputs to the gradient has a rule itself. :func:`check_second_order`
compares ``<t, H s>`` with central differences of ``loss2`` along ``t``.
:func:`closure_markdown` is the table of docs/gradient-coverage.md's last
section, for every rule, from each of its specs' simplest case.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from hypothesis import HealthCheck, Phase, find, given, settings

from onnxtrain.autodiff import MissingGradientError, build_vjp
from onnxtrain.graph import GraphBuilder, dtypes, ops
from onnxtrain.graph.passes import drop_unread_initializers
from tests.autodiff import gradcheck
from tests.autodiff.gradcheck import DIM_MODES, Compiled, DimMode, Result
from tests.autodiff.specs import Case, Spec

#: The operators of the common layers, whose rules must be closed (issue: gradients inside losses).
COMMON_LAYERS = (
    "Gemm", "MatMul", "Add", "Sub", "Mul", "Div", "Tanh", "Sigmoid", "Relu", "Softplus", "Gelu", "Erf", "Exp",
    "Log", "Pow", "Sqrt", "Softmax", "LogSoftmax", "LayerNormalization", "ReduceSum", "ReduceMean",
    "ReduceMax", "ReduceMin", "ReduceSumSquare", "ReduceL2", "Reshape", "Transpose", "Concat", "Slice", "Split",
    "Squeeze", "Unsqueeze", "Flatten", "Expand", "Gather", "Identity", "Neg", "Abs", "Conv",
)  # fmt: skip


@dataclass
class SecondOrder:
    """A spec's model with Hessian-vector products: outputs ``loss2`` then ``d loss2 / d x_i``."""

    first: Compiled
    model: onnx.ModelProto
    vectors: list[str]  # the inputs s_i, one per differentiated input


def build_second_order(spec: Spec, case: Case, mode: DimMode) -> SecondOrder:
    """Differentiate ``<s, grad>`` of the spec's gradient model again; raises where a rule is not closed."""
    first = gradcheck.build_model(spec, case, mode)
    model = onnx.ModelProto()
    model.CopyFrom(first.model)  # the builder extends the model it is given
    builder = GraphBuilder(model)
    gradients = [value.name for value in first.model.graph.output[1 + first.n_outputs :]]
    terms, vectors = [], []
    for name, gradient in zip(first.wrt, gradients, strict=True):
        vector = builder.add_input(f"s_{name}", builder.tensor_type_of(name))
        vectors.append(vector)
        terms.append(builder.add_node1("ReduceSum", [builder.add_node1("Mul", [gradient, vector])], keepdims=0))
    loss2 = terms[0] if len(terms) == 1 else builder.add_node1("Sum", terms)
    seed = builder.add_initializer(np.ones((), dtypes.to_numpy_dtype(builder.elem_type(loss2))), "one")
    second = build_vjp(builder, {loss2: seed}, first.wrt)
    products = []
    for name in first.wrt:  # a first derivative that does not depend on x: a second derivative of zeros
        products.append(second[name] or ops.filled_like(builder, name, 0.0, "zeros"))
    builder.set_outputs([loss2, *products])
    built = builder.finalize()
    drop_unread_initializers(built)  # the seed, where no rule read it (a second derivative of zeros)
    return SecondOrder(first, built, vectors)


def check_second_order(spec: Spec, case: Case, mode: DimMode, seed: int) -> Result | None:
    """``<t, H s>`` against the central difference of ``loss2`` along ``t`` (in the spec's precision; float32
    with a larger step and tolerance); ``None`` where the drawn data is invalid for the spec."""
    built = build_second_order(spec, case, mode)
    first = built.first
    first.session = gradcheck.session_for(spec, first.model)  # for the projections' shapes
    session = gradcheck.session_for(spec, built.model)
    rng = np.random.default_rng(seed)
    values = gradcheck.draw_values(spec, case, first.args, rng)
    if values is None or not _twice_differentiable_at(spec, case, values):
        return None
    feeds: dict[str, np.ndarray] = {**values, **first.extras}
    shapes = gradcheck.projection_shapes_at(first, feeds)
    for (c, _, dtype), shape in zip(first.projections, shapes, strict=True):
        feeds[c] = np.asarray(rng.normal(size=shape), dtype=dtype)
    for name, vector in zip(first.wrt, built.vectors, strict=True):
        feeds[vector] = rng.normal(size=values[name].shape).astype(values[name].dtype)
    loss2, *products = session.run(None, feeds)
    directions = {name: rng.normal(size=values[name].shape) for name in first.wrt}
    analytic = sum(float(np.sum(directions[name] * p)) for name, p in zip(first.wrt, products, strict=True))
    scale = sum(float(np.sum(np.abs(directions[name] * p))) for name, p in zip(first.wrt, products, strict=True))
    output = session.get_outputs()[0].name

    def f(step: float) -> float:
        moved = dict(feeds)
        for name, t in directions.items():
            moved[name] = np.asarray(values[name].astype(np.float64) + step * t, values[name].dtype)
        return float(session.run([output], moved)[0])

    if np.dtype(spec.dtype) == np.float64:
        h = 1e-5
        numeric = (8 * (f(h) - f(-h)) - (f(2 * h) - f(-2 * h))) / (12 * h)
        tolerance = 1e-6 * (abs(analytic) + scale) + 1e-8 * (1 + abs(float(loss2)))
    else:  # float32 (onnxruntime has no float64 kernel): a larger step, Richardson-extrapolated
        h = 1e-2
        numeric = (4 * (f(h / 2) - f(-h / 2)) / h - (f(h) - f(-h)) / (2 * h)) / 3
        tolerance = 3e-3 * (abs(analytic) + scale) + 3e-4 * (1 + abs(float(loss2)))
    return Result(analytic, numeric, tolerance)


#: The cases of a spec the closure table builds: its simplest and this many drawn (derandomized) ones.
DRAWN_CASES = 3


def _twice_differentiable_at(spec: Spec, case: Case, values: dict[str, np.ndarray]) -> bool:
    """``False`` at the points where a rule's gradient is right but its second derivative is not (see
    :data:`KNOWN_LIMITS`): ``reduction="mul"`` scatters with two exact zeros among the updates, CumProd with
    an exact zero."""
    if spec.op_type in ("ScatterND", "ScatterElements") and dict(case.attrs).get("reduction") == "mul":
        return all(np.count_nonzero(value == 0) < 2 for value in values.values())
    if spec.op_type == "CumProd":
        return all(np.count_nonzero(value == 0) == 0 for value in values.values())
    return True


#: Second derivatives known to be wrong, printed under the table.
KNOWN_LIMITS = (
    'ScatterND and ScatterElements with `reduction="mul"`: where two or more updates of one position are '
    "exactly 0, the second derivative misses the products between them (the gradient counts zero updates "
    "apart, by comparisons, which have no derivative).",
    "CumProd: where an input is exactly 0, the same (the gradient treats the first zero apart).",
)


@functools.cache
def closure_cases(spec: Spec) -> tuple[Case, ...]:
    """The case Hypothesis shrinks the spec's strategy to, and :data:`DRAWN_CASES` more: deterministic."""
    quiet = settings(
        database=None, max_examples=1, phases=[Phase.generate, Phase.shrink], suppress_health_check=list(HealthCheck)
    )
    cases = [find(spec.cases, lambda case: True, settings=quiet)]

    @settings(
        database=None,
        max_examples=DRAWN_CASES,
        derandomize=True,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(spec.cases)
    def collect(case: Case) -> None:
        if repr(case) not in {repr(known) for known in cases}:  # cases may hold arrays: compared by repr
            cases.append(case)

    collect()
    return tuple(cases)


@functools.cache
def closure_fault(spec: Spec) -> str | None:
    """``None`` where the spec's rule is closed on each of its :func:`closure_cases` (the simplest with its
    dimensions static, symbolic and unknown, the others unknown: the modes the spec allows); else what stops
    the first second build that fails."""
    simplest, *drawn = closure_cases(spec)
    modes = getattr(spec, "dim_modes", DIM_MODES)
    attempts = [*((simplest, mode) for mode in modes), *((case, modes[-1]) for case in drawn)]
    for case, mode in attempts:
        try:
            build_second_order(spec, case, mode)
        except MissingGradientError as error:
            text = str(error)
            operator = text.split("no gradient rule for operator ", 1)[-1].split(" ", 1)[0]
            return f"no rule for {operator}"
        except Exception as error:  # a rule that cannot run on its own gradient graph: recorded as it says
            return f"{type(error).__name__}: {' '.join(str(error).split())[:120]}"
    return None


def releases() -> str:
    """``onnx 1.23.2 and onnxruntime 1.32.0``: what the table depends on (the specs' operators must run)."""
    import onnxruntime

    return f"onnx {onnx.__version__} and onnxruntime {onnxruntime.__version__}"


def closed_operators(section: str) -> set[OperatorKey]:
    """The ``(domain, operator)`` pairs a committed table (:func:`closure_markdown`) marks closed."""
    return {key for key, text in committed_rows(section).items() if not text}


def _fault_of_rule_spec(index: int) -> str | None:
    """:func:`closure_fault` of ``tests.autodiff.test_rules.SPECS[index]`` (run in a worker process)."""
    import warnings

    from tests.autodiff.test_rules import SPECS

    warnings.simplefilter("ignore")
    return closure_fault(SPECS[index])


def rule_spec_faults(workers: int = 2) -> list[str | None]:
    """:func:`closure_fault` of every spec of ``tests.autodiff.test_rules.SPECS``, in order, over ``workers``
    processes (spawned: each builds its share of the specs; the builds are independent)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from tests.autodiff.test_rules import SPECS

    if workers <= 1:
        return [closure_fault(spec) for spec in SPECS]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        return list(pool.map(_fault_of_rule_spec, range(len(SPECS)), chunksize=8))


OperatorKey = tuple[str, str]


def closure_rows(specs: Sequence[Spec], faults_of_specs: Sequence[str | None]) -> dict[OperatorKey, str]:
    """For each ``(domain, operator)`` of ``specs``, the table's last cell: ``""`` where every spec of it is
    closed, else what stops each spec that is not (``"; "``-joined, ``|`` escaped for Markdown)."""
    reasons: dict[OperatorKey, list[str]] = {}
    for spec, fault in zip(specs, faults_of_specs, strict=True):
        row = reasons.setdefault(operator_key(spec), [])
        if fault is not None:
            row.append(f"{spec.id}: {fault}" if spec.variant else fault)
    return {key: "; ".join(texts).replace("|", "\\|") for key, texts in reasons.items()}


def operator_key(spec: Spec) -> OperatorKey:
    """The table row a spec counts towards: ``(domain, operator)``, the default domain spelled ``ai.onnx``."""
    return (spec.domain or "ai.onnx", spec.op_type)


def table_row(key: OperatorKey, text: str) -> str:
    """One line of the table: domain, operator, closed or not, and ``text`` (a :func:`closure_rows` cell)."""
    return f"| {key[0]} | {key[1]} | {'no' if text else 'yes'} | {text} |"


def committed_rows(section: str) -> dict[OperatorKey, str]:
    """The rows of a committed table (:func:`closure_markdown`), as :func:`closure_rows` gives them."""
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if len(cells) == 4 and cells[2] in ("yes", "no"):
            rows[(cells[0], cells[1])] = cells[3]
    return rows


def closure_markdown(rows: dict[OperatorKey, str]) -> str:
    """The section of docs/gradient-coverage.md on second derivatives, from its rows (:func:`closure_rows`)."""
    closed = [key for key, text in rows.items() if not text]
    lines = [
        "## Second derivatives",
        "",
        "A rule is *closed under differentiation* when the gradient it emits can be differentiated again: every",
        "operator on the way from the node's inputs to its gradient has a rule itself. Then a loss containing a",
        "`Gradient` block over it trains, and `hessian_vector_product` runs through it. Generated from four",
        "cases of each spec, its simplest (with static, symbolic and unknown dimensions) and three drawn ones",
        "(with unknown dimensions), by tests/autodiff/closure.py; the second derivatives are checked against",
        "finite differences in tests/autodiff/test_second_order_rules.py.",
        "",
        f"{len(closed)} of {len(rows)} operators with rules are closed (generated with {releases()}).",
        "",
        "| Domain | Operator | Closed | What stops the second derivative |",
        "|---|---|---|---|",
    ]
    lines += [table_row(key, rows[key]) for key in sorted(rows)]
    lines += ["", "Known wrong second derivatives of closed rules:", ""]
    lines += [f"- {limit}" for limit in KNOWN_LIMITS]
    return "\n".join(lines) + "\n"


__all__ = [
    "COMMON_LAYERS",
    "build_second_order",
    "check_second_order",
    "closure_fault",
    "closure_markdown",
    "closure_rows",
    "committed_rows",
    "operator_key",
]
