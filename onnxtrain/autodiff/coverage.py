"""The gradient coverage document: the registry's table, and which torch.nn layers train.

``python tools/gradient_coverage.py`` regenerates ``docs/gradient-coverage.md``:
the registry part (:func:`coverage_markdown`, also printed by
``python -m onnxtrain.autodiff.coverage``) and, when torch is installed, the
table of torch.nn layers (:func:`layers_markdown`, one :func:`check_training`
per exported layer). This module never imports torch.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from onnxtrain.autodiff.engine import backward
from onnxtrain.autodiff.paths import find_path
from onnxtrain.autodiff.registry import GradientRegistry, Rule, domain_key
from onnxtrain.autodiff.rules import builtin_registry
from onnxtrain.graph import versions

#: The heading that starts the torch.nn section of the document (everything before it is the registry part).
LAYERS_HEADING = "## torch.nn layers"
#: The heading of the document's last section: which rules are closed under differentiation (generated from
#: the tests' specs by tools/gradient_coverage.py).
SECOND_ORDER_HEADING = "## Second derivatives"
#: The command that regenerates the whole document.
COMMAND = "python tools/gradient_coverage.py"


@dataclass(frozen=True)
class CoverageRow:
    """One row of the coverage table (see :func:`coverage_rows`)."""

    domain: str
    op_type: str
    since: int
    until: int | None
    inputs: tuple[str, ...]
    differentiable: bool
    formula: str

    @property
    def opsets(self) -> str:
        """``"13+"``, ``"13-17"``: the opset range as text."""
        return f"{self.since}+" if self.until is None else f"{self.since}-{self.until}"


def differentiable_inputs(rule: Rule) -> tuple[str, ...]:
    """Names of the inputs ``rule`` differentiates (``"inputs"`` for variadic ones)."""
    names = _input_names(rule.domain, rule.op_type, rule.since)
    if names is None:
        return tuple(str(i) for i in rule.inputs) if rule.inputs is not None else ("all",)
    candidates = range(len(names)) if rule.inputs is None else rule.inputs
    return tuple(names[i][0] for i in candidates if i < len(names) and (rule.inputs is not None or names[i][1]))


def coverage_rows(registry: GradientRegistry) -> list[CoverageRow]:
    """The coverage table of ``registry``: one row per rule and per non-differentiable operator."""
    rows = [
        CoverageRow(
            rule.domain,
            rule.op_type,
            _first_row_opset(rule),
            rule.until,
            differentiable_inputs(rule),
            True,
            rule.formula,
        )
        for rule in registry.rules()
    ]
    rows += [
        CoverageRow(domain, op, max(first_version(domain, op) or 1, _oldest(domain)), None, (), False, "")
        for domain, op in sorted(registry.non_differentiable_operators())
    ]
    return rows


def _first_row_opset(rule: Rule) -> int:
    """The first opset a rule's row shows: from onnxtrain's oldest and the rule's own, and from ONNX's first
    definition of the operator unless the rule ends before it (ONNX Runtime's LayerNormalization below 17)."""
    start = max(rule.since, _oldest(rule.domain))
    defined = first_version(rule.domain, rule.op_type) or 1
    if rule.until is None or defined <= rule.until:
        start = max(start, defined)
    return start


def _oldest(domain: str) -> int:
    """The oldest opset of ``domain`` onnxtrain supports (``ai.onnx``: 13; others: 1)."""
    return versions.MIN_OPSET if domain == "" else 1


@functools.cache
def first_version(domain: str, op_type: str) -> int | None:
    """The first opset version of ``domain`` that defines ``op_type`` (``None``: unknown op)."""
    versions = [
        schema.since_version
        for schema in onnx.defs.get_all_schemas_with_history()
        if schema.name == op_type and domain_key(schema.domain) == domain
    ]
    return min(versions) if versions else None


_FLOAT_TYPE_STRINGS = ("tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)")


@functools.cache
def _input_names(domain: str, op_type: str, since: int) -> tuple[tuple[str, bool], ...] | None:
    """``(name, can_be_float)`` for each input of the newest schema, or ``None``."""
    try:
        schema = onnx.defs.get_schema(op_type, 1 << 16, domain)
    except onnx.defs.SchemaError:
        return None
    constraints = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
    result = []
    for formal in schema.inputs:
        allowed: Iterable[str] = constraints.get(formal.type_str, [formal.type_str])
        result.append((formal.name, any(t in _FLOAT_TYPE_STRINGS for t in allowed)))
    return tuple(result)


def coverage_markdown(registry: GradientRegistry | None = None) -> str:
    """The coverage table of ``registry`` (default: the built-in one) as Markdown."""
    registry = builtin_registry() if registry is None else registry
    rows = coverage_rows(registry)
    rules = [row for row in rows if row.differentiable]
    stops = [row for row in rows if not row.differentiable]
    lines = [
        "# Gradient coverage",
        "",
        f"Generated from the rule registry by `{COMMAND}`; do not edit.",
        "",
        f"{len({(r.domain, r.op_type) for r in rules})} operators have gradient rules; "
        f"{len(stops)} are declared non-differentiable (they stop the gradient).",
        "Opsets are those of the operator's domain; onnxtrain reads `ai.onnx` opset 13 and newer.",
        "",
        "| Domain | Operator | Opsets | Differentiable inputs | Gradient |",
        "|---|---|---|---|---|",
    ]
    for row in rules:
        formula = row.formula.replace("|", "\\|")
        lines.append(
            f"| {row.domain or 'ai.onnx'} | {row.op_type} | {row.opsets} | {', '.join(row.inputs)} | `{formula}` |"
        )
    lines += [
        "",
        "## Non-differentiable operators",
        "",
        "Their outputs carry no gradient: integer or bool results, or piecewise-constant functions.",
        "",
        "| Domain | Operator | Opsets |",
        "|---|---|---|",
    ]
    lines += [f"| {row.domain or 'ai.onnx'} | {row.op_type} | {row.opsets} |" for row in stops]
    pairs = registry.straight_through_pairs()
    if pairs:
        lines += [
            "",
            "## Straight-through pairs",
            "",
            "The first operator has no rule of its own: where the second reads each of its outputs, and nothing",
            "else does, the second's rule differentiates the pair (the straight-through estimator of",
            "quantization-aware training); where anything else reads them, the first has no gradient rule.",
            "",
            "| Domain | Operator | Read by |",
            "|---|---|---|",
        ]
        lines += [
            f"| {domain or 'ai.onnx'} | {op} | {pair.reader}"
            + (f" (maybe through {', '.join(sorted(pair.through))})" if pair.through else "")
            + " |"
            for (domain, op), pair in sorted(pairs.items())
        ]
    return "\n".join(lines) + "\n"


def split_document(text: str) -> tuple[str, str]:
    """``(registry part, torch.nn part)`` of the document, which joins them with a blank line before
    :data:`LAYERS_HEADING` (the torch.nn part is ``""`` when the heading is absent); the section under
    :data:`SECOND_ORDER_HEADING`, last, belongs to neither (:func:`second_order_section`)."""
    text = _cut(text, SECOND_ORDER_HEADING)[0]
    return _cut(text, LAYERS_HEADING)


def second_order_section(text: str) -> str:
    """The document's section under :data:`SECOND_ORDER_HEADING` (``""`` when absent)."""
    return _cut(text, SECOND_ORDER_HEADING)[1]


def _cut(text: str, heading: str) -> tuple[str, str]:
    """``text`` before and from the section ``heading`` that a blank line precedes."""
    at = text.find("\n\n" + heading + "\n")
    if at < 0:
        return text, ""
    return text[: at + 1], text[at + 2 :]


# ---------------------------------------------------------------- does a model train


@dataclass(frozen=True)
class TrainingCheck:
    """What :func:`check_training` found for one model.

    Attributes:
        operators: the model's distinct operators (``domain::op`` outside ``ai.onnx``), sorted.
        missing: the operators on the path from ``wrt`` to the outputs that have no gradient rule.
        error: why the training model did not build or run (``""`` when it did).
    """

    operators: tuple[str, ...]
    missing: tuple[str, ...] = ()
    error: str = ""

    @property
    def trains(self) -> bool:
        """A training model builds (and runs, when feeds were given)."""
        return not self.missing and not self.error


def _label(node: onnx.NodeProto) -> str:
    return node.op_type if versions.is_standard(node) else f"{node.domain}::{node.op_type}"


def model_operators(model: onnx.ModelProto) -> tuple[str, ...]:
    """The distinct operators of ``model``'s graph (``domain::op`` outside ``ai.onnx``), sorted: a
    :class:`TrainingCheck`'s ``operators``."""
    return tuple(sorted({_label(node) for node in model.graph.node}))


def _float_tensor(value: onnx.ValueInfoProto) -> bool:
    from onnxtrain.graph import dtypes

    return value.type.HasField("tensor_type") and dtypes.is_float(value.type.tensor_type.elem_type)


def check_training(
    model: onnx.ModelProto,
    wrt: Sequence[str] | None = None,
    feeds: Mapping[str, np.ndarray] | None = None,
    registry: GradientRegistry | None = None,
) -> TrainingCheck:
    """Whether a training model builds for ``model``: ``d loss / d wrt`` for ``loss`` = the sum of its float outputs.

    ``wrt`` defaults to every float initializer and float graph input. Every operator on the
    path from ``wrt`` to the outputs needs a rule (those without are ``missing``); then the
    gradient graph is built and, given ``feeds``, run once in onnxruntime. When that fails,
    ``model`` itself is run too, so that a model onnxruntime cannot run is told apart. ``model``
    is not changed.
    """
    from onnxtrain.graph import GraphBuilder, dtypes

    registry = builtin_registry() if registry is None else registry
    graph = model.graph
    operators = model_operators(model)
    if wrt is None:
        wrt = [t.name for t in graph.initializer if dtypes.is_float(t.data_type)]
        wrt += [v.name for v in graph.input if _float_tensor(v) and v.name not in wrt]
    outputs = [v.name for v in graph.output if _float_tensor(v)]
    if not outputs:
        return TrainingCheck(operators, error="no float output")
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    try:
        builder = GraphBuilder(copy)
        path = find_path(builder, outputs, list(wrt), registry)
        missing = tuple(sorted({_label(item.node) for item in path.nodes if item.rule is None}))
        if missing:
            return TrainingCheck(operators, missing)
        terms = [builder.add_node1("ReduceSum", [name], keepdims=0) for name in outputs]
        terms = [builder.add_node1("Cast", [t], to=onnx.TensorProto.FLOAT) for t in terms]
        loss = terms[0] if len(terms) == 1 else builder.add_node1("Sum", terms)
        grads = backward(builder, loss, list(wrt), registry)
        builder.set_outputs([loss, *grads.values()])
        trained = builder.finalize()
    except Exception as error:  # reported, not raised: it is the answer
        return TrainingCheck(operators, error=_fault(model, feeds) or f"{type(error).__name__}: {error}")
    if feeds is not None:
        try:
            _run(trained, feeds)
        except Exception as error:  # the same
            return TrainingCheck(
                operators, error=_fault(model, feeds) or f"onnxruntime: {type(error).__name__}: {error}"
            )
    return TrainingCheck(operators)


def _run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> None:
    """Run ``model`` once in onnxruntime (CPU)."""
    from onnxtrain.sessions import inference_session

    inference_session(model.SerializeToString()).run(None, dict(feeds))


def _fault(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray] | None) -> str:
    """Why onnxruntime cannot run ``model`` itself on ``feeds`` (``""`` when it can, or without feeds)."""
    from onnxtrain.graph import versions

    if feeds is None:
        return ""
    forward = onnx.ModelProto()
    forward.CopyFrom(model)
    versions.stamp_ir_version(forward)  # the IR version its opsets need, which onnxruntime reads
    try:
        _run(forward, feeds)
    except Exception as error:  # the model itself does not run: nothing to train
        return f"the model itself fails in onnxruntime: {error}"
    return ""


