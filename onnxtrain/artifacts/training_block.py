"""``TrainingBlock``: a block whose build yields a training model and an eval model."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

import onnx

from onnxtrain.artifacts.accumulation import add_gradient_accumulation
from onnxtrain.artifacts.training_model import TrainingModels, build_training_models
from onnxtrain.autodiff import GradientRegistry
from onnxtrain.blocks.block import Block, output_names
from onnxtrain.graph.builder import GraphBuilder
from onnxtrain.losses._common import trained_values


class TrainingBlock(Block):
    """Base class of blocks that build a loss and get its gradient graph (onnxblock semantics).

    ``build`` returns the name of the loss (first) and, optionally, further
    outputs. Calling the block inside ``with onnxblock.base(model):`` builds:

    - the training model, in ONNX Runtime's interface: user inputs, every
      parameter as an input, then ``<x>_grad.accumulation.buffer`` per
      gradient and ``lazy_reset_grad`` (bool[1]); outputs the loss, the
      further outputs and ``<x>_grad.accumulation.out`` per gradient, which
      is the accumulated gradient itself (``lazy_reset_grad ? grad : buffer +
      grad``: stock onnxruntime has no in-place accumulator, see
      :mod:`onnxtrain.artifacts.accumulation`). The gradients are those of
      the graph inputs marked, in input order, then of the trainable
      parameters, in parameter order;
    - the eval model: the same user inputs and parameters, the loss and
      further outputs, with Dropout and BatchNormalization in inference mode.

    :attr:`gradient_models` holds both before accumulation (plain
    ``<x>_grad`` outputs). No parameter or input requires a gradient until
    :meth:`requires_grad` says so.
    ``registry`` replaces the built-in gradient rules (e.g. a copy extended
    with rules for custom operators).
    """

    def __init__(self, *, registry: GradientRegistry | None = None) -> None:
        super().__init__()
        self._requires_grad: dict[str, None] = {}
        self._frozen_params: dict[str, None] = {}
        self._registry = registry
        self._loss_scale: str | None = None
        self._activation_checkpoints: str | list[str] | None = None
        self._built: TrainingModels | None = None
        self._accumulated: onnx.ModelProto | None = None

    @abstractmethod
    def build(self, *args: Any, **kwargs: Any) -> Any:
        """Stack blocks on the inputs; return the loss name (then any further output names)."""

    def scale_loss_by(self, parameter: str | None) -> None:
        """Differentiate ``loss * parameter`` (a frozen float32 ``[1]`` parameter, the dynamic loss scale of
        :mod:`onnxtrain.optim.loss_scaling`) instead of the loss; ``None``: the loss itself."""
        self._loss_scale = parameter

    def checkpoint_activations(self, checkpoints: str | Sequence[str] | None = "auto") -> None:
        """Keep only ``checkpoints`` (forward values) for the backward and recompute the rest from them;
        ``"auto"``: the layer boundaries; ``None``: keep every value the backward reads (the default).
        See :func:`~onnxtrain.graph.passes.recompute.recompute_from_checkpoints`."""
        if checkpoints is not None and not isinstance(checkpoints, str):
            checkpoints = list(checkpoints)
        self._activation_checkpoints = checkpoints

    def requires_grad(self, argument_name: str, value: bool = True) -> None:
        """Mark the initializer ``argument_name`` as trainable (``value=True``) or frozen.

        A float graph input may be marked too: the training model then gives
        its gradient (``<input>_grad.accumulation.out``).
        """
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
        assert self._accumulated is not None
        return self._accumulated, built.eval

    @property
    def gradient_models(self) -> TrainingModels:
        """The models before gradient accumulation: the training model outputs ``<x>_grad`` itself."""
        return self._models()

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
        outer = builder.gradient_registry
        builder.gradient_registry = self._registry  # for Gradient blocks of the loss (blocks.Gradient)
        try:
            with trained_values(self._requires_grad.keys()):  # a loss's target no trained value feeds is data
                return self._build_training(builder, *args, **kwargs)
        finally:
            builder.gradient_registry = outer

    def _build_training(self, builder: GraphBuilder, *args: Any, **kwargs: Any) -> Any:
        with builder.transaction():
            output = super().__call__(*args, **kwargs)
            names = output_names(self, output)
            builder.set_outputs(names)
            forward = builder.finalize()
            initializers = {tensor.name for tensor in forward.graph.initializer}
            graph_inputs = {value.name for value in forward.graph.input} - initializers
            marked_inputs = [name for name in self._requires_grad if name in graph_inputs]
            parameters = [name for name in self._requires_grad if name not in graph_inputs]
            built = build_training_models(
                forward,
                names,
                parameters,
                list(self._frozen_params),
                input_gradients=marked_inputs,
                registry=self._registry,
                loss_scale=self._loss_scale,
                activation_checkpoints=self._activation_checkpoints,
            )
            order = [value.name for value in built.training.graph.input if value.name in marked_inputs]
            accumulated = add_gradient_accumulation(built.training, [*order, *(t.name for t in built.trainable)])
            self._built = built
            self._accumulated = accumulated
        return output
