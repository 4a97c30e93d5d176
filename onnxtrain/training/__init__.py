"""The training runtime: train, eval and optimizer steps over the artifacts, on stock onnxruntime.

``onnxtrain.api`` gives these classes ONNX Runtime's ``onnxruntime.training.api``
names; :class:`TrainingSession` mirrors the C++ ``Ort::TrainingSession``.
See docs/runtime.md.
"""

from __future__ import annotations

from onnxtrain.training.device import Device
from onnxtrain.training.module import Module
from onnxtrain.training.optimizer import Optimizer, OptimizerStateWarning
from onnxtrain.training.schedulers import (
    CosineLRScheduler,
    ExponentialLRScheduler,
    LinearLRScheduler,
    LRScheduler,
    StepLRScheduler,
)
from onnxtrain.training.session import TrainingSession
from onnxtrain.training.state import NominalStateError, Parameter, Parameters, Properties, TrainingState

__all__ = [
    "CosineLRScheduler",
    "Device",
    "ExponentialLRScheduler",
    "LRScheduler",
    "LinearLRScheduler",
    "Module",
    "NominalStateError",
    "Optimizer",
    "OptimizerStateWarning",
    "Parameter",
    "Parameters",
    "Properties",
    "StepLRScheduler",
    "TrainingSession",
    "TrainingState",
]
