"""Dimensions onnx's shape inference leaves unknown, named by onnxruntime's symbolic shape inference.

onnx's inference names a dimension where a graph input or a declaration
names it and carries the name through the operators' schemas, but an export
loses names where sizes are computed: a ``Reshape`` to ``[batch, seq, -1,
64]``, a causal mask sliced from a constant up to ``Shape(x)[1]``, a
``Range`` of that length. The autodiff then cannot prove that a gradient has
its input's shape, and sums over the broadcast axes at run time
(:func:`onnxtrain.autodiff.broadcast.dynamic_unbroadcast`: about eleven
nodes each). onnxruntime's ``SymbolicShapeInference`` (``onnxruntime.tools``,
with sympy) computes those dimensions as expressions of the inputs'
(``seq``, ``batch*seq``, ``12``); :func:`with_symbolic_dims` adds them to a
model's ``value_info`` where onnx's own inference would leave them unknown.
GPT-2 small's export: 86 sums decided at run time before, none after; the
training model 5,116 -> 4,053 nodes.

It never merges conflicting dimensions (``auto_merge`` off: a size that may
be 1 at run time is never assumed equal to another), and never touches the
graph's inputs and outputs, whose declarations are the user's. Where the
inference fails or sympy is missing, the model is left as it is: the
gradients are the same, decided at run time.

Nor does it keep what the tool guessed. Where it cannot decide a comparison
it warns and picks a branch (a ``Slice`` whose end is ``h`` on an axis of
``2*floor(h/2 - 1/2) + 2``, a decoder's crop back to an odd input size:
``Unable to determine if h <= ..., treat as equal``, so the crop's output is
declared uncropped, one row too many at odd ``h``). Every node during whose
inference the tool warns is a guess: its outputs, and every value computed
from them, are left undeclared (onnx's own inference, or run time, sizes
them). Expressions with whole floats are written plainly (``floor(1.0*n)``
is ``n``, the input's symbol).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import onnx

from onnxtrain.graph.walk import computed_from, names_read

_LOGGER = logging.getLogger(__name__)
#: The logger of onnxruntime's tool, which warns where it guesses (``Unable to determine if h <= ..., treat as
#: equal``) and of every broadcast it cannot name (``Min(64, seq)`` against ``seq``).
_TOOL_LOGGER = "onnxruntime.tools.symbolic_shape_infer"


class _Guesses(logging.Filter):
    """The outputs of the nodes during whose inference the tool warned (on this thread), its warnings held back
    from the user (its errors still pass). ``node``: the node being inferred; ``blind``: a warning came outside
    any node, or the tool's warnings cannot be seen (``logging.disable``), so no inferred value can be trusted."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()
        self.node: onnx.NodeProto | None = None
        self.outputs: set[str] = set()
        self.blind = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or record.thread not in (self.thread, None):  # None: logThreads off
            return True
        if self.node is None:
            self.blind = True
        else:
            self.outputs.update(self.node.output)
        return record.levelno > logging.WARNING


@contextlib.contextmanager
def _tool_guesses() -> Iterator[_Guesses]:
    """The tool's warnings recorded (and held back) while the block runs: its level lowered to ``WARNING`` where
    it was higher, and given back after."""
    tool = logging.getLogger(_TOOL_LOGGER)
    level = tool.level
    guesses = _Guesses()
    if tool.getEffectiveLevel() > logging.WARNING:
        tool.setLevel(logging.WARNING)
    guesses.blind = not tool.isEnabledFor(logging.WARNING)
    tool.addFilter(guesses)
    try:
        yield guesses
    finally:
        tool.removeFilter(guesses)
        tool.setLevel(level)


