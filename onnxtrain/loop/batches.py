"""Which samples go where: the validation split, each epoch's order, the batches, and a fingerprint of the data.

Everything is a function of the seed (and the epoch), never of a generator's
history, so that a run resumed at any step sees the samples an uninterrupted
run would have seen.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import numpy as np


def split(samples: int, val_split: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(train rows, validation rows)``: ``round(val_split * samples)`` rows (at least one) held out.

    The rows come from ``np.random.default_rng([seed]).permutation(samples)``:
    they depend on the seed alone. ``val_split == 0`` holds nothing out.
    """
    if not 0.0 <= val_split < 1.0:
        raise ValueError(f"the validation split is a fraction in (0, 1), not {val_split!r}")
    if val_split == 0.0:
        return np.arange(samples), np.arange(0)
    if samples < 2:
        raise ValueError(f"{samples} sample(s) cannot be split into training and validation data")
    held_out = min(max(round(val_split * samples), 1), samples - 1)
    order = np.random.default_rng([seed]).permutation(samples)
    return order[held_out:], order[:held_out]


def epoch_order(samples: int, seed: int, epoch: int) -> np.ndarray:
    """The order of the training rows in ``epoch`` (counted from 0): ``default_rng([seed, epoch]).permutation``."""
    return np.random.default_rng([seed, epoch]).permutation(samples)


def batch_count(samples: int, batch_size: int) -> int:
    """Batches per epoch; the last one holds the remaining samples (it may be smaller)."""
    return math.ceil(samples / batch_size)


def step_count(samples: int, batch_size: int, accumulate: int = 1) -> int:
    """Optimizer steps per epoch: one per ``accumulate`` batches, the last taking the batches that remain."""
    return math.ceil(batch_count(samples, batch_size) / accumulate)


def fingerprint(arrays: Sequence[np.ndarray]) -> str:
    """A short hash of the arrays' dtypes, shapes and bytes: the same data gives the same text."""
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()[:16]


__all__ = ["batch_count", "epoch_order", "fingerprint", "split", "step_count"]
