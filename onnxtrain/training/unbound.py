"""The unbound path: train steps with ``InferenceSession.run``, for models with STRING user inputs or outputs.

onnxruntime's ``IOBinding`` cannot bind string tensors, so such a model's
train step runs the training model with ``InferenceSession.run``: the user
inputs as checked (strings as object arrays of ``str``), every parameter
and gradient buffer as its OrtValue on the device, and ``lazy_reset_grad``.
The new gradients and running statistics come back as outputs, and are
copied into their buffers only once the step is kept (:meth:`UnboundTrainStep.commit`):
a failed step leaves them as they were. The results are the bound steps':
the training model with ``lazy_reset_grad`` true is the reset step's
computation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort

from onnxtrain.training import values
from onnxtrain.training.binding import BoundSession
from onnxtrain.training.model_io import TrainingModelIO
from onnxtrain.training.store import StateTensor


class UnboundTrainStep:
    """The training model's run without ``IOBinding``, over the module's tensors.

    ``parameters``: ``(input, tensor)`` of every parameter; ``gradients``:
    ``(buffer input, accumulated output, tensor)`` per trainable parameter;
    ``statistics``: ``(updated output, tensor)`` per running statistic;
    ``flags``: the ``lazy_reset_grad`` values on the device, by value.
    """

    def __init__(
        self,
        session: BoundSession,
        io: TrainingModelIO,
        parameters: Sequence[tuple[str, StateTensor]],
        gradients: Sequence[tuple[str, str, StateTensor]],
        statistics: Sequence[tuple[str, StateTensor]],
        flags: Mapping[bool, ort.OrtValue],
    ) -> None:
        self.session = session
        self.io = io
        self.parameters = list(parameters)
        self.gradients = list(gradients)
        self.statistics = list(statistics)
        self.flags = flags
        self.outputs = [*io.outputs, *(out for _, out, _ in self.gradients), *(out for out, _ in self.statistics)]

    def run(self, feeds: Sequence[np.ndarray | ort.OrtValue], accumulate: bool) -> list[Any]:
        """Run the training model on the checked user inputs ``feeds`` (adding to the gradients where
        ``accumulate``); the user outputs, then the new gradients and running statistics."""
        io = self.io
        inputs: dict[str, np.ndarray | ort.OrtValue] = dict(zip(io.inputs.names, feeds, strict=True))
        for name, tensor in self.parameters:
            inputs[name] = tensor.value
        for buffer, _, grad in self.gradients:
            inputs[buffer] = grad.value
        inputs[io.flag] = self.flags[not accumulate]
        inputs.update(self.session.constants)
        return self.session.session.run(self.outputs, inputs, self.session.run_options)

    def commit(self, results: Sequence[Any]) -> None:
        """Copy the new gradients and running statistics of a kept step's ``results`` into their buffers."""
        new = results[len(self.io.outputs) :]
        for (_, out, grad), array in zip(self.gradients, new[: len(self.gradients)], strict=True):
            values.write(grad.value, array, f"gradient {out!r}")
        for (out, tensor), array in zip(self.statistics, new[len(self.gradients) :], strict=True):
            values.write(tensor.value, array, f"running statistic {out!r}")


__all__ = ["UnboundTrainStep"]
