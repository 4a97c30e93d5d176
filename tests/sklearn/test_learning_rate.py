"""The learning-rate schedules (scikit-learn's, with onnxcustom's class names) and ``select``."""

from __future__ import annotations

import math

import pytest

from onnxtrain.sklearn import BaseLearningRate, LearningRateSGD, LearningRateSGDNesterov


def test_constant_invscaling_and_optimal_formulas() -> None:
    assert list(LearningRateSGD(0.1, learning_rate="constant").loop(3)) == [0.1, 0.1, 0.1]
    invscaling = list(LearningRateSGD(0.2, power_t=0.5).loop(4))
    assert invscaling == pytest.approx([0.2 / math.sqrt(t + 1) for t in range(4)], rel=1e-15)
    alpha = 0.01
    optimal = LearningRateSGD(0.3, alpha=alpha, learning_rate="optimal")
    typw = math.sqrt(1 / math.sqrt(alpha))
    t0 = 1 / (alpha * typw / max(1.0, 2 * (1 + typw)))  # scikit-learn's optimal_init (Bottou's heuristic)
    assert optimal.optimal_init == pytest.approx(t0, rel=1e-15)
    rates = list(optimal.loop(5))
    assert rates[0] == 0.3
    # proportional to scikit-learn's 1 / (alpha (t0 + t)), scaled to start at eta0
    assert [r / rates[0] for r in rates] == pytest.approx([t0 / (t0 + t) for t in range(5)], rel=1e-14)


def test_update_learning_rate_after_iteration_t_gives_the_rate_of_t_plus_one() -> None:
    schedule = LearningRateSGD(1.0, power_t=1.0)
    with pytest.raises(RuntimeError, match="init_learning_rate"):
        schedule.value  # noqa: B018
    assert schedule.init_learning_rate().value == 1.0
    assert schedule.update_learning_rate(0).value == 0.5
    assert schedule.update_learning_rate(3).value == 0.2


def test_select_names_floats_and_instances() -> None:
    instance = LearningRateSGDNesterov(momentum=0.5, nesterov=False)
    assert BaseLearningRate.select(instance) is instance
    from_float = BaseLearningRate.select(0.05)
    assert isinstance(from_float, LearningRateSGD) and from_float.eta0 == 0.05
    assert from_float.learning_rate == "invscaling"
    for name in ("constant", "invscaling", "optimal"):
        chosen = BaseLearningRate.select(name)
        assert type(chosen) is LearningRateSGD and chosen.learning_rate == name
    for name in ("SGD", "LearningRateSGD", "SGDRegressor"):
        assert type(BaseLearningRate.select(name)) is LearningRateSGD
    for name in ("Nesterov", "SGDNesterov", "LearningRateSGDNesterov"):
        chosen = BaseLearningRate.select(name, eta0=0.2)
        assert type(chosen) is LearningRateSGDNesterov and chosen.needs_grad and chosen.eta0 == 0.2
    assert not LearningRateSGD().needs_grad
    assert repr(instance).startswith("LearningRateSGDNesterov(eta0=0.01") and "nesterov=False" in repr(instance)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: LearningRateSGD(learning_rate="adaptive"), "learning_rate='adaptive'"),
        (lambda: LearningRateSGD(eta0=0.0), "eta0 must be > 0"),
        (lambda: LearningRateSGD(alpha=float("inf")), "alpha must be a finite number"),
        (lambda: LearningRateSGD(power_t=-1.0), "power_t must be >= 0"),
        (lambda: LearningRateSGDNesterov(momentum=0.0), "momentum must be > 0"),
        (lambda: BaseLearningRate.select("cyclic"), "learning_rate='cyclic' is not a learning rate"),
        (lambda: BaseLearningRate.select(True), "learning_rate=True is not a learning rate"),
    ],
)
def test_bad_values_are_refused(make: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()  # type: ignore[operator]


def test_nesterov_flag_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="nesterov must be a bool"):
        LearningRateSGDNesterov(nesterov="yes")  # type: ignore[arg-type]
