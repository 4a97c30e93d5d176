"""What every loss shares: the reduction, target inputs and input checks."""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator, Sequence
from contextvars import ContextVar
from typing import Literal, get_args

import numpy as np
import onnx

from onnxtrain import caller
from onnxtrain.blocks import ReduceMean, ReduceSum
from onnxtrain.graph import dtypes, ops, walk
from onnxtrain.graph.builder import Dim, GraphBuilder, describe_type, tensor_type
from onnxtrain.graph.declared import GENERATED_PREFIX, DeclaredShapeWarning, check_output_shape


class ComputedTargetWarning(UserWarning):
    """A loss's target is a value the model computes (its other output), not data: training pulls one toward the
    other (ONNX Runtime's default ``loss_input_names``, all the outputs, does this to a model of two outputs).
    Given where a loss on one output of the model takes another for its target and that target may train; not
    where a custom block computes the loss's input (it chose the pair), nor for a target that no trained value
    feeds (a frozen teacher's probabilities, :func:`trained_values`)."""


#: The values the training block being built trains (:func:`trained_values`); ``None`` outside one.
_TRAINED: ContextVar[Collection[str] | None] = ContextVar("onnxtrain_trained_values", default=None)
#: Whether the loss's inputs are generate_artifacts' default, every output of the model (see :func:`every_output`).
_EVERY_OUTPUT: ContextVar[bool] = ContextVar("onnxtrain_every_output", default=False)


Reduction = Literal["mean", "sum", "none"]
REDUCTIONS: tuple[str, ...] = get_args(Reduction)


def check_reduction(loss: str, reduction: str, valid: Sequence[str] = REDUCTIONS) -> str:
    """Return ``reduction``; ``ValueError`` listing the valid ones otherwise."""
    if reduction not in valid:
        raise ValueError(f"{loss} got reduction={reduction!r}; choose one of {list(valid)}")
    return reduction


def reduce_loss(elementwise: str, reduction: str) -> str:
    """Mean or sum over all elements (a scalar), or the element-wise loss for ``"none"``."""
    if reduction == "none":
        return elementwise
    block = ReduceMean(keepdims=False) if reduction == "mean" else ReduceSum(keepdims=False)
    return block(elementwise)


def require_float(b: GraphBuilder, loss: str, name: str) -> int:
    """The element type of ``name``; ``TypeError`` unless it is floating point."""
    elem_type = b.elem_type(b.require(name))
    if not dtypes.is_float(elem_type):
        raise TypeError(
            f"{loss} needs a floating-point input, but {name!r} is {describe_type(b.type_of(name))}; "
            "cast it first with blocks.Cast(onnx.TensorProto.FLOAT)"
        )
    return elem_type


