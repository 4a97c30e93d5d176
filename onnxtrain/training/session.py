"""``TrainingSession``: ONNX Runtime's C++ ``Ort::TrainingSession``, one method per function, in snake_case.

A thin composition of :class:`~onnxtrain.training.module.Module`,
:class:`~onnxtrain.training.optimizer.Optimizer` and a scheduler, for code
ported from the C, C++, C#, Java or JS training APIs. docs/runtime.md maps
every C++ function to its method here and in ``onnxtrain.api``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort

from onnxtrain.training.buffers import Buffer
from onnxtrain.training.device import Device, ProviderSpec
from onnxtrain.training.models import ModelSource
from onnxtrain.training.module import Module
from onnxtrain.training.optimizer import Optimizer
from onnxtrain.training.schedulers import LinearLRScheduler, LRScheduler
from onnxtrain.training.state import TrainingState

Value = np.ndarray | ort.OrtValue


class TrainingSession:
    """Train, eval and optimizer steps over one state (C++ ``TrainingSession``).

    Args:
        state: the ``CheckpointState`` to begin or resume training from.
        train_model: the training model (path, bytes or ModelProto).
        eval_model: the eval model, or ``None``.
        optimizer_model: the optimizer model, or ``None``.
        device, providers, session_options, check_finite: as for ``Module``.
    """

    def __init__(
        self,
        state: TrainingState,
        train_model: ModelSource,
        eval_model: ModelSource | None = None,
        optimizer_model: ModelSource | None = None,
        *,
        device: str | Device | None = None,
        providers: Sequence[ProviderSpec] | None = None,
        session_options: ort.SessionOptions | None = None,
        check_finite: bool = False,
    ) -> None:
        self.module = Module(
            train_model,
            state,
            eval_model,
            device,
            session_options,
            providers=providers,
            check_finite=check_finite,
        )
        self.optimizer = None if optimizer_model is None else Optimizer(optimizer_model, self.module)
        self.scheduler: LRScheduler | None = None

    @property
    def state(self) -> TrainingState:
        return self.module.state

    def _optimizer(self, call: str) -> Optimizer:
        if self.optimizer is None:
            raise RuntimeError(f"{call} needs the optimizer model: pass optimizer_model to TrainingSession")
        return self.optimizer

    # ------------------------------------------------------------ the loop

    def train_step(self, input_values: Sequence[Value]) -> list[Value]:
        """``TrainStep``: the training model's user outputs (loss first); gradients accumulate on the device."""
        return _as_list(self.module.train_step(*input_values))

    def lazy_reset_grad(self) -> None:
        """``LazyResetGrad``: the next train step overwrites the gradients instead of adding to them."""
        self.module.lazy_reset_grad()

    def eval_step(self, input_values: Sequence[Value]) -> list[Value]:
        """``EvalStep``: the eval model's user outputs."""
        return _as_list(self.module.eval_step(*input_values))

    def set_learning_rate(self, learning_rate: float) -> None:
        """``SetLearningRate``."""
        self._optimizer("set_learning_rate").set_learning_rate(learning_rate)

    def get_learning_rate(self) -> float:
        """``GetLearningRate``."""
        return self._optimizer("get_learning_rate").get_learning_rate()

    def register_linear_lr_scheduler(self, warmup_step_count: int, total_step_count: int, initial_lr: float) -> None:
        """``RegisterLinearLRScheduler``: ONNX Runtime's linear warm-up and decay (sets the rate at once)."""
        self.scheduler = LinearLRScheduler(
            self._optimizer("register_linear_lr_scheduler"), warmup_step_count, total_step_count, initial_lr
        )

    def register_lr_scheduler(self, scheduler: LRScheduler) -> None:
        """Use any scheduler of :mod:`onnxtrain.training.schedulers` made on ``self.optimizer``."""
        if not isinstance(scheduler, LRScheduler) or scheduler.optimizer is not self.optimizer:
            raise ValueError("register a scheduler made on this session's optimizer (session.optimizer)")
        self.scheduler = scheduler

    def scheduler_step(self) -> None:
        """``SchedulerStep``: set the learning rate for the current step count."""
        if self.scheduler is None:
            raise RuntimeError("no scheduler: call register_linear_lr_scheduler(...) first")
        self.scheduler.step()

    def optimizer_step(self) -> None:
        """``OptimizerStep``: update the trainable parameters from the accumulated gradients."""
        self._optimizer("optimizer_step").step()

    # ------------------------------------------------------------- inference

    def export_model_for_inferencing(
        self, inference_model_path: str | os.PathLike[str], graph_output_names: Sequence[str]
    ) -> None:
        """``ExportModelForInferencing``: the eval model with the current parameters, pruned to the outputs."""
        self.module.export_model_for_inferencing(inference_model_path, graph_output_names)

    # ----------------------------------------------------------------- names

    def input_names(self, training: bool) -> list[str]:
        """``InputNames``: the user inputs of the training (``True``) or eval (``False``) model."""
        return _names(self.module, training, Module.input_names)

    def output_names(self, training: bool) -> list[str]:
        """``OutputNames``: the user outputs of the training or eval model."""
        return _names(self.module, training, Module.output_names)

    # ---------------------------------------------------------------- buffers

    def to_buffer(self, only_trainable: bool) -> ort.OrtValue:
        """``ToBuffer``: a contiguous copy of the (trainable) parameters, in training-model order."""
        return self.module.get_contiguous_parameters(trainable_only=only_trainable)

    def from_buffer(self, buffer: Buffer) -> None:
        """``FromBuffer``: load the parameters from a contiguous buffer.

        As ONNX Runtime's C++ wrapper does, the buffer's size says which: all
        parameters, or (a smaller buffer) the trainable ones only.
        """
        total = self.module.get_parameters_size(trainable_only=False)
        size = _size(buffer)
        if size == total:
            self.module.copy_buffer_to_parameters(buffer, trainable_only=False)
            return
        trainable = self.module.get_parameters_size(trainable_only=True)
        if size != trainable:
            raise ValueError(
                f"the buffer has {size} elements; the parameters have {total}, the trainable ones {trainable}"
            )
        self.module.copy_buffer_to_parameters(buffer, trainable_only=True)


def _as_list(outputs: Any) -> list[Value]:
    return list(outputs) if isinstance(outputs, tuple) else [outputs]


def _names(module: Module, training: bool, method: Any) -> list[str]:
    mode = module.training
    try:
        module.train(training)
        return list(method(module))
    finally:
        module.train(mode)


def _size(buffer: Buffer) -> int:
    if isinstance(buffer, ort.OrtValue):
        return int(np.prod(buffer.shape(), dtype=np.int64))
    if isinstance(buffer, np.ndarray):
        return int(buffer.size)
    if isinstance(buffer, Mapping):
        return sum(_size(part) for part in buffer.values())
    raise TypeError(
        f"the buffer must be an OrtValue, a numpy.ndarray or {{dtype: buffer}}, not {type(buffer).__name__}"
    )


__all__ = ["TrainingSession"]
