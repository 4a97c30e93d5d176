"""What a batch's loss is a mean over: the weight of each batch in an accumulated step.

The training model's metadata says it (:mod:`onnxtrain.artifacts.loss_items`:
the labels a mean cross-entropy or NLL counts; none for a summed loss); artifacts without it (written
before it, or by ONNX Runtime's tools) are read from the eval model where the
module has one, else counted by rows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from onnxtrain.artifacts.loss_items import loss_items
from onnxtrain.artifacts.metadata import LOSS_ITEMS_KEY, read_metadata
from onnxtrain.training import values


@dataclass(frozen=True)
class LossItems:
    """Where a batch's count of loss items comes from: ``labels`` (the position of the labels among the user
    inputs; ``None``: the batch's rows), ``ignore_index`` and the class ``weights``; ``summed``: the loss is a
    sum over its batch, and the batches of a step are added unweighted."""

    labels: int | None = None
    ignore_index: int | None = None
    weights: np.ndarray | None = None
    summed: bool = False

    @classmethod
    def of(cls, models: Sequence[onnx.ModelProto], user_inputs: Sequence[str]) -> LossItems:
        """The items of the loss of ``models`` (the training model, then the eval model if any): the first's
        metadata, else the first whose graph holds the loss; rows where neither says more."""
        found = None
        for model in models:
            written = read_metadata(model).get(LOSS_ITEMS_KEY)
            found = json.loads(written) if written is not None else loss_items(model)
            if found is not None:
                break
        names = list(user_inputs)
        if found is not None and found.get("reduction") == "sum":
            return cls(summed=True)
        if found is None or found.get("labels") not in names:
            return cls()
        weights = found["class_weights"]
        return cls(names.index(found["labels"]), found["ignore_index"], None if weights is None else np.array(weights))

    def count(self, batch: Sequence[Any]) -> float | None:
        """The items of ``batch`` (the user inputs, in order): its rows, or its counted labels' weight; ``None``
        for a loss summed over its batch (no weights)."""
        if self.summed:
            return None
        if self.labels is None:
            first = batch[0]
            shape = first.shape() if isinstance(first, ort.OrtValue) else np.shape(first)
            return float(shape[0]) if len(shape) else 1.0
        labels = batch[self.labels]
        labels = values.to_numpy(labels, copy=False) if isinstance(labels, ort.OrtValue) else np.asarray(labels)
        counted = labels if self.ignore_index is None else labels[labels != self.ignore_index]
        if self.weights is None:
            return float(counted.size)
        # a label out of range makes the train step fail with its own error: no IndexError before it
        return float(np.take(self.weights, counted.astype(np.int64), mode="clip").sum())


__all__ = ["LossItems"]
