"""scikit-learn-style training with onnxcustom's names: ``add_loss_output``, ``OrtGradientOptimizer``.

Code written for onnxcustom runs with only its imports changed::

    from onnxtrain.sklearn import add_loss_output, OrtGradientOptimizer
    # was: from onnxcustom.utils.orttraining_helper import add_loss_output
    #      from onnxcustom.training.optimizers import OrtGradientOptimizer

- :func:`add_loss_output` stacks a scoring loss (squared, absolute, elastic,
  log) with sample weights and L1/L2 penalties on a model, from blocks;
- :class:`OrtGradientOptimizer` trains it with ``fit`` on onnxtrain's runtime:
  SGD with scikit-learn's schedules (:class:`LearningRateSGD`), momentum and
  Nesterov (:class:`LearningRateSGDNesterov`), Adam and AdamW, validation,
  early stopping;
- :func:`trainable_weights` lists the initializers a model reads as weights
  (``weights_to_train``), leaving out the constants converters store beside them;
- models converted by skl2onnx train as they are when written in standard
  operators; errors name the converter option that does so
  (:func:`converter_hints`).
"""

from __future__ import annotations

from onnxtrain.sklearn.converted import converter_hints
from onnxtrain.sklearn.learning_rate import BaseLearningRate, LearningRateSGD, LearningRateSGDNesterov
from onnxtrain.sklearn.loss_output import Penalty, add_loss_output, get_train_initializer, penalty_loss_onnx
from onnxtrain.sklearn.optimizer import ConvergenceError, OrtGradientOptimizer
from onnxtrain.sklearn.weights import trainable_weights

__all__ = [
    "BaseLearningRate",
    "ConvergenceError",
    "LearningRateSGD",
    "LearningRateSGDNesterov",
    "OrtGradientOptimizer",
    "Penalty",
    "add_loss_output",
    "converter_hints",
    "get_train_initializer",
    "penalty_loss_onnx",
    "trainable_weights",
]
