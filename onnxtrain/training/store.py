r"""The runtime's state on a device: the tensors a ``Module`` and its ``Optimizer`` read and write.

:class:`StateStore` is what :class:`~onnxtrain.training.state.TrainingState`
(the user's ``CheckpointState``) holds for the runtime (``state.store``): the
parameters (NumPy arrays until a ``Module`` places them on its device, then
``onnxruntime.OrtValue``\ s there), the gradient buffers and their status, the
optimizer's step, learning rates and moments, and the update an optimizer
step recorded and has not applied yet. Each tensor is a :class:`StateTensor`:
its value, plus a spare of the same type and shape where a step that may fail
writes first (swapped in once the step succeeds). The runtime's table of who
reads and writes what is in :mod:`onnxtrain.training.module`.
"""

from __future__ import annotations

import gc
import math
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
import onnxruntime as ort

from onnxtrain import checkpoint as ckpt
from onnxtrain.checkpoint.state import DEFAULT_LEARNING_RATE, check_nominal_allocation, placeholder
from onnxtrain.graph.naming import unknown_name_hint
from onnxtrain.training import values
from onnxtrain.training.device import Device
from onnxtrain.training.model_io import ParameterInfo

#: ``"none"``: no train step yet; ``"ready"``: the last train steps' gradients; ``"reset"``: reset since
#: (the buffers may still hold the old values, which only a recorded update reads).
GradientStatus = Literal["none", "ready", "reset"]

#: ONNX Runtime's sentences for a nominal state used before its parameters hold values (its messages start so).
LOAD_PARAMETER_STATES = "Please load the parameter states first"
LOAD_ALL_PARAMETER_STATES = "Please load all the parameter states first"
LOAD_MODEL_PARAMETERS = "Please load the model parameters first."


class NominalStateError(RuntimeError, ValueError):
    """A parameter of a nominal checkpoint state is used before it holds a value.

    A ``RuntimeError``, as ONNX Runtime raises, and a ``ValueError``, as
    onnxtrain's runtime raised before; the message starts with ONNX Runtime's.
    """


class RecordedUpdate(Protocol):
    """An optimizer step recorded and not applied yet (an ``Optimizer``; see onnxtrain.training.fused)."""

    def apply(self) -> None:
        """Run the update now, with the learning rate and step number recorded."""


class StateTensor:
    """One tensor of the state: a NumPy array until placed, then an OrtValue on the device, plus a spare."""

    __slots__ = ("_array", "_spare", "device", "dtype", "flips", "shape", "value")

    def __init__(self, array: np.ndarray) -> None:
        self._array: np.ndarray | None = array
        self.dtype = array.dtype
        self.shape = tuple(array.shape)
        self.value: ort.OrtValue | None = None
        self._spare: ort.OrtValue | None = None
        self.device: Device | None = None
        self.flips = 0  # swaps so far: its parity says which of the two buffers is the value

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def place(self, device: Device) -> None:
        """Move to ``device`` (a copy; the host array is dropped once on a device)."""
        if self.device == device:
            return
        if self.value is None:
            assert self._array is not None
            self.value = values.from_numpy(self._array, device)
            self._array = None
        else:
            self.value = values.copy(self.value, device)
        self._spare = None
        self.device = device

    def numpy(self) -> np.ndarray:
        """A copy of the current value."""
        if self.value is None:
            assert self._array is not None
            return np.array(self._array, copy=True)
        return values.to_numpy(self.value)

    def placeholder(self) -> np.ndarray:
        """An array of the tensor's dtype and shape that owns no memory (for a nominal snapshot)."""
        return placeholder(self.dtype, self.shape)

    def write(self, array: Any, what: str) -> None:
        """Overwrite the value with ``array`` (same dtype and shape, else ``TypeError``/``ValueError``)."""
        array = np.asarray(array)
        if self.value is not None:
            values.write(self.value, array, what)
            return
        if array.dtype.newbyteorder("=") != self.dtype:
            raise TypeError(
                f"{what} is {values.describe(self.dtype, self.shape)}; got "
                f"{values.describe(array.dtype, array.shape)}: cast it with .astype({values.cast_hint(self.dtype)})"
            )
        if array.shape != self.shape:
            raise ValueError(f"{what} is {values.describe(self.dtype, self.shape)}; got shape {list(array.shape)}")
        copy = np.array(array, dtype=self.dtype, copy=True, order="C")
        copy.setflags(write=False)
        self._array = copy

    def spare(self) -> ort.OrtValue:
        """The second buffer a step writes into (allocated on first use)."""
        if self._spare is None:
            assert self.device is not None, "place the state on a device first"
            self._spare = values.empty(self.shape, self.dtype, self.device)
        return self._spare

    def swap(self) -> None:
        """Make the spare (just written by a step) the current value."""
        self.value, self._spare = self._spare, self.value
        self.flips += 1


