"""Optimizers: blocks that build an optimizer model in standard ONNX operators.

Each optimizer is a ``ForwardBlock`` built from the ``(trainable, frozen)``
parameters of a ``TrainingBlock``, as ONNX Runtime's ``onnxblock.optim``::

    with onnxblock.empty_base():
        optimizer = optim.AdamW(weight_decay=0.01, clip_grad=optim.ClipGradNorm(1.0))
        optimizer(training_block.parameters())
    optimizer_model = optimizer.to_model_proto()

The model's interface (inputs ``learning_rate``, ``step``, then ``p``,
``p_grad``, ``p.momentum0``, ... per parameter; outputs ``p.updated``,
``p.momentum0.updated``, ...) is described in :mod:`onnxtrain.optim.base`
and ``docs/artifacts.md``. :mod:`onnxtrain.optim.reference` holds NumPy
reference implementations of every update.
"""

from __future__ import annotations

from onnxtrain.optim import reference
from onnxtrain.optim.adagrad import Adagrad
from onnxtrain.optim.adam import Adam, AdamW
from onnxtrain.optim.base import (
    GRAD_SUFFIX,
    LEARNING_RATE,
    STEP,
    UPDATED_SUFFIX,
    Optimizer,
    ParameterSpec,
    StateSpec,
    UnmatchedPatternWarning,
    grad_name,
    state_name,
    updated_name,
)
from onnxtrain.optim.clip import ClipGradNorm, ClipGradValue, GradientClipping
from onnxtrain.optim.loss_scaling import LossScaling
from onnxtrain.optim.rmsprop import RMSprop
from onnxtrain.optim.sgd import SGD

__all__ = [
    "GRAD_SUFFIX",
    "LEARNING_RATE",
    "SGD",
    "STEP",
    "UPDATED_SUFFIX",
    "Adagrad",
    "Adam",
    "AdamW",
    "ClipGradNorm",
    "ClipGradValue",
    "GradientClipping",
    "LossScaling",
    "Optimizer",
    "ParameterSpec",
    "RMSprop",
    "StateSpec",
    "UnmatchedPatternWarning",
    "grad_name",
    "reference",
    "state_name",
    "updated_name",
]  # fmt: skip
