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
optimizer step (:meth:`TrainingState._settle`). The results are those of
running each step when it is called.

If onnxruntime fails during a fused run (a label out of range, say), the update
has been applied: the fused session runs in onnxruntime's priority-based order,
which runs the optimizer model's nodes, listed first, before any node of the
train step. The gradients are then reset, as after any failed train step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnxtrain.artifacts.fuse import FusedModel, FusionError, fuse_update_and_train
from onnxtrain.artifacts.generate import PROTOBUF_LIMIT
from onnxtrain.optim.base import grad_name, state_name, updated_name
from onnxtrain.optim.emit import LEARNING_RATE, STEP
from onnxtrain.training.binding import BoundSession
from onnxtrain.training.inplace import unsafe_in_place
from onnxtrain.training.interface import LoadedModel

if TYPE_CHECKING:
    from onnxtrain.training.module import Module
    from onnxtrain.training.optimizer import Optimizer
    from onnxtrain.training.state import StateTensor


#: ``(input, tensor, output)``: a tensor the fused step reads from ``input`` and writes in place as ``output``.
Updated = tuple[str, "StateTensor", str]


class FusedStep:
    """The fused session of one optimizer over its module; see the module docstring."""

    def __init__(
        self,
        fused: FusedModel,
        model: LoadedModel,
        session: BoundSession,
        optimizer: Optimizer,
        in_place: list[Updated],
    ) -> None:
        self.model = model  # the fused model, which the epoch step loops over (onnxtrain.training.epoch)
        self.session = session
        self.optimizer = optimizer
        self.in_place = in_place
        self.learning_rate = fused.name_of(LEARNING_RATE)
        self.step = fused.name_of(STEP)

    @classmethod
    def create(cls, module: Module, optimizer_model: LoadedModel, optimizer: Optimizer) -> FusedStep | None:
        """The fused step, or ``None`` where the two models cannot be merged or updated in place."""
        training = module._train_model.with_data()
        optimizing = optimizer_model.with_data()
        if training.ByteSize() + optimizing.ByteSize() > PROTOBUF_LIMIT:
            return None  # one serialized model would pass protobuf's limit
        try:
            fused = fuse_update_and_train(training, optimizing, module._io.trainable)
        except FusionError:
            return None
        in_place = _updated_tensors(fused, module, optimizer)
        if unsafe_in_place(fused.model.graph, {name: out for name, _, out in in_place}):
            return None
        model = LoadedModel(fused.model, fused.model.SerializeToString())
        session = BoundSession(model, "fused training step", module._fused_options, module._providers, module._device)
        return cls(fused, model, session, optimizer, in_place)

    def bind(self) -> None:
        """Bind the optimizer's inputs and each updated tensor as both input and output (the module binds the rest)."""
        optimizer, session = self.optimizer, self.session
        session.bind_value(self.learning_rate, optimizer._lr_value)
        session.bind_value(self.step, optimizer._step_value)
        for name, tensor, out in self.in_place:
            session.bind_value(name, tensor.value)
            session.bind_output_into(out, tensor.value)


def _updated_tensors(fused: FusedModel, module: Module, optimizer: Optimizer) -> list[Updated]:
    """The parameters, moments and gradients the fused model updates, with its names for each."""
    tensors, grads, moments = module._state._tensors, module._state._grads, optimizer._record.moments
    updated: list[Updated] = []
    for p in module._io.trainable:
        updated.append((p, tensors[p], fused.name_of(updated_name(p))))
        for i, moment in enumerate(moments[p]):
            name = state_name(p, i)
            updated.append((fused.name_of(name), moment, fused.name_of(updated_name(name))))
        updated.append((fused.name_of(grad_name(p)), grads[p], fused.gradients[p]))
    return updated


__all__ = ["FusedStep"]
