"""ONNX Runtime's ``onnxblock.save_checkpoint`` and ``onnxblock.load_checkpoint_to_model``, on onnxtrain's checkpoints.

``save_checkpoint((trainable, frozen), path)`` writes the parameters a
``TrainingBlock`` returns (``block.parameters()``) as a checkpoint in ONNX
Runtime's format (:mod:`onnxtrain.checkpoint`, atomically);
``load_checkpoint_to_model(path, model)`` puts a checkpoint's parameter values
into the initializers of the same names of ``model``, in place: an inference
model gets the trained weights.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from onnxtrain import checkpoint
from onnxtrain.graph import dtypes


def save_checkpoint(
    parameters: tuple[Sequence[onnx.TensorProto], Sequence[onnx.TensorProto]] | None,
    path_to_checkpoint: str | os.PathLike[str],
    nominal_checkpoint: bool = False,
) -> None:
    """Save ``(trainable, frozen)`` TensorProtos as the checkpoint ``path_to_checkpoint``.

    ``nominal_checkpoint=True`` keeps names, types and shapes only. Raises
    ``RuntimeError("No checkpoint parameters provided.")`` for ``None``, as
    ONNX Runtime does.
    """
    if parameters is None:
        raise RuntimeError("No checkpoint parameters provided.")
    if not isinstance(parameters, (tuple, list)) or len(parameters) != 2:
        raise TypeError(
            "parameters must be the pair (trainable, frozen) of TensorProto lists that block.parameters() returns, "
            f"not {type(parameters).__name__}"
        )
    trainable, frozen = parameters
    state = checkpoint.from_tensors(trainable, frozen, nominal=nominal_checkpoint)
    checkpoint.save(state, path_to_checkpoint)


def load_checkpoint_to_model(path_to_checkpoint: str | os.PathLike[str], model: onnx.ModelProto) -> None:
    """Set each initializer of ``model`` that the checkpoint has a parameter of to that parameter's value.

    Changes ``model`` in place; initializers the checkpoint does not name stay
    as they are. ``ValueError`` for a nominal checkpoint (it holds no values),
    or a parameter of another shape or type than the initializer it replaces.
    """
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"model must be an onnx.ModelProto, not {type(model).__name__}")
    state = checkpoint.load(path_to_checkpoint)
    if state.is_nominal:
        raise ValueError(
            f"{os.fspath(path_to_checkpoint)!r} is a nominal checkpoint: it holds the parameters' names and shapes, "
            "not their values; load a full checkpoint"
        )
    values = {**state.trainable, **state.frozen}
    replaced = []
    for tensor in model.graph.initializer:
        if tensor.name in values:
            replaced.append((tensor, _matching(tensor, values[tensor.name])))
    for tensor, array in replaced:  # only once every parameter fits: a failure leaves the model as it was
        tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))


def _matching(tensor: onnx.TensorProto, array: np.ndarray) -> np.ndarray:
    """``array``, checked to have ``tensor``'s element type and dims."""
    expected = dtypes.to_numpy_dtype(tensor.data_type)
    if array.dtype != expected or list(array.shape) != list(tensor.dims):
        raise ValueError(
            f"the checkpoint's {tensor.name!r} is {array.dtype}{list(array.shape)}, but the model's initializer is "
            f"{expected}{list(tensor.dims)}: the checkpoint belongs to another model"
        )
    return array


__all__ = ["load_checkpoint_to_model", "save_checkpoint"]
