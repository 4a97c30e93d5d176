"""Where an adapter can go: weights that are the second input of a matrix product, and only that.

A *site* is one product reading a weight initializer ``W`` as its right operand:

- ``MatMul(x, W)``, ``W: [in, out]``;
- ``Gemm(x, W)``, ``W: [in, out]`` (``transB=0``) or ``[out, in]`` (``transB=1``);
- ``MatMul(x, Transpose(W))`` (or Gemm), ``W`` a float 2-D initializer stored
  transposed, ``[out, in]`` for MatMul, as torch's TorchScript exporter writes
  a ``Linear`` in training mode;
- ``MatMul(x, DequantizeLinear(W, ...))`` (or Gemm), ``W`` an integer ``[in, out]``
  initializer (the weight named is the quantized one);
- ``com.microsoft::MatMulNBits(x, W, scales, ...)``, ``in = K``, ``out = N``.

A weight read through ``Identity`` copies (torch's TorchScript exporter writes
one per use of a shared layer: ALBERT's) has the sites of its copies' readers,
one adapter for all. Only the top-level graph is searched. A weight also read by anything else
(a ``Gather`` of tied embeddings, the left operand of a product) has no site:
an adapter beside it would change one reader and not the others. Which sites
a target pattern chooses: :func:`select`, by the names of :mod:`onnxtrain.lora.names`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import onnx

from onnxtrain.graph import dtypes
from onnxtrain.graph.attributes import attribute
from onnxtrain.graph.versions import is_standard
from onnxtrain.lora.names import KnownAs, names_of_initializers

#: What kind of product reads the weight.
SiteKind = Literal["MatMul", "Gemm", "DequantizeLinear", "MatMulNBits"]


@dataclass(frozen=True)
class Site:
    """One product whose right operand is the weight ``weight``.

    Attributes:
        weight: the initializer's name.
        node: index of the product node in ``graph.node``.
        kind: ``MatMul``, ``Gemm``, ``DequantizeLinear`` (``MatMul``/``Gemm`` of a
            dequantized weight) or ``MatMulNBits``.
        fan_in, fan_out: the logical ``[in, out]`` of the product.
        elem_type: the float type the product computes in (the adapter's).
        transposed: whether the float weight is stored ``[out, in]`` (Gemm ``transB=1``, or
            read through a ``Transpose`` by MatMul or Gemm ``transB=0``).
    """

    weight: str
    node: int
    kind: SiteKind
    fan_in: int
    fan_out: int
    elem_type: int
    transposed: bool = False


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    return int(attribute(node, name, default))


def _readers(graph: onnx.GraphProto) -> dict[str, list[tuple[int, int]]]:
    """``{value: [(node index, input index), ...]}`` for the top-level graph."""
    readers: dict[str, list[tuple[int, int]]] = {}
    for k, node in enumerate(graph.node):
        for j, name in enumerate(node.input):
            if name:
                readers.setdefault(name, []).append((k, j))
    return readers


def _describe(graph: onnx.GraphProto, k: int, j: int) -> str:
    node = graph.node[k]
    return f"{node.op_type} node {node.name or f'#{k}'!r} as input {j}"


def find_sites(graph: onnx.GraphProto) -> tuple[dict[str, list[Site]], dict[str, str]]:
    """The sites of every adaptable weight, and why each other initializer is not adaptable.

    Returns ``({weight: [site, ...]}, {initializer: reason})``.
    """
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    readers = _readers(graph)
    outputs = {value.name for value in graph.output}
    sites: dict[str, list[Site]] = {}
    reasons: dict[str, str] = {}
    for name, tensor in initializers.items():
        found: list[Site] = []
        problems: list[str] = []
        if name in outputs:
            problems.append("it is a graph output")
        for k, j in _through_identities(graph, name, readers, outputs):
            site = _site(graph, name, tensor, k, j, readers, outputs)
            if isinstance(site, Site):
                found.append(site)
            else:
                problems.append(site)
        if found and problems:  # a product's weight that something else reads too
            problems.append(
                f"it is also the weight of {_describe(graph, found[0].node, 1)}: an adapter there would leave its "
                "other readers on the base weight (an embedding tied to the output head, say), so none goes beside it"
            )
        orientations = {site.transposed: site for site in found}
        if len(orientations) > 1:
            problems.append(
                f"read as [in, out] by {_describe(graph, orientations[False].node, 1)} and as [out, in] by "
                f"{_describe(graph, orientations[True].node, 1)}: one adapter cannot update both"
            )
        if found and not problems:
            sites[name] = found
        else:
            reasons[name] = "; ".join(problems) if problems else "no node reads it"
    return sites, reasons


def _through_identities(
    graph: onnx.GraphProto, name: str, readers: dict[str, list[tuple[int, int]]], outputs: set[str]
) -> list[tuple[int, int]]:
    """The readers ``(node, input)`` of ``name``, those of an ``Identity`` replaced by its output's: torch's
    TorchScript exporter reads a layer applied several times (ALBERT's shared layer) through an ``Identity`` per
    use, and one adapter beside the weight serves every use, as PEFT's does. An ``Identity`` whose output is a
    graph output stays a reader (no site)."""
    found: list[tuple[int, int]] = []
    pending = list(readers.get(name, []))
    while pending:
        k, j = pending.pop(0)
        node = graph.node[k]
        if node.op_type == "Identity" and is_standard(node) and node.output[0] not in outputs:
            pending += readers.get(node.output[0], [])
        else:
            found.append((k, j))
    return found


def _site(
    graph: onnx.GraphProto,
    name: str,
    tensor: onnx.TensorProto,
    k: int,
    j: int,
    readers: dict[str, list[tuple[int, int]]],
    outputs: set[str],
) -> Site | str:
    """The site of reader ``(k, j)`` of initializer ``name``, or why it is none."""
    node = graph.node[k]
    where = _describe(graph, k, j)
    dims = list(tensor.dims)
    standard = is_standard(node)
    if node.op_type == "MatMulNBits" and node.domain == "com.microsoft" and j == 1:
        scales = graph.node[k].input[2]
        elem = _elem_type_of(graph, scales)
        return Site(name, k, "MatMulNBits", _attr(node, "K", 0), _attr(node, "N", 0), elem)
    if standard and node.op_type == "DequantizeLinear" and j == 0:
        product = node.output[0]
        users = readers.get(product, [])
        if product in outputs or len(users) != 1 or len(dims) != 2:
            return f"read by {where}, whose output is not the right operand of exactly one MatMul/Gemm"
        (pk, pj) = users[0]
        inner = _product(graph, pk, pj, dims)
        if isinstance(inner, str):
            return f"dequantized by {where}, then {inner}"
        fan_in, fan_out, transposed = inner
        elem = _elem_type_of(graph, node.input[1])
        return Site(name, pk, "DequantizeLinear", fan_in, fan_out, elem, transposed)
    if not dtypes.is_float(tensor.data_type):
        return f"read by {where} (an integer weight must feed DequantizeLinear or MatMulNBits)"
    if standard and node.op_type == "Transpose" and j == 0:
        return _transposed_site(graph, name, tensor, k, readers, outputs)
    inner = _product(graph, k, j, dims)
    if isinstance(inner, str):
        return inner
    fan_in, fan_out, transposed = inner
    kind: SiteKind = "Gemm" if node.op_type == "Gemm" else "MatMul"
    return Site(name, k, kind, fan_in, fan_out, tensor.data_type, transposed)


def _transposed_site(
    graph: onnx.GraphProto,
    name: str,
    tensor: onnx.TensorProto,
    k: int,
    readers: dict[str, list[tuple[int, int]]],
    outputs: set[str],
) -> Site | str:
    """The site of 2-D float weight ``name`` read by ``Transpose`` node ``k`` into the right operand of a product.

    The product sees ``W^T``: the weight is stored transposed unless a Gemm ``transB=1`` transposes it back.
    """
    node = graph.node[k]
    where = _describe(graph, k, 0)
    dims = list(tensor.dims)
    perm = _ints(node, "perm")
    product = node.output[0]
    users = readers.get(product, [])
    if len(dims) != 2 or perm not in (None, [1, 0]):
        return f"read by {where}, which is no transposition of a 2-D weight"
    if product in outputs or len(users) != 1:
        return f"read by {where}, whose output is not the right operand of exactly one MatMul/Gemm"
    (pk, pj) = users[0]
    inner = _product(graph, pk, pj, dims[::-1])
    if isinstance(inner, str):
        return f"transposed by {where}, then {inner}"
    fan_in, fan_out, transposed = inner
    kind: SiteKind = "Gemm" if graph.node[pk].op_type == "Gemm" else "MatMul"
    return Site(name, pk, kind, fan_in, fan_out, tensor.data_type, not transposed)


def _ints(node: onnx.NodeProto, name: str) -> list[int] | None:
    values = attribute(node, name)
    return None if values is None else [int(v) for v in values]


def _product(graph: onnx.GraphProto, k: int, j: int, dims: Sequence[int]) -> tuple[int, int, bool] | str:
    """``(in, out, transposed)`` when node ``k`` is a MatMul/Gemm reading a 2-D weight as input ``j == 1``."""
    node = graph.node[k]
    where = _describe(graph, k, j)
    if not is_standard(node) or node.op_type not in ("MatMul", "Gemm") or j != 1:
        return f"read by {where}, not as the second input of a MatMul or Gemm"
    if len(dims) != 2:
        return f"read by {where} with rank {len(dims)}; adapters need a 2-D weight"
    if node.op_type == "Gemm" and _attr(node, "transB", 0):
        return dims[1], dims[0], True
    return dims[0], dims[1], False


def _elem_type_of(graph: onnx.GraphProto, name: str) -> int:
    """The element type of initializer ``name`` (float32 when it is not one)."""
    for tensor in graph.initializer:
        if tensor.name == name:
            return tensor.data_type
    return onnx.TensorProto.FLOAT


def select(
    patterns: Sequence[str], sites: dict[str, list[Site]], reasons: dict[str, str], graph: onnx.GraphProto
) -> list[str]:
    """The adaptable weights matched by the glob ``patterns``, in initializer order.

    A pattern matches a weight when it matches one of the names the weight is
    known by in ``graph`` (:mod:`onnxtrain.lora.names`: its own, its readers',
    their module paths). ``ValueError`` for a pattern that matches no adaptable
    weight, naming what it matched instead (and why that is not adaptable) or
    the weights there are.
    """
    known = names_of_initializers(graph)
    chosen: set[str] = set()
    for pattern in patterns:
        hits = {name for name in sites if known[name].matched_by(pattern)}
        if not hits:
            # the matrices first (a weight read the wrong way is the likely target), then scales and the rest
            ranks = {tensor.name: len(tensor.dims) for tensor in graph.initializer}
            matched = [name for name in reasons if known[name].matched_by(pattern)]
            others = sorted(matched, key=lambda name: (ranks.get(name) != 2, name))
            if others:
                more = f" (and {len(others) - 5} more)" if len(others) > 5 else ""
                why = "; ".join(f"{name!r}: {reasons[name]}" for name in others[:5]) + more
                raise ValueError(
                    f"target pattern {pattern!r} matches no weight an adapter can go beside: it matches {why}. "
                    "Adapters go beside a weight that is the second input of a MatMul or Gemm (or of "
                    "MatMulNBits, or dequantized or transposed into one) and nothing else; those here: "
                    f"{_listing(sites, known)}"
                )
            raise ValueError(
                f"target pattern {pattern!r} matches no initializer, node or module name (patterns are globs, as "
                "fnmatch: '*', '?', '[...]', over a whole name or the part after one of its dots); the weights "
                f"adapters can go beside: {_listing(sites, known)}"
            )
        chosen |= hits
    return [name for name in sites if name in chosen]


def _listing(sites: dict[str, list[Site]], known: dict[str, KnownAs]) -> str:
    """The adaptable weights, sorted, and the modules of their products when the nodes name any."""
    modules = sorted({path for name in sites for path in known[name].modules})
    return f"{sorted(sites)}" + (f", in the modules {modules}" if modules else "")
