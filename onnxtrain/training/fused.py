"""The fused step: a train step and the optimizer step after it, in one onnxruntime run.

In the usual loop ``module(x, y); optimizer.step(); module.lazy_reset_grad()``
every train step starts from reset gradients and is followed by an optimizer
step. For such a step the module runs the fused model
(:func:`onnxtrain.artifacts.fuse.fuse_training_step`) instead of the training
model: it returns the loss and writes the gradients, as the training model
would, and also computes the optimizer's update, which it writes into the
spare buffers of the parameters and moments without making it current. The
update is a speculation: ``optimizer.step()`` makes it current (a swap, no
run) only if nothing it was computed from has changed since: no other train
step, no parameter written, the same learning rate and step count. Otherwise
``step()`` runs the optimizer model on the gradients as usual, so results never
depend on which path ran.

Whether the next train step speculates is decided by the last optimizer step:
if the update computed at its train step would have been used, speculate
again; if not (gradient accumulation, or a learning rate set between the train
step and the optimizer step), run the training model alone, so that a loop
that would waste the update does not compute it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnxtrain.artifacts.fuse import FusedModel, FusionError, fuse_training_step
from onnxtrain.artifacts.generate import PROTOBUF_LIMIT
from onnxtrain.optim.base import state_name, updated_name
from onnxtrain.optim.emit import LEARNING_RATE, STEP
from onnxtrain.training.binding import BoundSession
from onnxtrain.training.interface import LoadedModel

if TYPE_CHECKING:
    from onnxtrain.training.module import Module
    from onnxtrain.training.optimizer import Optimizer
    from onnxtrain.training.state import StateTensor


#: What an update computed at a train step depends on, besides that step's gradients: the state's
#: revision right after the train step, the step count, the learning rate, and whether the fused model
#: ran (the update is in the spares).
_Basis = tuple[int, int, float, bool]


class FusedStep:
    """The fused session of one optimizer over its module, and its speculation; see the module docstring."""

    def __init__(self, fused: FusedModel, session: BoundSession, optimizer: Optimizer) -> None:
        self.session = session
        self._optimizer = optimizer
        module = optimizer._module
        record = optimizer._record
        tensors = module._state._tensors
        self.gradients = [(fused.gradients[p], module._state._grads[p]) for p in module._io.trainable]
        self.learning_rate = fused.name_of(LEARNING_RATE)
        self.step = fused.name_of(STEP)
        # (input, tensor, output): the moments are bound here; the parameters' inputs are the module's
        self.updates: list[tuple[str | None, StateTensor, str]] = []
        for p in module._io.trainable:
            self.updates.append((None, tensors[p], fused.name_of(updated_name(p))))
            for i, moment in enumerate(record.moments[p]):
                name = state_name(p, i)
                self.updates.append((fused.name_of(name), moment, fused.name_of(updated_name(name))))
        self.speculate = True
        self._basis: _Basis | None = None

    @classmethod
    def create(cls, module: Module, optimizer_model: LoadedModel, optimizer: Optimizer) -> FusedStep | None:
        """The fused step, or ``None`` where the two models cannot be merged (they then run apart)."""
        training = module._train_model.with_data()
        optimizing = optimizer_model.with_data()
        if training.ByteSize() + optimizing.ByteSize() > PROTOBUF_LIMIT:
            return None  # one serialized model would pass protobuf's limit
        try:
            fused = fuse_training_step(training, optimizing, module._io.trainable)
        except FusionError:
            return None
        model = LoadedModel(fused.model, fused.model.SerializeToString())
        session = BoundSession(model, "fused training step", module._fused_options, module._providers, module._device)
        return cls(fused, session, optimizer)

    # ------------------------------------------------- used by the module

    def begin(self, from_reset: bool) -> bool:
        """A train step begins: forget any earlier update; whether this step runs the fused model.

        It does when the step starts from reset gradients and the last
        optimizer step says speculating pays; then this writes the learning
        rate and step number where the bound inputs read them.
        """
        self._basis = None
        if not (from_reset and self.speculate):
            return False
        self._optimizer._write_step_inputs()
        return True

    def bind(self) -> None:
        """Bind the optimizer's inputs and the update's outputs (the module binds the rest)."""
        optimizer, session = self._optimizer, self.session
        session.bind_value(self.learning_rate, optimizer._lr_value)
        session.bind_value(self.step, optimizer._step_value)
        for name, tensor, out in self.updates:
            if name is not None:
                session.bind_value(name, tensor.value)
            session.bind_output_into(out, tensor.spare())

    def after_train_step(self, *, from_reset: bool, computed: bool) -> None:
        """Record what the update of this train step (computed or not) depends on."""
        if not from_reset:
            return  # accumulated gradients: the basis was forgotten when this step began
        record = self._optimizer._record
        self._basis = (self._optimizer._module._state._revision, record.step, record.learning_rate, computed)

    # ---------------------------------------------- used by the optimizer

    def take(self) -> bool:
        """At an optimizer step: make the computed update current if it still holds; whether it did.

        Also decides whether the next train step speculates: if and only if
        this step's update, computed or not, would have held.
        """
        basis, self._basis = self._basis, None
        record = self._optimizer._record
        holds = basis is not None and basis[:3] == (
            self._optimizer._module._state._revision,
            record.step,
            record.learning_rate,
        )
        self.speculate = holds
        if not (holds and basis is not None and basis[3]):
            return False
        for _, tensor, _ in self.updates:
            tensor.swap()
        return True


__all__ = ["FusedStep"]