# ---------------------------------------------------------------- the torch.nn table


@dataclass(frozen=True)
class LayerRow:
    """One row of the torch.nn table: a layer, its export and whether it trains.

    ``check`` is ``None`` when the export failed; ``export_error`` says why.
    """

    name: str
    check: TrainingCheck | None
    export_error: str = ""


def _cell(text: str, limit: int = 160) -> str:
    """``text`` as one table cell: one line, pipes escaped, cut at ``limit`` characters."""
    line = " ".join(text.split())
    if len(line) > limit:
        line = line[: limit - 3] + "..."
    return line.replace("|", "\\|")


def layers_markdown(rows: Sequence[LayerRow], source: str, excluded: Mapping[str, str]) -> str:
    """The torch.nn section: one row per layer; ``source`` names the exporter; ``excluded``: class -> why not."""
    training = sum(1 for row in rows if row.check is not None and row.check.trains)
    unexported = sum(1 for row in rows if row.check is None)
    lines = [
        LAYERS_HEADING,
        "",
        f"Generated by `{COMMAND}` from {source}; do not edit.",
        "",
        "Each layer is exported in training mode with small example inputs. It *trains* when",
        "`trainable_parameters` names exactly its parameters and a training model over them builds: every",
        "operator on the path from its parameters and float inputs to its outputs has a rule, the gradient",
        "graph is built and runs once in onnxruntime.",
        "",
        f"{training} of {len(rows)} layers train; {unexported} do not export (a limit of torch's exporter, not "
        f"onnxtrain's); {len(rows) - training - unexported} export but do not train.",
        "",
        "| Layer | ONNX operators | Trains | Missing rules or error |",
        "|---|---|---|---|",
    ]
    for row in rows:
        if row.check is None:
            lines.append(f"| {row.name} | | export fails | {_cell(row.export_error)} |")
            continue
        check = row.check
        verdict = "yes" if check.trains else "no"
        why = ", ".join(check.missing) if check.missing else _cell(check.error)
        lines.append(f"| {row.name} | {', '.join(check.operators)} | {verdict} | {why} |")
    if excluded:
        lines += ["", "Not in the table (not layers one exports on their own):", ""]
        lines += [f"- `{name}`: {why}" for name, why in sorted(excluded.items())]
    return "\n".join(lines) + "\n"


def main() -> None:
    """Print the registry part of the document (the whole document: ``python tools/gradient_coverage.py``)."""
    print(coverage_markdown(), end="")


if __name__ == "__main__":
    main()
