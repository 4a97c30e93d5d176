"""Python's side of benchmarks/web: the step time of the digits MLP in onnxtrain's runtime, on the same artifacts
and batch as the Node.js and Chromium figures (web/demo/make_assets.py's files).

    python benchmarks/web/python_step.py ASSETS [--warmup N] [--steps N] [--repeats N]

Prints a JSON object: the milliseconds per step of each repeat of ``module(x, y); optimizer.step();
module.lazy_reset_grad()`` (the fused step, onnxtrain's default), and of the same with ``fuse=False``
(the training and optimizer models run one after the other, as onnxtrain-web runs them).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def time_steps(assets: Path, fuse: bool, warmup: int, steps: int, repeats: int) -> list[float]:
    from onnxtrain.api import CheckpointState, Module, Optimizer

    manifest = json.loads((assets / "digits.json").read_text())
    size, features = manifest["batchSize"], manifest["features"]
    raw = (assets / "digits.bin").read_bytes()
    x = np.frombuffer(raw, "<f4", size * features).reshape(size, features).copy()
    y = np.frombuffer(raw, np.uint8, size, offset=4 * manifest["count"] * features).astype(np.int64)
    artifacts = assets / "artifacts"
    state = CheckpointState.load_checkpoint(str(artifacts / "checkpoint"))
    module = Module(str(artifacts / "training_model.onnx"), state, str(artifacts / "eval_model.onnx"))
    optimizer = Optimizer(str(artifacts / "optimizer_model.onnx"), module, fuse=fuse)
    optimizer.set_learning_rate(0.01)

    def step() -> None:
        module(x, y)
        optimizer.step()
        module.lazy_reset_grad()

    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(steps):
            step()
        times.append((time.perf_counter() - started) * 1e3 / steps)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("assets", type=Path)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import onnxruntime

    result = {
        "onnxruntime": onnxruntime.__version__,
        "fused": time_steps(args.assets, True, args.warmup, args.steps, args.repeats),
        "unfused": time_steps(args.assets, False, args.warmup, args.steps, args.repeats),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
