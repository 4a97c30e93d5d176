"""The workloads: a torch model, its data, its loss and optimizer, and how long to time it.

Every framework trains the same model from the same initial weights on the
same batches: the model is built once in torch (seeded), exported to ONNX for
onnxtrain and onnxruntime-training, and its state dict is saved for PyTorch.
torch is imported inside the functions, so that this module loads without it.

The ``*-epoch`` workloads (``epoch=True``) hold a whole data set of
``data_batches`` batches in memory: onnxtrain times ``Module.train_epoch`` over
it (one onnxruntime call per pass) and reports the pass's time per batch; the
other frameworks run their usual per-step loop over the same batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    import torch

Loss = Literal["mse", "ce"]
Optim = Literal["sgd", "adamw"]
Dataset = Literal["random", "digits"]
#: Batches of the per-step workloads, cycled through by the timed steps.
STEP_BATCHES = 4

#: AdamW as ONNX Runtime's ``OptimType.AdamW`` and onnxtrain's default build it;
#: torch's AdamW is configured the same way (its own defaults differ: eps=1e-8, weight_decay=0.01).
ADAMW = {"betas": (0.9, 0.999), "eps": 1e-6, "weight_decay": 0.0}


@dataclass(frozen=True)
class Workload:
    """A model, its inputs and its training set-up.

    ``input_shape`` excludes the batch axis; ``classes`` is the number of
    classes for cross-entropy (labels int64[batch]); for MSE the target has
    the model output's shape. ``steps`` is the number of timed steps per repeat.
    ``data_batches`` is the number of batches in the data (cycled by the steps);
    ``dataset`` where they come from; ``epoch``: onnxtrain times whole passes
    over them with ``train_epoch`` (see the module docstring).
    """

    name: str
    title: str
    batch: int
    input_shape: tuple[int, ...]
    loss: Loss
    optimizer: Optim
    learning_rate: float
    steps: int
    quick_steps: int
    classes: int = 0
    data_batches: int = STEP_BATCHES
    dataset: Dataset = "random"
    epoch: bool = False

    def build(self) -> torch.nn.Module:
        """The torch model, with deterministic initial weights."""
        import torch

        torch.manual_seed(0)
        return _BUILDERS[self.name]()

    def batches(self, count: int, output_shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """``count`` batches: inputs ``[count, batch, *input_shape]`` float32 and targets (labels or values)."""
        if self.dataset == "digits":
            return _digits(count, self.batch)
        rng = np.random.default_rng(1234)
        x = rng.standard_normal((count, self.batch, *self.input_shape), dtype=np.float32)
        if self.loss == "ce":
            y = rng.integers(0, self.classes, size=(count, self.batch), dtype=np.int64)
        else:
            y = rng.standard_normal((count, *output_shape), dtype=np.float32)
        return x, y


def _digits(count: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits (8x8 images scaled to [0, 1], labels 0-9): the first ``count * batch`` rows as
    ``[count, batch, 64]`` float32 and ``[count, batch]`` int64; random data of that shape without scikit-learn."""
    rows = count * batch
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        rng = np.random.default_rng(1234)
        x = rng.random((rows, 64), dtype=np.float32)
        y = rng.integers(0, 10, size=rows, dtype=np.int64)
    else:
        digits = load_digits()
        if len(digits.data) < rows:
            raise ValueError(f"digits has {len(digits.data)} rows, fewer than {count} batches of {batch}")
        x = (digits.data[:rows] / 16.0).astype(np.float32)
        y = digits.target[:rows].astype(np.int64)
    return x.reshape(count, batch, 64), y.reshape(count, batch)


def _linear() -> torch.nn.Module:
    import torch

    return torch.nn.Linear(10, 1)


def _mlp() -> torch.nn.Module:
    import torch

    return torch.nn.Sequential(
        torch.nn.Linear(784, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )


def _digits_mlp() -> torch.nn.Module:
    import torch

    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def _cnn() -> torch.nn.Module:
    import torch

    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(32 * 7 * 7, 10),
    )


