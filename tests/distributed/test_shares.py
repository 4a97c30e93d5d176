"""``batch_shares``, ``shard`` and ``batch_communicator``'s check as functions of the rank and size (a stand-in
communicator: no MPI needed)."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from onnxtrain.distributed.data import batch_communicator, batch_shares, shard


@dataclass
class Ranks:
    """What ``batch_shares``, ``shard`` and ``batch_communicator`` ask of a communicator."""

    rank: int
    size: int

    def Get_rank(self) -> int:  # mpi4py's names
        return self.rank

    def Get_size(self) -> int:
        return self.size


@given(rows=st.integers(0, 60), batch=st.integers(1, 7), size=st.integers(1, 4))
def test_batch_k_of_every_rank_is_its_part_of_global_batch_k(rows: int, batch: int, size: int) -> None:
    order = np.random.default_rng(rows).permutation(rows)
    shares = [batch_shares(order, batch, comm=Ranks(r, size)) for r in range(size)]
    assert len({len(s) for s in shares}) == 1  # the same number of rows, so of steps, on every rank
    usable = rows - rows % size
    assert sorted(np.concatenate(shares).tolist()) == sorted(order[:usable].tolist())
    for k, start in enumerate(range(0, usable, batch * size)):
        block = order[start : min(start + batch * size, usable)]
        parts = [s[k * batch : (k + 1) * batch] for s in shares]
        assert np.concatenate(parts).tolist() == block.tolist()


def test_shards_depend_on_the_seed_and_epoch_and_cover_the_rows() -> None:
    shards = [shard(10, seed=1, epoch=2, comm=Ranks(r, 3)) for r in range(3)]
    assert sorted(np.concatenate(shards).tolist()) == list(range(10)) and [len(s) for s in shards] == [4, 3, 3]
    assert shard(10, 1, 2, comm=Ranks(0, 3)).tolist() == shards[0].tolist()
    assert shard(10, 1, 3, comm=Ranks(0, 3)).tolist() != shards[0].tolist()
    assert shard(10, shuffle=False, comm=Ranks(1, 3)).tolist() == [1, 4, 7]


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        batch_shares(np.arange(4), 0, comm=Ranks(0, 2))
    with pytest.raises(ValueError, match="n_samples must be a count of rows"):
        shard(-1, comm=Ranks(0, 2))


@pytest.mark.parametrize(
    ("option", "suggestion"), [("--batch-size {}", "use --batch-size 6"), ("batch_size={}", "use batch_size=6")]
)
def test_a_batch_that_does_not_split_over_the_ranks_is_refused_naming_the_option(
    option: str, suggestion: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.excepthook", sys.excepthook)  # init's abort hook, undone after the test
    comm = Ranks(0, 3)
    assert batch_communicator(9, option, comm) is comm
    with pytest.raises(
        ValueError, match=f"{re.escape(option.format(7))} is not a multiple of the 3 ranks.*{suggestion}"
    ):
        batch_communicator(7, option, comm)
