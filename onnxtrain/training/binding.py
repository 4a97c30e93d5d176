"""One onnxruntime session with one ``IOBinding``, reused for every run.

Parameters, gradient buffers and optimizer state are bound as the OrtValues
the state keeps on the device; outputs that replace them are bound to the
same buffers (in place) or to spares (docs/runtime.md, "How a step runs"), so
a step copies nothing but the user inputs in and the user outputs (the loss)
out.

onnxruntime's Python wrappers of ``IOBinding`` and ``run_with_iobinding``
validate every call for WebGPU graph capture; with ``run_options`` that check
alone costs about 25 microseconds per run, which is more than a whole small
training step. Where the wrapped native objects are there (``_iobinding``,
``_sess``, ``_ortvalue``; every onnxruntime since 1.8), the binding talks to
them directly; otherwise it goes through the public wrappers.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np
import onnxruntime as ort

from onnxtrain.graph.passes.recompute import transformers_to_disable
from onnxtrain.sessions import inference_session
from onnxtrain.training import half_kernels, values
from onnxtrain.training.constants import SharedConstants
from onnxtrain.training.device import Device, ProviderSpec
from onnxtrain.training.models import LoadedModel


class _PublicBinding:
    """Bindings through onnxruntime's public Python API."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self._session = session
        self._binding = session.io_binding()

    def bind_ortvalue_input(self, name: str, value: ort.OrtValue) -> None:
        self._binding.bind_ortvalue_input(name, value)

    def bind_cpu_input(self, name: str, array: np.ndarray) -> None:
        self._binding.bind_cpu_input(name, array)

    def bind_ortvalue_output(self, name: str, value: ort.OrtValue) -> None:
        self._binding.bind_ortvalue_output(name, value)

    def bind_output(self, name: str, device: Device) -> None:
        self._binding.bind_output(name, device.type, device.id)

    def bind_input_view(self, name: str, value: ort.OrtValue, shape: Shape, device: Device) -> None:
        self._binding.bind_input(name, device.type, device.id, value.element_type(), list(shape), value.data_ptr())

    def bind_output_view(self, name: str, value: ort.OrtValue, shape: Shape, device: Device) -> None:
        self._binding.bind_output(name, device.type, device.id, value.element_type(), list(shape), value.data_ptr())

    def run(self, options: ort.RunOptions) -> None:
        self._session.run_with_iobinding(self._binding, options)

    def outputs(self, count: int) -> list[ort.OrtValue]:
        return self._binding.get_outputs()[:count]


class _NativeBinding:
    """The same, through the native objects the public wrappers hold (no per-call validation)."""

    def __init__(self, session: ort.InferenceSession) -> None:
        wrapper = session.io_binding()
        self._native_session = session._sess
        self._binding = wrapper._iobinding
        self._devices: dict[Device, Any] = {}
        self._arrays: dict[str, np.ndarray] = {}  # bound host arrays must outlive the binding

    @staticmethod
    def supported(session: ort.InferenceSession) -> bool:
        try:
            wrapper = session.io_binding()
            probe = ort.OrtValue.ortvalue_from_numpy(np.zeros(1, np.float32))
            return (
                hasattr(session, "_sess")
                and hasattr(session._sess, "run_with_iobinding")
                and hasattr(wrapper, "_iobinding")
                and hasattr(probe, "_ortvalue")
                and hasattr(ort.OrtDevice, "make")
            )
        except Exception:  # any surprise: use the public API
            return False

    def bind_ortvalue_input(self, name: str, value: ort.OrtValue) -> None:
        self._binding.bind_ortvalue_input(name, value._ortvalue)

    def bind_cpu_input(self, name: str, array: np.ndarray) -> None:
        self._arrays[name] = array
        self._binding.bind_input(name, array)

    def bind_ortvalue_output(self, name: str, value: ort.OrtValue) -> None:
        self._binding.bind_ortvalue_output(name, value._ortvalue)

    def bind_output(self, name: str, device: Device) -> None:
        self._binding.bind_output(name, self._device(device))

    def bind_input_view(self, name: str, value: ort.OrtValue, shape: Shape, device: Device) -> None:
        self._binding.bind_input(name, self._device(device), value.element_type(), list(shape), value.data_ptr())

    def bind_output_view(self, name: str, value: ort.OrtValue, shape: Shape, device: Device) -> None:
        self._binding.bind_output(name, self._device(device), value.element_type(), list(shape), value.data_ptr())

    def _device(self, device: Device) -> Any:
        """onnxruntime's native object for ``device``."""
        native = self._devices.get(device)
        if native is None:
            native = self._devices[device] = ort.OrtDevice.make(device.type, device.id)._get_c_device()
        return native

    def run(self, options: ort.RunOptions) -> None:
        self._native_session.run_with_iobinding(self._binding, options)

    def outputs(self, count: int) -> list[ort.OrtValue]:
        if not count:
            return []
        vector = self._binding.get_outputs()
        return [ort.OrtValue(vector[i]) for i in range(count)]


