"""The runtime's training state: parameters, gradients, optimizer state and properties, on a device.

:class:`TrainingState` is ONNX Runtime's ``onnxruntime.training.api.CheckpointState``
(``onnxtrain.api.CheckpointState`` is this class): the one mutable object a
``Module`` and its ``Optimizer`` share. It is made from the immutable
:class:`onnxtrain.checkpoint.CheckpointState` (what a checkpoint file holds)
and turned back into one to be saved. Its tensors stay NumPy arrays until a
``Module`` places them on its device; from then on each is an
``onnxruntime.OrtValue`` in the device's memory. Optimizer steps update the
parameters and moments in place. Where a failed train step must leave a value
as it was (accumulated gradients, running statistics), the step writes into a
spare of the same type and shape, and the two are swapped once it succeeds.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import onnxruntime as ort

from onnxtrain import checkpoint as ckpt
from onnxtrain.checkpoint.state import DEFAULT_LEARNING_RATE, check_nominal_allocation, placeholder
from onnxtrain.training import values
from onnxtrain.training.device import Device
from onnxtrain.training.interface import ParameterInfo

if TYPE_CHECKING:
    from onnxtrain.training.optimizer import Optimizer

GradientStatus = Literal["none", "ready", "reset"]

#: The property a checkpoint saved without its optimizer state after optimizer steps holds: that step count.
#: An ``Optimizer`` made on such a checkpoint warns that its moments restart (``OptimizerStateWarning``).
OPTIMIZER_STATE_DROPPED = "onnxtrain.optimizer_state_dropped_at_step"

#: ONNX Runtime's sentences for a nominal state used before its parameters hold values (its messages start so).
LOAD_PARAMETER_STATES = "Please load the parameter states first"
LOAD_ALL_PARAMETER_STATES = "Please load all the parameter states first"
LOAD_MODEL_PARAMETERS = "Please load the model parameters first."


class NominalStateError(RuntimeError, ValueError):
    """A parameter of a nominal checkpoint state is used before it holds a value.

    A ``RuntimeError``, as ONNX Runtime raises, and a ``ValueError``, as
    onnxtrain's runtime raised before; the message starts with ONNX Runtime's.
    """


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


class Parameter:
    """A parameter of the state: ``name``, ``data`` (a NumPy copy; assignable), ``grad``, ``requires_grad``."""

    def __init__(self, state: TrainingState, name: str) -> None:
        self._state = state
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    @property
    def data(self) -> np.ndarray:
        """A copy of the current value; ``NominalStateError`` while a nominal state's parameter holds none."""
        tensor = self._state._tensor(self._name)
        self._state._check_gettable(self._name)
        self._state._settle()
        return tensor.numpy()

    @data.setter
    def data(self, value: np.ndarray) -> None:
        """Write ``value`` (same dtype and shape); a nominal state's parameter then holds it."""
        self._state._set_parameter(self._name, value)

    @property
    def grad(self) -> np.ndarray | None:
        """The accumulated gradient (a copy); ``None`` for frozen parameters and before a ``Module`` uses the state.

        As in ONNX Runtime, it is zero (the value the next train step starts
        from) once a ``Module`` holds the state, until its first train step,
        and after ``lazy_reset_grad()`` until the next one.
        ``NominalStateError`` while a nominal state's parameter holds no value.
        """
        self._state._check_gettable(self._name)
        return self._state._gradient(self._name)

    @property
    def requires_grad(self) -> bool:
        return self._state._requires_grad[self._name]

    @property
    def shape(self) -> tuple[int, ...]:
        return self._state._tensor(self._name).shape

    @property
    def dtype(self) -> np.dtype:
        return self._state._tensor(self._name).dtype

    def __repr__(self) -> str:
        return f"Parameter(name={self._name}, requires_grad={self.requires_grad})"


class Parameters:
    """``state.parameters``: ``[name]`` gives a :class:`Parameter`, ``[name] = array`` writes its value."""

    def __init__(self, state: TrainingState) -> None:
        self._state = state

    def __getitem__(self, name: str) -> Parameter:
        """The parameter (``KeyError`` naming the parameters for an unknown name).

        Of a nominal state, ``NominalStateError`` (ONNX Runtime's "Please load
        the parameter states first") until the parameter holds a value, as in
        ONNX Runtime; ``names()`` and ``repr(state)`` show it meanwhile.
        """
        self._state._tensor(name)  # KeyError naming the parameters
        self._state._check_gettable(name)
        return Parameter(self._state, name)

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        self._state._set_parameter(name, value)

    def __contains__(self, name: object) -> bool:
        return name in self._state._tensors

    def __iter__(self) -> Iterator[tuple[str, Parameter]]:
        """``(name, Parameter)`` pairs, as ONNX Runtime's ``Parameters`` yields them (``NominalStateError`` at a
        parameter of a nominal state that holds no value yet; ``names()`` lists them all)."""
        for name in list(self._state._tensors):
            yield name, self[name]

    def __len__(self) -> int:
        return len(self._state._tensors)

    def names(self) -> list[str]:
        """The parameter names: trainable ones first, in checkpoint order."""
        return list(self._state._tensors)

    def __repr__(self) -> str:
        return f"Parameters({[Parameter(self._state, name) for name in self._state._tensors]})"


