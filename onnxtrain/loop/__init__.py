"""Training runs over an artifact directory: data from files, epochs, checkpoints and exact resumes.

The layer above the runtime (:mod:`onnxtrain.training`) that ``onnxtrain train``
and ``onnxtrain demo`` use:

- :mod:`~onnxtrain.loop.files`: the artifact files, and ``trained_checkpoint``;
- :mod:`~onnxtrain.loop.data`: arrays from an ``.npz`` or a ``.csv``, cast and
  shaped for the training model's inputs;
- :mod:`~onnxtrain.loop.batches`: the validation split, each epoch's order, the batches;
- :mod:`~onnxtrain.loop.record`: where a run stands, in its checkpoint's properties;
- :mod:`~onnxtrain.loop.metrics`: the accuracy, where the loss implies classes;
- :mod:`~onnxtrain.loop.schedule`: the learning-rate schedule of a run;
- :mod:`~onnxtrain.loop.interrupts`: Ctrl-C taken between steps;
- :mod:`~onnxtrain.loop.settings`: what a run does (:class:`Settings`);
- :mod:`~onnxtrain.loop.steps`: the epochs and steps of one run, early stopping, and its saves;
- :mod:`~onnxtrain.loop.run`: :func:`train`, which starts or resumes a run.
"""

from __future__ import annotations

from onnxtrain.loop.batches import batch_count, epoch_order, fingerprint, split, step_count
from onnxtrain.loop.data import fit_to_inputs, load_data
from onnxtrain.loop.files import BEST_CHECKPOINT, TRAINED_CHECKPOINT, ArtifactFiles, remove_checkpoint
from onnxtrain.loop.metrics import Accuracy, accuracy_of
from onnxtrain.loop.record import (
    LEARNING_RATE_PROPERTY,
    EpochLosses,
    RunRecord,
    stored_learning_rate,
    with_learning_rate,
)
from onnxtrain.loop.run import train, user_inputs
from onnxtrain.loop.schedule import Schedule
from onnxtrain.loop.settings import Settings
from onnxtrain.loop.steps import RunResult, TrainingInterrupted, measured, stopped_line

__all__ = [
    "BEST_CHECKPOINT",
    "LEARNING_RATE_PROPERTY",
    "TRAINED_CHECKPOINT",
    "Accuracy",
    "ArtifactFiles",
    "EpochLosses",
    "RunRecord",
    "RunResult",
    "Schedule",
    "Settings",
    "TrainingInterrupted",
    "accuracy_of",
    "batch_count",
    "epoch_order",
    "fingerprint",
    "fit_to_inputs",
    "load_data",
    "measured",
    "remove_checkpoint",
    "split",
    "step_count",
    "stopped_line",
    "stored_learning_rate",
    "train",
    "user_inputs",
    "with_learning_rate",
]
