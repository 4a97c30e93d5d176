"""The training state (ONNX Runtime's ``CheckpointState``): parameters, optimizer state and properties.

:class:`TrainingState` is ONNX Runtime's ``onnxruntime.training.api.CheckpointState``
(``onnxtrain.api.CheckpointState`` is this class): the one mutable object a
``Module`` and its ``Optimizer`` share. It is made from the immutable
:class:`onnxtrain.checkpoint.CheckpointState` (what a checkpoint file holds)
and turned back into one to be saved. The tensors, gradients, moments and the
recorded update live in its :attr:`TrainingState.store`
(:class:`~onnxtrain.training.store.StateStore`), which the runtime reads and
writes; this module is the user's view of it: parameters by name, properties,
snapshots, checkpoint files.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from onnxtrain import checkpoint as ckpt
from onnxtrain.training import values
from onnxtrain.training.store import (
    LOAD_ALL_PARAMETER_STATES,
    LOAD_MODEL_PARAMETERS,
    LOAD_PARAMETER_STATES,
    NominalStateError,
    StateStore,
    StateTensor,
)

#: The property a checkpoint saved without its optimizer state after optimizer steps holds: that step count.
#: An ``Optimizer`` made on such a checkpoint warns that its moments restart (``OptimizerStateWarning``).
OPTIMIZER_STATE_DROPPED = "onnxtrain.optimizer_state_dropped_at_step"


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
        tensor = self._state.store.tensor(self._name)
        self._state.store.check_gettable(self._name)
        self._state.store.settle()
        return tensor.numpy()

    @data.setter
    def data(self, value: np.ndarray) -> None:
        """Write ``value`` (same dtype and shape); a nominal state's parameter then holds it."""
        self._state.store.set_parameter(self._name, value)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """``numpy.asarray(parameter)``: its value (a copy), as ``data`` gives it."""
        return np.asarray(self.data, dtype=dtype)

    @property
    def grad(self) -> np.ndarray | None:
        """The accumulated gradient (a copy); ``None`` for frozen parameters and before a ``Module`` uses the state.

        As in ONNX Runtime, it is zero (the value the next train step starts
        from) once a ``Module`` holds the state, until its first train step,
        and after ``lazy_reset_grad()`` until the next one.
        ``NominalStateError`` while a nominal state's parameter holds no value.
        """
        self._state.store.check_gettable(self._name)
        return self._state.store.gradient(self._name)

    @property
    def requires_grad(self) -> bool:
        """Whether it trains. Assignable while no live ``Module`` holds the state (before one is made, or once
        every module over it is gone: ``del module, optimizer``), to continue with artifacts that train other
        parameters (frozen: its optimizer moments are dropped; made trainable: it starts from the optimizer's
        initial moments; the gradients restart, as a loaded checkpoint's)."""
        return self._state.store.requires_grad[self._name]

    @requires_grad.setter
    def requires_grad(self, trainable: bool) -> None:
        self._state.store.set_requires_grad(self._name, trainable)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._state.store.tensor(self._name).shape

    @property
    def dtype(self) -> np.dtype:
        return self._state.store.tensor(self._name).dtype

    def __repr__(self) -> str:
        """ONNX Runtime's ``Parameter(name=..., requires_grad=...)``, then the shape and dtype (no tensor read)."""
        tensor = self._state.store.tensor(self._name)
        return (
            f"Parameter(name={self._name}, requires_grad={self.requires_grad}, shape={tensor.shape}, "
            f"dtype={tensor.dtype})"
        )


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
        self._state.store.tensor(name)  # KeyError naming the parameters
        self._state.store.check_gettable(name)
        return Parameter(self._state, name)

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        self._state.store.set_parameter(name, value)

    def __contains__(self, name: object) -> bool:
        return name in self._state.store.tensors

    def __iter__(self) -> Iterator[tuple[str, Parameter]]:
        """``(name, Parameter)`` pairs, as ONNX Runtime's ``Parameters`` yields them (``NominalStateError`` at a
        parameter of a nominal state that holds no value yet; ``names()`` lists them all)."""
        for name in list(self._state.store.tensors):
            yield name, self[name]

    def __len__(self) -> int:
        return len(self._state.store.tensors)

    def names(self) -> list[str]:
        """The parameter names: trainable ones first, in checkpoint order (the contiguous buffers follow the
        training model's order instead: ``module.get_contiguous_parameters_layout()``)."""
        return list(self._state.store.tensors)

    def __repr__(self) -> str:
        return f"Parameters({[Parameter(self._state, name) for name in self._state.store.tensors]})"


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
        #: The runtime's tensors, gradients, optimizer record and recorded update (onnxtrain.training.store).
        self.store = StateStore(state)
        self._properties: dict[str, ckpt.PropertyValue] = dict(state.properties)
        #: The names of the properties the checkpoint held (not those set since).
        self.loaded_properties = frozenset(state.properties)
        #: The file it was read from (``load_checkpoint``), for errors; ``None`` for a state made in memory.
        self.source: str | None = None

    # ----------------------------------------------------------- ORT's API

    @classmethod
    def load_checkpoint(cls, checkpoint_uri: str | os.PathLike[str]) -> TrainingState:
        """Read a checkpoint file (ORT's on-device format): parameters, optimizer state if any, properties."""
        state = cls(ckpt.load(checkpoint_uri))
        state.source = os.fspath(checkpoint_uri)
        return state

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
        if name in self.store.tensors:
            return self.parameters[name]
        return self.properties[name]

    def __setitem__(self, name: str, value: Any) -> None:
        if name in self.store.tensors:
            self.store.set_parameter(name, value)
        else:
            self.properties[name] = value

    def __contains__(self, name: object) -> bool:
        return name in self.store.tensors or name in self._properties

    # ----------------------------------------------------------- snapshots

    @property
    def is_nominal(self) -> bool:
        """Whether some parameters still hold no values (a nominal checkpoint not yet filled)."""
        return bool(self.store.unloaded)

    @property
    def step(self) -> int:
        """Optimizer steps taken (0 without optimizer state)."""
        return self.store.step

    def to_checkpoint(self, include_optimizer_state: bool = True) -> ckpt.CheckpointState:
        """An immutable snapshot (copies) of the parameters, the optimizer state (optional) and properties.

        Without the optimizer state, after optimizer steps, the properties
        also record the step count as ``OPTIMIZER_STATE_DROPPED``, so that an
        optimizer resuming from the snapshot can warn that its moments restart;
        with it, that property is left out.
        """
        if self.store.unloaded and len(self.store.unloaded) != len(self.store.tensors):
            raise NominalStateError(
                f"Cannot save a partly loaded nominal state. {LOAD_ALL_PARAMETER_STATES}: parameters "
                f"{sorted(self.store.unloaded)} hold no values yet; load them "
                "(module.copy_buffer_to_parameters(buffer, trainable_only=False), or state.parameters[name] = array) "
                "before saving"
            )
        nominal = bool(self.store.unloaded)
        self.store.settle()
        copy = StateTensor.placeholder if nominal else StateTensor.numpy
        trainable = {n: copy(t) for n, t in self.store.tensors.items() if self.store.requires_grad[n]}
        frozen = {n: copy(t) for n, t in self.store.tensors.items() if not self.store.requires_grad[n]}
        optimizer = None
        properties = dict(self._properties)
        if include_optimizer_state and self.store.optimizer is not None and not nominal:
            record = self.store.optimizer
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
        params = {n: values.describe(t.dtype, t.shape) for n, t in self.store.tensors.items()}
        return (
            f"CheckpointState(parameters={params}, step={self.step}, properties={self._properties!r}, "
            f"device={str(self.store.device) if self.store.device else 'host'})"
        )


__all__ = [
    "LOAD_ALL_PARAMETER_STATES",
    "LOAD_MODEL_PARAMETERS",
    "LOAD_PARAMETER_STATES",
    "OPTIMIZER_STATE_DROPPED",
    "NominalStateError",
    "Parameter",
    "Parameters",
    "Properties",
    "StateTensor",
    "TrainingState",
]
