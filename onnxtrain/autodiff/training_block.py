"""``TrainingBlock``: a block whose build yields a training model and an eval model."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

import onnx

from onnxtrain.autodiff.registry import GradientRegistry
from onnxtrain.autodiff.training import TrainingModels, build_training_models
from onnxtrain.blocks.block import Block, output_names


class TrainingBlock(Block):
    """Base class of blocks that build a loss and get its gradient graph (onnxblock semantics).

    ``build`` returns the name of the loss (first) and, optionally, further
    outputs. Calling the block inside ``with onnxblock.base(model):`` builds:

    - the training model: user inputs, then every parameter as an input;
      outputs the loss, the further outputs and ``<param>_grad`` per trainable
      parameter (see :mod:`onnxtrain.autodiff.training`);
    - the eval model: the same inputs, the loss and further outputs, with
      Dropout and BatchNormalization in inference mode.

    No parameter requires a gradient until :meth:`requires_grad` says so.
    ``registry`` replaces the built-in gradient rules (e.g. a copy extended
    with rules for custom operators).
    """

    def __init__(self, *, registry: GradientRegistry | None = None) -> None:
        super().__init__()
        self._requires_grad: dict[str, None] = {}
        self._frozen_params: dict[str, None] = {}
        self._registry = registry
        self._built: TrainingModels | None = None

    @abstractmethod
    def build(self, *args: Any, **kwargs: Any) -> Any:
        """Stack blocks on the inputs; return the loss name (then any further output names)."""

    def requires_grad(self, argument_name: str, value: bool = True) -> None:
        """Mark the initializer ``argument_name`` as trainable (``value=True``) or frozen."""
        if not isinstance(argument_name, str):
            raise TypeError(f"requires_grad takes a parameter name (str), not {argument_name!r}")
        if value:
            self._frozen_params.pop(argument_name, None)
            self._requires_grad[argument_name] = None
        else:
            self._requires_grad.pop(argument_name, None)
            self._frozen_params[argument_name] = None

    def parameters(self) -> tuple[list[onnx.TensorProto], list[onnx.TensorProto]]:
        """``(trainable, frozen)`` parameters as TensorProtos, once the block is built."""
        built = self._models("Please build the training model first before trying to retrieve the parameters.")
        return built.trainable, built.frozen

    def to_model_proto(self) -> tuple[onnx.ModelProto, onnx.ModelProto]:
        """``(training_model, eval_model)``, once the block is built."""
        built = self._models("Please build the training and eval models first before trying to retrieve them.")
        return built.training, built.eval

    @property
    def running_stats(self) -> dict[str, str]:
        """``{running statistic parameter: training-model output with its new value}``."""
        return self._models().running_stats

    def _models(self, ort_message: str = "") -> TrainingModels:
        """The built models; ``RuntimeError`` before the build, starting with ONNX Runtime's own words."""
        if self._built is None:
            raise RuntimeError(
                f"{ort_message} {type(self).__name__} has not been built yet: call it inside "
                "`with onnxblock.base(model):` before asking for its models or parameters".lstrip()
            )
        return self._built

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        builder = self.builder
        with builder.transaction():
            output = super().__call__(*args, **kwargs)
            names = output_names(self, output)
            builder.set_outputs(names)
            forward = builder.finalize()
            self._built = build_training_models(
                forward, names, list(self._requires_grad), list(self._frozen_params), registry=self._registry
            )
        return output
