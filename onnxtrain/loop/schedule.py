"""The learning-rate schedule of a run, from the runtime's schedulers (:mod:`onnxtrain.training.schedulers`).

A schedule is a function of the optimizer's step count, which the checkpoint
keeps, so a resumed run continues on it exactly. ``linear`` and ``cosine``
span the run's optimizer steps (its epochs times the batches of one), after
``warmup_steps`` of linear warm-up from 0; ``step`` multiplies the rate by
``gamma`` every ``step_size`` steps; ``exponential`` by ``gamma`` every step.
Errors name the ``onnxtrain train`` options that set each value.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Literal

from onnxtrain.training import Optimizer
from onnxtrain.training.schedulers import (
    CosineLRScheduler,
    ExponentialLRScheduler,
    LinearLRScheduler,
    LRScheduler,
    StepLRScheduler,
)

ScheduleKind = Literal["linear", "cosine", "step", "exponential"]
#: The schedules, as ``onnxtrain train --schedule`` names them (``constant``: none).
KINDS: tuple[str, ...] = ("linear", "cosine", "step", "exponential")
#: ``step``'s factor when none is given (torch's ``StepLR``).
STEP_GAMMA = 0.1


@dataclass(frozen=True)
class Schedule:
    """A learning-rate schedule: its kind and the values it uses (the others are ``None``)."""

    kind: ScheduleKind
    warmup_steps: int | None = None
    min_lr: float | None = None
    step_size: int | None = None
    gamma: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"--schedule {self.kind!r} is not a schedule; choose one of {', '.join(KINDS)}")
        uses = {
            "warmup_steps": ("linear", "cosine"), "min_lr": ("cosine",), "step_size": ("step",),
            "gamma": ("step", "exponential"),
        }  # fmt: skip
        for name, kinds in uses.items():
            if getattr(self, name) is not None and self.kind not in kinds:
                option = f"--{name.replace('_', '-')}"
                raise ValueError(f"{option} applies to --schedule {' and '.join(kinds)}, not {self.kind}")
        if self.kind == "step" and self.step_size is None:
            raise ValueError("--schedule step needs --step-size N: the rate is multiplied by --gamma every N steps")
        if self.kind == "exponential" and self.gamma is None:
            raise ValueError("--schedule exponential needs --gamma G: the rate is multiplied by G every step")
        for name in ("warmup_steps", "step_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"--{name.replace('_', '-')} must be an integer >= 0, not {value!r}")
        if self.step_size == 0:
            raise ValueError("--step-size must be at least 1")
        for name in ("min_lr", "gamma"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"--{name.replace('_', '-')} must be a finite number >= 0, not {value!r}")

    def scheduler(self, optimizer: Optimizer, initial_lr: float, total_steps: int) -> LRScheduler:
        """The runtime's scheduler for ``optimizer``, over a run of ``total_steps`` optimizer steps."""
        warmup = self.warmup_steps or 0
        if self.kind in ("linear", "cosine") and warmup > total_steps:
            raise ValueError(
                f"--warmup-steps {warmup} is more than the run's {total_steps} optimizer steps; give fewer, or more "
                "--epochs"
            )
        if self.min_lr is not None and self.min_lr > initial_lr:
            raise ValueError(f"--min-lr {self.min_lr:g} is more than the learning rate {initial_lr:g}")
        if self.kind == "linear":
            return LinearLRScheduler(optimizer, warmup, total_steps, initial_lr)
        if self.kind == "cosine":
            return CosineLRScheduler(optimizer, warmup, total_steps, initial_lr, self.min_lr or 0.0)
        if self.kind == "step":
            gamma = STEP_GAMMA if self.gamma is None else self.gamma
            return StepLRScheduler(optimizer, int(self.step_size or 1), initial_lr, gamma)
        return ExponentialLRScheduler(optimizer, initial_lr, float(self.gamma or 0.0))

    def describe(self, total_steps: int) -> str:
        """``cosine schedule over 240 steps, 10 of warm-up, down to 1e-05``."""
        if self.kind in ("linear", "cosine"):
            warmup = f", {self.warmup_steps} of warm-up" if self.warmup_steps else ""
            floor = f", down to {self.min_lr:g}" if self.min_lr else ""
            return f"{self.kind} schedule over {total_steps} steps{warmup}{floor}"
        if self.kind == "step":
            gamma = STEP_GAMMA if self.gamma is None else self.gamma
            return f"step schedule: times {gamma:g} every {self.step_size} steps"
        return f"exponential schedule: times {self.gamma:g} every step"

    def to_json(self) -> str:
        """The schedule as the run record keeps it (its values as given; ``None`` for the unused ones)."""
        return json.dumps(asdict(self))


__all__ = ["KINDS", "STEP_GAMMA", "Schedule", "ScheduleKind"]
