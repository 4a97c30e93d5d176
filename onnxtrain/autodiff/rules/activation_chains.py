"""Activations exported as chains of element-wise nodes, differentiated as the function they compute.

Exporters write GELU, SiLU and QuickGELU out in element-wise nodes: GPT-2's
tanh GELU is ``Mul(x, 0.5)``, ``Pow(x, 3)``, ``Mul``, ``Add``, ``Mul``,
``Tanh``, ``Add``, ``Mul``. Differentiated node by node, its backward is 12
nodes that read the values of four links, kept or computed again (on a GPU,
where onnxruntime fuses the forward into one ``FastGelu``, 19 launches a
layer after it); the function's own derivative
(:mod:`~onnxtrain.autodiff.rules.activations`) is 13 with the product by the
gradient, and reads the chain's input alone.

A *chain* ends at the ``Mul`` being differentiated and starts at one value
``x``: its nodes are operators of ONNX's domain that :data:`EVALUATED` knows
(casts between float types among them: half precision's autocast computes
part of a chain in bfloat16),
each reading ``x``, a constant of one element, or another node of the
chain; nothing outside the chain reads their values, which are no graph
outputs. It is recognised by what it computes, whatever form the exporter
wrote (``Pow(x, 3)`` or ``x * x * x``, the constants first or last): evaluated
in float64 at :func:`probes`, it equals an activation of :data:`KNOWN`
within :data:`TOLERANCE` (an export's float32 constants move the function by
1e-8 at most; GELU's erf and tanh forms differ by up to 5e-4). The ``Mul``'s
rule then gives ``x`` the gradient ``g f'(x)``, computed in the wider float
type of ``x`` and the chain's output, and the chain's other nodes get none.
Anything else (a constant of more than one element, a link read
elsewhere, a function of no known form) is differentiated node by node, as
before.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import onnx
from onnx import helper

from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.rules import activations
from onnxtrain.graph import dtypes
from onnxtrain.graph.attributes import attributes as node_attributes
from onnxtrain.graph.versions import is_standard

#: The most nodes a chain has (GPT-2's tanh GELU has 8; torch's own export of it, 9).
MAX_NODES = 16

#: How far a chain's values at the probes may be from the activation's (absolute, and relative to its value): an
#: export's float32 constants move GELU by 1e-8 at most; 0.0447 for its 0.044715, by 1e-5.
TOLERANCE = 1e-7


@dataclass(frozen=True)
class Activation:
    """A function of one variable that chains are recognised as.

    Attributes:
        name: what the documentation calls it.
        value: the function in float64.
        derivative: ``f'(x)``, emitted from ``x`` and ``y = f(x)``.
    """

    name: str
    value: Callable[[np.ndarray], np.ndarray]
    derivative: Callable[[RuleContext, str, str], str]


def _erf(x: np.ndarray) -> np.ndarray:
    return np.frompyfunc(math.erf, 1, 1)(x).astype(np.float64)  # type: ignore[no-any-return]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))  # type: ignore[no-any-return]


#: The activations a chain may compute: torch's ``gelu`` (erf and tanh forms), SiLU, and CLIP's QuickGELU.
KNOWN: tuple[Activation, ...] = (
    Activation(
        "GELU, tanh approximation",
        lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))),
        lambda ctx, x, y: activations.gelu_tanh_derivative(ctx, x),
    ),
    Activation(
        "GELU",
        lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
        lambda ctx, x, y: activations.gelu_erf_derivative(ctx, x),
    ),
    Activation("SiLU", lambda x: x * _sigmoid(x), activations.sigmoid_gated_derivative),
    Activation(
        "QuickGELU",
        lambda x: x * _sigmoid(1.702 * x),
        lambda ctx, x, y: activations.sigmoid_gated_derivative(ctx, x, y, 1.702),
    ),
)

#: Element-wise operators a chain may hold, as numpy computes them.
EVALUATED: Mapping[str, Callable[..., np.ndarray]] = MappingProxyType(
    {
        "Add": np.add,
        "Sub": np.subtract,
        "Mul": np.multiply,
        "Div": np.divide,
        "Pow": np.power,
        "Neg": np.negative,
        "Reciprocal": np.reciprocal,
        "Sqrt": np.sqrt,
        "Exp": np.exp,
        "Tanh": np.tanh,
        "Erf": _erf,
        "Sigmoid": _sigmoid,
        "Identity": np.positive,
        "Cast": np.positive,  # between float types only (_evaluable): the function is the same
    }
)


def probes() -> np.ndarray:
    """Where chains are evaluated: 49 points from -5.9 to 6.1, none at 0."""
    return np.linspace(-6.0, 6.0, 49) + 0.1


@dataclass(frozen=True)
class Chain:
    """Element-wise nodes computing one value from ``x`` (see the module docstring).

    Attributes:
        x: the chain's input.
        nodes: its nodes, each after the nodes it reads; the last makes its output.
    """

    x: str
    nodes: tuple[onnx.NodeProto, ...]


def fuse_activation_chain(ctx: RuleContext, g: str) -> bool:
    """Give the input of the chain that ends at ``ctx``'s node the gradient ``g f'(x)`` where the chain computes a
    :data:`KNOWN` activation ``f``; whether it did (the node's own inputs then get no gradient)."""
    for chain in chains_ending_here(ctx):
        activation = recognised(ctx, chain)
        if activation is not None:
            if not ctx.depends_on_wrt(chain.x):
                return False
            x, y = chain.x, ctx.outputs[0]
            wide = ctx.cast_like(x, y) if _itemsize(ctx, y) > _itemsize(ctx, x) else x
            derivative = activation.derivative(ctx, wide, ctx.cast_like(y, wide))
            ctx.contribute(x, ctx.cast_like(ctx.mul(ctx.cast_like(g, wide), derivative), x))
            return True
    return False


def _itemsize(ctx: RuleContext, name: str) -> int:
    return int(helper.tensor_dtype_to_np_dtype(ctx.elem_type(name)).itemsize)


def chains_ending_here(ctx: RuleContext) -> Iterator[Chain]:
    """The chains ending at ``ctx``'s node, of two nodes or more, from the nearest input ``x`` to the farthest."""
    final = ctx.node
    if not _evaluable(final):
        return
    for x in _upstream_values(ctx, final):
        if not dtypes.is_float(ctx.builder.elem_type_if_known(x) or onnx.TensorProto.UNDEFINED):
            continue
        nodes = _closed_chain(ctx, final, x)
        if nodes is not None and len(nodes) > 1:
            yield Chain(x, tuple(nodes))


def recognised(ctx: RuleContext, chain: Chain) -> Activation | None:
    """The activation of :data:`KNOWN` that ``chain`` computes at :func:`probes`, or ``None``."""
    points = probes()
    values: dict[str, np.ndarray] = {chain.x: points}
    with np.errstate(all="ignore"):
        for node in chain.nodes:
            arguments = [values[n] if n in values else _scalar(ctx, n) for n in node.input]
            values[node.output[0]] = np.asarray(EVALUATED[node.op_type](*arguments), dtype=np.float64)
    result = values[chain.nodes[-1].output[0]]
    for activation in KNOWN:
        if np.allclose(result, activation.value(points), rtol=TOLERANCE, atol=TOLERANCE):
            return activation
    return None


def _evaluable(node: onnx.NodeProto) -> bool:
    if not is_standard(node) or node.op_type not in EVALUATED or len(node.output) != 1:
        return False
    if node.op_type == "Cast":  # half precision's casts inside a chain (autocast computes x^3 in bfloat16)
        attributes = node_attributes(node)
        return set(attributes) <= {"to", "saturate"} and dtypes.is_float(attributes.get("to", 0))
    return not node.attribute


def _scalar(ctx: RuleContext, name: str) -> np.ndarray | None:
    """``name``'s value in float64 when it is a numeric constant of one element, else ``None``."""
    value = ctx.constant_value(name)
    if value is None or value.size != 1 or not np.issubdtype(value.dtype, np.number):
        return None
    return value.astype(np.float64).reshape(())


def _upstream_values(ctx: RuleContext, final: onnx.NodeProto) -> list[str]:
    """The values that are no constants read by ``final`` and the evaluable nodes above it (at most
    :data:`MAX_NODES`), nearest first: where a chain may start."""
    values: list[str] = []
    queue, seen = [final], {id(final)}
    while queue:
        node = queue.pop(0)
        for name in node.input:
            if not name or name in values or _scalar(ctx, name) is not None:
                continue
            values.append(name)
            producer = ctx.producer(name)
            if producer is not None and id(producer) not in seen and len(seen) < MAX_NODES and _evaluable(producer):
                seen.add(id(producer))
                queue.append(producer)
    return values


def _closed_chain(ctx: RuleContext, final: onnx.NodeProto, x: str) -> list[onnx.NodeProto] | None:
    """The nodes from ``x`` to ``final``, each after those it reads, when they form a chain (module docstring)."""
    order: list[onnx.NodeProto] = []
    placed: set[str] = set()
    visits = [0]  # nodes entered: the search stops at MAX_NODES, whatever lies above a branch that misses x
    rank = ctx.rank(x)

    def visit(node: onnx.NodeProto) -> bool:
        visits[0] += 1
        if visits[0] > MAX_NODES:
            return False
        for name in node.input:
            if name == x or name in placed:
                continue
            # a value being differentiated (a trainable scale) is no constant, though an initializer of one element
            constant = ctx.constant_value(name) if name and not ctx.depends_on_wrt(name) else None
            if constant is not None:
                if _scalar(ctx, name) is None or (constant.ndim > 0 and (rank is None or constant.ndim > rank)):
                    return False
                continue
            producer = ctx.producer(name)
            if producer is None or not _evaluable(producer) or not visit(producer):
                return False
        placed.add(node.output[0])
        order.append(node)
        return True

    if not visit(final):
        return None
    inside = order[:-1]
    if not any(x in node.input for node in order):
        return None
    if not all(ctx.read_only_by(node.output[0], order) for node in inside):
        return None
    return order
