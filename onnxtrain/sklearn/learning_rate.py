"""Learning-rate schedules of scikit-learn's SGD estimators, with onnxcustom's class names.

The rate changes once per iteration (a pass over the data), ``t = 0, 1, ...``::

    constant     eta_t = eta0
    invscaling   eta_t = eta0 / (t + 1) ** power_t
    optimal      eta_t = eta0 * t0 / (t0 + t),  t0 = 1 / (alpha * eta_b),
                 eta_b = typw / max(1, 2 (1 + typw)),  typw = sqrt(1 / sqrt(alpha))

``optimal`` is scikit-learn's ``1 / (alpha (t0 + t))`` (with Léon Bottou's
heuristic for ``t0``) scaled so that it starts at ``eta0``, as onnxcustom
does. :class:`LearningRateSGDNesterov` adds momentum to the SGD update.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator
from typing import Any, Literal

import numpy as np

Schedule = Literal["constant", "invscaling", "optimal"]
SCHEDULES: tuple[str, ...] = ("constant", "invscaling", "optimal")


def _positive(owner: str, name: str, value: Any, *, zero: bool = False) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{owner}: {name} must be a finite number, not {value!r}")
    if value < 0 or (value == 0 and not zero):
        raise ValueError(f"{owner}: {name} must be {'>= 0' if zero else '> 0'}, not {value!r}")
    return float(value)


class BaseLearningRate:
    """A learning rate that changes once per iteration: ``init_learning_rate()``, then
    ``update_learning_rate(t)`` after iteration ``t``; ``value`` is the current rate."""

    def __init__(self) -> None:
        self.value_: float | None = None

    def init_learning_rate(self) -> BaseLearningRate:
        """Start a new training: the rate of iteration 0."""
        self.value_ = self.rate_at(0)
        return self

    def update_learning_rate(self, t: int) -> BaseLearningRate:
        """After iteration ``t`` (from 0): the rate of iteration ``t + 1``."""
        self.value_ = self.rate_at(t + 1)
        return self

    def rate_at(self, t: int) -> float:
        """The rate of iteration ``t``."""
        raise NotImplementedError

    @property
    def value(self) -> float:
        """The current learning rate."""
        if self.value_ is None:
            raise RuntimeError(f"{type(self).__name__}.init_learning_rate() was never called")
        return self.value_

    @property
    def needs_grad(self) -> bool:
        """Whether the update keeps state from past gradients (momentum)."""
        return False

    def loop(self, n: int = 1000) -> Iterator[float]:
        """The rates of the first ``n`` iterations."""
        self.init_learning_rate()
        for t in range(n):
            yield self.value
            self.update_learning_rate(t)

    @staticmethod
    def select(class_name: Any, **kwargs: Any) -> BaseLearningRate:
        """A learning rate from a name, a float or an instance (returned as it is).

        A float is ``eta0`` of :class:`LearningRateSGD`; names are
        ``"SGD"``/``"LearningRateSGD"``, ``"SGDNesterov"``/``"Nesterov"``/``"LearningRateSGDNesterov"``,
        or a schedule (``"constant"``, ``"invscaling"``, ``"optimal"``) of :class:`LearningRateSGD`.
        """
        if isinstance(class_name, BaseLearningRate):
            return class_name
        if isinstance(class_name, numbers.Real) and not isinstance(class_name, (bool, np.bool_)):
            return LearningRateSGD(float(class_name), **kwargs)
        if class_name in SCHEDULES:
            return LearningRateSGD(learning_rate=class_name, **kwargs)
        aliases: dict[str, type[LearningRateSGD]] = {
            "SGD": LearningRateSGD,
            "LearningRateSGD": LearningRateSGD,
            "SGDRegressor": LearningRateSGD,
            "SGDNesterov": LearningRateSGDNesterov,
            "Nesterov": LearningRateSGDNesterov,
            "LearningRateSGDNesterov": LearningRateSGDNesterov,
        }
        if isinstance(class_name, str) and class_name in aliases:
            return aliases[class_name](**kwargs)
        raise ValueError(
            f"learning_rate={class_name!r} is not a learning rate; pass a float (eta0), a schedule "
            f"{list(SCHEDULES)}, one of {list(aliases)}, or a LearningRateSGD instance"
        )


class LearningRateSGD(BaseLearningRate):
    """scikit-learn's ``SGDRegressor`` schedules (see the module docstring for the formulas).

    Args:
        eta0: the initial rate.
        alpha: the regularization constant the ``"optimal"`` schedule derives ``t0`` from.
        power_t: the exponent of ``"invscaling"``.
        learning_rate: ``"constant"``, ``"invscaling"`` or ``"optimal"``.
    """

    def __init__(
        self, eta0: float = 0.01, alpha: float = 0.0001, power_t: float = 0.25, learning_rate: Schedule = "invscaling"
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        if learning_rate not in SCHEDULES:
            raise ValueError(f"{owner}: learning_rate={learning_rate!r}; choose one of {list(SCHEDULES)}")
        self.eta0 = _positive(owner, "eta0", eta0)
        self.alpha = _positive(owner, "alpha", alpha)
        self.power_t = _positive(owner, "power_t", power_t, zero=True)
        self.learning_rate = learning_rate

    @property
    def optimal_init(self) -> float:
        """``t0`` of the ``"optimal"`` schedule."""
        typw = math.sqrt(1.0 / math.sqrt(self.alpha))
        eta_b = typw / max(1.0, 2.0 * (1.0 + typw))
        return 1.0 / (eta_b * self.alpha)

    def rate_at(self, t: int) -> float:
        if self.learning_rate == "constant":
            return self.eta0
        if self.learning_rate == "invscaling":
            return self.eta0 / (t + 1) ** self.power_t
        t0 = self.optimal_init
        return self.eta0 * t0 / (t0 + t)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(eta0={self.eta0!r}, alpha={self.alpha!r}, power_t={self.power_t!r}, "
            f"learning_rate={self.learning_rate!r}{self._extra_repr()})"
        )

    def _extra_repr(self) -> str:
        return ""


class LearningRateSGDNesterov(LearningRateSGD):
    """:class:`LearningRateSGD`'s schedules for SGD with momentum (Nesterov's by default).

    The update is ``torch.optim.SGD``'s: ``buf = momentum * buf + g``,
    ``p -= eta * (g + momentum * buf)`` (Nesterov) or ``p -= eta * buf``.
    """

    def __init__(
        self,
        eta0: float = 0.01,
        alpha: float = 0.0001,
        power_t: float = 0.25,
        learning_rate: Schedule = "invscaling",
        momentum: float = 0.9,
        nesterov: bool = True,
    ) -> None:
        super().__init__(eta0=eta0, alpha=alpha, power_t=power_t, learning_rate=learning_rate)
        self.momentum = _positive(type(self).__name__, "momentum", momentum)
        if not isinstance(nesterov, bool):
            raise TypeError(f"{type(self).__name__}: nesterov must be a bool, not {nesterov!r}")
        self.nesterov = nesterov

    @property
    def needs_grad(self) -> bool:
        return True

    def _extra_repr(self) -> str:
        return f", momentum={self.momentum!r}, nesterov={self.nesterov!r}"


__all__ = ["SCHEDULES", "BaseLearningRate", "LearningRateSGD", "LearningRateSGDNesterov", "Schedule"]
