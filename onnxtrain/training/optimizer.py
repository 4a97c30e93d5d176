"""``Optimizer``: one run of the optimizer model per step, with ONNX Runtime's ``training.api.Optimizer`` names.

The optimizer model (docs/artifacts.md) takes ``learning_rate``, ``step``
(the state's step count + 1, as ONNX Runtime feeds it) and, per trainable
parameter, the parameter, its accumulated gradient and its moments; it
outputs the new parameter and moments, which it writes in place, over the old
ones on the device (:mod:`onnxtrain.training.inplace` checks that the model
allows it; otherwise into spares, which are then swapped in). With the fused
step (the default), ``step()`` only records the update, and the next train
step applies it (:mod:`onnxtrain.training.fused`). The moments come from the
checkpoint when it has optimizer state, else they are created (on the device) from the initial values in the model's
metadata when the optimizer is made, with step 0 and learning rate 1e-3
(ONNX Runtime's default) until one is set.

Made on a checkpoint without optimizer state that looks saved by training (it
records being saved after optimizer steps, ``OPTIMIZER_STATE_DROPPED``, or
has properties other than onnxtrain's), an optimizer that keeps moments warns
(:class:`OptimizerStateWarning`): they restart from their initial values, as
in ONNX Runtime, which says nothing. A checkpoint from ``generate_artifacts``
has no such property.

As in ONNX Runtime, a step does not reset the gradients (call
``module.lazy_reset_grad()`` after it). Unlike it, a step without gradients
(before any train step, or right after ``lazy_reset_grad()``) raises
``RuntimeError`` instead of applying zero or stale gradients, and
``set_learning_rate`` without a scheduler also sets the initial learning rate,
the one a checkpoint stores, so that a resumed run continues at the same rate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from onnxtrain import caller
from onnxtrain.artifacts import ort_training
from onnxtrain.artifacts.generate import OPTIMIZER_KEY
from onnxtrain.graph import versions
from onnxtrain.optim import ParameterSpec
from onnxtrain.optim.base import grad_name, state_name, updated_name
from onnxtrain.optim.emit import LEARNING_RATE, STEP
from onnxtrain.optim.loss_scaling import LAST_STEP_SKIPPED, LOSS_SCALE, SKIPPED_STEPS
from onnxtrain.optim.sequence_model import optimizer_of
from onnxtrain.training import values
from onnxtrain.training.batch_step import Schedule
from onnxtrain.training.fused import FusedStep
from onnxtrain.training.inplace import unsafe_in_place
from onnxtrain.training.model_io import ParameterInfo, optimizer_io
from onnxtrain.training.models import LoadedModel, ModelSource, load_model
from onnxtrain.training.module import Module
from onnxtrain.training.state import OPTIMIZER_STATE_DROPPED, TrainingState
from onnxtrain.training.store import OptimizerRecord, StateTensor


class OptimizerStateWarning(UserWarning):
    """Training resumes from a checkpoint without optimizer state: the optimizer's moments restart."""


def _warn_if_resuming(state: TrainingState, initial_values: tuple[float, ...]) -> None:
    """Warn when ``state`` has no optimizer state, the optimizer keeps some, and the checkpoint looks trained.

    A checkpoint saved by ``generate_artifacts`` (or ``onnxtrain generate``)
    holds no optimizer state and no property but onnxtrain's; one saved after
    optimizer steps without its optimizer state records that step count
    (``OPTIMIZER_STATE_DROPPED``); other properties are a user's, which ONNX
    Runtime's examples set while training.
    """
    if state.store.optimizer is not None or not initial_values:
        return
    loaded = state.loaded_properties
    if OPTIMIZER_STATE_DROPPED in loaded:
        steps = state.properties[OPTIMIZER_STATE_DROPPED]
        why = f"it was saved after {steps} optimizer step{'' if steps == 1 else 's'} without it"
    else:
        names = sorted(name for name in loaded if not name.startswith("onnxtrain."))
        if not names:
            return
        why = f"it has properties {names}, as a checkpoint saved while training has"
    count = len(initial_values)
    caller.warn(
        f"the checkpoint holds no optimizer state, but {why}: training resumes with the optimizer's {count} "
        f"moment{'s' if count > 1 else ''} per parameter restarting from their initial values "
        f"{list(initial_values)}, and its step count from 0. To resume where training stood, save checkpoints "
        "with CheckpointState.save_checkpoint(state, path, include_optimizer_state=True)",
        OptimizerStateWarning,
    )


def _learning_rate(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"the learning rate must be a float, not {type(value).__name__}")
    rate = float(value)
    if not math.isfinite(rate) or rate < 0:
        raise ValueError(f"the learning rate must be finite and >= 0, not {rate!r}")
    return float(np.float32(rate))  # what the model's float32 input holds


