"""``Block`` and ``ForwardBlock``: the units users stack on a base model.

A block is built by calling it inside ``with onnxblock.base(model):``; its
``build`` method appends nodes to that model and returns the name(s) of its
output value(s). Blocks compose by calling other blocks inside ``build``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from onnxtrain.graph.builder import GraphBuilder
from onnxtrain.graph.context import current_builder
from onnxtrain.graph.io import inferred_skeleton


def output_names(block: Block, output: Any) -> list[str]:
    """The value names a block's ``build`` returned, checked to be strings."""
    names = [output] if isinstance(output, str) else output
    if not isinstance(names, Sequence) or not names or not all(isinstance(n, str) for n in names):
        raise ValueError(
            f"{type(block).__name__}.build() returned {output!r}; it must return the name of the "
            "value it built (a str) or a non-empty list of names"
        )
    return list(names)


def as_axes(axes: int | Sequence[int], owner: str) -> list[int]:
    """``axes`` as a list of ints: one axis may be given alone (torch's ``dim=1``); ``TypeError`` naming
    ``owner`` for anything else."""
    if isinstance(axes, (int, np.integer)) and not isinstance(axes, bool):
        return [int(axes)]
    if isinstance(axes, (str, bytes)) or not isinstance(axes, Sequence):
        raise TypeError(f"{owner} takes axes as an int or a list of ints, not {axes!r}")
    if not all(isinstance(axis, (int, np.integer)) and not isinstance(axis, bool) for axis in axes):
        raise TypeError(f"{owner} takes axes as an int or a list of ints, not {axes!r}")
    return [int(axis) for axis in axes]


class Block(ABC):
    """Base class of every block. Subclasses implement :meth:`build`.

    Calling a block runs ``build`` on the current base model. When ``build``
    raises, everything it appended is removed again: the base model is left as
    it was before the call.

    Attributes:
        base: the model being built (set while the block is called).
    """

    def __init__(self) -> None:
        self.base: onnx.ModelProto | None = None

    @abstractmethod
    def build(self, *args: Any, **kwargs: Any) -> Any:
        """Append this block's nodes on top of the given value names; return output name(s)."""

    @property
    def builder(self) -> GraphBuilder:
        """The :class:`GraphBuilder` of the current base context."""
        return current_builder(type(self).__name__)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        builder = self.builder
        self.base = builder.model
        with builder.transaction():
            output = self.build(*args, **kwargs)
            builder.sync()  # take in nodes that build() appended to self.base by hand
        return output

    def infer_shapes_on_base(self) -> onnx.ModelProto:
        """The current base model with inferred shapes in ``graph.value_info``.

        Inference runs on a light copy, so a model whose weights live in
        external data files (even over 2 GB) is never loaded.
        """
        builder = self.builder
        inferred = inferred_skeleton(builder.model)
        model = onnx.ModelProto()
        model.CopyFrom(builder.model)
        del model.graph.value_info[:]
        model.graph.value_info.extend(inferred.graph.value_info)
        return model


class ForwardBlock(Block):
    """A block that makes a forward model: its outputs become the graph outputs.

    After the block is called, :meth:`to_model_proto` returns a checked copy of
    the base model whose outputs are exactly the values ``build`` returned.
    """

    def __init__(self) -> None:
        super().__init__()
        self._model: onnx.ModelProto | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        builder = self.builder
        with builder.transaction():
            output = super().__call__(*args, **kwargs)
            builder.set_outputs(output_names(self, output))
            self._model = builder.finalize()
        return output

    def to_model_proto(self) -> onnx.ModelProto:
        """The forward model built by the last call of this block."""
        if self._model is None:
            raise RuntimeError(
                f"{type(self).__name__} has not been built yet: call it inside "
                "`with onnxblock.base(model):` before to_model_proto()"
            )
        return self._model
