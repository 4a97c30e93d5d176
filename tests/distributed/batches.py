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
