"""ONNX Runtime's ``onnxruntime.training.api`` names, over onnxtrain's runtime.

Code written for ONNX Runtime's training API runs with only its import changed::

    from onnxtrain.api import CheckpointState, Module, Optimizer, LinearLRScheduler
    # was: from onnxruntime.training.api import CheckpointState, Module, Optimizer, LinearLRScheduler

``CheckpointState`` is :class:`onnxtrain.training.TrainingState` (the runtime's
mutable state; :class:`onnxtrain.checkpoint.CheckpointState` is the immutable
content of a checkpoint file). Beyond ONNX Runtime: ``CosineLRScheduler``,
``StepLRScheduler``, ``ExponentialLRScheduler``, ``TrainingSession`` (the C++
API) and ``NominalStateError`` (what a nominal checkpoint's state raises before
its parameters hold values: a ``RuntimeError`` whose message starts with ONNX
Runtime's). See docs/runtime.md.
"""

from __future__ import annotations

from onnxtrain.training.module import Module
from onnxtrain.training.optimizer import Optimizer
from onnxtrain.training.schedulers import (
    CosineLRScheduler,
    ExponentialLRScheduler,
    LinearLRScheduler,
    LRScheduler,
    StepLRScheduler,
)
from onnxtrain.training.session import TrainingSession
from onnxtrain.training.state import NominalStateError, Parameter, Parameters, Properties
from onnxtrain.training.state import TrainingState as CheckpointState

__all__ = [
    "CheckpointState",
    "CosineLRScheduler",
    "ExponentialLRScheduler",
    "LRScheduler",
    "LinearLRScheduler",
    "Module",
    "NominalStateError",
    "Optimizer",
    "Parameter",
    "Parameters",
    "Properties",
    "StepLRScheduler",
    "TrainingSession",
]
