"""The demo's pieces: scikit-learn's handwritten digits, an MLP for them built with blocks, the loss-curve plot.

scikit-learn and matplotlib are the ``demo`` extra; :func:`require_extras`
says how to install them when they are missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

import onnxtrain.onnxblock as onnxblock
from onnxtrain.cli.common import CommandError
from onnxtrain.loop import EpochLosses

#: Digits the demo holds out (of 1,797) to measure the accuracy on.
HELD_OUT = 360


def require_extras() -> None:
    """``CommandError`` unless scikit-learn and matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
        import sklearn  # noqa: F401
    except ImportError as error:
        raise CommandError(
            f'the demo needs scikit-learn and matplotlib ({error.name} is missing): pip install "onnxtrain[demo]"'
        ) from None


def load() -> tuple[np.ndarray, np.ndarray]:
    """``(pixels, labels)``: 1,797 images of 8x8 pixels scaled to [0, 1] (float32 [N, 64]), labels int64 [N]."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    return (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int64)


class DigitsMLP(onnxblock.ForwardBlock):
    """pixels [batch, 64] -> Linear(64, 64) -> Relu -> Linear(64, 10) -> class scores."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.hidden = onnxblock.blocks.Linear(64, 64, seed=2 * seed)
        self.relu = onnxblock.blocks.Relu()
        self.scores = onnxblock.blocks.Linear(64, 10, seed=2 * seed + 1)

    def build(self, pixels: str) -> str:
        return self.scores(self.relu(self.hidden(pixels)))


def forward_model(seed: int) -> onnx.ModelProto:
    """The MLP as a forward-only ONNX model with a symbolic batch dimension; ``seed`` draws its weights."""
    net = DigitsMLP(seed)
    with onnxblock.empty_base() as base:
        base.add_input("pixels", onnx.helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, ["batch", 64]))
        net("pixels")
    return net.to_model_proto()


def plot_losses(history: Sequence[EpochLosses], path: Path) -> None:
    """A PNG of the training and held-out loss per epoch (matplotlib's Agg canvas; pyplot's state untouched)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 4), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    epochs = [entry.epoch for entry in history]
    axes.plot(epochs, [entry.train_loss for entry in history], label="training")
    axes.plot(epochs, [entry.val_loss for entry in history], label="held-out")
    axes.set_xlabel("epoch")
    axes.set_ylabel("cross-entropy loss")
    axes.set_yscale("log")
    axes.set_title("onnxtrain demo: an MLP on scikit-learn's digits")
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, format="png")


__all__ = ["HELD_OUT", "DigitsMLP", "forward_model", "load", "plot_losses", "require_extras"]
