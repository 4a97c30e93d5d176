"""The ranks' side of the distributed tests, run by ``mpiexec -n 2`` (see test_distributed.py).

``python worker.py train CASES.json OUT``: for each case, load the artifacts, broadcast rank 0's state,
train ``steps`` steps of ``accumulate`` micro-batches with each rank on its half of every batch, and save
the parameters and the losses to ``OUT/<case>-rank<r>.npz``.
``python worker.py shard OUT``: each rank's shards of 3 epochs, to ``OUT/shard-rank<r>.npz``.
``python worker.py fail``: rank 1 raises while rank 0 waits in an all-reduce.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from onnxtrain import api, distributed

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.distributed.batches import batches


def train(cases_file: str, out: str) -> None:
    """Each case: ``steps`` steps from the checkpoint ``load`` (default: the artifacts'), on the batches from
    number ``first`` on, on ``device`` (default ``cpu``); ``epoch``: by ``Module.train_epoch`` over this rank's
    rows; ``save``: rank 0 writes the checkpoint there at the end; ``reduce_on_device``: the
    ``DistributedOptimizer``'s (default ``None``)."""
    comm = distributed.init()
    rank, size = distributed.rank(), distributed.size()
    for case in json.loads(Path(cases_file).read_text()):
        folder = Path(case["artifacts"])
        state = api.CheckpointState.load_checkpoint(case.get("load", str(folder / "checkpoint")))
        device = case.get("device", "cpu")
        module = api.Module(str(folder / "training_model.onnx"), state, str(folder / "eval_model.onnx"), device=device)
        optimizer = api.Optimizer(str(folder / "optimizer_model.onnx"), module)
        if rank != 0:  # rank 0's values must win the broadcast
            for name, parameter in state.parameters:
                state.parameters[name] = (parameter.data + 1).astype(parameter.data.dtype)  # the scaler's int64 too
        distributed.broadcast_parameters(state, root=0)
        optimizer = distributed.DistributedOptimizer(optimizer, reduce_on_device=case.get("reduce_on_device"))
        optimizer.set_learning_rate(case["learning_rate"])
        first = case.get("first", 0)
        data = list(batches(case, first + case["steps"] * case["accumulate"]))[first:]
        part = case["rows"] // size
        parts = [(x[rank * part : (rank + 1) * part], y[rank * part : (rank + 1) * part]) for x, y in data]
        losses = []
        if case.get("epoch"):  # this rank's halves of the batches, one after the other, as one pass
            xs, ys = (np.concatenate([p[k] for p in parts]) for k in (0, 1))
            losses = list(module.train_epoch(optimizer, xs, ys, part))
        else:
            for x, y in parts:
                losses.append(float(np.asarray(module(x, y))))
                if len(losses) % case["accumulate"] == 0:
                    optimizer.step()
                    module.lazy_reset_grad()
        if "save" in case and rank == 0:
            api.CheckpointState.save_checkpoint(state, case["save"], include_optimizer_state=True)
        arrays = {f"param:{name}": p.data for name, p in state.parameters}
        path = {"on_device": optimizer.reduces_on_device, "cuda_aware": distributed.cuda_aware()}
        np.savez(Path(out) / f"{case['name']}-rank{rank}.npz", losses=np.array(losses), **arrays, **path)
    comm.Barrier()


def shard(out: str) -> None:
    distributed.init()
    shards = {f"epoch{e}": distributed.shard(23, seed=5, epoch=e) for e in range(3)}
    np.savez(Path(out) / f"shard-rank{distributed.rank()}.npz", **shards)


def fit(out: str) -> None:
    """``OrtGradientOptimizer(..., distributed=True).fit`` on every rank with the same data
    (:func:`tests.distributed.batches.fit_setup`); the weights and losses to ``OUT/fit-<optimizer>-rank<r>.npz``."""
    from tests.distributed.batches import fit_setup

    for name in ("SGDOptimizer", "AdamWOptimizer"):
        estimator, x, y = fit_setup(name, distributed=True)
        estimator.fit(x, y)
        arrays = {f"param:{k}": v for k, v in estimator.trained_coef_.items()}
        np.savez(Path(out) / f"fit-{name}-rank{distributed.rank()}.npz", losses=estimator.train_losses_, **arrays)


def fail() -> None:
    comm = distributed.init()
    if distributed.rank() == 1:
        raise RuntimeError("a planted failure on rank 1")
    comm.allreduce(1)  # rank 0 waits here for rank 1, which never comes


if __name__ == "__main__":
    command, *arguments = sys.argv[1:]
    {"train": train, "shard": shard, "fit": fit, "fail": fail}[command](*arguments)