def target_input(
    b: GraphBuilder,
    loss: str,
    name: str,
    like: str,
    *,
    elem_type: int | None = None,
    drop_axis: int | None = None,
) -> str:
    """The target (or labels) value ``name`` for a loss on ``like``.

    An existing value of that name is used as it is, when its element type
    fits. Otherwise a graph input is added with ``like``'s shape (symbolic
    dimensions kept; axis ``drop_axis`` removed) and element type ``elem_type``
    (``like``'s by default). When ``like`` is a graph output, its declared
    shape is first checked against its graph (:mod:`onnxtrain.graph.declared`):
    axes the graph contradicts take the inferred size, with a
    :class:`DeclaredShapeWarning` naming the output; the target input's
    ``doc_string`` says which output its shape comes from, and which of its
    axes no inference could check.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"{loss} needs the target name as a non-empty str, got {name!r}")
    source = b.tensor_type_of(like)
    wanted = source.tensor_type.elem_type if elem_type is None else elem_type
    if b.has(name):
        have = b.elem_type(name)
        if have != wanted:
            raise TypeError(
                f"{loss} needs its target {name!r} to be {dtypes.dtype_name(wanted)}, but the model already "
                f"has {name!r} as {describe_type(b.type_of(name))}; pass another target name"
            )
        outputs = {value.name for value in b.model.graph.output}
        if name in outputs and like in outputs and (_EVERY_OUTPUT.get() or _may_be_trained(b, name)):
            caller.warn(
                f"{loss} takes the model's output {name!r} as the target of its output {like!r}: training pulls "
                f"{like!r} toward {name!r}, with no labels from the data. To train {like!r} against data, pass "
                f"loss_input_names=[{like!r}] (generate_artifacts' default gives a loss every output of the model)",
                ComputedTargetWarning,
            )
        return name
    dims, note = _checked_shape(b, loss, name, like, wanted, drop_axis)
    added = b.add_input(name, tensor_type(wanted, dims))
    if note:
        value = next(value for value in b.model.graph.input if value.name == added)
        value.doc_string = note
    return added


@contextlib.contextmanager
def trained_values(names: Collection[str]) -> Iterator[None]:
    """Tell the losses built inside the ``with`` block which values train (a training block's parameters and
    inputs that require gradients; ``names`` may be a live view, read when a loss asks): a target computed from
    none of them is data to the loss, such as a frozen teacher's output, and no :class:`ComputedTargetWarning`
    is given for it."""
    token = _TRAINED.set(names)
    try:
        yield
    finally:
        _TRAINED.reset(token)


@contextlib.contextmanager
def every_output() -> Iterator[None]:
    """Tell the losses built inside the ``with`` block that their inputs are every output of the model, the
    default of ``generate_artifacts``, not the user's choice: a built-in loss then takes a second output as its
    target whether or not anything computes it from trained values (a frozen backbone's features), and
    :class:`ComputedTargetWarning` says so."""
    token = _EVERY_OUTPUT.set(True)
    try:
        yield
    finally:
        _EVERY_OUTPUT.reset(token)


def _may_be_trained(b: GraphBuilder, value: str) -> bool:
    """Whether ``value`` is computed from a value that trains (:func:`trained_values`); ``True`` where no
    training block says which values train (a loss built in a bare ``onnxblock.base``)."""
    trained = _TRAINED.get()
    if trained is None:
        return True
    read = {value}
    for node in walk.needed_nodes(b.model.graph.node, [value]):
        read |= walk.names_read(node)
    return any(name in trained for name in read)


def _checked_shape(
    b: GraphBuilder, loss: str, name: str, like: str, elem_type: int, drop_axis: int | None
) -> tuple[list[Dim] | None, str]:
    """The target's shape: ``like``'s (its declaration checked against the graph when it is a graph output),
    without axis ``drop_axis``; and the note. ``elem_type``: the target's element type, for the warning."""
    dims: list[Dim] | None = b.shape(like)
    if dims is not None:  # a name onnx's inference made up for an unknown size claims nothing
        dims = [None if isinstance(d, str) and d.startswith(GENERATED_PREFIX) else d for d in dims]
    check = check_output_shape(b.model, like) if dims is not None else None
    if dims is None or check is None or len(check.declared) != len(dims):
        return _without(dims, drop_axis), ""
    source = dtypes.dtype_name(b.elem_type(like))
    if check.contradicted:
        corrected = check.corrected(dims)
        caller.warn(
            DeclaredShapeWarning(
                f"{check.message(source)}. {loss} shapes its target {name!r} after "
                f"{describe_type(tensor_type(elem_type, _without(corrected, drop_axis)))} instead; correct the "
                "output's shape in the model to silence this (torch.onnx.export: one dynamic_axes name per meaning, "
                "a new name for an axis whose size is its own)"
            ),
        )
        dims = corrected
    dims = _without(dims, drop_axis)
    undecided = check.undecided()
    if not undecided:
        return dims, ""
    declared = f"{source}[{', '.join('?' if d is None else str(d) for d in check.declared)}]"
    axes = ", ".join(str(axis) for axis in undecided)
    note = (
        f"shape copied from model output {like!r}, declared {declared}; shape inference could not check "
        f"axis {axes} of that declaration: first check the data given (as many samples in every input); if the "
        "sizes disagree at run time with data that is right, the output's declared shape is probably wrong "
        "(correct it in the model, or give the loss a target input of the right shape)"
    )
    return dims, note


def _without(dims: list[Dim] | None, axis: int | None) -> list[Dim] | None:
    """``dims`` without ``axis`` (the class axis of scores, which their labels lack); all of them for ``None``."""
    if dims is None or axis is None:
        return dims
    return [d for k, d in enumerate(dims) if k != axis]


def dim_size(b: GraphBuilder, x: str, axis: int) -> str:
    """The size of axis ``axis`` of ``x`` as a scalar of ``x``'s element type.

    A constant when the size is known; else ``Cast(Gather(Shape(x), axis))``,
    which every opset from 13 accepts (``Shape``'s ``start``/``end`` need 15).
    """
    elem_type = b.elem_type(x)
    dims = b.shape(x)
    if dims is not None and isinstance(dims[axis], int):
        return ops.constant(b, dims[axis], elem_type, "dim_size")
    shape = b.add_node1("Shape", [x])
    size = b.add_node1("Gather", [shape, ops.constant(b, axis, onnx.TensorProto.INT64, "axis")], axis=0)
    return b.add_node1("Cast", [size], to=elem_type)


def class_weights(loss: str, weight: object, argument: str = "weight") -> np.ndarray | None:
    """``weight`` as a 1-D float array of per-class weights, or ``None``."""
    if weight is None:
        return None
    array = np.asarray(weight)
    if array.ndim != 1 or array.size == 0 or array.dtype.kind not in "fiu":
        raise ValueError(f"{loss} needs {argument} as a 1-D array of numbers (one per class), got {weight!r}")
    return array.astype(np.float64)
