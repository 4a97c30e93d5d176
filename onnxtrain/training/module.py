"""``Module``: train and eval steps over the artifacts, with ONNX Runtime's ``training.api.Module`` names.

A train step runs the training model once with the user inputs, every
parameter, the gradient buffers and ``lazy_reset_grad``; it returns the loss
(and the additional outputs) and keeps the accumulated gradients and the
BatchNormalization running statistics on the device. As in ONNX Runtime:

- ``lazy_reset_grad`` is fed ``True`` on the first train step after the
  module is made or after :meth:`Module.lazy_reset_grad`, else ``False``, so
  successive train steps add up their gradients (gradient accumulation);
- an optimizer step reads the accumulated gradients and does not reset them:
  call ``lazy_reset_grad()`` after it, as ORT's examples do.

With an ``Optimizer`` over the module, ``optimizer.step()`` records its
update, and the next train step that starts from reset gradients runs the
fused step instead (:mod:`onnxtrain.training.fused`): the update, then the
train step, in one run and in place; the same outputs and gradients.

**The paths of a step**, and what each reads and writes of the state
(:class:`~onnxtrain.training.store.StateStore`: parameters P, running
statistics S, gradients G and their status, moments M, the recorded update
R; "spare": written into the tensor's second buffer, swapped in once the run
succeeds). Every path gives the results of the plain training model and
optimizer model run one after the other, bit for bit
(``tests/training/test_fused_step.py``, ``test_reset_step.py``,
``test_train_epoch.py``).

============ ======================================== ================= ========================= ==================
path         taken when                               runs              writes                    a failed run
============ ======================================== ================= ========================= ==================
reset        train step, G reset or none, no R of     reset session     G in place, S to spares   G stays reset; S,
             this module's optimizer (first step)     (no accumulation) status ready              P as before
accumulating train step, G ready (no lazy_reset_grad) R applied first,  G and S to spares         nothing changes
                                                      training session
fused        train step, G reset, R is this module's  fused session     P, M, G in place, S to    R applied; G
             optimizer's (the usual loop)             (update, train)   spares; R cleared         reset
recorded     ``optimizer.step()`` with a fused step   nothing           R, rate and step inputs,  (raises before:
                                                                        step count                no G ready)
settled      R set, and anything reads or writes P,   optimizer session P, M in place (spares     (onnxruntime
             M or G other than the fused step;                          where in place is unsafe) errors only)
             ``optimizer.step()`` without fused step
epoch        ``train_epoch``: full batches after R    epoch session     P, M, G, S to spares,     nothing changes
             (:mod:`onnxtrain.training.epoch`)        (Scan of fused)   swapped; then R recorded
unbound      STRING user inputs or outputs            R applied first,  G, S copied in after the  nothing changes
                                                      ``session.run``   run
============ ======================================== ================= ========================= ==================

A train step whose loss is not finite (``check_finite``) is a failed run on
every path: it is discarded as the table says.

Beyond ONNX Runtime: running statistics are carried from step to step;
parameters may be of any float dtype; ``check_finite=True`` makes a
non-finite loss raise ``FloatingPointError`` naming the step, and the step is
then discarded (gradients and statistics as before it). Bad inputs raise
before anything runs, and leave the state unchanged. Class labels out of
range raise a ``ValueError`` naming them: checked on the host before the step
where the class count is fixed (:mod:`onnxtrain.training.labels`), else by the
loss's check during the run (:mod:`onnxtrain.losses.label_check`). A model with
STRING user inputs or outputs, which onnxruntime's IOBinding cannot bind,
runs its steps with ``InferenceSession.run`` (:mod:`onnxtrain.training.unbound`),
with the same results. A nominal state's steps raise ``NominalStateError``
(ONNX Runtime's messages) until its parameters hold values.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import onnx
import onnxruntime as ort

from onnxtrain import checkpoint
from onnxtrain.artifacts.export import export_model_for_inferencing
from onnxtrain.artifacts.generate import PROTOBUF_LIMIT
from onnxtrain.artifacts.metadata import LOSS_INPUTS_KEY, LOSS_KEY, PRECISION_KEY, read_metadata
from onnxtrain.graph.saving import replacing_model
from onnxtrain.losses.label_check import label_error
from onnxtrain.training import values
from onnxtrain.training.binding import BoundSession
from onnxtrain.training.buffers import Buffer, buffers_per_dtype, copy_into_parameters, one_buffer
from onnxtrain.training.constants import SharedConstants
from onnxtrain.training.device import Device, ProviderSpec, resolve, shares_arena
from onnxtrain.training.finite import raise_if_not_finite
from onnxtrain.training.fused import FusedStep
from onnxtrain.training.gradient_scale import GradientScale
from onnxtrain.training.half_kernels import warn_of_a_half_export
from onnxtrain.training.labels import HostLabelChecks
from onnxtrain.training.lookups import HostLookupChecks
from onnxtrain.training.loss_items import LossItems
from onnxtrain.training.model_io import EvalModelIO, TrainingModelIO, eval_io, static_input_shapes, training_io
from onnxtrain.training.models import LoadedModel, ModelSource, load_model
from onnxtrain.training.options import SMALL_TENSOR, default_session_options, largest_step_input
from onnxtrain.training.random_draws import StepSeeds
from onnxtrain.training.reset import ResetStep
from onnxtrain.training.state import TrainingState
from onnxtrain.training.train_epoch import EpochOptimizer, EpochTrainer
from onnxtrain.training.unbound import UnboundTrainStep

_HOST = Device("cpu")

Outputs = np.ndarray | ort.OrtValue | tuple[np.ndarray, ...] | tuple[ort.OrtValue, ...]


class ParameterSlice(NamedTuple):
    """Where a parameter lies in a contiguous buffer (:meth:`Module.get_contiguous_parameters_layout`):
    ``buffer[offset : offset + size].reshape(shape)`` is its value, in the buffer of its ``dtype``."""

    name: str
    offset: int
    size: int
    shape: tuple[int, ...]
    dtype: str


class Module:
    """Train and eval steps for the training and eval models; see the module docstring.

    Args:
        train_model_uri: the training model (path, bytes or ModelProto).
        state: the ``CheckpointState`` (``onnxtrain.api.CheckpointState.load_checkpoint(path)``);
            its tensors move to ``device`` and stay there.
        eval_model_uri: the eval model, for eval steps and export.
        device: ``"cpu"`` (default), ``"cuda"`` or ``"cuda:<id>"``.
        session_options: an ``onnxruntime.SessionOptions`` for all sessions
            (default: all graph optimizations, default thread counts).
        providers: onnxruntime execution providers, instead of ``device``.
        check_finite: raise ``FloatingPointError`` when a train step's loss is
            NaN or infinite (one host sync per step), discarding that step.
        seed: where the training model draws at random (Dropout in training
            mode), each train step's draws are a function of it and the step
            (:mod:`onnxtrain.training.random_draws`; ``onnxruntime.set_seed`` is
            set before each step): a run resumed from a checkpoint draws what
            the uninterrupted run drew. ``None``: onnxruntime's own draws.
    """

    training: bool

    def __init__(
        self,
        train_model_uri: ModelSource,
        state: TrainingState,
        eval_model_uri: ModelSource | None = None,
        device: str | Device | None = None,
        session_options: ort.SessionOptions | None = None,
        *,
        providers: Sequence[ProviderSpec] | None = None,
        check_finite: bool = False,
        seed: int | None = None,
    ) -> None:
        if not isinstance(state, TrainingState):
            hint = (
                "; wrap a checkpoint's content with onnxtrain.api.CheckpointState(state)"
                if isinstance(state, checkpoint.CheckpointState)
                else ""
            )
            raise TypeError(
                "state must be onnxtrain.api.CheckpointState (CheckpointState.load_checkpoint(path)), not "
                f"{type(state).__module__}.{type(state).__name__}{hint}"
            )
        if session_options is not None and not isinstance(session_options, ort.SessionOptions):
            raise TypeError(
                f"session_options must be an onnxruntime.SessionOptions, not {type(session_options).__name__}"
            )
        self._device, self._providers = resolve(device, providers)
        # one arena on the device for all the sessions (training.options), unless the providers configure it
        self._shared_arena = self._device if shares_arena(self._providers) else None
        self._session_options = session_options  # the user's, for every session; else per session (open_session)
        store = state.store
        train = load_model(train_model_uri, "train_model_uri")
        store.adopt_declared_shapes(static_input_shapes(train.proto))  # ONNX Runtime's nominal checkpoints keep none
        infos = store.parameter_infos()
        try:
            self._io = training_io(train.proto, infos)
        except ValueError as error:  # the model and the checkpoint disagree: name both files
            raise ValueError(f"{error} ({_files(train_model_uri, state)})") from None
        self._eval_model: LoadedModel | None = None
        self._eval_io: EvalModelIO | None = None
        if eval_model_uri is not None:
            self._eval_model = load_model(eval_model_uri, "eval_model_uri")
            _check_same_loss(train.proto, self._eval_model.proto, train_model_uri, eval_model_uri)
            self._eval_io = eval_io(self._eval_model.proto, infos)
        # the large constants (a LoRA model's frozen base), held once for every session (training.constants)
        self._constants = SharedConstants(self._device)
        self._half_warned: set[str] = set()  # operators warned of as run in float32, once for all the sessions
        train = self._constants.share(train, "train_model_uri")
        if self._eval_model is not None:
            self._eval_model = self._constants.share(self._eval_model, "eval_model_uri")
        self._constants.release_host_copies()
        # the labels of a fixed class count, checked on the host before each step instead of in the graph, where
        # a GPU waits for the check mid-step (training.labels); the eval model keeps its own for export
        train, self._label_checks = HostLabelChecks.taken_from(train, self._io.inputs.names)
        self._eval_label_checks = HostLabelChecks()
        # ids checked against the rows of the tables they look up (training.lookups)
        self._lookup_checks = HostLookupChecks.of(train.proto, self._io.inputs.names)
        self._eval_lookup_checks = HostLookupChecks()
        eval_run = self._eval_model
        if eval_run is not None and self._eval_io is not None:
            eval_run, self._eval_label_checks = HostLabelChecks.taken_from(eval_run, self._eval_io.inputs.names)
            self._eval_lookup_checks = HostLookupChecks.of(eval_run.proto, self._eval_io.inputs.names)
        # random draws of each train step from the seed and the step (training.random_draws)
        train, self._seeds = StepSeeds.for_model(train, seed)
        self._train_model = train
        # what the loss is a mean over: the weights of gradient accumulation
        told = [train.proto] if self._eval_model is None else [train.proto, self._eval_model.proto]
        self._loss_items = LossItems.of(told, self._io.inputs.names)
        # the training model's sessions run its nodes in its order (open_session): the loss where it is written
        in_node_order = functools.partial(self.open_session, in_node_order=True)
        self._train_session = in_node_order(train, "training model")
        # STRING user inputs or outputs, which onnxruntime's IOBinding cannot bind: each step then runs the
        # training (eval) model with InferenceSession.run, without the reset and fused steps (training.unbound)
        self._unbound = self._io.strings
        self._unbound_eval = self._eval_io is not None and self._eval_io.strings
        # the steps from reset gradients, which write them in place (None: the training session runs those too)
        self._reset = None if self._unbound else ResetStep.create(train, self._io.trainable, in_node_order)
        self._eval_session = None if eval_run is None else self.open_session(eval_run, "eval model")
        # everything checked: only now does the state move
        store.place(self._device)
        store.hold(self)  # while this module lives, which parameters train is its training model's
        store.ensure_gradients(self._io.trainable)  # zeros; the gradients another module left stay as they are
        self._state = state
        self._store = store
        self.training = True
        self._check_finite = bool(check_finite)
        self._train_steps = 0
        self._fused: FusedStep | None = None  # set by the Optimizer over this module
        # (the fused step's session, parities) of the last fused step bound with preallocated outputs
        # (and whether its user inputs are bound to the staged buffers)
        self._last_fused: tuple[BoundSession, tuple[int, ...], bool] | None = None
        self._gradient_scale: GradientScale | None = None  # scale_grad's session, made on first use
        self._epoch_trainer = EpochTrainer(self)  # train_epoch, with its epoch steps per shape of batch
        self._epochs = self._epoch_trainer.steps
        self._flags = {flag: values.from_numpy(np.array([flag]), self._device) for flag in (False, True)}
        tensors, grads = store.tensors, store.gradients
        self._param_slots = [(name, tensors[name]) for name in self._io.parameters]
        self._grad_slots = [(self._io.buffers[p], self._io.gradients[p], grads[p]) for p in self._io.trainable]
        self._stat_slots = [(out, tensors[p]) for p, out in self._io.statistics.items()]
        self._unbound_step = (
            UnboundTrainStep(
                self._train_session, self._io, self._param_slots, self._grad_slots, self._stat_slots, self._flags
            )
            if self._unbound
            else None
        )
        # the user outputs (loss first), preallocated on the host where all their shapes are fixed
        specs = {spec.name: spec for spec in self._io.output_specs}
        self._host_outputs: list[ort.OrtValue] | None = None
        self._host_views: list[np.ndarray] | None = None  # NumPy views of them (no view for bfloat16)
        if not self._unbound and all(specs[name].static for name in self._io.outputs):
            self._host_outputs = [values.empty(specs[n].shape, specs[n].dtype, _HOST) for n in self._io.outputs]
            if not any(values.needs_ortvalue(specs[n].dtype) for n in self._io.outputs):
                self._host_views = [value.numpy() for value in self._host_outputs]
        self._eval_slots = [] if self._eval_io is None else [(n, tensors[n]) for n in self._eval_io.parameters]
        # one tensor of each group that swaps together (parameters, gradients, statistics): their parities
        # pick the training session's binding, so that a steady loop re-binds none of them
        self._parity_tensors = tuple(
            group[0][-1]
            for group in ([(p, tensors[p]) for p in self._io.trainable], self._grad_slots, self._stat_slots)
            if group
        )

    def open_session(
        self, model: LoadedModel, what: str, *, alone: bool = False, in_node_order: bool = False
    ) -> BoundSession:
        """A session for ``model`` (``what`` names it in errors) on this module's device, with its options.

        ``alone``: a session that runs once per step with no other between
        (the fused step's, the epoch step's), whose threads spin by default,
        in priority order. With the default options, a session whose every
        input of a step is fixed and smaller than ``SMALL_TENSOR`` elements is
        *small*: alone on the CPU, it runs on one thread (splitting so little
        work costs more than it saves: digits' MLP 64-32-10, batch 32: 31.5
        against 35.0 µs per step; 2 cores, 2026-11-25); any other session runs
        without onnxruntime's memory pattern and its planned reuse of buffers,
        each tensor's buffer going back to the arena at its last read
        (``default_session_options``).
        ``in_node_order``: run the nodes in the model's order where several are
        ready (onnxruntime's priority-based order, as ``alone``): the optimizer
        model's, whose update is emitted in the order that keeps the fewest
        full-size temporaries alive (:mod:`onnxtrain.optim.adam`), and the
        training model's, whose loss runs where the forward computes it and
        whose backward frees the forward's values as the autodiff ordered it
        (onnxruntime's default order kept GPT-2's ``[N, vocabulary]``
        log-probabilities to the end: the first step's peak at 16 x 256, 8.60
        against 6.98 GiB).
        The user's ``session_options`` serve every session as they are.
        """
        options = self._session_options
        if options is None:
            largest = largest_step_input(model.proto)
            small = largest is not None and largest < SMALL_TENSOR
            options = default_session_options(
                spinning=alone,
                update_first=alone or in_node_order,
                shared_arena=self._shared_arena,
                threads=1 if alone and small and self._device.type == "cpu" else 0,
                memory_pattern=small,
                memory_reuse=small,
            )
        own = self._session_options is None  # options made for this session alone (shared ones must not change)
        return BoundSession(
            model, what, options, self._providers, self._device, constants=self._constants, own_options=own,
            half_warned=self._half_warned,
        )  # fmt: skip

    # --------------------------------------------------------------- steps

    def __call__(self, *user_inputs: Any, **named_inputs: Any) -> Outputs:
        """A train step in training mode, an eval step in eval mode.

        Inputs are the model's user inputs, by position or by name, as NumPy
        arrays or OrtValues. Returns the outputs (the loss first) as NumPy
        arrays, or as OrtValues on the device when every input is an OrtValue;
        one output comes back alone, several as a tuple.
        """
        if self.training:
            return self._train_step(user_inputs, named_inputs)
        return self._eval_step(user_inputs, named_inputs)

    def train(self, mode: bool = True) -> Module:
        """Training mode (``mode=True``) or eval mode; returns ``self``."""
        self.training = bool(mode)
        return self

    def eval(self) -> Module:
        """Eval mode; returns ``self``."""
        return self.train(False)

    def lazy_reset_grad(self) -> None:
        """Reset the gradients to zero, lazily: the next train step overwrites the buffers instead of adding.
        The gradients are the state's: this resets them for every module over it."""
        self._store.reset_gradients()

    def scale_grad(self, factor: float) -> None:
        """Multiply the accumulated gradients by ``factor``, on the device (an onnxtrain extension).

        After ``k`` train steps on batches of equal size, each of a loss that
        is a mean over its batch, ``scale_grad(1 / k)`` makes the gradients
        those of the mean over all ``k`` batches' rows, as one batch of them
        gives (PyTorch: ``(loss / k).backward()``); batches of different sizes
        are weighted as ``train_epoch(accumulate=k)`` does. Gradients reset or not yet
        computed read as zeros and stay so. An update recorded by
        ``optimizer.step()`` is applied first, from the gradients it was
        recorded with.
        """
        if isinstance(factor, bool) or not isinstance(factor, (int, float, np.integer, np.floating)):
            raise TypeError(f"scale_grad takes a number, not {type(factor).__name__}")
        if not np.isfinite(factor):
            raise ValueError(f"scale_grad: the factor must be finite, not {factor!r}")
        store = self._store
        if store.gradient_status != "ready" or not self._grad_slots:
            return
        store.settle()
        gradients = [grad for _, _, grad in self._grad_slots]
        if self._gradient_scale is None or self._gradient_scale.gradients != tuple(gradients):
            self._gradient_scale = GradientScale.create(gradients, self.open_session)
        self._gradient_scale(float(factor))

    def count_loss_items(self, *user_inputs: Any) -> float | None:
        """What the loss is a mean over in a batch of ``user_inputs`` (in model order): the labels it counts for
        a cross-entropy or NLL of ``reduction="mean"`` (those not ``ignore_index``, by their class weights),
        ``None`` for a loss summed over its batch, else the rows (:mod:`onnxtrain.training.loss_items`).
        Gradient accumulation weighs each batch by it (not at all where ``None``)."""
        return self._loss_items.count(user_inputs)

    @property
    def _accumulate(self) -> bool:
        """Whether the next train step adds to the gradients: a train step (of any module over the state) since
        they were last reset."""
        return self._store.steps_since_reset > 0

    def _check_loaded(self, sentence: str) -> None:
        """``NominalStateError`` starting with ``sentence`` (ONNX Runtime's) while parameters of a nominal
        state hold no values; the steps need every parameter (ONNX Runtime: the whole state loaded)."""
        if self._store.unloaded:
            self._store.check_loaded(self._store.tensors, sentence)

    def _train_step(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Outputs:
        io = self._io
        feeds = io.inputs.collect(args, kwargs)
        if self._label_checks:
            self._label_checks.raise_if_out_of_range(feeds, f"train step {self._train_steps + 1}")
        if self._lookup_checks:
            self._lookup_checks.raise_if_out_of_range(feeds, f"train step {self._train_steps + 1}")
        if self._store.unloaded:
            self._check_loaded("Cannot perform TrainStep with a nominal state.")
        if self._unbound:
            return self._unbound_train_step(feeds)
        store = self._store
        # a step from reset gradients that nothing can observe any more writes the new ones in place: the fused
        # step when its optimizer recorded an update (it reads the old gradients before it writes them), else
        # the reset step; any other train step accumulates into spares, after the recorded update is applied
        in_place = not self._accumulate and store.gradient_status != "ready"
        fused = self._fused if in_place else None
        if fused is not None and store.recorded_update is not fused.update:
            fused = None
        if fused is None:
            store.settle()
        reset = self._reset if in_place and fused is None else None
        if fused is not None:
            shapes = tuple([f.shape if f.__class__ is np.ndarray else tuple(f.shape()) for f in feeds])
            session = fused.session_for(shapes)
        else:
            session = reset.session if reset is not None else self._train_session
        on_device = (
            bool(feeds) and feeds[0].__class__ is not np.ndarray and all([isinstance(f, ort.OrtValue) for f in feeds])
        )
        host_outputs = None if on_device else self._host_outputs
        self._bind_train_step(session, feeds, on_device, host_outputs, fused, reset)
        if self._seeds is not None:
            self._seeds.before_step(store.step, store.steps_since_reset)
        try:
            session.run()
        except Exception as error:  # onnxruntime's own exception types
            self.raise_if_labels_out_of_range(error, io.inputs.names, feeds, f"train step {self._train_steps + 1}")
            raise
        finally:
            if fused is not None:  # the update ran first (see onnxtrain.training.fused), even where the step failed
                store.recorded_update = None
        results = session.outputs(len(io.outputs)) if host_outputs is None else host_outputs
        step = self._train_steps + 1
        if self._check_finite and results:
            raise_if_not_finite(results[0], step, self._store.step)
        if session is self._train_session:  # the others wrote the gradients in place (see _bind_train_step)
            for _, _, grad in self._grad_slots:
                grad.swap()
        for _, tensor in self._stat_slots:
            tensor.swap()
        store.gradients_computed()
        self._train_steps = step
        if host_outputs is None:
            return _pack(results, on_device)
        # preallocated, and the next step overwrites them: copies
        views = self._host_views
        arrays = tuple([view.copy() for view in views] if views is not None else map(values.to_numpy, host_outputs))
        return arrays[0] if len(arrays) == 1 else arrays

    def _bind_train_step(
        self,
        session: BoundSession,
        feeds: Sequence[np.ndarray | ort.OrtValue],
        on_device: bool,
        host_outputs: list[ort.OrtValue] | None,
        fused: FusedStep | None,
        reset: ResetStep | None,
    ) -> None:
        """Bind one train step: the training model's run, or the fused step's or the reset step's when given.

        The user outputs first (so that they are the first bound outputs), then
        the inputs; the state (parameters, gradient buffers, moments, spares) only
        on the first use of this binding, since its OrtValues are the same for
        every step with the same buffer parities (``BoundSession.settle``).
        """
        io = self._io
        key = tuple([tensor.flips & 1 for tensor in self._parity_tensors])
        staged = None if fused is None or on_device else fused.staged_inputs(session, feeds)
        binding = (session, key, staged is not None) if fused is not None and host_outputs is not None else None
        if binding is not None and self._last_fused == binding:
            # a steady loop: this binding is the one the last fused step used and left selected, with every
            # output and the state in place; only the user inputs are new (or, staged, already copied in)
            if staged is None:
                for name, value in zip(io.inputs.names, feeds, strict=True):
                    session.bind_input(name, value)
            return
        self._last_fused = binding
        session.select(key)
        if host_outputs is None:
            device = self._device if on_device else _HOST
            for name in io.outputs:
                session.bind_output(name, device)
        else:
            for name, value in zip(io.outputs, host_outputs, strict=True):
                session.bind_output_into(name, value)
        if staged is not None:
            for name, buffer in zip(io.inputs.names, staged, strict=True):
                session.bind_value(name, buffer)
        else:
            for name, value in zip(io.inputs.names, feeds, strict=True):
                session.bind_input(name, value)
        if fused is None and reset is None:
            session.bind_value(io.flag, self._flags[not self._accumulate])
        if session.settled:
            return
        for name, tensor in self._param_slots:
            session.bind_value(name, tensor.value)
        if fused is not None:
            # in place, gradients included: the fused step starts from reset gradients, whose old values only
            # the update reads, before they are written; nothing else can observe them (a failed step leaves
            # them reset), so they need no spare
            fused.bind(session)
        elif reset is not None:  # the same: a failed step leaves them reset, or absent
            reset.bind(self._store.gradients)
        else:
            for buffer, out, grad in self._grad_slots:
                session.bind_value(buffer, grad.value)
                session.bind_output_into(out, grad.spare())
        for out, tensor in self._stat_slots:
            session.bind_output_into(out, tensor.spare())
        session.settle()

    def _unbound_train_step(self, feeds: Sequence[np.ndarray | ort.OrtValue]) -> Outputs:
        """A train step without IOBinding (:mod:`onnxtrain.training.unbound`), for models with STRING user
        inputs or outputs; any recorded update is applied first (by the optimizer model alone, as before any
        train step that is not fused). Kept once the run succeeds (and the loss is finite, with
        ``check_finite``)."""
        unbound, store = self._unbound_step, self._store
        assert unbound is not None
        store.settle()
        step = self._train_steps + 1
        if self._seeds is not None:
            self._seeds.before_step(store.step, store.steps_since_reset)
        try:
            results = unbound.run(feeds, self._accumulate)
        except Exception as error:  # onnxruntime's own exception types
            self.raise_if_labels_out_of_range(error, self._io.inputs.names, feeds, f"train step {step}")
            raise
        user = len(self._io.outputs)
        if self._check_finite and user:
            raise_if_not_finite(results[0], step, store.step)
        unbound.commit(results)
        store.gradients_computed()
        self._train_steps = step
        arrays = tuple(results[:user])
        return arrays[0] if len(arrays) == 1 else arrays

    def train_epoch(
        self,
        optimizer: EpochOptimizer,
        inputs: np.ndarray | Sequence[np.ndarray],
        labels: np.ndarray | None,
        batch_size: int,
        shuffle: bool = False,
        seed: int | None = None,
        *,
        learning_rates: Sequence[float] | np.ndarray | None = None,
        accumulate: int = 1,
    ) -> np.ndarray:
        """One pass over in-memory data, in one onnxruntime run; the loss of every batch, ``[batches]``.

        The same as the per-step loop (the same losses and state)::

            order = np.random.default_rng(seed).permutation(n) if shuffle else np.arange(n)
            for b in range(ceil(n / batch_size)):
                rows = order[b * batch_size : (b + 1) * batch_size]   # the last batch may be shorter
                loss = module(*[a[rows] for a in (*inputs, labels)])
                optimizer.step()
                scheduler.step()            # where a scheduler is attached to the optimizer
                module.lazy_reset_grad()

        ``inputs``: the array of the model's first user input, or the arrays of
        its user inputs before the labels; ``labels``: the array of the last
        one (``None`` when ``inputs`` gives them all). All have the same number
        of rows ``n``. ``learning_rates`` (one per optimizer step) sets each
        step's rate instead of the optimizer's (or its scheduler's), as
        ``optimizer.set_learning_rate`` before the step would. The batches
        are train steps whatever the mode (``module.eval()`` included), as
        :meth:`train_step`'s are.

        ``accumulate=k`` accumulates the gradients of ``k`` batches in a row
        (the last group what remains) and takes one optimizer step per group,
        each batch weighted by what its loss is a mean over
        (:meth:`count_loss_items`: its rows, or the labels a mean
        cross-entropy counts; no weights for a summed loss;
        :mod:`onnxtrain.training.batch_step`, :meth:`scale_grad`): the step of
        one batch of ``k * batch_size`` rows, in the memory of one of
        ``batch_size``. Those passes run step by step.

        The full batches run as an ONNX ``Scan`` over the fused step
        (:mod:`onnxtrain.training.epoch`), in one onnxruntime call; a batch
        runs as a step of its own (:mod:`onnxtrain.training.batch_step`) where
        no update is recorded yet (the first batch of the first epoch), where
        the last batch is shorter, and everywhere when the optimizer has no
        fused step (:mod:`onnxtrain.training.train_epoch` decides). The last batch's
        update is left recorded, as ``optimizer.step()`` leaves it. With
        ``check_finite``, a batch whose loss is not finite raises
        ``FloatingPointError`` with the state the per-step loop leaves; any
        other error of the run leaves the state as it was before the run.
        """
        return self._epoch_trainer.train_epoch(
            optimizer, inputs, labels, batch_size, shuffle, seed, learning_rates=learning_rates, accumulate=accumulate
        )

    def _eval_step(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Outputs:
        if self._eval_io is None or self._eval_session is None:
            raise RuntimeError("this Module has no eval model: pass eval_model_uri when creating it")
        io = self._eval_io
        feeds = io.inputs.collect(args, kwargs)
        if self._eval_label_checks:
            self._eval_label_checks.raise_if_out_of_range(feeds, "eval step")
        if self._eval_lookup_checks:
            self._eval_lookup_checks.raise_if_out_of_range(feeds, "eval step")
        self._check_loaded("Cannot perform EvalStep with a nominal state.")
        self._store.settle()
        session = self._eval_session
        if self._unbound_eval:  # STRING inputs or outputs: InferenceSession.run (see onnxtrain.training.unbound)
            inputs: dict[str, np.ndarray | ort.OrtValue] = dict(zip(io.inputs.names, feeds, strict=True))
            inputs.update((name, tensor.value) for name, tensor in self._eval_slots)
            inputs.update(session.constants)
            try:
                results = session.session.run(list(io.outputs), inputs, session.run_options)
            except Exception as error:
                self.raise_if_labels_out_of_range(error, io.inputs.names, feeds, "eval step")
                raise
            return results[0] if len(results) == 1 else tuple(results)
        on_device = bool(feeds) and all(isinstance(f, ort.OrtValue) for f in feeds)
        for name in io.outputs:
            session.bind_output(name, self._device if on_device else _HOST)
        for name, value in zip(io.inputs.names, feeds, strict=True):
            session.bind_input(name, value)
        for name, tensor in self._eval_slots:
            session.bind_value(name, tensor.value)
        try:
            session.run()
        except Exception as error:
            self.raise_if_labels_out_of_range(error, io.inputs.names, feeds, "eval step")
            raise
        return _pack(session.outputs(len(io.outputs)), on_device)

    def raise_if_labels_out_of_range(
        self, error: Exception, names: Sequence[str], feeds: Sequence[np.ndarray | ort.OrtValue], step: str
    ) -> None:
        """``ValueError`` from ``error`` when it is a loss's label check failing (onnxtrain.losses.label_check);
        ``names`` and ``feeds``: the step's user inputs; ``step`` names the step in the message."""
        models = [m.proto for m in (self._train_model, self._eval_model) if m is not None]
        given = dict(zip(names, feeds, strict=True))

        def value_of(name: str) -> np.ndarray | None:
            value = given.get(name)
            return values.to_numpy(value) if isinstance(value, ort.OrtValue) else value

        translated = label_error(error, models, value_of, step)
        if translated is not None:
            raise translated from error

    # ------------------------------------------------------ parameter buffers

    def _names(self, trainable_only: bool) -> list[str]:
        return list(self._io.trainable) if trainable_only else list(self._io.parameters)

    def get_parameters_size(self, trainable_only: bool = True) -> int:
        """The number of elements of the (trainable) parameters."""
        return sum(self._store.tensors[name].size for name in self._names(trainable_only))

    def get_contiguous_parameters_layout(self, trainable_only: bool = False) -> list[ParameterSlice]:
        """Where each parameter lies in the contiguous buffers, in buffer order: ``(name, offset, size, shape,
        dtype)`` per parameter (:class:`ParameterSlice`).

        The buffers (:meth:`get_contiguous_parameters`, :meth:`copy_buffer_to_parameters`) follow the order of
        the training model's inputs, ``module.io.parameters``, not ``state.parameters.names()`` (trainable
        first, in checkpoint order). ``offset`` is in the buffer of the parameter's dtype: the one buffer, or
        ``get_contiguous_parameters_per_dtype()[dtype]``. Reads no tensor.
        """
        ends: dict[str, int] = {}
        layout = []
        for name in self._names(trainable_only):
            tensor = self._store.tensors[name]
            kind = str(tensor.dtype)
            offset = ends.get(kind, 0)
            ends[kind] = offset + tensor.size
            layout.append(ParameterSlice(name, offset, tensor.size, tensor.shape, kind))
        return layout

    def get_contiguous_parameters(self, trainable_only: bool = False) -> ort.OrtValue:
        """The parameters, flattened and concatenated in training-model order, as one OrtValue on the device.

        The buffer has the parameters' dtype; parameters of several dtypes
        raise ``TypeError`` (use :meth:`get_contiguous_parameters_per_dtype`).
        Its ``device_name()`` is ONNX Runtime's training API's (``"Cpu"``, ``"Cuda"``).
        :meth:`get_contiguous_parameters_layout` says where each parameter lies in it.
        """
        return one_buffer(self._store, self._names(trainable_only), self._device)

    def get_contiguous_parameters_per_dtype(self, trainable_only: bool = False) -> dict[str, ort.OrtValue]:
        """``{dtype name: buffer}``: per dtype, its parameters flattened and concatenated in model order.

        ``NominalStateError`` while some of these parameters hold no value (a nominal state not yet loaded).
        """
        return buffers_per_dtype(self._store, self._names(trainable_only), self._device)

    def copy_buffer_to_parameters(self, buffer: Buffer, trainable_only: bool = True) -> None:
        """Write a contiguous buffer (as :meth:`get_contiguous_parameters` gives) into the parameters.

        ``buffer``: one 1-D array or OrtValue of the parameters' dtype, or
        ``{dtype name: buffer}`` for parameters of several dtypes. Its size must
        be exactly the parameters' (``ValueError`` otherwise, nothing written).

        This is how a nominal state (``nominal_checkpoint``) gets its values:
        ``trainable_only=False`` loads every parameter; ``trainable_only=True``
        (which ONNX Runtime refuses on a nominal state) loads the trainable
        ones, and the steps still refuse to run until the frozen ones hold
        values too.
        """
        copy_into_parameters(self._store, self._names(trainable_only), buffer, trainable_only)

    # --------------------------------------------------------------- export

    def export_model_for_inferencing(
        self,
        inference_model_uri: str | os.PathLike[str],
        graph_output_names: Sequence[str],
        *,
        precision: str | None = None,
    ) -> None:
        """Write the eval model with the current parameters baked in, pruned to ``graph_output_names``;
        ``precision`` (``"fp32"``, ``"bf16"``, ``"fp16"``; default: as the eval model computes) as
        :func:`onnxtrain.artifacts.export.export_model_for_inferencing` takes it."""
        if self._eval_model is None or self._eval_io is None:
            raise RuntimeError("export needs the eval model: pass eval_model_uri when creating the Module")
        self._check_loaded("Cannot export the model with a nominal state.")
        self._store.settle()
        names = [graph_output_names] if isinstance(graph_output_names, str) else list(graph_output_names)
        parameters = {name: tensor.numpy() for name, tensor in self._eval_slots}
        eval_model = self._constants.restore(self._eval_model.with_data())
        model = export_model_for_inferencing(eval_model, parameters, names, precision=precision)
        computes = read_metadata(eval_model).get(PRECISION_KEY)
        warn_of_a_half_export(model, computes, [] if self._eval_session is None else self._eval_session.widened)
        with replacing_model(model, Path(inference_model_uri), PROTOBUF_LIMIT):
            pass  # written beside the file, then renamed over it: a failed export leaves the earlier one

    # ------------------------------------------------------------------ names

    def __repr__(self) -> str:
        """The device, the mode, the parameters and the current mode's user inputs and outputs (no tensor read)."""
        tensors, trainable = self._store.tensors, self._io.trainable
        trains = set(trainable)
        frozen = [name for name in self._io.parameters if name not in trains]

        def counted(names: Sequence[str]) -> str:
            size = sum(tensors[name].size for name in names)
            return f"{len(names)} parameter{'' if len(names) == 1 else 's'} ({size:,} values)"

        io: TrainingModelIO | EvalModelIO | None = self._io if self.training else self._eval_io
        model = "" if io is None else f"inputs=[{io.inputs.signature()}], outputs={list(io.outputs)}, "
        return (
            f"Module(device={str(self._device)!r}, mode={'train' if self.training else 'eval'!r}, "
            f"trainable={counted(trainable)}, frozen={counted(frozen)}, {model}"
            f"eval_model={self._eval_model is not None}, train_steps={self._train_steps})"
        )

    def input_names(self) -> list[str]:
        """The user inputs of the training model (training mode) or of the eval model (eval mode)."""
        if self.training:
            return list(self._io.inputs.names)
        return [] if self._eval_io is None else list(self._eval_io.inputs.names)

    def output_names(self) -> list[str]:
        """The user outputs (the loss, then the additional outputs) of the training or eval model."""
        if self.training:
            return list(self._io.outputs)
        return [] if self._eval_io is None else list(self._eval_io.outputs)

    @property
    def device(self) -> Device:
        """Where the sessions run and the state lives."""
        return self._device

    @property
    def state(self) -> TrainingState:
        """The state this module trains (its ``store`` holds the tensors on the device)."""
        return self._state

    @property
    def io(self) -> TrainingModelIO:
        """The training model's inputs and outputs: user inputs, parameters, gradients, statistics."""
        return self._io

    @property
    def train_model(self) -> LoadedModel:
        """The training model as the module runs it: as loaded, but for the label checks it runs on the host."""
        return self._train_model

    def check_labels(self, feeds: Sequence[np.ndarray | ort.OrtValue], step: str) -> None:
        """``ValueError`` when a label of ``feeds`` (the training model's user inputs, in order) is out of the
        range of a loss whose check this module runs on the host (:mod:`onnxtrain.training.labels`); ``step``
        names the step in the message."""
        self._label_checks.raise_if_out_of_range(feeds, step)

    def check_ids(self, feeds: Sequence[np.ndarray | ort.OrtValue], step: str) -> None:
        """``ValueError`` when an id of ``feeds`` (the training model's user inputs, in order; NumPy arrays) is
        outside the rows of the table it looks up (:mod:`onnxtrain.training.lookups`); ``step`` names the step or
        the data in the message."""
        self._lookup_checks.raise_if_out_of_range(feeds, step)

    @property
    def seeds_each_step(self) -> bool:
        """Whether each train step seeds the random draws of the training model (``seed``): ``train_epoch`` then
        runs a step at a time."""
        return self._seeds is not None

    @property
    def runs_unbound(self) -> bool:
        """Whether train steps run without IOBinding (STRING user inputs or outputs): no fused or epoch step."""
        return self._unbound

    def use_fused_step(self, fused: FusedStep | None) -> None:
        """Run train steps that follow a recorded update of ``fused.update`` as ``fused`` (the Optimizer sets it)."""
        self._fused = fused

    def train_step(self, *user_inputs: Any, **named_inputs: Any) -> Outputs:
        """A train step whatever the mode (``module(...)`` in training mode); ``Ort::TrainingSession::TrainStep``."""
        return self._train_step(user_inputs, named_inputs)

    def eval_step(self, *user_inputs: Any, **named_inputs: Any) -> Outputs:
        """An eval step whatever the mode (``module(...)`` in eval mode); ``Ort::TrainingSession::EvalStep``."""
        return self._eval_step(user_inputs, named_inputs)

    @property
    def train_step_count(self) -> int:
        """Train steps run by this module (discarded ones not counted)."""
        return self._train_steps

    def count_train_steps(self, count: int) -> None:
        """Count ``count`` train steps that a run of the epoch model took (``train_epoch``)."""
        self._train_steps += count

    @property
    def accumulates(self) -> bool:
        """Whether the next train step adds to the gradients: a train step ran since ``lazy_reset_grad()``."""
        return self._accumulate

    @property
    def checks_finite(self) -> bool:
        """Whether a train step whose loss is not finite raises (``check_finite``)."""
        return self._check_finite


def _check_same_loss(train: onnx.ModelProto, eval_model: onnx.ModelProto, train_uri: object, eval_uri: object) -> None:
    """``ValueError`` where the training and eval models' metadata name another loss or other loss inputs: two
    ``generate_artifacts`` runs (a set's files mixed), whose eval step would compute another loss."""
    trained, evaluated = read_metadata(train), read_metadata(eval_model)
    for key in (LOSS_KEY, LOSS_INPUTS_KEY):
        if key in trained and key in evaluated and trained[key] != evaluated[key]:
            names = [repr(path) if (path := _path_of(uri)) is not None else "given" for uri in (train_uri, eval_uri)]
            raise ValueError(
                f"the training model {names[0]} computes {trained[LOSS_KEY]} on {trained.get(LOSS_INPUTS_KEY)}, the "
                f"eval model {names[1]} {evaluated[LOSS_KEY]} on {evaluated.get(LOSS_INPUTS_KEY)}: they come from "
                "two generate_artifacts runs; pass the eval model written with this training model"
            )


def _path_of(uri: object) -> str | None:
    """The path a model was given as, or ``None`` for a model given in memory."""
    return os.fspath(uri) if isinstance(uri, (str, os.PathLike)) else None


def _files(model: object, state: TrainingState) -> str:
    """The training model's file and the checkpoint's, where known, for an error about the two."""
    path = _path_of(model)
    named = [f"training model {path!r}"] if path is not None else []
    named += [f"checkpoint {state.source!r}"] if state.source is not None else []
    return ", ".join(named) or "a training model and a checkpoint given in memory"


def _pack(results: list[ort.OrtValue], on_device: bool) -> Outputs:
    if on_device:
        return results[0] if len(results) == 1 else tuple(results)
    arrays = tuple(values.to_numpy(value, copy=False) for value in results)
    return arrays[0] if len(arrays) == 1 else arrays


__all__ = ["Buffer", "Module", "ParameterSlice"]
