"""The batches of a distributed test case, the same in the ranks and in the single process they match."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np


def batches(case: Mapping[str, Any], count: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``count`` batches ``(x [rows, 4], y [rows, 3])`` of the case's dtype, drawn from its seed."""
    rng = np.random.default_rng(case["seed"])
    dtype = np.dtype(case["dtype"])
    for _ in range(count):
        yield (
            rng.normal(size=(case["rows"], 4)).astype(dtype),
            rng.normal(size=(case["rows"], 3)).astype(dtype),
        )


def fit_setup(optimizer: str, *, distributed: bool) -> tuple[Any, np.ndarray, np.ndarray]:
    """An ``OrtGradientOptimizer`` over a linear regression (42 rows, batches of 8: the last of 2), and its data."""
    from onnxtrain.sklearn import OrtGradientOptimizer, add_loss_output
    from tests.sklearn.test_optimizer import data, linear

    x, y = data(42)
    estimator = OrtGradientOptimizer(add_loss_output(linear()), ["coef", "intercept"], max_iter=5, batch_size=8,
                                     training_optimizer_name=optimizer, learning_rate=0.01, random_state=3,
                                     distributed=distributed)  # fmt: skip
    return estimator, x, y
