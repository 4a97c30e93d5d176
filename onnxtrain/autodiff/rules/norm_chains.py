"""RMS normalization exported as a chain of nodes, differentiated as one function.

Llama, Mistral, Gemma, T5 and Qwen write their RMSNorm as
``x * rsqrt(mean(x^2) + eps)``, which torch's exporters write out:
``Pow(x, 2)`` (or ``x * x``), ``ReduceMean`` over the last axes with the
axes kept, ``Add(eps)``, ``Sqrt``, ``Div(1, .)`` (or ``Reciprocal``), and the
``Mul`` by ``x`` (T5 squares ``x`` cast to float32; with bfloat16 weights it
casts its input twice, once for the square and once for the product). Node
by node its backward is 14 nodes (at known shapes), an ``Expand`` of the
mean's gradient to the activation's size among them; as one function,
``y = x r`` with ``r = (mean(x^2) + eps)^(-1/2)``, it is
``dx = r (g - y mean(g y))``
(:func:`~onnxtrain.autodiff.rules.backward_helpers.rms_scale_grad`), five
nodes reading the output ``y`` and the per-row ``r``, whatever ``eps``.

The ``Mul`` rule asks :func:`fuse_rms_chain` first. The chain is matched by
its structure from the ``Mul``, in either operand order, through exactly
those operators: constants of one element (``1``, ``2``, ``eps``), the
reduction's axes known while building with ``keepdims=1``, and the chain's
inner values read by nothing else the loss depends on. Anything else is
differentiated node by node.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.rules.backward_helpers import rms_scale_grad
from onnxtrain.graph import dtypes
from onnxtrain.graph.attributes import attribute
from onnxtrain.graph.attributes import attributes as node_attributes
from onnxtrain.graph.versions import is_standard


@dataclass(frozen=True)
class RmsChain:
    """``y = x * r``, ``r = 1 / sqrt(mean(x^2, axes) + eps)``: its input ``x``, ``r``, the axes and the nodes."""

    x: str
    r: str
    axes: tuple[int, ...]
    nodes: tuple[onnx.NodeProto, ...]


def fuse_rms_chain(ctx: RuleContext, g: str) -> bool:
    """Give ``x`` the gradient ``r (g - y mean(g y))`` where ``ctx``'s ``Mul`` ends an RMS normalization chain
    (see the module docstring); whether it did (the node's own inputs then get no gradient)."""
    chain = rms_chain(ctx)
    if chain is None or not ctx.depends_on_wrt(chain.x):
        return False
    ctx.contribute(chain.x, rms_scale_grad(ctx, g, ctx.outputs[0], chain.r, chain.axes))
    return True


def rms_chain(ctx: RuleContext) -> RmsChain | None:
    """The RMS normalization chain that ``ctx``'s ``Mul`` ends, or ``None``."""
    final = ctx.node
    if final.op_type != "Mul" or not is_standard(final) or len(final.input) != 2:
        return None
    for x, r in (final.input, reversed(final.input)):
        chain = _chain(ctx, final, x, r)
        if chain is not None:
            return chain
    return None


def _chain(ctx: RuleContext, final: onnx.NodeProto, x: str, r: str) -> RmsChain | None:
    if x == r or not dtypes.is_float(ctx.builder.elem_type_if_known(x) or onnx.TensorProto.UNDEFINED):
        return None
    inverse = _producer(ctx, r, "Div", "Reciprocal")
    if inverse is None or (inverse.op_type == "Div" and not _is_constant(ctx, inverse.input[0], 1.0)):
        return None
    root = _producer(ctx, inverse.input[-1], "Sqrt")
    shifted = root and _producer(ctx, root.input[0], "Add")
    if shifted is None:
        return None
    mean_value = next((v for v in shifted.input if _is_constant(ctx, _other(shifted, v))), None)
    mean = mean_value and _producer(ctx, mean_value, "ReduceMean")
    axes = mean and _kept_axes(ctx, mean)
    square = mean and _producer(ctx, mean.input[0], "Pow", "Mul")
    squared = square and _squared(ctx, square)
    if square is None or axes is None or squared is None:
        return None
    cast = _producer(ctx, squared, "Cast") if squared != x else None
    if squared != x and (cast is None or not _float_cast(cast) or not _same_cast(ctx, cast, x)):
        return None
    nodes = (*([cast] if cast else []), square, mean, shifted, root, inverse, final)
    if not all(ctx.read_only_by(node.output[0], nodes) for node in nodes[:-1]):
        return None
    return RmsChain(x, r, axes, nodes)


def _other(node: onnx.NodeProto, value: str) -> str:
    """The input of a two-input ``node`` that is not ``value``."""
    return node.input[1] if node.input[0] == value else node.input[0]


def _producer(ctx: RuleContext, value: str, *op_types: str) -> onnx.NodeProto | None:
    node = ctx.producer(value) if value else None
    if node is None or node.op_type not in op_types or not is_standard(node) or len(node.output) != 1:
        return None
    return node


def _is_constant(ctx: RuleContext, name: str, value: float | None = None) -> bool:
    """Whether ``name`` is a float constant of one element (equal to ``value`` when given)."""
    array = ctx.constant_value(name) if not ctx.depends_on_wrt(name) else None
    if array is None or array.size != 1 or not np.issubdtype(array.dtype, np.floating):
        return False
    return value is None or float(array.reshape(())) == value


def _squared(ctx: RuleContext, node: onnx.NodeProto) -> str | None:
    """The value ``node`` squares (``v * v``, ``Pow(v, 2)``), or ``None``."""
    if node.op_type == "Mul":
        return node.input[0] if node.input[0] == node.input[1] else None
    exponent = ctx.constant_value(node.input[1]) if not ctx.depends_on_wrt(node.input[1]) else None
    return node.input[0] if exponent is not None and exponent.size == 1 and float(exponent.reshape(())) == 2 else None


def _same_cast(ctx: RuleContext, cast: onnx.NodeProto, x: str) -> bool:
    """Whether ``cast`` makes ``x``'s values: it casts ``x``, or it casts what ``x`` is cast from, to the same type
    (T5 with bfloat16 weights casts its input to float32 twice, once for the square, once for the product)."""
    if cast.input[0] == x:
        return True
    twin = _producer(ctx, x, "Cast")
    return twin is not None and twin.input[0] == cast.input[0] and _cast_to(twin) == _cast_to(cast)


def _cast_to(node: onnx.NodeProto) -> int:
    return int(attribute(node, "to", 0))


def _float_cast(node: onnx.NodeProto) -> bool:
    """Whether ``Cast`` ``node`` casts to a float type (T5 squares ``x`` cast to float32, and scales ``x``)."""
    return dtypes.is_float(_cast_to(node))


def _kept_axes(ctx: RuleContext, node: onnx.NodeProto) -> tuple[int, ...] | None:
    """The axes ``ReduceMean`` ``node`` reduces, known while building and kept as size 1, or ``None``."""
    attributes = node_attributes(node)
    if attributes.get("keepdims", 1) != 1 or attributes.get("noop_with_empty_axes", 0):
        return None
    if len(node.input) > 1 and node.input[1]:
        value = ctx.constant_value(node.input[1])
        axes = None if value is None else [int(a) for a in value.reshape(-1)]
    else:
        axes = [int(a) for a in attributes.get("axes", [])]
    return tuple(axes) if axes else None