def _per_tensor(model: LoadedModel, trainable: Sequence[str], infos: Mapping[str, ParameterInfo]) -> LoadedModel:
    """``model``, or onnxtrain's optimizer model for the same step when it takes ONNX Runtime's sequences
    (``com.microsoft::AdamWOptimizer``/``SGDOptimizerV2`` or ``onnxblock.optim``'s standard form)."""
    if not ort_training.is_sequence_optimizer_model(model.proto):
        return model
    specs = [
        ParameterSpec(name, onnx.helper.np_dtype_to_tensor_dtype(infos[name].dtype), infos[name].shape)
        for name in trainable
    ]
    opset = versions.opset_version(model.proto, "") or versions.DEFAULT_OPSET
    proto = ort_training.per_tensor_optimizer_model(model.proto, specs, opset)
    return LoadedModel(proto, proto.SerializeToString())


def _kind(model: onnx.ModelProto) -> str | None:
    """The optimizer ``model`` computes (``"AdamW"``), from its metadata or ONNX Runtime's sequence optimizer
    nodes; ``None`` where neither says."""
    for entry in model.metadata_props:
        if entry.key == OPTIMIZER_KEY:
            return entry.value.partition("(")[0].strip() or None
    if ort_training.is_sequence_optimizer_model(model):
        optimizer = optimizer_of(model)
        return None if optimizer is None else type(optimizer).__name__
    return None