_MAX_LAYOUTS = 8

#: A tensor's dimensions.
Shape = tuple[int, ...]


class _View:
    """An OrtValue's buffer bound with another shape (what is bound, for :class:`_Layout`)."""

    __slots__ = ("shape", "value")

    def __init__(self, value: ort.OrtValue, shape: Shape) -> None:
        self.value = value
        self.shape = shape

    def views(self, value: ort.OrtValue, shape: Shape) -> bool:
        return self.value is value and self.shape == shape


class _Layout:
    """One IOBinding and what is bound to it."""

    __slots__ = ("held", "inputs", "io", "outputs", "settled")

    def __init__(self, io: _NativeBinding | _PublicBinding) -> None:
        self.io = io
        self.inputs: dict[str, ort.OrtValue | _View] = {}
        self.outputs: dict[str, ort.OrtValue | _View] = {}
        self.held: dict[str, ort.OrtValue] = {}
        self.settled = False


# the operator domains whose kernels stock onnxruntime registers itself
_BUILTIN_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training", "com.microsoft"})


#: ``com.microsoft`` operators only onnxruntime's training build has: its optimizers and gradient accumulation
#: (its gradient kernels are the others, named ``...Grad``).
_TRAINING_BUILD_OPS = frozenset(
    {"InPlaceAccumulatorV2", "InPlaceAccumulator", "AdamWOptimizer", "AdamOptimizer", "SGDOptimizerV2"}
    | {"SGDOptimizer", "LambOptimizer", "ZeroGradient", "PassThrough", "YieldOp"}
)


def _custom_op_hint(model: LoadedModel) -> str:
    """What to do when ``model`` uses operators onnxruntime has no kernels for: onnxruntime-training's own (its
    artifacts, to generate again), or operator domains of a custom op library."""
    training_build = sorted(
        {
            node.op_type
            for node in model.proto.graph.node
            if node.domain == "com.microsoft" and (node.op_type.endswith("Grad") or node.op_type in _TRAINING_BUILD_OPS)
        }
    )
    if training_build:
        return (
            f". The model uses operators of ONNX Runtime's training build (com.microsoft {training_build[:4]}), which "
            "stock onnxruntime has no kernels for: these are artifacts onnxruntime.training.artifacts wrote. "
            "Generate them again from the forward model with onnxtrain.artifacts.generate_artifacts (the same "
            "arguments); its checkpoints carry over (docs/migration.md)"
        )
    used = {node.domain for node in model.proto.graph.node}
    custom = sorted(used - _BUILTIN_DOMAINS)
    if not custom:
        return ""
    return (
        f". The model uses operators of domain(s) {custom}: register the library that implements them, "
        "options = onnxruntime.SessionOptions(); options.register_custom_ops_library(path), and pass "
        "session_options=options"
    )


