"""The epoch step: many train and optimizer steps in one onnxruntime run (:mod:`onnxtrain.artifacts.epoch`).

``Module.train_epoch`` drives it (:mod:`onnxtrain.training.train_epoch`).

:class:`EpochStep` holds the session of the epoch model built from a fused
step (:class:`~onnxtrain.training.fused.FusedStep`) for one shape of batch,
and runs it over batches in memory. The tensors the scan carries (parameters,
moments, gradients, running statistics) are its inputs; their new values are
written into the tensors' spares, which :meth:`EpochStep.commit` swaps in. A
run that fails, or whose result the module discards (a loss that is not
finite, with ``check_finite``), leaves the state as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from onnxtrain.artifacts.epoch import EpochModel, epoch_scan_model
from onnxtrain.graph.io import copy_model
from onnxtrain.sessions import inferred_shapes
from onnxtrain.training import values
from onnxtrain.training.binding import BoundSession
from onnxtrain.training.device import Device
from onnxtrain.training.fused import FusedStep
from onnxtrain.training.half_kernels import missing_half_kernel, widen
from onnxtrain.training.models import LoadedModel
from onnxtrain.training.store import StateTensor

_HOST = Device("cpu")


def unpacks_with_slices(device: Device) -> bool:
    """Whether the epoch model on ``device`` splits its packed parameters back with ``Slice`` nodes rather than
    one ``Split``: on CUDA, whose ``Split`` waits for a host copy of its axis' map at every run
    (:mod:`onnxtrain.artifacts.vectorize`)."""
    return device.type == "cuda"


class EpochStep:
    """The epoch model's session over one fused step's tensors; see the module docstring."""

    def __init__(
        self,
        epoch: EpochModel,
        session: BoundSession,
        carried: Sequence[StateTensor],
        frozen: Mapping[str, StateTensor],
    ) -> None:
        self.epoch = epoch
        self.session = session
        self.carried = list(zip(epoch.carried, carried, strict=True))
        self.frozen = dict(frozen)

    @classmethod
    def create(
        cls,
        fused: FusedStep,
        batches: Mapping[str, Sequence[int]],
        loss: str,
        statistics: Mapping[str, tuple[str, StateTensor]],
        frozen: Mapping[str, StateTensor],
        open_session: Callable[[LoadedModel, str], BoundSession],
        device: Device,
    ) -> EpochStep:
        """The epoch step over ``fused`` for batches of the shapes ``batches`` (``{user input: shape}``);
        ``statistics``: ``{parameter: (the output of its new value, its tensor)}``; ``open_session(model, what)``
        makes the session on ``device``."""
        carried = [(name, out) for name, _, out in fused.in_place]
        tensors = [tensor for _, tensor, _ in fused.in_place]
        for name, (out, tensor) in statistics.items():
            carried.append((name, out))
            tensors.append(tensor)
        step_model = fused.model.proto
        widened: set[str] = set()
        while True:
            epoch = epoch_scan_model(
                step_model,
                carried,
                batches,
                loss,
                fused.learning_rate,
                fused.step,
                fused.updates,
                inferred_shapes,
                unpack_with_slices=unpacks_with_slices(device),
            )
            model = LoadedModel(epoch.model, epoch.model.SerializeToString())
            try:
                session = open_session(model, "epoch model")
                break
            except ValueError as error:
                # a half operator the provider has no kernel for, inside the Scan's body, where the session's own
                # fallback does not reach: widened in the step model the body is made of, which the step's
                # session widened the same way (and warned of)
                missing = missing_half_kernel(error)
                if missing is None or missing in widened:
                    raise
                step_model = copy_model(step_model)
                if widen(step_model, missing) is None:
                    raise
                widened.add(missing)
        used = {value.name for value in epoch.model.graph.input}
        return cls(epoch, session, tensors, {name: t for name, t in frozen.items() if name in used})

    def run(self, batches: Sequence[np.ndarray], learning_rates: np.ndarray, first_step: int) -> np.ndarray:
        """Train on batch ``j`` of each user input's ``batches`` (``[M, B, ...]``, in model order) in iteration
        ``j``, after the update of step ``first_step + j`` with ``learning_rates[j]``; the losses, ``[M]``.

        The new state is in the spares until :meth:`commit`.
        """
        epoch, session = self.epoch, self.session
        session.bind_output(epoch.losses, _HOST)  # first: the only output read back
        for name, array in zip(epoch.data.values(), batches, strict=True):
            session.bind_input(name, array)
        session.bind_input(epoch.learning_rates, np.ascontiguousarray(learning_rates.reshape(-1)))
        if epoch.steps is not None:
            steps = np.arange(first_step, first_step + len(learning_rates), dtype=np.int64)
            session.bind_input(epoch.steps, steps)
        for name, tensor in self.frozen.items():
            session.bind_value(name, tensor.value)
        for (before, after), tensor in self.carried:
            session.bind_value(before, tensor.value)
            session.bind_output_into(after, tensor.spare())
        session.run()
        return values.to_numpy(session.outputs(1)[0])

    def commit(self) -> None:
        """Swap in the state the last run wrote."""
        for _, tensor in self.carried:
            tensor.swap()


__all__ = ["EpochStep", "unpacks_with_slices"]
