"""Learning-rate schedules of a run: checked as the command's options, the runtime's schedulers, and described."""

from __future__ import annotations

import pytest

from onnxtrain.loop import Schedule
from onnxtrain.training.schedulers import cosine_lr, exponential_lr, linear_lr, step_lr


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"kind": "warm"}, "--schedule 'warm' is not a schedule"),
        ({"kind": "step"}, "--schedule step needs --step-size"),
        ({"kind": "exponential"}, "--schedule exponential needs --gamma"),
        ({"kind": "linear", "gamma": 0.5}, "--gamma applies to --schedule step and exponential, not linear"),
        ({"kind": "step", "step_size": 2, "warmup_steps": 3}, "--warmup-steps applies to"),
        ({"kind": "cosine", "min_lr": float("nan")}, "--min-lr must be a finite number"),
        ({"kind": "step", "step_size": 0}, "--step-size must be at least 1"),
    ],
)
def test_schedules_are_checked_in_the_commands_words(arguments: dict[str, object], message: str):
    with pytest.raises(ValueError, match=message):
        Schedule(**arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("schedule", "rate"),
    [
        (Schedule("linear", warmup_steps=3), lambda t: linear_lr(t, 3, 20, 0.5)),
        (Schedule("cosine", warmup_steps=2, min_lr=0.01), lambda t: cosine_lr(t, 2, 20, 0.5, 0.01)),
        (Schedule("step", step_size=4), lambda t: step_lr(t, 4, 0.5, 0.1)),
        (Schedule("exponential", gamma=0.9), lambda t: exponential_lr(t, 0.5, 0.9)),
    ],
)
def test_the_runtimes_schedulers(schedule: Schedule, rate) -> None:
    scheduler = schedule.scheduler(_optimizer(), 0.5, 20)
    assert [scheduler.lr_at(t) for t in range(20)] == [rate(t) for t in range(20)]


def test_a_warm_up_longer_than_the_run_and_a_floor_above_the_rate():
    with pytest.raises(ValueError, match="--warmup-steps 30 is more than the run's 20 optimizer steps"):
        Schedule("linear", warmup_steps=30).scheduler(_optimizer(), 0.5, 20)
    with pytest.raises(ValueError, match=r"--min-lr 1 is more than the learning rate 0\.5"):
        Schedule("cosine", min_lr=1.0).scheduler(_optimizer(), 0.5, 20)


def test_descriptions():
    assert Schedule("cosine", warmup_steps=10, min_lr=1e-5).describe(240) == (
        "cosine schedule over 240 steps, 10 of warm-up, down to 1e-05"
    )
    assert Schedule("step", step_size=5).describe(10) == "step schedule: times 0.1 every 5 steps"
    assert Schedule("exponential", gamma=0.5).describe(10) == "exponential schedule: times 0.5 every step"


def _optimizer():
    from onnxtrain import artifacts
    from onnxtrain.training import Module, Optimizer, TrainingState
    from tests.cli.helpers import tiny_mlp

    model = tiny_mlp()
    built = artifacts.build_artifacts(
        model, requires_grad=[t.name for t in model.graph.initializer], loss="CrossEntropyLoss", optimizer="SGD"
    )
    module = Module(built.training_model, TrainingState(built.checkpoint), built.eval_model)
    return Optimizer(built.optimizer_model, module)
