"""Where a training run stands, kept in its checkpoint's properties, and the learning rate ``generate`` chose.

A checkpoint's properties (int64, float32 or str) hold, under ``onnxtrain.run.``:

- ``epochs`` (planned), ``epoch`` (finished), ``batch`` (batches done in the next epoch);
- what fixes the trajectory: ``seed``, ``val_split``, ``batch_size``,
  ``samples`` and ``data`` (a fingerprint of the arrays);
- ``val_data``: a fingerprint of separate validation data (empty when there
  is none); ``schedule``: the learning-rate schedule (JSON, empty for a
  constant rate); ``patience``: the epochs early stopping waits for a better
  validation loss (0: no early stopping); ``accumulate``: the batches of
  one optimizer step;
- ``learning_rate``; ``history``, a JSON list with one
  ``{"epoch", "train_loss", "val_loss", "train_accuracy", "val_accuracy"}``
  per finished epoch (``null`` where there is none); ``epoch_loss``, the JSON
  ``[loss sum, samples]`` of the unfinished epoch's batches, and
  ``epoch_accuracy``, its ``[correct, counted]``, so that its means come out
  the same after a resume. JSON keeps Python floats exactly.

Records written before ``val_data``, ``schedule``, ``patience``,
``epoch_accuracy`` and ``accumulate`` existed lack them: they read as none
(``accumulate`` as 1, a step per batch).

The optimizer's step count and initial learning rate live in the checkpoint's
optimizer state, as in ONNX Runtime. ``onnxtrain.learning_rate`` (no ``run.``)
is the rate ``onnxtrain generate --lr`` stores in the initial checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from onnxtrain.checkpoint import CheckpointState, PropertyValue

#: The initial checkpoint's property with the learning rate chosen when the artifacts were generated.
LEARNING_RATE_PROPERTY = "onnxtrain.learning_rate"
#: The prefix of the run record's properties.
RUN_PREFIX = "onnxtrain.run."

_INTS = ("epochs", "epoch", "batch", "seed", "batch_size", "samples")
_FLOATS = ("val_split", "learning_rate")
_TEXTS = ("data", "history", "epoch_loss")
#: Properties added later, with the value a record without them has.
_OPTIONAL: dict[str, PropertyValue] = {
    "val_data": "", "schedule": "", "patience": 0, "epoch_accuracy": "[0, 0]", "accumulate": 1,
}  # fmt: skip


def with_learning_rate(state: CheckpointState, learning_rate: float) -> CheckpointState:
    """``state`` recording ``learning_rate`` for later training runs (``onnxtrain generate --lr``)."""
    return replace(state, properties={**state.properties, LEARNING_RATE_PROPERTY: float(learning_rate)})


def stored_learning_rate(properties: Mapping[str, PropertyValue]) -> float | None:
    """The learning rate :func:`with_learning_rate` recorded, or ``None``."""
    value = properties.get(LEARNING_RATE_PROPERTY)
    if value is None:
        return None
    if isinstance(value, str):
        raise ValueError(f"the checkpoint's property {LEARNING_RATE_PROPERTY!r} is {value!r}, not a number")
    return float(value)


@dataclass(frozen=True)
class EpochLosses:
    """One finished epoch: its number (from 1), the mean training loss, the validation loss, and the accuracies.

    ``None`` where there is no validation data, or no accuracy (a loss that
    implies no classes, or a model without the class scores as an output).
    """

    epoch: int
    train_loss: float
    val_loss: float | None
    train_accuracy: float | None = None
    val_accuracy: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch, "train_loss": self.train_loss, "val_loss": self.val_loss,
            "train_accuracy": self.train_accuracy, "val_accuracy": self.val_accuracy,
        }  # fmt: skip


@dataclass(frozen=True)
class RunRecord:
    """Where a run stands and what fixes its trajectory; see the module docstring."""

    epochs: int
    seed: int
    val_split: float
    batch_size: int
    samples: int
    data: str
    learning_rate: float
    epoch: int = 0
    batch: int = 0
    loss_sum: float = 0.0
    loss_samples: int = 0
    history: tuple[EpochLosses, ...] = field(default_factory=tuple)
    val_data: str = ""
    schedule: str = ""
    patience: int = 0
    correct: int = 0
    counted: int = 0
    accumulate: int = 1

    @property
    def finished(self) -> bool:
        """All epochs done, or stopped early."""
        return self.epoch >= self.epochs or self.stopped_early

    @property
    def best(self) -> EpochLosses | None:
        """The finished epoch with the lowest validation loss (the first of equals); ``None`` without validation."""
        validated = [entry for entry in self.history if entry.val_loss is not None]
        return min(validated, key=lambda entry: entry.val_loss) if validated else None  # type: ignore[arg-type, return-value]

    @property
    def stopped_early(self) -> bool:
        """Early stopping is on and ``patience`` epochs have passed without a lower validation loss."""
        best = self.best
        return bool(self.patience) and best is not None and self.epoch - best.epoch >= self.patience

    def position(self) -> str:
        """``epoch 3 of 10`` after an epoch, ``epoch 4 of 10, batch 7`` within one."""
        if self.batch:
            return f"epoch {self.epoch + 1} of {self.epochs}, batch {self.batch}"
        return f"epoch {self.epoch} of {self.epochs}"

    def differences(self, other: RunRecord) -> list[str]:
        """What differs between this run's data and settings and ``other``'s: ``batch size 32 (now 64)``."""
        same_split = np.float32(self.val_split) == np.float32(other.val_split)
        pairs = [
            ("number of samples", self.samples, other.samples, self.samples == other.samples),
            ("batch size", self.batch_size, other.batch_size, self.batch_size == other.batch_size),
            (
                "gradient accumulation",
                _accumulation_text(self.accumulate),
                _accumulation_text(other.accumulate),
                self.accumulate == other.accumulate,
            ),
            ("seed", self.seed, other.seed, self.seed == other.seed),
            # stored as a float32 property: shown as the float32 it is (0.2, not 0.20000000298023224)
            ("validation split", _float32_text(self.val_split), _float32_text(other.val_split), same_split),
        ]
        found = [f"{what} {mine} (now {theirs})" for what, mine, theirs, same in pairs if not same]
        if self.samples == other.samples and self.data != other.data:
            found.append("the data's values")
        if self.val_data != other.val_data:
            found.append(
                "other validation data" if self.val_data and other.val_data
                else f"validation data {'from a file' if self.val_data else 'none'} "
                f"(now {'from a file' if other.val_data else 'none'})"
            )  # fmt: skip
        if self.schedule != other.schedule:
            mine, theirs = schedule_text(self.schedule), schedule_text(other.schedule)
            found.append(f"learning-rate schedule {mine} (now {theirs})")
        if self.patience != other.patience:
            found.append(f"early stopping {_patience_text(self.patience)} (now {_patience_text(other.patience)})")
        return found

    def to_properties(self) -> dict[str, PropertyValue]:
        """The properties that hold this record."""
        names = (*_INTS, *_FLOATS, "data", "val_data", "schedule", "patience", "accumulate")
        values: dict[str, PropertyValue] = {name: getattr(self, name) for name in names}
        values["history"] = json.dumps([entry.to_json() for entry in self.history])
        values["epoch_loss"] = json.dumps([self.loss_sum, self.loss_samples])
        values["epoch_accuracy"] = json.dumps([self.correct, self.counted])
        return {RUN_PREFIX + name: value for name, value in values.items()}

    @classmethod
    def from_properties(cls, properties: Mapping[str, PropertyValue]) -> RunRecord | None:
        """The record in ``properties``, ``None`` when they hold none; ``ValueError`` when it is damaged."""
        if not any(name.startswith(RUN_PREFIX) for name in properties):
            return None
        values = {name: properties.get(RUN_PREFIX + name) for name in (*_INTS, *_FLOATS, *_TEXTS)}
        values |= {name: properties.get(RUN_PREFIX + name, default) for name, default in _OPTIONAL.items()}
        kinds = {**dict.fromkeys(_INTS, int), **dict.fromkeys(_FLOATS, float), **dict.fromkeys(_TEXTS, str)}
        kinds |= {name: type(default) for name, default in _OPTIONAL.items()}
        wrong = [RUN_PREFIX + name for name, kind in kinds.items() if type(values[name]) is not kind]
        if wrong:
            raise ValueError(f"the checkpoint's run record is damaged: {', '.join(wrong)} missing or of the wrong type")
        try:
            history = tuple(EpochLosses(**entry) for entry in json.loads(str(values.pop("history"))))
            loss_sum, loss_samples = json.loads(str(values.pop("epoch_loss")))
            correct, counted = json.loads(str(values.pop("epoch_accuracy")))
        except (ValueError, TypeError) as error:
            raise ValueError(f"the checkpoint's run record is damaged: {error}") from None
        return cls(
            **values, loss_sum=float(loss_sum), loss_samples=int(loss_samples), history=history,  # type: ignore[arg-type]
            correct=int(correct), counted=int(counted),
        )  # fmt: skip


def schedule_text(schedule: str) -> str:
    """A recorded schedule (JSON) in words: ``cosine (warmup_steps 10, min_lr 0)``; ``constant`` for none."""
    if not schedule:
        return "constant"
    try:
        settings = json.loads(schedule)
        kind = settings.pop("kind")
    except (ValueError, TypeError, KeyError, AttributeError):
        return repr(schedule)
    details = ", ".join(f"{name} {value:g}" for name, value in settings.items() if value is not None)
    return f"{kind} ({details})" if details else str(kind)


def _float32_text(value: float) -> str:
    """``value`` as the shortest decimal that reads back as the same float32."""
    return str(np.float32(value))


def _accumulation_text(accumulate: int) -> str:
    return "off" if accumulate == 1 else f"{accumulate} batches a step"


def _patience_text(patience: int) -> str:
    return f"after {patience} epoch{'' if patience == 1 else 's'} without improvement" if patience else "off"


__all__ = [
    "LEARNING_RATE_PROPERTY",
    "RUN_PREFIX",
    "EpochLosses",
    "RunRecord",
    "schedule_text",
    "stored_learning_rate",
    "with_learning_rate",
]