@dataclass
class OptimizerRecord:
    """ORT's optimizer group ``group0`` while training: step, learning rates and the moments on the device."""

    step: int = 0
    initial_learning_rate: float = DEFAULT_LEARNING_RATE
    learning_rate: float = DEFAULT_LEARNING_RATE
    moments: dict[str, list[StateTensor]] = field(default_factory=dict)


class StateStore:
    """The runtime's state of one checkpoint; see the module docstring.

    Attributes: ``tensors`` (every parameter, trainable first),
    ``requires_grad``, ``unloaded`` (the parameters of a nominal state that
    hold no value yet), ``gradients`` (per trainable parameter, once a
    ``Module`` made them), ``gradient_status``, ``optimizer`` (the step,
    learning rates and moments; ``None`` until an optimizer or the checkpoint
    gives them), ``recorded_update`` and ``device`` (where a ``Module``
    placed the tensors; they stay there once it is gone). :meth:`hold`
    records the modules over the state, weakly: while one lives, which
    parameters train is its training model's (:meth:`set_requires_grad`).
    """

    def __init__(self, state: ckpt.CheckpointState) -> None:
        self.tensors: dict[str, StateTensor] = {}
        self.requires_grad: dict[str, bool] = {}
        for group, trainable in ((state.trainable, True), (state.frozen, False)):
            for name, array in group.items():
                self.tensors[name] = StateTensor(array)  # nominal: a placeholder, allocated once needed
                self.requires_grad[name] = trainable
        self.unloaded: set[str] = set(self.tensors) if state.is_nominal else set()
        self.gradients: dict[str, StateTensor] = {}
        self.gradient_status: GradientStatus = "none"
        #: Train steps since the gradients were last reset (by any module over the state): the next adds if any.
        self.steps_since_reset = 0
        self.recorded_update: RecordedUpdate | None = None
        self.device: Device | None = None
        self._holders: weakref.WeakSet[object] = weakref.WeakSet()  # the live modules over the state
        self.optimizer: OptimizerRecord | None = None
        if state.optimizer is not None:
            self.optimizer = OptimizerRecord(
                step=state.optimizer.step,
                initial_learning_rate=state.optimizer.initial_learning_rate,
                learning_rate=state.optimizer.initial_learning_rate,
                moments={name: [StateTensor(m) for m in moments] for name, moments in state.optimizer.moments.items()},
            )

    @property
    def step(self) -> int:
        """Optimizer steps taken (0 without optimizer state)."""
        return 0 if self.optimizer is None else self.optimizer.step

    def tensor(self, name: str) -> StateTensor:
        """Parameter ``name``'s tensor (``KeyError`` naming the parameters)."""
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"no parameter {name!r} in the state; {unknown_name_hint(name, self.tensors)}") from None

    def settle(self) -> None:
        """Apply the recorded update, if any: before anything reads or writes what it changes."""
        if self.recorded_update is not None:
            self.recorded_update.apply()
            self.recorded_update = None

    def adopt_declared_shapes(self, declared: Mapping[str, tuple[int, ...]]) -> list[str]:
        """Give each parameter of a nominal state that holds no value and whose checkpoint kept no dimensions
        (ONNX Runtime's nominal checkpoints, written without the data: rank 0) the shape ``declared`` gives it
        (a model's inputs, of rank 1 or more); the names given one."""
        adopted = []
        for name, shape in declared.items():
            tensor = self.tensors.get(name)
            if tensor is None or name not in self.unloaded or tensor.shape or tensor.value is not None or not shape:
                continue
            self.tensors[name] = StateTensor(placeholder(tensor.dtype, shape))
            adopted.append(name)
        return adopted

    def hold(self, module: object) -> None:
        """Record that ``module`` runs over the state, for as long as it lives (a weak reference)."""
        self._holders.add(module)

    def holders(self) -> int:
        """How many modules over the state are still alive.

        A module the program no longer references may wait for Python's cycle
        collector, and an update recorded by its optimizer keeps the optimizer
        (and the module) referenced: only where some module is counted, the
        update is applied (as anything that reads the state would) and the
        collector runs before they are counted again.
        """
        if self._holders:
            self.settle()
            gc.collect()
        return len(self._holders)

    def set_requires_grad(self, name: str, trainable: object) -> None:
        """Make parameter ``name`` trainable or frozen while no live ``Module`` holds the state (its training
        model decides which parameters train): frozen, its optimizer moments are dropped; made trainable, the
        optimizer gives it its initial moments (:meth:`ensure_optimizer`), the step count staying the state's.

        Set on a state that modules held and let go, the gradients restart as a loaded checkpoint's (none until
        the next module makes them): the old ones are the old training model's. The tensors stay on the device.
        """
        self.tensor(name)
        if not isinstance(trainable, (bool, np.bool_)):
            raise TypeError(f"requires_grad of {name!r} must be True or False, not {trainable!r}")
        held = self.holders()
        if held:
            modules = "1 Module over it is" if held == 1 else f"{held} Modules over it are"
            raise RuntimeError(
                f"cannot change whether {name!r} trains while a Module holds the state ({modules} still referenced: "
                "by a variable, an Optimizer or TrainingSession over it, or IPython's Out history): its training "
                "model decides which parameters train. Let them go (del module, optimizer) and set requires_grad "
                "again, or set it on a state loaded again (CheckpointState.load_checkpoint of a checkpoint saved "
                "with include_optimizer_state=True); then regenerate the artifacts with the new requires_grad and "
                "make the Module of them"
            )
        if self.requires_grad[name] == bool(trainable):
            return
        self.requires_grad[name] = bool(trainable)
        if not trainable and self.optimizer is not None:
            self.optimizer.moments.pop(name, None)
        order = sorted(self.tensors, key=lambda n: not self.requires_grad[n])  # trainable first, else in order
        self.tensors = {n: self.tensors[n] for n in order}
        self.gradients = {}
        self.gradient_status = "none"
        self.steps_since_reset = 0

    def parameter_infos(self) -> dict[str, ParameterInfo]:
        """Per parameter: trainable or not, dtype, shape (what the models' inputs are checked against)."""
        return {n: ParameterInfo(self.requires_grad[n], t.dtype, t.shape) for n, t in self.tensors.items()}

    def set_parameter(self, name: str, value: Any) -> None:
        """Write ``value`` into parameter ``name``; a nominal state's parameter that holds no value gets it.

        (ONNX Runtime refuses any write to a nominal state; here only a value of
        another dtype or shape is refused, with ONNX Runtime's sentence.)
        """
        tensor = self.tensor(name)
        if isinstance(value, ort.OrtValue):
            value = values.to_numpy(value)
        if name in self.unloaded:
            array = np.asarray(value)
            if array.dtype.newbyteorder("=") != tensor.dtype or array.shape != tensor.shape:
                raise NominalStateError(
                    f"Cannot copy parameter to a nominal state. {LOAD_ALL_PARAMETER_STATES}, or assign to {name!r} "
                    f"an array of its dtype and shape: it is {values.describe(tensor.dtype, tensor.shape)}; got "
                    f"{values.describe(array.dtype, array.shape)}"
                )
        self.settle()
        tensor.write(value, f"parameter {name!r}")
        self.unloaded.discard(name)

    def gradient(self, name: str) -> np.ndarray | None:
        """A copy of ``name``'s gradient: zeros while reset or before a step, ``None`` without a buffer."""
        self.tensor(name)
        grad = self.gradients.get(name)
        if grad is None:
            return None
        if self.gradient_status != "ready":  # none computed yet, or reset: what the next step starts from
            return np.zeros(grad.shape, grad.dtype)
        return grad.numpy()

    def check_gettable(self, name: str) -> None:
        """``NominalStateError`` (ONNX Runtime's sentence) when parameter ``name`` holds no value yet."""
        if name in self.unloaded:
            raise NominalStateError(
                f"Cannot get parameter from a nominal state. {LOAD_PARAMETER_STATES}: {name!r} holds no value yet; "
                f"load the parameters with module.copy_buffer_to_parameters(buffer, trainable_only=False), or "
                f"assign this one with state.parameters[{name!r}] = array"
            )

    def check_loaded(self, names: Iterable[str], sentence: str) -> None:
        """``NominalStateError`` when some of the parameters ``names`` hold no value yet (a nominal state).

        The message starts with ``sentence`` (ONNX Runtime's, for the call that
        needs them) and ONNX Runtime's "Please load the model parameters first.",
        and names the parameters that hold no value.
        """
        if not self.unloaded:
            return
        missing = [name for name in names if name in self.unloaded]
        if missing:
            raise NominalStateError(
                f"{sentence} {LOAD_MODEL_PARAMETERS} Parameters {sorted(missing)} of this nominal checkpoint state "
                "hold no values yet: load them with module.copy_buffer_to_parameters(buffer, trainable_only=False) "
                "(the buffer from get_contiguous_parameters() of a module over the full checkpoint), or assign "
                "each with state.parameters[name] = array"
            )

    def place(self, device: Device) -> None:
        """Put every tensor on ``device``; a state in use on another device cannot move."""
        if self.device is not None and self.device != device:
            raise ValueError(
                f"this CheckpointState is already in use on {self.device}; a module on {device} needs its own "
                "state: load the checkpoint again"
            )
        if self.unloaded:  # placeholders become allocated tensors: refuse what would not fit
            tensors = ((n, t) for n, t in self.tensors.items() if n in self.unloaded and t.value is None)
            check_nominal_allocation(((n, t.dtype, t.shape) for n, t in tensors), f"placing the state on {device}")
        for tensor in self.tensors.values():
            tensor.place(device)
        if self.optimizer is not None:
            for moments in self.optimizer.moments.values():
                for moment in moments:
                    moment.place(device)
        self.device = device

    def gradients_computed(self) -> None:
        """A train step wrote the gradients: they are ready, and the next step adds to them."""
        self.gradient_status = "ready"
        self.steps_since_reset += 1

    def reset_gradients(self) -> None:
        """``lazy_reset_grad``: the next train step overwrites the gradients; they read as zeros until then."""
        self.steps_since_reset = 0
        if self.gradient_status == "ready":
            self.gradient_status = "reset"

    def ensure_gradients(self, names: Sequence[str]) -> None:
        """Gradient buffers (zeros) for ``names`` on the state's device."""
        assert self.device is not None
        for name in names:
            if name not in self.gradients:
                tensor = self.tensors[name]
                grad = StateTensor(np.zeros(tensor.shape, tensor.dtype))
                grad.place(self.device)
                self.gradients[name] = grad

    def ensure_optimizer(self, trainable: Sequence[str], initial_values: Sequence[float]) -> OptimizerRecord:
        """The optimizer record, created from ``initial_values`` or checked against the loaded checkpoint."""
        assert self.device is not None
        record = self.optimizer
        if record is None:
            record = OptimizerRecord()
            for name in trainable:
                tensor = self.tensors[name]
                moments = [StateTensor(np.full(tensor.shape, v, tensor.dtype)) for v in initial_values]
                for moment in moments:
                    moment.place(self.device)
                record.moments[name] = moments
            self.optimizer = record
            return record
        if not initial_values and _unread_sgd_moments(record, trainable):
            record.moments = {name: [] for name in trainable}
        for name in trainable:
            if name not in record.moments:  # made trainable since the moments were saved (set_requires_grad)
                tensor = self.tensors[name]
                record.moments[name] = [StateTensor(np.full(tensor.shape, v, tensor.dtype)) for v in initial_values]
                for moment in record.moments[name]:
                    moment.place(self.device)
            moments = record.moments[name]
            if len(moments) != len(initial_values):
                raise ValueError(
                    f"the checkpoint's optimizer state has {len(moments)} moment(s) for {name!r}, but the optimizer "
                    f"model keeps {len(initial_values)} per parameter: it was saved with another optimizer or other "
                    "artifacts; load a checkpoint of these artifacts, or one without optimizer state"
                )
            tensor = self.tensors[name]
            for i, moment in enumerate(moments):
                if moment.dtype != tensor.dtype:
                    raise ValueError(
                        f"the checkpoint's momentum{i} of {name!r} is {moment.dtype}, but the parameter is "
                        f"{tensor.dtype}: it was saved for other artifacts"
                    )
        return record


def _unread_sgd_moments(record: OptimizerRecord, trainable: Sequence[str]) -> bool:
    """Whether ``record`` holds ONNX Runtime's SGD state: one zero ``momentum0`` per trainable parameter.

    ONNX Runtime's SGD passes a ``first_order_moments`` sequence that
    ``SGDOptimizerV2`` never reads; an optimizer that keeps no state resumes
    such a checkpoint (its step count) without them.
    """
    moments = [record.moments.get(name, []) for name in trainable]
    return all(len(m) == 1 for m in moments) and not any(m[0].numpy().any() for m in moments)


__all__ = [
    "LOAD_ALL_PARAMETER_STATES",
    "LOAD_MODEL_PARAMETERS",
    "LOAD_PARAMETER_STATES",
    "GradientStatus",
    "NominalStateError",
    "OptimizerRecord",
    "RecordedUpdate",
    "StateStore",
    "StateTensor",
]
