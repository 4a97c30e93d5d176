"""The accuracy of a run's predictions, where the loss implies classes.

The artifacts' metadata names the loss and the model output it reads
(:mod:`onnxtrain.artifacts.metadata`); when the training or eval model also
outputs that value (``onnxtrain generate`` adds it for its classification
losses), each step's scores give the accuracy:

- ``CrossEntropyLoss``, ``NLLLoss`` with integer labels: ``argmax`` of the
  scores over the class axis (axis 1, as in PyTorch) equals the label, among
  the labels that are classes (not the loss's ``ignore_index``);
- ``BCEWithLogitsLoss``: ``logit > 0`` agrees with ``target > 0.5``, per element;
- ``BCELoss``: ``probability > 0.5`` agrees with ``target > 0.5``, per element.

The target is the model's last user input: the input the loss added.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import onnx

from onnxtrain.artifacts.metadata import loss_description, loss_inputs
from onnxtrain.training.tensor_spec import TensorSpec

Prediction = Literal["classes", "logits", "probabilities"]
#: The losses that imply classes, and how their input predicts.
PREDICTIONS: dict[str, Prediction] = {
    "CrossEntropyLoss": "classes",
    "NLLLoss": "classes",
    "BCEWithLogitsLoss": "logits",
    "BCELoss": "probabilities",
}


@dataclass(frozen=True)
class Accuracy:
    """Where a model's scores and targets are (output and input positions), and how its scores predict."""

    prediction: Prediction
    output: int  # the scores' position among the model's outputs (the loss first)
    target: int  # the target's position among the model's user inputs

    def count(self, outputs: Any, inputs: Sequence[np.ndarray]) -> tuple[int, int]:
        """``(correct, counted)`` predictions of one batch; ``(0, 0)`` when scores and targets do not line up."""
        scores = _host(outputs[self.output])
        target = np.asarray(inputs[self.target])
        if self.prediction == "classes":
            if scores.ndim != target.ndim + 1:
                return 0, 0
            predicted = scores.argmax(axis=1)
            if predicted.shape != target.shape:
                return 0, 0
            counted = (target >= 0) & (target < scores.shape[1])  # not the ignored label (a padded position's)
            return int(np.count_nonzero((predicted == target) & counted)), int(np.count_nonzero(counted))
        predicted = scores > (0.0 if self.prediction == "logits" else 0.5)
        truth = target > 0.5
        if predicted.shape != truth.shape:
            return 0, 0
        return int(np.count_nonzero(predicted == truth)), int(truth.size)


def accuracy_of(model: onnx.ModelProto, outputs: Sequence[str], inputs: Sequence[TensorSpec]) -> Accuracy | None:
    """How to measure the accuracy from the outputs of ``model`` (a training or eval model); ``None`` if it cannot.

    ``outputs``: the model's outputs as the runtime returns them (the loss
    first); ``inputs``: its user inputs.
    """
    prediction = PREDICTIONS.get(loss_description(model) or "")
    read = loss_inputs(model)
    if prediction is None or not read or read[0] not in outputs[1:] or not inputs:
        return None
    target = len(inputs) - 1
    if prediction == "classes" and inputs[target].dtype.kind not in "iu":
        return None  # class probabilities as targets: no label to compare with
    return Accuracy(prediction, list(outputs).index(read[0], 1), target)


def _host(value: Any) -> np.ndarray:
    """A NumPy array of an output (an ``OrtValue`` on a device is copied to the host)."""
    if isinstance(value, np.ndarray):
        return value
    from onnxtrain.training import values

    return values.to_numpy(value)


__all__ = ["PREDICTIONS", "Accuracy", "Prediction", "accuracy_of"]