def _transformer(layer_norm_as_ops: bool = False) -> torch.nn.Module:
    import torch

    class LayerNormOps(torch.nn.LayerNorm):
        """``nn.LayerNorm`` written with elementary operations, which export as ReduceMean, Sub, Pow, Sqrt, Div."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            mean = x.mean(-1, keepdim=True)
            centered = x - mean
            variance = (centered * centered).mean(-1, keepdim=True)
            return centered / torch.sqrt(variance + self.eps) * self.weight + self.bias

    norm = LayerNormOps if layer_norm_as_ops else torch.nn.LayerNorm

    class EncoderLayer(torch.nn.Module):
        """``nn.TransformerEncoderLayer(256, 4, 1024, dropout=0, batch_first=True)`` (post-norm, ReLU), spelled out.

        torch 2.13's TorchScript exporter cannot trace ``nn.MultiheadAttention``
        in training mode (``scaled_dot_product_attention`` gets a tensor
        ``is_causal``), so attention is written with matmuls and softmax.
        """

        def __init__(self, d: int = 256, heads: int = 4, ffn: int = 1024) -> None:
            super().__init__()
            self.heads = heads
            self.scale = float((d // heads) ** -0.5)
            self.qkv = torch.nn.Linear(d, 3 * d)
            self.out = torch.nn.Linear(d, d)
            self.norm1 = norm(d)
            self.ff1 = torch.nn.Linear(d, ffn)
            self.ff2 = torch.nn.Linear(ffn, d)
            self.norm2 = norm(d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, d = x.shape
            h, dh = self.heads, d // self.heads
            q, k, v = self.qkv(x).reshape(b, s, 3, h, dh).permute(2, 0, 3, 1, 4).unbind(0)
            scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale
            attention = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(b, s, d)
            x = self.norm1(x + self.out(attention))
            return self.norm2(x + self.ff2(torch.relu(self.ff1(x))))

    return EncoderLayer()


def _transformer_layer_norm_as_ops() -> torch.nn.Module:
    return _transformer(layer_norm_as_ops=True)


_BUILDERS = {
    "linreg": _linear,
    "linreg-epoch": _linear,
    "mlp": _mlp,
    "digits-mlp-epoch": _digits_mlp,
    "cnn": _cnn,
    "transformer": _transformer,
    "transformer-lnops": _transformer_layer_norm_as_ops,
}

WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("linreg", "linear regression 10->1, batch 32, SGD, MSE", 32, (10,), "mse", "sgd", 0.01, 5000, 200),
        Workload(
            "mlp", "MLP 784-512-512-10, batch 64, AdamW, CE", 64, (784,), "ce", "adamw", 1e-3, 300, 20, classes=10
        ),
        Workload(
            "cnn",
            "CNN conv16-pool-conv32-pool-fc10 on 1x28x28, batch 64, AdamW, CE",
            64,
            (1, 28, 28),
            "ce",
            "adamw",
            1e-3,
            100,
            5,
            classes=10,
        ),
        Workload(
            "transformer",
            "transformer encoder layer d=256 h=4 ffn=1024, seq 64, batch 8, AdamW, MSE",
            8,
            (64, 256),
            "mse",
            "adamw",
            1e-4,
            60,
            3,
        ),
        # the same layer and weights with LayerNorm spelled out: onnxruntime-training cannot differentiate
        # the LayerNormalization operator that the exporter writes, but it can differentiate this
        Workload(
            "transformer-lnops",
            "the same transformer layer with LayerNorm as elementary ops (which ORT-training can differentiate)",
            8,
            (64, 256),
            "mse",
            "adamw",
            1e-4,
            60,
            3,
        ),
        # whole passes over a data set in memory: onnxtrain's train_epoch against the peers' per-step loops
        Workload(
            "linreg-epoch",
            "linreg's model on 200 batches of 32 rows; onnxtrain: train_epoch over all 200, time per batch",
            32,
            (10,),
            "mse",
            "sgd",
            0.01,
            6000,
            400,
            data_batches=200,
            epoch=True,
        ),
        Workload(
            "digits-mlp-epoch",
            "MLP 64-32-10 on scikit-learn's digits (1792 rows: 56 batches of 32), AdamW, CE; onnxtrain: train_epoch "
            "over all 56, time per batch",
            32,
            (64,),
            "ce",
            "adamw",
            1e-3,
            2240,
            112,
            classes=10,
            data_batches=56,
            dataset="digits",
            epoch=True,
        ),
    )
}