class Properties:
    """``state.properties``: user properties of type int (int64), float (float32) or str."""

    def __init__(self, state: TrainingState) -> None:
        self._state = state

    def __getitem__(self, name: str) -> ckpt.PropertyValue:
        try:
            return self._state._properties[name]
        except KeyError:
            raise KeyError(f"no property {name!r}; the state has {sorted(self._state._properties)}") from None

    def __setitem__(self, name: str, value: ckpt.PropertyValue) -> None:
        # the checkpoint's own validation: int64 range, float32 rounding, no bools
        checked = ckpt.CheckpointState(properties={name: value}).properties[name]
        self._state._properties[name] = checked

    def __contains__(self, name: object) -> bool:
        return name in self._state._properties

    def __iter__(self) -> Iterator[tuple[str, ckpt.PropertyValue]]:
        """``(name, value)`` pairs, as ONNX Runtime's ``Properties`` yields them."""
        yield from list(self._state._properties.items())

    def __len__(self) -> int:
        return len(self._state._properties)

    def __repr__(self) -> str:
        return f"Properties({dict(self._state._properties)!r})"


class TrainingState:
    """The state a ``Module`` and an ``Optimizer`` share (ORT's ``CheckpointState``); see the module docstring."""

    def __init__(self, state: ckpt.CheckpointState) -> None:
        if not isinstance(state, ckpt.CheckpointState):
            raise TypeError(
                f"TrainingState takes an onnxtrain.checkpoint.CheckpointState, not {type(state).__name__}; "
                "use TrainingState.load_checkpoint(path) to read a file"
            )
        self._tensors: dict[str, StateTensor] = {}
        self._requires_grad: dict[str, bool] = {}
        for group, trainable in ((state.trainable, True), (state.frozen, False)):
            for name, array in group.items():
                self._tensors[name] = StateTensor(array)  # nominal: a placeholder, allocated once needed
                self._requires_grad[name] = trainable
        self._unloaded: set[str] = set(self._tensors) if state.is_nominal else set()
        self._grads: dict[str, StateTensor] = {}
        self._grad_status: GradientStatus = "none"
        # the optimizer whose last step is recorded and not applied yet (onnxtrain.training.fused)
        self._pending: Optimizer | None = None
        self._properties: dict[str, ckpt.PropertyValue] = dict(state.properties)
        self._loaded_properties = frozenset(state.properties)  # what the checkpoint held, not what was set since
        self._device: Device | None = None
        self._optimizer: OptimizerRecord | None = None
        if state.optimizer is not None:
            self._optimizer = OptimizerRecord(
                step=state.optimizer.step,
                initial_learning_rate=state.optimizer.initial_learning_rate,
                learning_rate=state.optimizer.initial_learning_rate,
                moments={name: [StateTensor(m) for m in moments] for name, moments in state.optimizer.moments.items()},
            )

    # ----------------------------------------------------------- ORT's API

    @classmethod
    def load_checkpoint(cls, checkpoint_uri: str | os.PathLike[str]) -> TrainingState:
        """Read a checkpoint file (ORT's on-device format): parameters, optimizer state if any, properties."""
        return cls(ckpt.load(checkpoint_uri))

    @classmethod
    def save_checkpoint(
        cls, state: TrainingState, checkpoint_uri: str | os.PathLike[str], include_optimizer_state: bool = False
    ) -> None:
        """Write ``state`` atomically; with ``include_optimizer_state`` also the step and moments (if any)."""
        if not isinstance(state, TrainingState):
            raise TypeError(f"save_checkpoint takes a CheckpointState, not {type(state).__name__}")
        ckpt.save(state.to_checkpoint(include_optimizer_state), checkpoint_uri)

    @property
    def parameters(self) -> Parameters:
        return Parameters(self)

    @property
    def properties(self) -> Properties:
        return Properties(self)

    def __getitem__(self, name: str) -> Parameter | ckpt.PropertyValue:
        """ORT's older spelling: a parameter, else a property, by name."""
        if name in self._tensors:
            return self.parameters[name]
        return self.properties[name]

    def __setitem__(self, name: str, value: Any) -> None:
        if name in self._tensors:
            self._set_parameter(name, value)
        else:
            self.properties[name] = value

    def __contains__(self, name: object) -> bool:
        return name in self._tensors or name in self._properties

    # ----------------------------------------------------------- snapshots

    @property
    def is_nominal(self) -> bool:
        """Whether some parameters still hold no values (a nominal checkpoint not yet filled)."""
        return bool(self._unloaded)

    @property
    def step(self) -> int:
        """Optimizer steps taken (0 without optimizer state)."""
        return 0 if self._optimizer is None else self._optimizer.step

    def to_checkpoint(self, include_optimizer_state: bool = True) -> ckpt.CheckpointState:
        """An immutable snapshot (copies) of the parameters, the optimizer state (optional) and properties.

        Without the optimizer state, after optimizer steps, the properties
        also record the step count as ``OPTIMIZER_STATE_DROPPED``, so that an
        optimizer resuming from the snapshot can warn that its moments restart;
        with it, that property is left out.
        """
        if self._unloaded and len(self._unloaded) != len(self._tensors):
            raise NominalStateError(
                f"Cannot save a partly loaded nominal state. {LOAD_ALL_PARAMETER_STATES}: parameters "
                f"{sorted(self._unloaded)} hold no values yet; load them (module.copy_buffer_to_parameters(buffer, "
                "trainable_only=False), or state.parameters[name] = array) before saving"
            )
        nominal = bool(self._unloaded)
        self._settle()
        copy = StateTensor.placeholder if nominal else StateTensor.numpy
        trainable = {n: copy(t) for n, t in self._tensors.items() if self._requires_grad[n]}
        frozen = {n: copy(t) for n, t in self._tensors.items() if not self._requires_grad[n]}
        optimizer = None
        properties = dict(self._properties)
        if include_optimizer_state and self._optimizer is not None and not nominal:
            record = self._optimizer
            optimizer = ckpt.OptimizerState(
                moments={n: [m.numpy() for m in ms] for n, ms in record.moments.items()},
                step=record.step,
                initial_learning_rate=record.initial_learning_rate,
            )
            properties.pop(OPTIMIZER_STATE_DROPPED, None)
        elif self.step > 0:
            properties[OPTIMIZER_STATE_DROPPED] = self.step
        return ckpt.CheckpointState(trainable, frozen, optimizer, properties, is_nominal=nominal)

    def __repr__(self) -> str:
        params = {n: values.describe(t.dtype, t.shape) for n, t in self._tensors.items()}
        return (
            f"CheckpointState(parameters={params}, step={self.step}, properties={self._properties!r}, "
            f"device={str(self._device) if self._device else 'host'})"
        )

    # ---------------------------------------------- used by Module/Optimizer

    def _tensor(self, name: str) -> StateTensor:
        try:
            return self._tensors[name]
        except KeyError:
            raise KeyError(f"no parameter {name!r}; the state has {list(self._tensors)}") from None

    def _settle(self) -> None:
        """Apply the optimizer step that was recorded and not applied yet, if any (onnxtrain.training.fused)."""
        if self._pending is not None:
            self._pending._apply()
            self._pending = None

    def _set_parameter(self, name: str, value: Any) -> None:
        """Write ``value`` into parameter ``name``; a nominal state's parameter that holds no value gets it.

        (ONNX Runtime refuses any write to a nominal state; here only a value of
        another dtype or shape is refused, with ONNX Runtime's sentence.)
        """
        tensor = self._tensor(name)
        if isinstance(value, ort.OrtValue):
            value = values.to_numpy(value)
        if name in self._unloaded:
            array = np.asarray(value)
            if array.dtype.newbyteorder("=") != tensor.dtype or array.shape != tensor.shape:
                raise NominalStateError(
                    f"Cannot copy parameter to a nominal state. {LOAD_ALL_PARAMETER_STATES}, or assign to {name!r} "
                    f"an array of its dtype and shape: it is {values.describe(tensor.dtype, tensor.shape)}; got "
                    f"{values.describe(array.dtype, array.shape)}"
                )
        self._settle()
        tensor.write(value, f"parameter {name!r}")
        self._unloaded.discard(name)

    def _gradient(self, name: str) -> np.ndarray | None:
        self._tensor(name)
        grad = self._grads.get(name)
        if grad is None:
            return None
        if self._grad_status != "ready":  # none computed yet, or reset: what the next step starts from
            return np.zeros(grad.shape, grad.dtype)
        return grad.numpy()

    def _infos(self) -> dict[str, ParameterInfo]:
        return {n: ParameterInfo(self._requires_grad[n], t.dtype, t.shape) for n, t in self._tensors.items()}

    def _check_gettable(self, name: str) -> None:
        """``NominalStateError`` (ONNX Runtime's sentence) when parameter ``name`` holds no value yet."""
        if name in self._unloaded:
            raise NominalStateError(
                f"Cannot get parameter from a nominal state. {LOAD_PARAMETER_STATES}: {name!r} holds no value yet; "
                f"load the parameters with module.copy_buffer_to_parameters(buffer, trainable_only=False), or "
                f"assign this one with state.parameters[{name!r}] = array"
            )

    def _check_loaded(self, names: Iterable[str], sentence: str) -> None:
        """``NominalStateError`` when some of the parameters ``names`` hold no value yet (a nominal state).

        The message starts with ``sentence`` (ONNX Runtime's, for the call that
        needs them) and ONNX Runtime's "Please load the model parameters first.",
        and names the parameters that hold no value.
        """
        if not self._unloaded:
            return
        missing = [name for name in names if name in self._unloaded]
        if missing:
            raise NominalStateError(
                f"{sentence} {LOAD_MODEL_PARAMETERS} Parameters {sorted(missing)} of this nominal checkpoint state "
                "hold no values yet: load them with module.copy_buffer_to_parameters(buffer, trainable_only=False) "
                "(the buffer from get_contiguous_parameters() of a module over the full checkpoint), or assign "
                "each with state.parameters[name] = array"
            )

    def _check_nominal(self, names: Iterable[str], what: str) -> None:
        """``CheckpointError`` if allocating the nominal parameters among ``names`` that hold no value yet
        (placeholders) would pass ``MAX_NOMINAL_BYTES`` (``onnxtrain.checkpoint.state``)."""
        if self._unloaded:
            tensors = ((n, self._tensors[n]) for n in names if n in self._unloaded)
            check_nominal_allocation(((n, t.dtype, t.shape) for n, t in tensors if t.value is None), what)

    def _place(self, device: Device) -> None:
        """Put every tensor on ``device``; a state in use on another device cannot move."""
        if self._device is not None and self._device != device:
            raise ValueError(
                f"this CheckpointState is already in use on {self._device}; a module on {device} needs its own "
                "state: load the checkpoint again"
            )
        self._check_nominal(self._tensors, f"placing the state on {device}")
        for tensor in self._tensors.values():
            tensor.place(device)
        if self._optimizer is not None:
            for moments in self._optimizer.moments.values():
                for moment in moments:
                    moment.place(device)
        self._device = device

    def _ensure_gradients(self, names: Sequence[str]) -> None:
        """Gradient buffers (zeros) for ``names`` on the state's device."""
        assert self._device is not None
        for name in names:
            if name not in self._grads:
                tensor = self._tensors[name]
                grad = StateTensor(np.zeros(tensor.shape, tensor.dtype))
                grad.place(self._device)
                self._grads[name] = grad

    def _ensure_optimizer(self, trainable: Sequence[str], initial_values: Sequence[float]) -> OptimizerRecord:
        """The optimizer record, created from ``initial_values`` or checked against the loaded checkpoint."""
        assert self._device is not None
        record = self._optimizer
        if record is None:
            record = OptimizerRecord()
            for name in trainable:
                tensor = self._tensors[name]
                moments = [StateTensor(np.full(tensor.shape, v, tensor.dtype)) for v in initial_values]
                for moment in moments:
                    moment.place(self._device)
                record.moments[name] = moments
            self._optimizer = record
            return record
        if not initial_values and _unread_sgd_moments(record, trainable):
            record.moments = {name: [] for name in trainable}
        for name in trainable:
            moments = record.moments.get(name, [])
            if len(moments) != len(initial_values):
                raise ValueError(
                    f"the checkpoint's optimizer state has {len(moments)} moment(s) for {name!r}, but the optimizer "
                    f"model keeps {len(initial_values)} per parameter: it was saved with another optimizer or other "
                    "artifacts; load a checkpoint of these artifacts, or one without optimizer state"
                )
            tensor = self._tensors[name]
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
    "OPTIMIZER_STATE_DROPPED",
    "NominalStateError",
    "OptimizerRecord",
    "Parameter",
    "Parameters",
    "Properties",
    "StateTensor",
    "TrainingState",
]