class Optimizer:
    """Updates the module's trainable parameters from their accumulated gradients.

    Args:
        optimizer_uri: the optimizer model (path, bytes or ModelProto).
        module: the :class:`~onnxtrain.training.module.Module` whose state it updates;
            it runs on the module's device with the module's session options.
        fuse: let a step's update be applied by the module's next train step
            that starts from reset gradients, in one onnxruntime run
            (:mod:`onnxtrain.training.fused`); ``False`` runs the optimizer
            model at every ``step()``. Results are the same either way.
    """

    def __init__(self, optimizer_uri: ModelSource, module: Module, *, fuse: bool = True) -> None:
        if not isinstance(module, Module):
            raise TypeError(f"module must be an onnxtrain Module, not {type(module).__name__}")
        state, store = module.state, module.state.store
        model = load_model(optimizer_uri, "optimizer_uri")
        self._kind = _kind(model.proto)
        trainable = module.io.trainable
        if not trainable:
            raise ValueError("the training model has no trainable parameters, so there is nothing to optimize")
        model = _per_tensor(model, trainable, store.parameter_infos())
        self._io = optimizer_io(model.proto, trainable, store.parameter_infos())
        self._session = module.open_session(model, "optimizer model", in_node_order=True)
        _warn_if_resuming(state, self._io.initial_values)
        self._record: OptimizerRecord = store.ensure_optimizer(trainable, self._io.initial_values)
        self._module = module
        self._store = store
        self._scheduler: Schedule | None = None
        tensors, grads, moments = store.tensors, store.gradients, self._record.moments
        self._slots: list[tuple[str, StateTensor]] = []  # (input name, tensor) a step updates
        self._grad_slots = [(grad_name(p), grads[p]) for p in trainable]
        for p in trainable:
            self._slots.append((p, tensors[p]))
            self._slots += [(state_name(p, i), m) for i, m in enumerate(moments[p])]
        self._slots += [(name, tensors[name]) for name in self._io.shared_state]  # the loss scaler's state
        self._in_place = not unsafe_in_place(model.proto.graph, {name: updated_name(name) for name, _ in self._slots})
        # learning rate and step, bound once and written in place per step. On the CPU: OrtValues viewing these
        # arrays. On another device: OrtValues there, each written (one small copy) when its value changes,
        # because onnxruntime copies a host input to the device when it is bound, not at each run
        self._lr_host = np.zeros(1, np.float32)
        self._step_host = np.zeros(1, np.int64)
        self._on_host = module.device.type == "cpu"
        if self._on_host:
            self._lr_value = ort.OrtValue.ortvalue_from_numpy(self._lr_host)
            self._step_value = ort.OrtValue.ortvalue_from_numpy(self._step_host)
        else:
            self._lr_value = values.from_numpy(self._lr_host, module.device)
            self._step_value = values.from_numpy(self._step_host, module.device)
        # the parities of the gradients and of the parameters (the moments swap with them) pick the binding
        self._parity_tensors = (grads[trainable[0]], tensors[trainable[0]])
        # a module that runs unbound (STRING inputs or outputs) has no fused step: step() runs the update at once
        self._fused = None
        if fuse and not module.runs_unbound:
            self._fused = FusedStep.create(
                module.train_model,
                model,
                trainable,
                module.io.inputs.names,
                store,
                moments,
                self,
                (self._lr_value, self._step_value),
                lambda fused, what: module.open_session(fused, what, alone=True),
                on_host=self._on_host,
                shared_state=self._io.shared_state,
            )
        module.use_fused_step(self._fused)

    def __repr__(self) -> str:
        """The optimizer, its learning rate and step count, whether its steps are fused, and its scheduler."""
        kind = "" if self._kind is None else f"{self._kind}, "
        scheduler = "" if self._scheduler is None else f", scheduler={type(self._scheduler).__name__}"
        return (
            f"Optimizer({kind}learning_rate={self._record.learning_rate:g}, step={self._record.step}, "
            f"fused={self._fused is not None}{scheduler})"
        )

    def step(self) -> None:
        """One optimizer step with the accumulated gradients; the state's step count goes up by one.

        With the fused step, the update is recorded here and applied by the
        next train step (or before anything reads the state).
        """
        store = self._store
        if store.unloaded:
            store.check_loaded(store.tensors, "The optimizer state cannot be constructed.")
        if store.gradient_status != "ready":
            when = "after lazy_reset_grad()" if store.gradient_status == "reset" else "before any train step"
            raise RuntimeError(
                f"Optimizer.step() {when}: there are no gradients to apply; run a train step (module(...)) first"
            )
        store.settle()  # an earlier step still recorded is applied first
        self._write_step_inputs()
        if self._fused is not None:
            store.recorded_update = self
        else:
            self.apply()
        self._record.step += 1

    def apply(self) -> None:
        """Run the optimizer model on the gradients, with the learning rate and step number written by ``step()``.

        (The state calls it to apply a recorded update: :meth:`StateStore.settle`.)
        """
        session = self._session
        session.select(tuple(tensor.flips & 1 for tensor in self._parity_tensors))
        session.bind_value(LEARNING_RATE, self._lr_value)
        session.bind_value(STEP, self._step_value)
        for name, grad in self._grad_slots:
            session.bind_value(name, grad.value)
        for name, tensor in self._slots:
            session.bind_value(name, tensor.value)
            session.bind_output_into(updated_name(name), tensor.value if self._in_place else tensor.spare())
        session.run()
        if not self._in_place:
            for _, tensor in self._slots:
                tensor.swap()

    def _write_step_inputs(self) -> None:
        """Write this step's learning rate and number (the state's step + 1) where the bound inputs read them."""
        rate, step = self._record.learning_rate, self._record.step + 1
        if self._on_host:
            self._lr_host[0] = rate
            self._step_host[0] = step
            return
        if self._lr_host[0] != rate:
            self._lr_host[0] = rate
            self._lr_value.update_inplace(self._lr_host)
        self._step_host[0] = step
        self._step_value.update_inplace(self._step_host)

    def set_learning_rate(self, learning_rate: float) -> None:
        """Use ``learning_rate`` from the next step on (a scheduler's next ``step()`` overrides it)."""
        rate = _learning_rate(learning_rate)
        self._record.learning_rate = rate
        if self._scheduler is None:
            self._record.initial_learning_rate = rate

    def get_learning_rate(self) -> float:
        """The learning rate the next step uses."""
        return self._record.learning_rate

    @property
    def loss_scale(self) -> float | None:
        """The dynamic loss scale the next train step multiplies the loss by (``None``: the artifacts do not
        scale the loss). Reading it applies a recorded update and copies one number from the device."""
        return self._scaler_value(LOSS_SCALE, float)

    @property
    def last_step_skipped(self) -> bool | None:
        """Whether the last optimizer step was skipped for a gradient that was not finite (its parameters and
        moments left as they were, the loss scale backed off); ``None`` without loss scaling."""
        return self._scaler_value(LAST_STEP_SKIPPED, bool)

    @property
    def skipped_steps(self) -> int | None:
        """How many optimizer steps were skipped so far; ``None`` without loss scaling."""
        return self._scaler_value(SKIPPED_STEPS, int)

    def _scaler_value(self, name: str, kind: type) -> Any:
        if name not in self._io.shared_state:
            return None
        self._store.settle()
        return kind(self._store.tensors[name].numpy().reshape(-1)[0])

    # ------------------------------------------- for schedulers and train_epoch

    @property
    def module(self) -> Module:
        """The module whose state this optimizer updates."""
        return self._module

    @property
    def step_count(self) -> int:
        """Optimizer steps taken (the checkpoint's step), which schedulers read."""
        return self._record.step

    @property
    def initial_learning_rate(self) -> float:
        return self._record.initial_learning_rate

    @property
    def scheduler(self) -> Schedule | None:
        """The scheduler that sets the learning rate after each step, if one is attached."""
        return self._scheduler

    @property
    def fused_step(self) -> FusedStep | None:
        """The fused step (the recorded update and a train step in one run), where the models allow it."""
        return self._fused

    def recorded_update(self) -> tuple[float, int]:
        """The learning rate and the step number of the update recorded by the last ``step()``."""
        return float(self._lr_host[0]), int(self._step_host[0])

    def record_applied(self, count: int) -> None:
        """Count ``count`` updates applied by a run that applied them itself (``Module.train_epoch``): the step
        count goes up by ``count``."""
        self._record.step += count

    def attach_scheduler(self, scheduler: Schedule, initial_lr: float) -> None:
        """Let ``scheduler`` set the learning rate, from ``initial_lr`` (the scheduler's constructor calls it)."""
        self._record.initial_learning_rate = _learning_rate(initial_lr)
        self._record.learning_rate = self._record.initial_learning_rate
        self._scheduler = scheduler

    def schedule_learning_rate(self, learning_rate: float) -> None:
        """Set the learning rate of the next step, as the scheduler computed it (the initial rate stays)."""
        self._record.learning_rate = _learning_rate(learning_rate)


__all__ = ["Optimizer", "OptimizerStateWarning"]