def symbolic_value_info(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The types onnxruntime's symbolic shape inference gives ``model``'s intermediate values (what it inferred
    before any failure; none without sympy or where it cannot start), less those it guessed and those computed
    from them; whole floats in the names' expressions written as integers (``floor(1.0*n)`` -> ``n``)."""
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except ImportError:  # sympy is missing
        return []
    inference = SymbolicShapeInference(2**31 - 1, False, False, 0)  # int_max, auto_merge, guess_output_rank, verbose
    # the loop of its public infer_shapes, which on an incomplete inference raises and also saves the model into
    # the working directory (sym_shape_infer_temp.onnx): the same steps, keeping what was inferred, writing nothing
    with _tool_guesses() as guesses:
        try:
            infer_node = inference._onnx_infer_single_node  # the first step of each node of _infer_impl's loop

            def watched(node: onnx.NodeProto) -> Any:
                guesses.node = node  # a subgraph's nodes are another instance's: their warnings are this node's
                return infer_node(node)

            inference._onnx_infer_single_node = watched
            inference._preprocess(model)
            while inference.run_:
                inference._infer_impl()
        except Exception as error:  # any failure of that tool: what it inferred so far is still sound
            _LOGGER.debug("symbolic shape inference stopped: %s", error)
    result = getattr(inference, "out_mp_", None)
    if result is None or guesses.blind:
        return []
    guessed = computed_from(guesses.outputs, [(names_read(node), node.output) for node in model.graph.node])
    if guessed:
        _LOGGER.debug("symbolic shape inference guessed %d values; left undeclared", len(guessed))
    expressions = getattr(inference, "symbolic_dims_", {})
    kept = [value for value in result.graph.value_info if value.name not in guessed]
    for value in kept:
        _plain_dims(value, expressions)
    return kept


def _plain_dims(value: onnx.ValueInfoProto, expressions: Mapping[str, Any]) -> None:
    """``value``'s dimensions named by the tool's sympy ``expressions`` with whole floats (``1.0*n``, from a
    ``Resize`` by scale) rewritten as the integers they are: ``floor(1.0*n)`` is ``n``, a number is a number."""
    import sympy

    for dim in value.type.tensor_type.shape.dim:
        expression = expressions.get(dim.dim_param) if dim.dim_param else None
        if not isinstance(expression, sympy.Expr):
            continue
        whole = {f: sympy.Integer(int(f)) for f in expression.atoms(sympy.Float) if sympy.Rational(f).is_integer}
        if not whole:
            continue
        plain = expression.xreplace(whole)
        if plain.is_Integer and int(plain) >= 0:
            dim.dim_value = int(plain)
        elif not plain.is_number:
            dim.dim_param = str(plain)


def with_symbolic_dims(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (changed in place) with the dimensions of its intermediate values that its ``value_info`` leaves
    unknown filled from :func:`symbolic_value_info`; values it does not list are added."""
    graph = model.graph
    boundary = {value.name for value in (*graph.input, *graph.output)}
    existing = {value.name: value for value in graph.value_info}
    for value in symbolic_value_info(model):
        if value.name in boundary or not value.type.HasField("tensor_type"):
            continue
        tensor = value.type.tensor_type
        if not tensor.HasField("shape") or not all(d.HasField("dim_value") or d.dim_param for d in tensor.shape.dim):
            continue
        known = existing.get(value.name)
        if known is None:
            graph.value_info.append(value)
            existing[value.name] = graph.value_info[-1]
        else:
            _fill_unknown(known, value)
    return model


def _fill_unknown(known: onnx.ValueInfoProto, inferred: onnx.ValueInfoProto) -> None:
    """``known``'s unknown dimensions taken from ``inferred`` (the whole shape where ``known`` has none); nothing
    where the ranks or element types differ."""
    target, source = known.type.tensor_type, inferred.type.tensor_type
    if target.elem_type and target.elem_type != source.elem_type:
        return
    if not target.HasField("shape"):
        target.shape.CopyFrom(source.shape)
        return
    if len(target.shape.dim) != len(source.shape.dim):
        return
    for dim, other in zip(target.shape.dim, source.shape.dim, strict=True):
        if not dim.HasField("dim_value") and not dim.dim_param:
            dim.CopyFrom(other)


__all__ = ["symbolic_value_info", "with_symbolic_dims"]