class RunError(RuntimeError):
    """onnxruntime failed a run of a bound session: a kernel's error (an index out of range, shapes that do not
    broadcast), as onnxruntime's message. ``run_with_iobinding`` raises it as a plain ``RuntimeError`` (its
    other entry points raise the types of ``onnxruntime.capi.onnxruntime_pybind11_state``); this type tells it
    from the runtime's own errors."""


#: How onnxruntime's message starts when ``run_with_iobinding`` fails (its C++ binding adds it to the status).
_RUN_FAILED = "Error in execution:"


def quiet_run_options() -> ort.RunOptions:
    """Options for a run that logs only fatal errors: a kernel that fails (a label check, say) raises its
    status as the exception, which the runtime turns into its own message; onnxruntime would also print it
    to standard error as an error log, before the message the user should see. No cost per run (measured)."""
    options = ort.RunOptions()
    options.log_severity_level = 4
    return options


class BoundSession:
    """An ``InferenceSession`` and its binding; ``native=False`` forces onnxruntime's public wrappers.

    ``constants``: where the stubs of shared constants in ``model`` are held
    (:mod:`onnxtrain.training.constants`); the session takes them as external
    initializers where ``own_options`` (``options`` serve this session alone)
    and the constants allow it, else as inputs, bound in every binding
    (:attr:`constants` lists those). ``half_warned``: the half-precision
    operators already warned of as run in float32 (a module's sessions share
    it, so that each is named once; :func:`~onnxtrain.training.half_kernels.open_session`).
    """

    def __init__(
        self,
        model: LoadedModel,
        what: str,
        options: ort.SessionOptions,
        providers: list[ProviderSpec],
        device: Device,
        *,
        native: bool = True,
        constants: SharedConstants | None = None,
        own_options: bool = False,
        half_warned: set[str] | None = None,
    ) -> None:
        #: The shared constants the session takes as inputs, by name (bound already: feed them to a plain run).
        self.constants: dict[str, ort.OrtValue] = {}
        if constants is not None:
            model, self.constants = constants.prepare(model, options, own_options)
        #: The operators the session computes in float32 where the model computes them in half: the provider has
        #: no half kernel for them (:func:`~onnxtrain.training.half_kernels.open_session`).
        self.widened: list[str] = []
        try:
            self.session = half_kernels.open_session(
                model,
                what,
                lambda loaded: inference_session(
                    loaded.source, options, providers, disabled_optimizers=transformers_to_disable(loaded.proto)
                ),
                self.widened,
                half_warned,
            )
        except Exception as error:  # onnxruntime raises its own exception types
            raise ValueError(f"onnxruntime cannot load the {what}: {error}{_custom_op_hint(model)}") from error
        self.what = what
        self.device = device
        self.run_options = quiet_run_options()
        self._native = native and _NativeBinding.supported(self.session)
        # one binding per layout key (see select()), each with what is bound to it now, by name: an OrtValue
        # bound again is skipped (parameters between optimizer steps; with one layout per parity of the
        # double buffers, nothing at all in a steady loop)
        self._layouts: dict[Hashable, _Layout] = {}
        self.select(None)

    def select(self, key: Hashable) -> None:
        """Use the binding kept for ``key`` (made on first use) for the next binds and run.

        The runtime passes the parities of its double buffers, so that each
        binding always sees the same OrtValues and re-binds nothing. Any key is
        correct (what is bound is tracked per binding); a good one only saves
        re-binding.
        """
        layout = self._layouts.get(key)
        if layout is None:
            if len(self._layouts) >= _MAX_LAYOUTS:  # a key that keeps changing: forget the others
                self._layouts.clear()
            io = _NativeBinding(self.session) if self._native else _PublicBinding(self.session)
            layout = self._layouts[key] = _Layout(io)
            for name, value in self.constants.items():
                io.bind_ortvalue_input(name, value)
                layout.inputs[name] = value
        self._layout = layout
        self._io = layout.io
        self._inputs = layout.inputs
        self._outputs = layout.outputs
        self._held = layout.held

    @property
    def settled(self) -> bool:
        """Whether :meth:`settle` was called on the selected binding: its state bindings are all in place."""
        return self._layout.settled

    def settle(self) -> None:
        """Mark the selected binding's state bindings complete, so that the caller may skip them from now on.

        Correct only where the key passed to :meth:`select` determines every
        state OrtValue bound (the runtime's parity keys do: a double buffer's
        two OrtValues never change, only which one is current).
        """
        self._layout.settled = True

    @property
    def native(self) -> bool:
        """Whether bindings go to onnxruntime's native objects directly."""
        return self._native

    def bind_input(self, name: str, value: np.ndarray | ort.OrtValue) -> None:
        """Bind a user input: an OrtValue as it is, a NumPy array from host memory."""
        self._inputs.pop(name, None)
        if value.__class__ is np.ndarray and not values.needs_ortvalue(value.dtype):
            self._io.bind_cpu_input(name, value)
            return
        if isinstance(value, ort.OrtValue):
            self._io.bind_ortvalue_input(name, value)
            return
        special = values.input_value(value)
        if special is not None:
            self._held[name] = special  # it views the array's memory: keep it alive while bound
            self._io.bind_ortvalue_input(name, special)
        else:
            self._io.bind_cpu_input(name, value)

    def bind_value(self, name: str, value: ort.OrtValue) -> None:
        """Bind an input to an OrtValue the runtime keeps (a parameter, a buffer, a flag)."""
        if self._inputs.get(name) is not value:
            self._io.bind_ortvalue_input(name, value)
            self._inputs[name] = value

    def bind_output_into(self, name: str, value: ort.OrtValue) -> None:
        """Let the run write output ``name`` into ``value`` (a preallocated spare)."""
        if self._outputs.get(name) is not value:
            self._io.bind_ortvalue_output(name, value)
            self._outputs[name] = value

    def bind_view(self, name: str, value: ort.OrtValue, shape: Shape, device: Device) -> None:
        """Bind an input to the buffer of ``value`` (on ``device``) seen with ``shape`` (as many elements): the
        same memory, no copy (inputs a model declares as rows, :func:`onnxtrain.artifacts.vectorize.pack_in_place`)."""
        bound = self._inputs.get(name)
        if not (bound.__class__ is _View and bound.views(value, shape)):  # type: ignore[union-attr]
            self._io.bind_input_view(name, value, shape, device)
            self._inputs[name] = _View(value, shape)

    def bind_output_view(self, name: str, value: ort.OrtValue, shape: Shape, device: Device) -> None:
        """Let the run write output ``name`` into the buffer of ``value`` (on ``device``) seen with ``shape``."""
        bound = self._outputs.get(name)
        if not (bound.__class__ is _View and bound.views(value, shape)):  # type: ignore[union-attr]
            self._io.bind_output_view(name, value, shape, device)
            self._outputs[name] = _View(value, shape)

    def bind_output(self, name: str, device: Device) -> None:
        """A fresh output on ``device`` (rebound before every run: onnxruntime would reuse the last one)."""
        self._outputs.pop(name, None)
        self._io.bind_output(name, device)

    def run(self) -> None:
        """Run the session with its bindings; a failure raises onnxruntime's error as :class:`RunError`, without
        logging it too."""
        try:
            self._io.run(self.run_options)
        except RuntimeError as error:
            if type(error) is not RuntimeError or not str(error).startswith(_RUN_FAILED):
                raise
            raise RunError(str(error)) from None  # the same message: onnxruntime's, once

    def outputs(self, count: int) -> list[ort.OrtValue]:
        """The first ``count`` bound outputs of the last run (bind those first)."""
        return self._io.outputs(count)


__all__ = ["BoundSession", "RunError", "quiet_run_options"]
