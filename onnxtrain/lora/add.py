"""``add_adapters``: low-rank adapters beside chosen weights of a base model.

For each product ``y = x W`` (see :mod:`onnxtrain.lora.sites`) it emits::

    x' = Dropout(x, ratio, training_mode=True)      # only when dropout > 0
    y  = Add(y_base, Mul(MatMul(MatMul(x', A), B), alpha / rank))

``A: [in, rank]``, ``B: [rank, out]``, in the product's view of ``W`` (a
weight stored ``[out, in]``, for Gemm ``transB=1`` or read through a
``Transpose``, is ``W^T`` there). For Gemm, ``x`` is ``A'`` (transposed when
``transA=1``) and the scale carries Gemm's ``alpha``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Literal

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxtrain.graph import dtypes, versions
from onnxtrain.graph.io import load_light
from onnxtrain.graph.naming import NameGenerator, names_in
from onnxtrain.lora import record
from onnxtrain.lora.sites import Site, find_sites, select
from onnxtrain.lora.types import declare_nbits_outputs

#: How ``A`` starts: PEFT's default (Kaiming-uniform, bound ``1/sqrt(in)``) or ``"gaussian"`` (sd ``1/rank``).
Init = Literal["kaiming", "gaussian"]


def add_adapters(
    model: onnx.ModelProto | str | os.PathLike[str],
    targets: str | Sequence[str],
    rank: int,
    alpha: float,
    dropout: float = 0.0,
    *,
    init: Init = "kaiming",
    seed: int = 0,
) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of ``model`` with LoRA adapters beside the weights ``targets`` names; and the adapters' names.

    ``y = x W + (alpha / rank) * dropout(x) A B``: ``A: [in, rank]`` drawn as ``init``
    says from ``seed`` (which also seeds the Dropout nodes), ``B: [rank, out]``
    zeros, so the adapted model starts equal to the base. ``targets``: glob
    patterns (``fnmatch``, case-sensitive) matched against the names a weight
    is known by (:mod:`onnxtrain.lora.names`: its initializer's, its readers'
    node names and torch module paths such as ``encoder.layer.0.attention.q_lin``),
    each whole or its part after a dot; each must match at least one weight that
    is the second input of a MatMul or Gemm (``transA``, ``transB``, ``alpha``
    handled; directly or through a ``Transpose``), the ``B`` of
    ``com.microsoft::MatMulNBits``, or an integer weight ``DequantizeLinear``
    feeds into such a product. The outputs of every ``MatMulNBits`` get their
    types declared, for the gradient graph. The base weights stay initializers:
    pass the returned names (``W.lora_A``, ``W.lora_B`` per weight, in
    initializer order) as ``requires_grad`` to ``generate_artifacts``, and
    everything else stays frozen. See ``docs/lora.md``.
    """
    patterns = _check_arguments(targets, rank, alpha, dropout, init, seed)
    base, data = load_light(model)  # weights are only read for their shapes and types
    graph = base.graph
    sites, reasons = find_sites(graph)
    chosen = select(patterns, sites, reasons, graph)
    existing = record.adapters_of(base)
    again = sorted({a.weight for a in existing} & set(chosen))
    if again:
        raise ValueError(f"weights {again} have adapters already; merge them first or target other weights")
    names = NameGenerator(names_in(graph))
    rng = np.random.default_rng(seed)
    inserts: dict[int, list[onnx.NodeProto]] = {}
    adapters = list(existing)
    trainable: list[str] = []
    for weight in chosen:
        adapter, nodes, tensors = _adapter(graph, sites[weight], rank, alpha, dropout, init, rng, names)
        graph.initializer.extend(tensors)
        for index, added in nodes.items():
            inserts.setdefault(index, []).extend(added)
        adapters.append(adapter)
        trainable += [adapter.a, adapter.b]
    ordered: list[onnx.NodeProto] = []
    for k, node in enumerate(graph.node):
        ordered.append(node)
        ordered.extend(inserts.get(k, []))
    del graph.node[:]
    graph.node.extend(ordered)
    declare_nbits_outputs(base)
    record.write(base, adapters)
    versions.stamp_ir_version(base)
    data.load_held(base)  # a ModelProto's weights, copied once into the result
    return base, trainable


def _check_arguments(
    targets: str | Sequence[str], rank: int, alpha: float, dropout: float, init: str, seed: int
) -> list[str]:
    patterns = [targets] if isinstance(targets, str) else list(targets)
    if not patterns or not all(isinstance(p, str) and p for p in patterns):
        raise ValueError(f"targets must be a glob pattern or a non-empty list of them, not {targets!r}")
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank <= 0:
        raise ValueError(f"rank must be a positive integer (the adapters' inner size), not {rank!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise ValueError(f"alpha must be a finite number (the adapter scales by alpha / rank), not {alpha!r}")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be a probability in [0, 1), not {dropout!r}")
    if init not in ("kaiming", "gaussian"):
        raise ValueError(f"init must be 'kaiming' or 'gaussian', not {init!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an integer, not {type(seed).__name__}")
    return patterns


