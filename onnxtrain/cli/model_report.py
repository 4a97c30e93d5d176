"""``onnxtrain inspect MODEL.onnx``: inputs, outputs, initializers and operators, and where gradients stop.

The model is read without its external data: only names, types and shapes
are needed, so a model of many gigabytes is described without loading it.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import onnx

from onnxtrain.cli.common import size_text
from onnxtrain.cli.table import elements, number, shape_text, table
from onnxtrain.graph import versions
from onnxtrain.graph.walk import all_nodes


def model_report(path: Path) -> list[str]:
    """The lines ``inspect`` prints for the model at ``path``."""
    from onnxtrain.graph.io import load_base_model, upgraded

    model, _ = load_base_model(path, check_data=False, in_file=True, upgrade=False)
    lines = [f"{path}: ONNX model, IR version {model.ir_version}, opsets {_opsets(model) or 'none'}"]
    written = versions.opset_version(model, "")
    model = upgraded(model)
    if versions.opset_version(model, "") != written:
        lines.append(f"  converted to {_opsets(model)} for training by onnx's version converter, as described below")
    graph = model.graph
    initialized = {tensor.name for tensor in graph.initializer}
    lines.append("inputs:")
    lines += [f"  {value.name}: {value_text(value)}" for value in graph.input if value.name not in initialized]
    lines.append("outputs:")
    lines += [f"  {value.name}: {value_text(value)}" for value in graph.output]
    lines += _initializers(graph)
    lines += _adapters(model)
    lines += _exporter_changes(model)
    lines += _embedding_rules(graph)
    lines += _operators(model)
    return lines


def _adapters(model: onnx.ModelProto) -> list[str]:
    """The LoRA adapters ``add_adapters`` recorded, with what trains them (none: no lines)."""
    from onnxtrain.lora.record import adapters_of

    adapters = adapters_of(model)
    if not adapters:
        return []
    ranks = sorted({adapter.rank for adapter in adapters})
    return [
        f"LoRA adapters: {len(adapters)} (rank {', '.join(map(str, ranks))}), on "
        + ", ".join(adapter.weight for adapter in adapters[:4])
        + (f" and {len(adapters) - 4} more" if len(adapters) > 4 else ""),
        "  --requires-grad adapters trains them (their A and B initializers)",
    ]


def _opsets(model: onnx.ModelProto) -> str:
    """``ai.onnx 17, com.microsoft 1``: the domains ``model`` imports and their versions."""
    return ", ".join(f"{entry.domain or 'ai.onnx'} {entry.version}" for entry in model.opset_import)


def value_text(value: onnx.ValueInfoProto) -> str:
    """``float32[batch, 64]`` for a tensor; the kind of value otherwise."""
    if not value.type.HasField("tensor_type"):
        return str(value.type.WhichOneof("value") or "unknown type")
    tensor = value.type.tensor_type
    dtype = dtype_text(tensor.elem_type)
    if not tensor.HasField("shape"):
        return f"{dtype}[...]"
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim]
    return f"{dtype}{shape_text(dims)}"


def dtype_text(elem_type: int) -> str:
    """``float32``, ``int64``: NumPy's name of an ONNX element type (ONNX's where NumPy has none)."""
    from onnxtrain.graph.dtypes import dtype_name, to_numpy_dtype

    try:
        return str(to_numpy_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        return dtype_name(elem_type)


def _initializers(graph: onnx.GraphProto) -> list[str]:
    """The initializers, each with its role (``onnxtrain.artifacts.initializer_roles``): a weight, which
    ``--requires-grad weights`` trains; a constant; a running statistic, which training mode updates."""
    from onnxtrain.graph.roles import initializer_roles

    if not graph.initializer:
        return ["initializers: none"]
    model = onnx.ModelProto(graph=graph)
    roles = initializer_roles(model)
    rows = [["name", "shape", "dtype", "elements", "role"]]
    total = 0
    by_role: Counter[str] = Counter()
    for tensor in graph.initializer:
        count = elements(tensor.dims)
        total += count
        by_role[roles[tensor.name]] += count
        rows.append(
            [tensor.name, shape_text(list(tensor.dims)), dtype_text(tensor.data_type), number(count),
             roles[tensor.name]]
        )  # fmt: skip
    size = sum(elements(t.dims) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize for t in graph.initializer)
    kinds = ", ".join(
        f"{number(by_role[r])} in {r}s" for r in ("weight", "running statistic", "constant") if by_role[r]
    )
    summary = f"  total: {number(total)} elements ({kinds}), {size_text(size)}"
    note = "  weights are what --requires-grad weights trains; running statistics are updated in training mode"
    return [f"initializers ({len(graph.initializer)}):", *table(rows, right=[3]), summary, note]


def _exporter_changes(model: onnx.ModelProto) -> list[str]:
    """The parameters torch's dynamo exporter merged, dropped or folded for inference (none: no line)."""
    from onnxtrain.artifacts.exported_parameters import REMEDY, clause
    from onnxtrain.graph.torch_metadata import parameter_changes

    changes = parameter_changes(model)
    if not changes:
        return []
    lines = [
        f"torch's exporter changed parameters for inference in {len(changes)} places; {REMEDY[0].lower()}{REMEDY[1:]}:"
    ]
    return [*lines, *(f"  {change.change}: {clause(change)}" for change in changes)]


def _embedding_rules(graph: onnx.GraphProto) -> list[str]:
    """The embedding tables whose lookup follows torch's ``nn.Embedding`` rules (none: no line)."""
    from onnxtrain.graph.embeddings import embedding_rule

    rules = {}
    for node in graph.node:
        rule = embedding_rule(node)
        if rule:
            rules.setdefault(node.input[0], rule)
    if not rules:
        return []
    lines = ["embedding lookups with torch's gradient rules (nn.Embedding's padding_idx, scale_grad_by_freq):"]
    return [*lines, *(f"  {table}: {rule.describe()}" for table, rule in rules.items())]


def _operators(model: onnx.ModelProto) -> list[str]:
    from onnxtrain.autodiff import builtin_registry
    from onnxtrain.graph.versions import opset_version
    from onnxtrain.sklearn.converted import converter_hints

    counts = Counter((node.domain, node.op_type) for node in all_nodes(model.graph))
    rows = [[op if not domain else f"{domain}::{op}", number(n)] for (domain, op), n in counts.most_common()]
    total = sum(counts.values())
    lines = [f"operators ({number(total)} node{'' if total == 1 else 's'}):", *table(rows, right=[1])]
    registry = builtin_registry()
    missing, stopping = [], []
    for domain, op in sorted(counts, key=lambda key: (key[0], key[1])):
        if registry.lookup(op, domain, opset_version(model, domain)) is not None:
            continue
        name = op if not domain else f"{domain}::{op}"
        (stopping if registry.is_non_differentiable(op, domain) else missing).append(name)
    if missing:
        lines.append(
            f"no gradient rule: {', '.join(missing)}: gradients cannot flow through these; train only parameters "
            "whose path to the loss avoids them, or register rules (onnxtrain.autodiff.GradientRegistry)"
        )
    else:
        lines.append("gradient rules: every differentiable operator has one")
    if stopping:
        lines.append(f"stop the gradient (not differentiable, by definition): {', '.join(stopping)}")
    lines += [f"  {hint}" for hint in converter_hints(model)]
    return lines


__all__ = ["dtype_text", "model_report", "value_text"]
