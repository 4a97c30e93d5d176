"""ONNX Runtime's custom-loss example (seeds/004, its "Prepare for training" page), kept in one place.

:data:`CUSTOM_LOSS_EXAMPLE` is the page's script, copied with only its imports
changed (``import onnx`` added, which the page uses without showing): it
reads ``model.onnx`` from the working directory and writes the four artifacts
there. :func:`weighted_average_loss` is its ``WeightedAverageLoss`` class, as
the script defines it, for tests that stack the loss themselves.
"""

from __future__ import annotations

from typing import Any

CUSTOM_LOSS_EXAMPLE = """
import onnx
import onnxtrain.onnxblock as onnxblock
from onnxtrain import artifacts

# Define a custom loss block that takes in two inputs
# and performs a weighted average of the losses from these
# two inputs.
class WeightedAverageLoss(onnxblock.Block):
    def __init__(self):
        self._loss1 = onnxblock.loss.MSELoss()
        self._loss2 = onnxblock.loss.MSELoss()
        self._w1 = onnxblock.blocks.Constant(0.4)
        self._w2 = onnxblock.blocks.Constant(0.6)
        self._add = onnxblock.blocks.Add()
        self._mul = onnxblock.blocks.Mul()

    def build(self, loss_input_name1, loss_input_name2):
        # The build method defines how the block should be stacked on top of
        # loss_input_name1 and loss_input_name2

        # Returns weighted average of the two losses
        return self._add(
            self._mul(self._w1(), self._loss1(loss_input_name1, target_name="target1")),
            self._mul(self._w2(), self._loss2(loss_input_name2, target_name="target2"))
        )

my_custom_loss = WeightedAverageLoss()

# Load the onnx model
model_path = "model.onnx"
base_model = onnx.load(model_path)

# Define the parameters that need their gradient computed
requires_grad = ["weight1", "bias1", "weight2", "bias2"]
frozen_params = ["weight3", "bias3"]

# Now, we can invoke generate_artifacts with this custom loss function
artifacts.generate_artifacts(base_model, requires_grad = requires_grad, frozen_params = frozen_params,
                            loss = my_custom_loss, optimizer = artifacts.OptimType.AdamW)

# Successful completion of the above call will generate 4 files in the current working directory,
# one for each of the artifacts mentioned above (training_model.onnx, eval_model.onnx, checkpoint, optimizer_model.onnx)
"""

#: The end of the class definition in the script: what comes after it loads the model and generates artifacts.
_CLASS_END = "my_custom_loss = WeightedAverageLoss()"


def weighted_average_loss() -> Any:
    """The example's ``WeightedAverageLoss`` class, defined by running the script's first part."""
    namespace: dict[str, Any] = {"__name__": "ort_custom_loss_example"}
    exec(compile(CUSTOM_LOSS_EXAMPLE.split(_CLASS_END)[0], "ort_custom_loss_example.py", "exec"), namespace)
    return namespace["WeightedAverageLoss"]


__all__ = ["CUSTOM_LOSS_EXAMPLE", "weighted_average_loss"]
