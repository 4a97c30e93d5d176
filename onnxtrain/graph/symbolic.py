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
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import onnx

_LOGGER = logging.getLogger(__name__)
#: The logger of onnxruntime's tool, which warns of every broadcast it cannot name (``Min(64, seq)`` against
#: ``seq``): a dimension left unknown, which is no fault of the user's model.
_TOOL_LOGGER = "onnxruntime.tools.symbolic_shape_infer"


@contextlib.contextmanager
def _tool_quiet() -> Iterator[None]:
    """The tool's warnings held back while the block runs (its errors still pass)."""
    tool = logging.getLogger(_TOOL_LOGGER)
    level = tool.level
    tool.setLevel(logging.ERROR)
    try:
        yield
    finally:
        tool.setLevel(level)


def symbolic_value_info(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The types onnxruntime's symbolic shape inference gives ``model``'s intermediate values (what it inferred
    before any failure; none without sympy or where it cannot start)."""
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except ImportError:  # sympy is missing
        return []
    inference = SymbolicShapeInference(2**31 - 1, False, False, 0)  # int_max, auto_merge, guess_output_rank, verbose
    # the loop of its public infer_shapes, which on an incomplete inference raises and also saves the model into
    # the working directory (sym_shape_infer_temp.onnx): the same steps, keeping what was inferred, writing nothing
    try:
        with _tool_quiet():
            inference._preprocess(model)
            while inference.run_:
                inference._infer_impl()
    except Exception as error:  # any failure of that tool: what it inferred so far is still sound
        _LOGGER.debug("symbolic shape inference stopped: %s", error)
    result = getattr(inference, "out_mp_", None)
    return list(result.graph.value_info) if result is not None else []


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
