"""The train step from reset gradients: the training model without its accumulation, writing gradients in place.

A train step that starts from reset gradients (the first after the module is
made or after ``lazy_reset_grad()``) adds nothing to the old gradients. Where
nothing can observe them any more either (their status is not ``"ready"``),
the module runs the training model with ``lazy_reset_grad`` taken as true
(:func:`onnxtrain.artifacts.accumulation.remove_gradient_accumulation`): each
gradient is an output of its own, bound to the gradient's buffer, so the
step writes it there directly. No spare buffers, and none of the
accumulation's additions and selections with their intermediate tensors. A
train step that accumulates runs the training model itself and writes into
spares, which a failed step leaves behind.

A failed step from reset may leave its gradients half written; they are then
still reset (read as zeros) or absent, as before the step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from onnxtrain.artifacts.accumulation import AccumulationFormError, remove_gradient_accumulation
from onnxtrain.training.binding import BoundSession
from onnxtrain.training.models import LoadedModel
from onnxtrain.training.store import StateTensor


class ResetStep:
    """The session of the training model without accumulation, and its gradient outputs."""

    def __init__(self, session: BoundSession, gradients: Mapping[str, str]) -> None:
        self.session = session
        self.gradients = dict(gradients)

    @classmethod
    def create(
        cls, training: LoadedModel, trainable: Sequence[str], open_session: Callable[[LoadedModel, str], BoundSession]
    ) -> ResetStep | None:
        """The step for ``training``'s model, its session made by ``open_session(model, what)``; ``None`` where the
        model's accumulation is not the form ``generate_artifacts`` writes, or the model passes protobuf's limit
        (the module then runs the training model on every step)."""
        if not training.fits_in_protobuf():
            return None
        model = training.with_data()
        try:
            reset = remove_gradient_accumulation(model, trainable)
        except AccumulationFormError:
            return None
        loaded = LoadedModel(reset.model, reset.model.SerializeToString())
        return cls(open_session(loaded, "training model (from reset gradients)"), reset.gradients)

    def bind(self, grads: Mapping[str, StateTensor]) -> None:
        """Bind each gradient's buffer as the output of its gradient (the module binds the rest)."""
        for param, out in self.gradients.items():
            self.session.bind_output_into(out, grads[param].value)


__all__ = ["ResetStep"]
