"""Which torch parameters each initializer of an optimized model holds, and torch's gradients mapped onto them.

ONNX Runtime's transformer optimizer renames and merges parameters: constant
folding turns ``Transpose(W)`` into a new initializer ``W^T``; the attention
fusions pack the query, key and value weights into one ``[W_q^T, W_k^T, W_v^T]``
(concatenated on the last axis) and their biases into one; a tied embedding
becomes two initializers (``E`` for the lookup, ``E^T`` for the head). Every
torch parameter has distinct values (:mod:`tests.transformers.models`), so
each initializer is recognised by value: a parameter, its transpose, or
pieces of either concatenated on the last axis.

Each such map ``p -> initializer`` is a selection of elements, so the
gradient of the loss with respect to ``p`` is the sum, over the initializers
that hold ``p``, of the matching pieces of their gradients (transposed back):
:func:`pull_back` computes it, and it must equal torch's gradient.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper


@dataclass(frozen=True)
class Piece:
    """``initializer[..., start:stop]`` equals torch's ``param`` (``param.T`` when ``transposed``)."""

    param: str
    transposed: bool
    start: int
    stop: int


def _view(value: np.ndarray, transposed: bool) -> np.ndarray:
    return value.T if transposed else value


def _whole(array: np.ndarray, params: Mapping[str, np.ndarray]) -> Piece | None:
    for name, value in params.items():
        for transposed in (False, True) if value.ndim == 2 else (False,):
            view = _view(value, transposed)
            if view.shape == array.shape and np.array_equal(view, array):
                return Piece(name, transposed, 0, array.shape[-1])
    return None


def _packed(array: np.ndarray, params: Mapping[str, np.ndarray]) -> tuple[Piece, ...] | None:
    """``array`` as two or more parameters (or transposes) side by side on the last axis; ``None`` if it is not."""
    pieces: list[Piece] = []
    start, width = 0, array.shape[-1]
    while start < width:
        found = None
        for name, value in params.items():
            for transposed in (False, True) if value.ndim == 2 else (False,):
                view = _view(value, transposed)
                stop = start + view.shape[-1]
                if (
                    view.shape[:-1] == array.shape[:-1]
                    and stop <= width
                    and np.array_equal(view, array[..., start:stop])
                ):
                    found = Piece(name, transposed, start, stop)
                    break
            if found:
                break
        if found is None:
            return None
        pieces.append(found)
        start = found.stop
    return tuple(pieces) if len(pieces) > 1 else None


def parameter_map(model: onnx.ModelProto, params: Mapping[str, np.ndarray]) -> dict[str, tuple[Piece, ...]]:
    """``{initializer: pieces}`` for every float initializer of ``model`` that holds torch parameters."""
    used = {name for node in model.graph.node for name in node.input}
    result: dict[str, tuple[Piece, ...]] = {}
    for tensor in model.graph.initializer:
        if tensor.name not in used or tensor.data_type != onnx.TensorProto.FLOAT or not tensor.dims:
            continue
        array = numpy_helper.to_array(tensor)
        whole = _whole(array, params)
        pieces = (whole,) if whole is not None else _packed(array, params)
        if pieces is not None:
            result[tensor.name] = pieces
    return result


def unmapped(mapping: Mapping[str, tuple[Piece, ...]], params: Mapping[str, np.ndarray]) -> list[str]:
    """The torch parameters no initializer holds."""
    held = {piece.param for pieces in mapping.values() for piece in pieces}
    return sorted(set(params) - held)


def pull_back(
    grads: Mapping[str, np.ndarray], mapping: Mapping[str, tuple[Piece, ...]], params: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """``dL/dp = sum over the pieces holding p of (the piece of dL/d initializer)``, transposed back."""
    total = {name: np.zeros_like(value) for name, value in params.items()}
    for initializer, pieces in mapping.items():
        for piece in pieces:
            total[piece.param] += _view(grads[initializer][..., piece.start : piece.stop], piece.transposed)
    return total


def describe(mapping: Mapping[str, tuple[Piece, ...]]) -> dict[str, str]:
    """``{initializer: "q.T | k.T | v.T"}``, for messages."""
    return {
        name: " | ".join(f"{p.param}{'.T' if p.transposed else ''}" for p in pieces) for name, pieces in mapping.items()
    }
