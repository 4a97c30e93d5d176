"""Class labels checked on the host before a step runs, instead of by the loss's check in the graph.

A loss over class labels checks them in its graph
(:mod:`onnxtrain.losses.label_check`): ``Compress`` gathers the labels out of
range, and a ``Reshape`` of them fails unless there are none. The size of a
``Compress``'s output is known only once it has run, so on a GPU its kernel
copies a count to the host in the middle of the step and waits for it: one
synchronisation per step, which keeps the host from queuing the backward
while the forward runs, and a copy a CUDA graph cannot capture.

Where the class count is fixed (the scores' axis 1 is a number, as in any
classifier or language model), the module checks the labels it is given
instead, before anything runs, and runs models without those checks
(:func:`~onnxtrain.losses.label_check.strip_label_checks`): the loss then
reads the labels themselves, which is what it read through the check
whenever the check passed. A step with a label out of range raises the same
``ValueError`` as before, before any run, so the state is as it was on every
path (the fused step included, which used to have applied its update). A
check whose class count is symbolic stays in the graph.

The host check is two reductions, ``min`` and ``max``, where every label is in
``[0, C)``; the element-wise test only where one is not (an ``ignore_index``
such as -100, or a label out of range). An MLP of 64-32-10 on batches of 32
(2 cores): 37.2 µs per step with the graph's check, 34.6 µs without it, plus
1.7 µs for ``min`` and ``max``. Labels given as an ``OrtValue`` on a device
are copied to the host for the check (a copy of ``N`` integers before the
step, instead of the count's copy inside it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from onnxtrain.graph.io import copy_model
from onnxtrain.losses.label_check import LabelCheck, labels_out_of_range, strip_label_checks, strippable_label_checks
from onnxtrain.training import values
from onnxtrain.training.models import LoadedModel


@dataclass(frozen=True)
class HostLabelChecks:
    """The label checks a module runs on the host: each with the position of its labels among the user inputs."""

    checks: tuple[tuple[int, LabelCheck], ...] = ()

    @classmethod
    def taken_from(cls, model: LoadedModel, user_inputs: Sequence[str]) -> tuple[LoadedModel, HostLabelChecks]:
        """``model`` without the checks of labels among ``user_inputs`` whose class count is fixed, and those
        checks; ``model`` itself where it has none. ``model`` holds its data (a path's model once its constants
        are shared, :meth:`SharedConstants.share <onnxtrain.training.constants.SharedConstants.share>`)."""
        names = list(user_inputs)
        found = strippable_label_checks(model.proto, names)
        if not found:
            return model, cls()
        stripped = strip_label_checks(copy_model(model.proto), inputs=names)
        return LoadedModel(stripped, stripped.SerializeToString()), cls.of(found, names)

    @classmethod
    def of(cls, checks: Sequence[LabelCheck], user_inputs: Sequence[str]) -> HostLabelChecks:
        """``checks``, each of labels among ``user_inputs``, run on the host."""
        names = list(user_inputs)
        return cls(tuple((names.index(check.labels), check) for check in checks))

    def __bool__(self) -> bool:
        return bool(self.checks)

    def raise_if_out_of_range(self, feeds: Sequence[np.ndarray | ort.OrtValue], step: str) -> None:
        """``ValueError`` naming the labels (``step`` names the step) when a label of ``feeds`` (the user inputs,
        in order) is out of its check's range."""
        for position, check in self.checks:
            labels = feeds[position]
            if isinstance(labels, ort.OrtValue):
                labels = values.to_numpy(labels, copy=False)
            error = labels_out_of_range(check, labels, step)
            if error is not None:
                raise error


__all__ = ["HostLabelChecks"]
