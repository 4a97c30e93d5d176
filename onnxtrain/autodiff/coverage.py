"""The gradient coverage table, generated from the registry.

``python -m onnxtrain.autodiff.coverage > docs/gradient-coverage.md``
"""

from __future__ import annotations

from onnxtrain.autodiff.registry import GradientRegistry, builtin_registry


def coverage_markdown(registry: GradientRegistry | None = None) -> str:
    """The coverage table of ``registry`` (default: the built-in one) as Markdown."""
    registry = builtin_registry() if registry is None else registry
    rows = registry.coverage()
    rules = [row for row in rows if row.differentiable]
    stops = [row for row in rows if not row.differentiable]
    lines = [
        "# Gradient coverage",
        "",
        "Generated from the rule registry by `python -m onnxtrain.autodiff.coverage`; do not edit.",
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
    return "\n".join(lines) + "\n"


def main() -> None:
    """Print the built-in coverage table."""
    print(coverage_markdown(), end="")


if __name__ == "__main__":
    main()
