"""The split, the epoch order and the fingerprint depend on the seed and the data only."""

from __future__ import annotations

import numpy as np
import pytest

from onnxtrain.loop import batch_count, epoch_order, fingerprint, split


def test_the_split_depends_on_the_seed_alone():
    train, val = split(100, 0.2, seed=4)
    assert len(val) == 20 and len(train) == 80
    assert sorted(np.concatenate([train, val]).tolist()) == list(range(100))
    again = split(100, 0.2, seed=4)
    np.testing.assert_array_equal(train, again[0])
    assert not np.array_equal(val, split(100, 0.2, seed=5)[1])


def test_no_split_and_tiny_splits():
    train, val = split(10, 0.0, seed=0)
    assert train.tolist() == list(range(10)) and val.size == 0
    assert len(split(10, 0.01, seed=0)[1]) == 1  # at least one held out
    assert len(split(10, 0.99, seed=0)[0]) == 1  # at least one trained on
    with pytest.raises(ValueError, match="cannot be split"):
        split(1, 0.5, seed=0)
    with pytest.raises(ValueError, match="fraction"):
        split(10, 1.0, seed=0)


def test_the_epoch_order_is_a_function_of_seed_and_epoch():
    np.testing.assert_array_equal(epoch_order(50, 1, 3), np.random.default_rng([1, 3]).permutation(50))
    assert not np.array_equal(epoch_order(50, 1, 3), epoch_order(50, 1, 4))


def test_batch_count_includes_the_partial_batch():
    assert (batch_count(96, 16), batch_count(97, 16), batch_count(1, 16)) == (6, 7, 1)


def test_the_fingerprint_sees_values_dtypes_and_shapes():
    a = np.arange(6, dtype=np.float32)
    base = fingerprint([a])
    assert fingerprint([a.copy()]) == base
    assert fingerprint([a + 1]) != base
    assert fingerprint([a.astype(np.float64)]) != base
    assert fingerprint([a.reshape(2, 3)]) != base
