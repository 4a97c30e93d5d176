"""Data-parallel training on MPI: ``mpiexec -n 2`` runs tests/distributed/worker.py, on one machine over
loopback, and the results are compared here with one process training on the whole batches.

Skipped, saying why, only where the MPI extra is not installed (``pip install -e '.[mpi]'``; ``make test``
installs it)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxtrain import api, optim
from onnxtrain.artifacts import LossType, OptimType
from tests.distributed.batches import batches
from tests.training import models

#: One mpiexec job at a time: each starts ranks of its own, which would oversubscribe the cores.
pytestmark = pytest.mark.xdist_group("mpiexec")

WORKER = Path(__file__).with_name("worker.py")
TIMEOUT = 120  # seconds for one mpiexec run


@pytest.fixture(scope="module")
def mpiexec() -> str:
    pytest.importorskip("mpi4py", reason="the MPI extra is not installed: pip install -e '.[mpi]'")
    found = shutil.which("mpiexec", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    if found is None:
        pytest.skip("mpi4py is installed but no mpiexec was found: pip install -e '.[mpi]' (MPICH's wheel has one)")
    return found


def run_ranks(mpiexec: str, *arguments: str, ranks: int = 2) -> subprocess.CompletedProcess[str]:
    """``mpiexec -n ranks python worker.py arguments``, bounded in time."""
    command = [mpiexec, "-n", str(ranks), sys.executable, str(WORKER), *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, check=False, env=MPI_ENVIRONMENT)


#: Open MPI refuses to run as root (containers, CI) and more ranks than cores unless told; MPICH ignores these.
MPI_ENVIRONMENT = os.environ | {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
}


OPTIMIZERS: dict[str, Any] = {"sgd-momentum": optim.SGD(momentum=0.9), "adamw": OptimType.AdamW}


def _case(tmp_path: Path, optimizer: str, dtype: str, accumulate: int, *, scaled: bool = False) -> dict[str, Any]:
    name = f"{optimizer}-{dtype}-accumulate{accumulate}{'-loss-scaled' if scaled else ''}"
    elem = onnx.TensorProto.DOUBLE if dtype == "float64" else onnx.TensorProto.FLOAT
    folder = tmp_path / name
    models.generate(folder, models.mlp((4, 8, 3), seed=3, elem_type=elem), loss=LossType.MSELoss,
                    optimizer=OPTIMIZERS[optimizer], loss_scaling=scaled)  # fmt: skip
    return {"name": name, "artifacts": str(folder), "dtype": dtype, "accumulate": accumulate, "steps": 4,
            "rows": 8, "seed": 17, "learning_rate": 0.05}  # fmt: skip


def _one_process(case: dict[str, Any]) -> dict[str, np.ndarray]:
    """The parameters after the case's steps (all of its batches) in one process, on the whole batches."""
    folder = Path(case["artifacts"])
    state = api.CheckpointState.load_checkpoint(str(folder / "checkpoint"))
    module = api.Module(
        str(folder / "training_model.onnx"), state, str(folder / "eval_model.onnx"), device=case.get("device", "cpu")
    )
    optimizer = api.Optimizer(str(folder / "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(case["learning_rate"])
    total = case.get("first", 0) + case["steps"] * case["accumulate"]
    for index, (x, y) in enumerate(batches(case, total), start=1):
        module(x, y)
        if index % case["accumulate"] == 0:
            optimizer.step()
            module.lazy_reset_grad()
    return {name: p.data for name, p in state.parameters}


def test_two_ranks_on_half_batches_equal_one_process_on_whole_batches(mpiexec: str, tmp_path: Path) -> None:
    """SGD with momentum and AdamW, float32 and float64, with and without gradient accumulation, reduced through
    host memory and (``reduce_on_device=True``) in a flat buffer onnxruntime packs on the module's device, and
    AdamW with loss scaling; rank 1 starts from other parameters, which the broadcast replaces with rank 0's."""
    cases = [
        _case(tmp_path, optimizer, dtype, accumulate)
        for optimizer in OPTIMIZERS
        for dtype in ("float32", "float64")
        for accumulate in (1, 2)
    ]
    cases += [case | {"name": f"{case['name']}-on-device", "reduce_on_device": True} for case in cases[1::2]]
    cases.append(_case(tmp_path, "adamw", "float32", 2, scaled=True))  # the loss scaler's state stays in step
    out = _run_cases(mpiexec, tmp_path, cases, 2, "out")
    for case in cases:
        expected = _one_process(case)
        rtol = 1e-12 if case["dtype"] == "float64" else 1e-6
        _assert_ranks_equal(out, case, expected, 2, rtol=rtol, atol=rtol * 1e-2)
        ranks = [np.load(out / f"{case['name']}-rank{r}.npz") for r in (0, 1)]
        assert not np.array_equal(ranks[0]["losses"], ranks[1]["losses"])  # each rank saw its own half
        assert all(bool(saved["on_device"]) == case.get("reduce_on_device", False) for saved in ranks)


def _run_cases(mpiexec: str, tmp_path: Path, cases: list[dict[str, Any]], ranks: int, tag: str) -> Path:
    spec = tmp_path / f"{tag}.json"
    spec.write_text(json.dumps(cases))
    out = tmp_path / tag
    out.mkdir()
    done = run_ranks(mpiexec, "train", str(spec), str(out), ranks=ranks)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _assert_ranks_equal(
    out: Path,
    case: dict[str, Any],
    expected: dict[str, np.ndarray],
    ranks: int,
    rtol: float = 1e-12,
    atol: float = 1e-14,
) -> None:
    """Every rank's parameters after ``case`` (saved in ``out``) equal ``expected``."""
    for rank in range(ranks):
        saved = np.load(out / f"{case['name']}-rank{rank}.npz")
        for name, value in expected.items():
            np.testing.assert_allclose(
                saved[f"param:{name}"], value, rtol=rtol, atol=atol, err_msg=f"{case['name']}: {name}, rank {rank}"
            )


@pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(), reason="no CUDA here")
def test_on_cuda_two_ranks_equal_one_process(mpiexec: str, tmp_path: Path) -> None:
    """Both ranks on the GPU: the gradients stay on it where MPI is CUDA-aware, else go through one host buffer
    per all-reduce (MPICH's wheel is not CUDA-aware); the parameters equal one process's on the GPU (float32,
    1e-5)."""
    cases = [_case(tmp_path, optimizer, "float32", 1) | {"device": "cuda"} for optimizer in OPTIMIZERS]
    out = _run_cases(mpiexec, tmp_path, cases, 2, "cuda")
    for case in cases:
        _assert_ranks_equal(out, case, _one_process(case), 2, rtol=1e-5, atol=1e-7)
        for rank in (0, 1):
            saved = np.load(out / f"{case['name']}-rank{rank}.npz")
            assert bool(saved["on_device"]) == bool(saved["cuda_aware"])  # reduce_on_device=None's choice


def test_train_epoch_with_a_distributed_optimizer_averages_every_step(mpiexec: str, tmp_path: Path) -> None:
    """``Module.train_epoch`` over each rank's halves runs the per-step loop, all-reducing at every step."""
    case = _case(tmp_path, "adamw", "float64", 1) | {"name": "epoch", "epoch": True}
    out = _run_cases(mpiexec, tmp_path, [case], 2, "epoch")
    _assert_ranks_equal(out, case, _one_process(case), 2)


@pytest.mark.parametrize("ranks", [3, 1])
def test_a_checkpoint_of_two_ranks_resumes_on_more_or_fewer(mpiexec: str, tmp_path: Path, ranks: int) -> None:
    """Rank 0 writes the checkpoint after 2 steps on 2 ranks; 3 ranks (or 1) resume from it for 2 more steps:
    the parameters of 4 uninterrupted steps in one process."""
    start = _case(tmp_path, "adamw", "float64", 1) | {"rows": 12, "steps": 2}
    start |= {"name": "start", "save": str(tmp_path / "checkpoint")}
    _run_cases(mpiexec, tmp_path, [start], 2, "start")
    resumed = start | {"name": "resumed", "load": start["save"], "first": 2}
    resumed.pop("save")
    out = _run_cases(mpiexec, tmp_path, [resumed], ranks, "resumed")
    _assert_ranks_equal(out, resumed, _one_process(resumed | {"first": 0, "steps": 4}), ranks)


def test_batchnorm_running_statistics_are_the_ranks_average(mpiexec: str, tmp_path: Path) -> None:
    """One step on 2 ranks: each rank's running mean and variance equal the average of those one process
    leaves after the same step on each half of the batch alone (float32, to 1e-6)."""
    folder = tmp_path / "batchnorm"
    models.generate(folder, models.batchnorm_mlp(seed=2), requires_grad=["W", "bn.scale", "bn.bias"],
                    frozen_params=["bn.mean", "bn.var"], loss=LossType.MSELoss, optimizer=OptimType.AdamW)  # fmt: skip
    case = {"name": "batchnorm", "artifacts": str(folder), "dtype": "float32", "accumulate": 1, "steps": 1,
            "rows": 8, "seed": 4, "learning_rate": 0.05}  # fmt: skip
    on_device = case | {"name": "batchnorm-on-device", "reduce_on_device": True}
    out = _run_cases(mpiexec, tmp_path, [case, on_device], 2, "bn")
    ((x, y),) = batches(case, 1)
    halves = []
    for half in (slice(0, 4), slice(4, 8)):
        state = api.CheckpointState.load_checkpoint(str(folder / "checkpoint"))
        module = api.Module(str(folder / "training_model.onnx"), state, str(folder / "eval_model.onnx"))
        module(x[half], y[half])
        halves.append({name: state.parameters[name].data for name in ("bn.mean", "bn.var")})
    for rank, tag in itertools.product((0, 1), ("batchnorm", "batchnorm-on-device")):
        saved = np.load(out / f"{tag}-rank{rank}.npz")
        for name in ("bn.mean", "bn.var"):
            expected = (halves[0][name] + halves[1][name]) / 2
            assert not np.allclose(halves[0][name], halves[1][name])  # the halves' statistics differ
            np.testing.assert_allclose(saved[f"param:{name}"], expected, rtol=1e-6, err_msg=f"{name}, rank {rank}")


def test_fit_on_two_ranks_gives_the_weights_and_losses_of_one_process(mpiexec: str, tmp_path: Path) -> None:
    """``OrtGradientOptimizer(distributed=True)``: each rank on half of every batch (the last batch of 2 rows
    too), SGD and AdamW on each batch's mean loss, the ranks' mean gradients averaged."""
    from tests.distributed.batches import fit_setup

    done = run_ranks(mpiexec, "fit", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("SGDOptimizer", "AdamWOptimizer"):
        estimator, x, y = fit_setup(name, distributed=False)
        estimator.fit(x, y)
        for rank in (0, 1):
            saved = np.load(tmp_path / f"fit-{name}-rank{rank}.npz")
            np.testing.assert_allclose(saved["losses"], estimator.train_losses_, rtol=1e-12, err_msg=name)
            for key, value in estimator.trained_coef_.items():
                np.testing.assert_allclose(saved[f"param:{key}"], value, rtol=1e-12, err_msg=f"{name}: {key}")


@pytest.mark.parametrize("accumulate", [1, 3])
def test_the_train_command_on_two_ranks_gives_the_run_of_one_process(
    mpiexec: str, tmp_path: Path, accumulate: int
) -> None:
    """``mpiexec -n 2 python -m onnxtrain train ... --distributed`` against ``onnxtrain train`` in one process:
    the same parameters, optimizer step and losses per epoch (cross-entropy, AdamW, float32; 90 training rows
    in batches of 8, the last of 2; with ``--accumulate 3``, 4 steps an epoch, the last of 8 + 8 + 2 rows),
    rank 0 alone writing the checkpoint."""
    import contextlib
    import io

    from onnxtrain import checkpoint
    from onnxtrain.cli import main
    from tests.cli.helpers import classification, tiny_mlp

    onnx.save(tiny_mlp(), tmp_path / "mlp.onnx")
    x, y = classification()
    np.savez(tmp_path / "data.npz", X=x, y=y)
    generate = ["generate", str(tmp_path / "mlp.onnx"), "--requires-grad", "all-float", "--loss", "ce", "--lr", "0.05"]
    train = ["--data", str(tmp_path / "data.npz"), "--epochs", "2", "--batch-size", "8", "--val-split", "0.25",
             "--accumulate", str(accumulate)]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        for name in ("single", "ranks"):
            assert main([*generate, "-o", str(tmp_path / name)]) == 0
        assert main(["train", str(tmp_path / "single"), *train]) == 0
    command = [mpiexec, "-n", "2", sys.executable, "-m", "onnxtrain", "train", str(tmp_path / "ranks"), *train,
               "--distributed"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, check=False, env=MPI_ENVIRONMENT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("done:") == 1  # rank 0 alone reports
    single, ranks = (checkpoint.load(tmp_path / name / "trained_checkpoint") for name in ("single", "ranks"))
    assert ranks.optimizer.step == single.optimizer.step == 2 * -(-12 // accumulate)
    for name, value in single.parameters.items():
        np.testing.assert_allclose(ranks.parameters[name], value, rtol=1e-5, atol=1e-7, err_msg=name)
    for key in ("onnxtrain.run.history",):
        assert key in ranks.properties
    history = {name: json.loads(str(state.properties["onnxtrain.run.history"])) for name, state in
               (("single", single), ("ranks", ranks))}  # fmt: skip
    for a, b in zip(history["single"], history["ranks"], strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5)


def test_shards_are_disjoint_cover_the_rows_and_change_with_the_epoch(mpiexec: str, tmp_path: Path) -> None:
    done = run_ranks(mpiexec, "shard", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    shards = [np.load(tmp_path / f"shard-rank{r}.npz") for r in (0, 1)]
    for epoch in range(3):
        first, second = (s[f"epoch{epoch}"] for s in shards)
        assert sorted([*first, *second]) == list(range(23))
        assert abs(len(first) - len(second)) <= 1
    assert not np.array_equal(shards[0]["epoch0"], shards[0]["epoch1"])


def test_a_failing_rank_aborts_the_job_with_its_rank_and_error(mpiexec: str) -> None:
    start = time.monotonic()
    done = run_ranks(mpiexec, "fail")
    assert done.returncode != 0
    assert time.monotonic() - start < TIMEOUT  # no hang: the other rank was waiting in an all-reduce
    assert "rank 1 of 2 failed" in done.stderr and "a planted failure on rank 1" in done.stderr
