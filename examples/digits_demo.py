"""The whole pipeline on data that ships with scikit-learn: handwritten digits (8x8 images).

1. build a forward-only MLP as an ONNX model with blocks;
2. ``generate_artifacts``: training, eval and optimizer models and a checkpoint;
3. train with ONNX Runtime's training API names (``onnxtrain.api``) on stock onnxruntime;
4. export an inference model and measure its accuracy on held-out digits.

Run: ``make demo`` (or ``python examples/digits_demo.py [--epochs N]``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from sklearn.datasets import load_digits

import onnxtrain.onnxblock as onnxblock
from onnxtrain import artifacts
from onnxtrain.api import CheckpointState, CosineLRScheduler, Module, Optimizer


class DigitsMLP(onnxblock.ForwardBlock):
    """pixels [batch, 64] -> Linear(64, 64) -> Relu -> Linear(64, 10) -> class scores."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = onnxblock.blocks.Linear(64, 64, seed=0)
        self.relu = onnxblock.blocks.Relu()
        self.scores = onnxblock.blocks.Linear(64, 10, seed=1)

    def build(self, pixels: str) -> str:
        return self.scores(self.relu(self.hidden(pixels)))


def forward_model() -> onnx.ModelProto:
    """The MLP as a forward-only ONNX model with a symbolic batch dimension."""
    net = DigitsMLP()
    with onnxblock.empty_base() as base:
        base.add_input("pixels", onnx.helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, ["batch", 64]))
        net("pixels")
    return net.to_model_proto()


def main(folder: Path, epochs: int = 30, batch: int = 32) -> float:
    """Train on 1,437 digits, report the accuracy on the other 360; return it. Artifacts go to ``folder``."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))
    train, test = order[:-360], order[-360:]

    model = forward_model()
    parameters = [t.name for t in model.graph.initializer]
    (scores,) = [o.name for o in model.graph.output]
    artifacts.generate_artifacts(
        model,
        requires_grad=parameters,
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=folder,
    )
    print(f"artifacts in {folder}: {sorted(p.name for p in folder.iterdir())}")

    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    module = Module(folder / "training_model.onnx", state, folder / "eval_model.onnx")
    optimizer = Optimizer(folder / "optimizer_model.onnx", module)
    steps_per_epoch = len(train) // batch
    scheduler = CosineLRScheduler(
        optimizer, warmup_step_count=steps_per_epoch, total_step_count=epochs * steps_per_epoch, initial_lr=1e-2
    )
    rng = np.random.default_rng(1)
    start = time.perf_counter()
    for epoch in range(epochs):
        module.train()
        losses = []
        shuffled = rng.permutation(train)
        for step in range(steps_per_epoch):
            rows = shuffled[step * batch : (step + 1) * batch]
            losses.append(float(np.asarray(module(x[rows], y[rows]))))
            optimizer.step()
            scheduler.step()
            module.lazy_reset_grad()
        if epoch % 10 == 0 or epoch == epochs - 1:
            module.eval()
            eval_loss = float(np.asarray(module(x[test], y[test])))
            print(f"epoch {epoch:3d}: train loss {np.mean(losses):.4f}, held-out loss {eval_loss:.4f}")
    seconds = time.perf_counter() - start
    print(f"{epochs * steps_per_epoch} steps in {seconds:.2f} s ({epochs * steps_per_epoch / seconds:.0f} steps/s)")

    inference = folder / "digits.onnx"
    module.export_model_for_inferencing(inference, [scores])
    session = ort.InferenceSession(str(inference), providers=["CPUExecutionProvider"])
    predicted = session.run(None, {"pixels": x[test]})[0].argmax(axis=1)
    accuracy = float((predicted == y[test]).mean())
    print(f"exported {inference.name}: accuracy on 360 held-out digits {accuracy:.1%}")
    return accuracy


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path("artifacts/digits"), help="where the artifacts go")
    arguments = parser.parse_args()
    main(arguments.out, arguments.epochs)
