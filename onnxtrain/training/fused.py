"""The fused step: an optimizer step deferred to the next train step, both in one onnxruntime run, in place.

In the usual loop ``module(x, y); optimizer.step(); module.lazy_reset_grad()``,
``optimizer.step()`` records its update (the learning rate and step number)
and runs nothing. The next train step that starts from reset gradients runs
the fused model (:func:`onnxtrain.artifacts.fuse.fuse_update_and_train`): it
applies the recorded update, then runs the train step on the updated
parameters. The parameters, the moments and the gradients are written in
place: each buffer is bound as both the input and the output of the run, which
:func:`onnxtrain.training.inplace.unsafe_in_place` proves safe (no node can
read an input after its new value is written), so no second set of buffers is
needed.

A recorded update is applied (by the optimizer model alone, in place) before
anything else sees the state: reading or writing a parameter, saving, exporting,
an eval step, a train step that accumulates or runs in another module, a second
optimizer step (:meth:`StateStore.settle <onnxtrain.training.store.StateStore.settle>`). The results are those of
running each step when it is called.

If onnxruntime fails during a fused run (a label out of range of a class count
the graph checks, say), the update has been applied: the fused session runs in onnxruntime's priority-based order,
which runs the optimizer model's nodes, listed first, before any node of the
train step. The gradients are then reset, as after any failed train step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from onnxtrain.artifacts.fuse import FusedModel, FusionError, fuse_update_and_train
from onnxtrain.artifacts.generate import PROTOBUF_LIMIT
from onnxtrain.artifacts.vectorize import Pack, ParameterUpdate, pack_in_place, views_in_place
from onnxtrain.graph.io import copy_model
from onnxtrain.graph.naming import keep_or_tag, names_in
from onnxtrain.graph.passes import fold_static_shapes
from onnxtrain.optim.base import updated_name
from onnxtrain.optim.emit import LEARNING_RATE, STEP
from onnxtrain.sessions import inferred_shapes
from onnxtrain.training.binding import BoundSession
from onnxtrain.training.inplace import unsafe_in_place
from onnxtrain.training.models import LoadedModel
from onnxtrain.training.options import SMALL_TENSOR, largest_step_input
from onnxtrain.training.store import RecordedUpdate, StateStore, StateTensor

#: The most bytes of user inputs per step that the session for fixed shapes copies into buffers of its own
#: (under ``SMALL_TENSOR`` float32 elements, 128 KiB, so that both sides of it are reachable; at 4-128 KiB
#: of batch the copy and a new binding cost the same within noise, 2 cores, 2026-11-27).
STAGED_BYTES = 1 << 16

#: ``(input, tensor, output)``: a tensor the fused step reads from ``input`` and writes in place as ``output``.
Updated = tuple[str, StateTensor, str]


#: Step shapes whose size class :meth:`FusedStep.session_for` remembers.
_MAX_SHAPES = 16


class FusedStep:
    """The fused session of one optimizer over its module; see the module docstring.

    ``update``: the optimizer whose recorded update the fused step applies
    (a train step runs it where the state's recorded update is this one);
    ``learning_rate`` and ``step``: the OrtValues holding the recorded rate
    and step number, written by the optimizer, bound as they are.

    Two sessions, each made when first needed: :attr:`session` over the
    fused model as built, for user inputs of any shape, and one over the
    model with the shapes of one step's inputs fixed and the shape
    computations that then become constant folded (:mod:`onnxtrain.graph.fold`),
    made for the first step whose every input (parameters included) is under
    ``SMALL_TENSOR`` elements, and run by every later step of those shapes
    (:meth:`session_for`): a steady loop's. The same arithmetic in fewer nodes
    (the linear regression's step: 15 instead of 22). Whether a step is small
    is decided at each step from its inputs' shapes, so a first batch of
    another size (a large one, or a short last one) fixes nothing for the
    batches after it. On the CPU a larger model's steps cost their arithmetic
    and run the first session whatever their shapes. On a GPU every node is
    a launch that costs the host about as much whatever the node's size, so
    the first step of any size gets the session for its shapes
    (:attr:`fold_every_shape`): GPT-2 small's fused step at 16 x 256 runs
    3,395 nodes instead of 4,165. There too the sessions run the optimizer's
    identical per-parameter chains once, on the tensors packed inside the step
    (:attr:`pack_updates`, :attr:`step_model`): 2,192 nodes, the loss's label check
    being done on the host (:mod:`onnxtrain.training.labels`).
    """

    def __init__(
        self,
        fused: FusedModel,
        model: LoadedModel,
        user_inputs: Sequence[str],
        open_session: Callable[[LoadedModel, str], BoundSession],
        update: RecordedUpdate,
        in_place: list[Updated],
        updates: list[ParameterUpdate],
        values: tuple[ort.OrtValue, ort.OrtValue],
        on_host: bool,
    ) -> None:
        self.model = model  # the fused model, which the epoch step scans over (onnxtrain.training.epoch)
        self._general: BoundSession | None = None
        self.update = update
        self.in_place = in_place
        #: Per trainable parameter, the fused model's names for it, its moments and its gradient, as read and
        #: written (what the epoch model packs, onnxtrain.artifacts.vectorize).
        self.updates = updates
        self.learning_rate = fused.name_of(LEARNING_RATE)
        self.step = fused.name_of(STEP)
        self._values = values
        self._user_inputs = tuple(user_inputs)
        self._open_session = open_session
        self._fixed: tuple[tuple[tuple[int, ...], ...], BoundSession] | None = None
        self._small: dict[tuple[tuple[int, ...], ...], bool] = {}  # whether a step of these shapes is small
        # host buffers for the inputs of the session for fixed shapes (staged_inputs), and their OrtValues
        self._on_host = on_host
        #: Whether a step of any size gets the session for its shapes, not only a small one: off the CPU.
        self.fold_every_shape = not on_host
        #: Whether the sessions run the optimizer's identical per-parameter chains once on packed tensors
        #: (:func:`~onnxtrain.artifacts.vectorize.pack_in_place`): off the CPU. Decided when the first session
        #: is made.
        self.pack_updates = not on_host
        #: Whether the packed update writes the tensors back with one ``Split`` per role rather than a ``Slice``
        #: per tensor (``benchmarks/real_size --split-unpack`` compares them on a GPU). Decided with
        #: :attr:`pack_updates`.
        self.split_unpack = False
        self._step_model: LoadedModel | None = None
        #: The inputs and outputs the step model declares as rows, with those shapes (bound as such).
        self._views: tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int]]] = ({}, {})
        self._staged: list[np.ndarray] | None = None
        self._staged_values: list[ort.OrtValue] = []

    @classmethod
    def create(
        cls,
        training: LoadedModel,
        optimizer_model: LoadedModel,
        trainable: Sequence[str],
        user_inputs: Sequence[str],
        store: StateStore,
        moments: Mapping[str, Sequence[StateTensor]],
        update: RecordedUpdate,
        values: tuple[ort.OrtValue, ort.OrtValue],
        open_session: Callable[[LoadedModel, str], BoundSession],
        *,
        on_host: bool = False,
        shared_state: Sequence[str] = (),
    ) -> FusedStep | None:
        """The fused step, or ``None`` where the two models cannot be merged or updated in place.

        ``values``: the learning rate's and the step number's OrtValues;
        ``open_session(model, what)`` makes the sessions; ``on_host``: they
        run on the CPU (small inputs are then staged, :meth:`staged_inputs`);
        ``shared_state``: frozen parameters the optimizer model updates too (the loss scaler's state).
        """
        if not (training.fits_in_protobuf() and optimizer_model.fits_in_protobuf()):
            return None  # one serialized model would pass protobuf's limit
        training_proto, optimizer_proto = training.with_data(), optimizer_model.with_data()
        if training_proto.ByteSize() + optimizer_proto.ByteSize() > PROTOBUF_LIMIT:
            return None
        try:
            fused = fuse_update_and_train(training_proto, optimizer_proto, trainable)
        except FusionError:
            return None
        in_place, updates = _updated_tensors(fused, trainable, store, moments)
        in_place += [(fused.name_of(n), store.tensors[n], fused.name_of(updated_name(n))) for n in shared_state]
        if unsafe_in_place(fused.model.graph, {name: out for name, _, out in in_place}):
            return None
        model = LoadedModel(fused.model, fused.model.SerializeToString())
        return cls(fused, model, user_inputs, open_session, update, in_place, updates, values, on_host)

    @property
    def session(self) -> BoundSession:
        """The session over the fused model as built, for inputs of any shape (made on first use)."""
        if self._general is None:
            self._general = self._open_session(self.step_model, "fused training step")
        return self._general

    @property
    def step_model(self) -> LoadedModel:
        """The model the sessions run: :attr:`model`, or with :attr:`pack_updates` the same with the optimizer's
        identical chains packed, where that saves nodes and keeps the update in place (made on first use)."""
        if self._step_model is None:
            self._step_model = self.model
            pairs = {name: out for name, _, out in self.in_place}
            found = (
                packed_in_place(self.model.proto, self.updates, pairs, split=self.split_unpack)
                if self.pack_updates
                else None
            )
            if found is not None:
                self._step_model = LoadedModel(found[0], found[0].SerializeToString())
                self._views = views_in_place(found[1])
        return self._step_model

    def session_for(self, shapes: tuple[tuple[int, ...], ...]) -> BoundSession:
        """The session for a step whose user inputs have ``shapes``: the one for fixed shapes where they are its
        shapes, or where none is made yet and a step of these shapes is small or :attr:`fold_every_shape` (made
        now); else the general one."""
        if self._fixed is not None:
            fixed, session = self._fixed
            return session if shapes == fixed else self.session
        small = self._small.get(shapes)
        if small is None:  # decided once per shape (walking the model's inputs takes 100 µs for an MLP)
            by_input = dict(zip(self._user_inputs, shapes, strict=True))
            largest = largest_step_input(self.model.proto, by_input)
            small = largest is not None and largest < SMALL_TENSOR
            if len(self._small) >= _MAX_SHAPES:  # shapes that keep changing: forget the old ones
                self._small.clear()
            self._small[shapes] = small
        if not small and not self.fold_every_shape:  # a step of much data on the CPU: its arithmetic is the cost
            return self.session
        by_input = dict(zip(self._user_inputs, shapes, strict=True))
        folded = fold_static_shapes(copy_model(self.step_model.proto), shapes=by_input, shapes_of=inferred_shapes)
        model = LoadedModel(folded, folded.SerializeToString())
        session = self._open_session(model, f"fused training step for inputs of shapes {shapes}")
        self._fixed = (shapes, session)
        return session

    def staged_inputs(self, session: BoundSession, feeds: Sequence[Any]) -> list[ort.OrtValue] | None:
        """``feeds`` copied into host buffers the session for fixed shapes keeps bound, where that is ``session``,
        the module runs on the CPU, every feed is a NumPy array of plain numbers and together they take at most
        ``STAGED_BYTES``; else ``None`` (the module binds the feeds themselves). Decided at each call.

        Copying a small batch costs less than binding it anew (0.7 against 1.8 µs per input), and a run whose
        inputs were not re-bound starts about 1 µs sooner (2 cores, 2026-11-25).
        """
        if not self._on_host or self._fixed is None or session is not self._fixed[1]:
            return None
        if not all(f.__class__ is np.ndarray and f.dtype.kind in "fiub" for f in feeds):
            return None
        if sum(f.nbytes for f in feeds) > STAGED_BYTES:
            return None
        if self._staged is None:  # the fixed shapes' buffers (each input's dtype is the model's)
            self._staged = [np.empty(f.shape, f.dtype) for f in feeds]
            self._staged_values = [ort.OrtValue.ortvalue_from_numpy(buffer) for buffer in self._staged]
        for buffer, feed in zip(self._staged, feeds, strict=True):
            np.copyto(buffer, feed)
        return self._staged_values

    def sessions(self) -> list[BoundSession]:
        """The sessions made so far: the general one, then the one for fixed shapes."""
        made = [self._general] if self._general is not None else []
        return made + ([self._fixed[1]] if self._fixed is not None else [])

    def bind(self, session: BoundSession) -> None:
        """Bind, in ``session`` (one of :meth:`sessions`), the recorded rate and step and each updated tensor as
        both input and output (the module binds the rest)."""
        session.bind_value(self.learning_rate, self._values[0])
        session.bind_value(self.step, self._values[1])
        input_views, output_views = self._views
        for name, tensor, out in self.in_place:
            view = input_views.get(name)
            if view is not None:  # packed by the model: the same buffer, seen as rows
                session.bind_view(name, tensor.value, view, tensor.device)
            else:
                session.bind_value(name, tensor.value)
            view = output_views.get(out)
            if view is not None:
                session.bind_output_view(out, tensor.value, view, tensor.device)
            else:
                session.bind_output_into(out, tensor.value)


def packed_in_place(
    model: onnx.ModelProto, updates: Sequence[ParameterUpdate], pairs: Mapping[str, str], *, split: bool = False
) -> tuple[onnx.ModelProto, list[Pack]] | None:
    """``model`` (a fused step) with the identical chains of ``updates`` packed
    (:func:`~onnxtrain.artifacts.vectorize.pack_in_place`), and the packs; ``None`` where nothing is packed or
    where the packed model could not write each output of ``pairs`` (``{input: output}``) into its input's
    buffer. ``split``: :func:`~onnxtrain.artifacts.vectorize.pack_in_place`'s."""
    packed, packs = pack_in_place(model, updates, keep_or_tag(names_in(model.graph), "packed"), split=split)
    if not packs or unsafe_in_place(packed.graph, pairs):
        return None
    return packed, packs


def _updated_tensors(
    fused: FusedModel, trainable: Sequence[str], store: StateStore, moments: Mapping[str, Sequence[StateTensor]]
) -> tuple[list[Updated], list[ParameterUpdate]]:
    """The parameters, moments and gradients the fused model updates, with its names for each; and the same
    per parameter."""
    updated: list[Updated] = []
    # each tensor's shape as the state holds it (the model's declaration could leave a dimension unnamed)
    declared = zip(trainable, fused.parameter_updates(trainable), strict=True)
    updates = [replace(update, shape=store.tensors[p].shape) for p, update in declared]
    for p, update in zip(trainable, updates, strict=True):
        updated.append((update.parameter[0], store.tensors[p], update.parameter[1]))
        updated += [(name, moment, out) for (name, out), moment in zip(update.moments, moments[p], strict=True)]
        updated.append((update.gradient[0], store.gradients[p], update.gradient[1]))
    return updated, updates


__all__ = ["FusedStep", "Updated", "packed_in_place"]
