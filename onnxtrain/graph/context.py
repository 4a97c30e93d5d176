"""The build context: which model the blocks being called add to.

The current :class:`GraphBuilder` lives in a :class:`contextvars.ContextVar`,
set by :func:`base` / :func:`empty_base` and reset when their ``with`` block
ends, also on an exception. Contexts nest (the inner one wins until it ends),
and threads or asyncio tasks each see their own.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path

import onnx
from onnx import helper

from onnxtrain.graph import versions
from onnxtrain.graph.builder import GraphBuilder
from onnxtrain.graph.declared import correct_declared_shapes
from onnxtrain.graph.io import initializers_not_inputs, load_base_model

_CURRENT: ContextVar[GraphBuilder | None] = ContextVar("onnxtrain_current_builder", default=None)


class NoBaseModelError(ValueError):
    """A block was called outside a ``with base(model):`` or ``with empty_base():`` block."""


def current_builder(caller: str = "this block") -> GraphBuilder:
    """The builder of the innermost active ``base`` context."""
    builder = _CURRENT.get()
    if builder is None:
        raise NoBaseModelError(
            f"{caller} was called outside a base model context: call it inside "
            "`with onnxblock.base(model):` (or `with onnxblock.empty_base():` to start from an empty model)"
        )
    return builder


@contextlib.contextmanager
def _activate(builder: GraphBuilder) -> Iterator[GraphBuilder]:
    token = _CURRENT.set(builder)
    try:
        yield builder
    finally:
        _CURRENT.reset(token)


@contextlib.contextmanager
def base(model: onnx.ModelProto | str | os.PathLike[str]) -> Iterator[GraphBuilder]:
    """Make a private copy of ``model`` the model that blocks called inside add to.

    ``model`` is a ``ModelProto`` (never modified) or a path, read without its
    external data. An initializer it also lists as a graph input is an
    initializer only (:func:`~onnxtrain.graph.io.initializers_not_inputs`), and a declared shape that its graph
    contradicts is dropped or corrected (:func:`~onnxtrain.graph.declared.correct_declared_shapes`).
    Yields the :class:`GraphBuilder`; ``.model`` is the model.
    """
    proto, base_dir = load_base_model(model)
    initializers_not_inputs(proto)
    correct_declared_shapes(proto)
    with _activate(GraphBuilder(proto, base_dir)) as builder:
        yield builder


@contextlib.contextmanager
def loaded_base(model: onnx.ModelProto, base_dir: Path | None) -> Iterator[GraphBuilder]:
    """Like :func:`base`, on a copy of a model that :func:`load_base_model` read (and checked) from ``base_dir``."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    with _activate(GraphBuilder(copy, base_dir)) as builder:
        yield builder


@contextlib.contextmanager
def empty_base(opset_version: int | None = None) -> Iterator[GraphBuilder]:
    """Like :func:`base`, on an empty model importing ``ai.onnx`` ``opset_version``.

    The default opset is :data:`onnxtrain.graph.versions.DEFAULT_OPSET`.
    """
    opset = versions.DEFAULT_OPSET if opset_version is None else opset_version
    model = helper.make_model(
        helper.make_graph([], "onnxtrain_graph", [], []),
        opset_imports=[helper.make_opsetid("", opset)],
        producer_name="onnxtrain",
    )
    with _activate(GraphBuilder(model)) as builder:
        yield builder
