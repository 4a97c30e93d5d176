"""``session_options``: each rank's share of the machine's cores, used by ``fit`` and ``onnxtrain train``."""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

pytest.importorskip("mpi4py", reason="the MPI extra is not installed: pip install -e '.[mpi]'")

from onnxtrain.distributed import local_rank, local_size, session_options
from onnxtrain.distributed.sessions import rank_threads


class Machine:
    """A communicator whose ``Split_type`` gives this machine's ``ranks`` processes, this one ``rank``."""

    def __init__(self, rank: int, ranks: int) -> None:
        self.rank, self.ranks, self.freed = rank, ranks, 0

    def Split_type(self, kind: int) -> Machine:  # mpi4py's names
        from mpi4py import MPI

        assert kind == MPI.COMM_TYPE_SHARED
        return self

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return self.ranks

    def Free(self) -> None:
        self.freed += 1


@pytest.mark.parametrize(
    ("ranks_here", "allowed", "cores", "threads"),
    [(2, 2, 2, 1), (1, 8, 8, 8), (3, 8, 8, 2), (4, 2, 2, 1), (2, 1, 2, 1), (2, 4, 16, 4)],
    ids=["2-ranks-2-cores", "alone", "3-ranks-8-cores", "more-ranks-than-cores", "bound-to-1", "bound-to-4"],
)
def test_each_rank_takes_its_share_of_the_cores(ranks_here: int, allowed: int, cores: int, threads: int) -> None:
    """Bound by the launcher (fewer cores allowed than the machine has): the cores it was given."""
    assert rank_threads(ranks_here, allowed, cores) == threads


def test_the_options_share_the_cores_and_do_not_spin() -> None:
    machine = Machine(1, 2)
    options = session_options(machine)
    assert options.intra_op_num_threads == rank_threads(2)
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert (local_rank(machine), local_size(machine), machine.freed) == (1, 2, 3)  # each split freed


class Recorded:
    """Stands for ``Module`` in the module under test: records the session options it is made with."""

    def __init__(self, module_type: Any) -> None:
        self.module_type, self.options = module_type, []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.options.append(kwargs.get("session_options"))
        return self.module_type(*args, **kwargs)


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """A distributed run of one rank in this process (MPI's singleton); ``init``'s abort hook undone after."""
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)


def test_fit_makes_its_module_with_the_rank_s_options(monkeypatch: pytest.MonkeyPatch, one_rank: None) -> None:
    from onnxtrain.sklearn import optimizer as sklearn_optimizer
    from tests.distributed.batches import fit_setup

    recorded = Recorded(sklearn_optimizer.Module)
    monkeypatch.setattr(sklearn_optimizer, "Module", recorded)
    estimator, x, y = fit_setup("SGDOptimizer", distributed=True)
    estimator.fit(x, y)
    (options,) = recorded.options
    assert options is not None and options.intra_op_num_threads == rank_threads(1)
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_the_train_command_makes_its_module_with_the_rank_s_options(
    monkeypatch: pytest.MonkeyPatch, one_rank: None, tmp_path: Path
) -> None:
    from onnxtrain.cli import main
    from onnxtrain.loop import run
    from tests.cli.helpers import classification, tiny_mlp

    onnx.save(tiny_mlp(), tmp_path / "mlp.onnx")
    x, y = classification()
    np.savez(tmp_path / "data.npz", X=x, y=y)
    recorded = Recorded(run.Module)
    monkeypatch.setattr(run, "Module", recorded)
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["generate", str(tmp_path / "mlp.onnx"), "--requires-grad", "all-float", "--loss", "ce",
                     "-o", str(tmp_path / "artifacts")]) == 0  # fmt: skip
        for distributed in ([], ["--distributed"]):
            train = [
                "train",
                str(tmp_path / "artifacts"),
                "--data",
                str(tmp_path / "data.npz"),
                "--epochs",
                "1",
                "--batch-size",
                "8",
            ]
            assert main([*train, "--restart", *distributed]) == 0
    alone, ranked = recorded.options
    assert alone is None  # the runtime's own defaults
    assert ranked is not None and ranked.get_session_config_entry("session.intra_op.allow_spinning") == "0"