def _initial_a(rng: np.random.Generator, fan_in: int, rank: int, init: Init) -> np.ndarray:
    """PEFT's ``kaiming_uniform_(a=sqrt(5))`` (uniform in ``±1/sqrt(in)``), or normal with sd ``1/rank``."""
    if init == "gaussian":
        return rng.normal(0.0, 1.0 / rank, size=(fan_in, rank))
    bound = 1.0 / math.sqrt(fan_in)
    return rng.uniform(-bound, bound, size=(fan_in, rank))


def _adapter(
    graph: onnx.GraphProto,
    sites: list[Site],
    rank: int,
    alpha: float,
    dropout: float,
    init: Init,
    rng: np.random.Generator,
    names: NameGenerator,
) -> tuple[record.Adapter, dict[int, list[onnx.NodeProto]], list[onnx.TensorProto]]:
    """The adapter of one weight: its record, the nodes to insert after each product, its initializers."""
    first = sites[0]
    weight = first.weight
    dtype = dtypes.to_numpy_dtype(first.elem_type)
    a_name, b_name = f"{weight}.lora_A", f"{weight}.lora_B"
    for name in (a_name, b_name):
        if name in names:
            raise ValueError(f"the model already has a value named {name!r}; rename it before adding adapters")
        names.reserve(name)
    tensors = [
        numpy_helper.from_array(_initial_a(rng, first.fan_in, rank, init).astype(dtype), a_name),
        numpy_helper.from_array(np.zeros((rank, first.fan_out), dtype), b_name),
    ]
    constants: list[str] = []

    def constant(value: np.ndarray, hint: str) -> str:
        name = names.fresh(f"{weight}.lora_{hint}")
        tensors.append(numpy_helper.from_array(value, name))
        constants.append(name)
        return name

    ratio = constant(np.asarray(dropout, dtype), "dropout_ratio") if dropout > 0 else ""
    training = constant(np.asarray(True), "training_mode") if dropout > 0 else ""
    scales: dict[float, str] = {}
    placements: list[record.Placement] = []
    inserts: dict[int, list[onnx.NodeProto]] = {}
    for site in sites:
        node = graph.node[site.node]
        if not node.name:
            node.name = names.fresh(f"{node.op_type}")
        factor = (alpha / rank) * _gemm_alpha(node)
        if factor not in scales:
            scales[factor] = constant(np.asarray(factor, dtype), "scale")
        output = node.output[0]
        base_output = names.fresh(f"{output}.base")
        node.output[0] = base_output
        dropout_seed = int(rng.integers(0, 2**31 - 1))
        nodes = _nodes(node, site, (a_name, b_name), (ratio, training, dropout_seed), scales[factor], output, names)
        inserts[site.node] = nodes
        placements.append(record.Placement(node.name, output, base_output, [n.name for n in nodes]))
    adapter = record.Adapter(
        weight, first.kind, a_name, b_name, rank, alpha / rank, first.transposed, constants, placements
    )
    return adapter, inserts, tensors


def _gemm_alpha(node: onnx.NodeProto) -> float:
    if node.op_type != "Gemm":
        return 1.0
    for attribute in node.attribute:
        if attribute.name == "alpha":
            return float(attribute.f)
    return 1.0


def _nodes(
    node: onnx.NodeProto,
    site: Site,
    adapter: tuple[str, str],
    dropout: tuple[str, str, int],
    scale: str,
    output: str,
    names: NameGenerator,
) -> list[onnx.NodeProto]:
    """``output = node's output + scale * dropout(x) @ A @ B`` for the product ``node`` (its output renamed first).

    ``dropout``: the ratio and training-flag constants (``""`` for none) and the Dropout's seed.
    """
    a, b = adapter
    ratio, training, seed = dropout
    stem = f"{site.weight}.lora"
    nodes: list[onnx.NodeProto] = []

    def emit(op_type: str, inputs: list[str], out: str | None = None, **attrs: object) -> str:
        result = out or names.fresh(f"{stem}_{op_type.lower()}")
        nodes.append(helper.make_node(op_type, inputs, [result], name=names.fresh(f"{stem}/{op_type}"), **attrs))
        return result

    x = node.input[0]
    if node.op_type == "Gemm" and any(att.name == "transA" and att.i for att in node.attribute):
        x = emit("Transpose", [x], perm=[1, 0])
    if ratio:
        x = emit("Dropout", [x, ratio, training], seed=seed)
    low = emit("MatMul", [emit("MatMul", [x, a]), b])
    emit("Add", [node.output[0], emit("Mul", [low, scale])], out=output)
    return nodes
