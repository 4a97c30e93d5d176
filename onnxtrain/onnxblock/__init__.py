"""The names of ONNX Runtime's ``onnxruntime.training.onnxblock``, on onnxtrain.

Code written for ONNX Runtime runs with only its import changed::

    import onnxtrain.onnxblock as onnxblock   # was: onnxruntime.training.onnxblock

``blocks``, ``loss`` and ``optim`` are modules here too, so ``from
onnxtrain.onnxblock import loss, optim`` and ``onnxblock.blocks.Add()`` work
as before.
"""

from __future__ import annotations

from onnxtrain.artifacts.training_block import TrainingBlock
from onnxtrain.blocks import Block, ForwardBlock
from onnxtrain.graph import base, empty_base
from onnxtrain.onnxblock import blocks, loss, optim
from onnxtrain.onnxblock.checkpoint_utils import load_checkpoint_to_model, save_checkpoint

__all__ = [
    "Block",
    "ForwardBlock",
    "TrainingBlock",
    "base",
    "blocks",
    "empty_base",
    "load_checkpoint_to_model",
    "loss",
    "optim",
    "save_checkpoint",
]
