"""PyTorch eager on the CPU: ``loss.backward(); opt.step(); opt.zero_grad()``.

The model is the workload's torch module with the exported initial weights
(``weights.npz``); AdamW is configured as ONNX Runtime's (eps 1e-6, no weight
decay). ``torch.set_num_threads`` gets ``--threads``, or the number of
physical cores: the size of onnxruntime's default intra-op thread pool.
On the epoch workloads too, the timed step is one step (``--spinning`` does
not apply to torch).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from benchmarks.measure import control, physical_cores, run_worker, time_steps, worker_arguments
from benchmarks.workers.common import Stopwatch, load_batches, load_spec


def train(args: argparse.Namespace) -> dict[str, Any]:
    watch = Stopwatch()
    import torch

    from benchmarks.workloads import ADAMW, WORKLOADS

    spec = load_spec(args.folder)
    batches = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in load_batches(args.folder)]
    watch.mark("import")
    threads = args.threads or physical_cores()
    torch.set_num_threads(threads)
    model = WORKLOADS[spec["name"]].build()
    with np.load(args.folder / "weights.npz") as weights:
        model.load_state_dict({name: torch.from_numpy(weights[name]) for name in weights.files})
    model.train()
    loss_fn = torch.nn.MSELoss() if spec["loss"] == "mse" else torch.nn.CrossEntropyLoss()
    parameters = list(model.parameters())
    lr = spec["learning_rate"]
    if spec["optimizer"] == "sgd":
        optimizer: torch.optim.Optimizer = torch.optim.SGD(parameters, lr=lr)
    else:
        optimizer = torch.optim.AdamW(parameters, lr=lr, **ADAMW)  # type: ignore[arg-type]
    watch.mark("setup")
    count = len(batches)

    def step(i: int) -> Any:
        x, y = batches[i % count]
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    timing = time_steps(step, args.warmup, args.steps, args.repeats, control(args))
    timing.pop("next_call")
    return {
        "framework": "pytorch",
        "workload": spec["name"],
        "versions": {"torch": torch.__version__},
        "threads": torch.get_num_threads(),
        **watch.marks,
        **timing,
    }


def main(args: argparse.Namespace) -> dict[str, Any]:
    if args.command != "train":
        return {"framework": "pytorch", "workload": load_spec(args.folder)["name"]}  # nothing to generate
    return train(args)


if __name__ == "__main__":
    sys.exit(run_worker(main, worker_arguments(__doc__ or "")))
