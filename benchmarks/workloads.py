"""The four workloads: a torch model, its data, its loss and optimizer, and how long to time it.

Every framework trains the same model from the same initial weights on the
same batches: the model is built once in torch (seeded), exported to ONNX for
onnxtrain and onnxruntime-training, and its state dict is saved for PyTorch.
torch is imported inside the functions, so that this module loads without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    import torch

Loss = Literal["mse", "ce"]
Optim = Literal["sgd", "adamw"]

#: AdamW as ONNX Runtime's ``OptimType.AdamW`` and onnxtrain's default build it;
#: torch's AdamW is configured the same way (its own defaults differ: eps=1e-8, weight_decay=0.01).
ADAMW = {"betas": (0.9, 0.999), "eps": 1e-6, "weight_decay": 0.0}


@dataclass(frozen=True)
class Workload:
    """A model, its inputs and its training set-up.

    ``input_shape`` excludes the batch axis; ``classes`` is the number of
    classes for cross-entropy (labels int64[batch]); for MSE the target has
    the model output's shape. ``steps`` is the number of timed steps per repeat.
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

    def build(self) -> torch.nn.Module:
        """The torch model, with deterministic initial weights."""
        import torch

        torch.manual_seed(0)
        return _BUILDERS[self.name]()

    def batches(self, count: int, output_shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """``count`` batches: inputs ``[count, batch, *input_shape]`` float32 and targets (labels or values)."""
        rng = np.random.default_rng(1234)
        x = rng.standard_normal((count, self.batch, *self.input_shape), dtype=np.float32)
        if self.loss == "ce":
            y = rng.integers(0, self.classes, size=(count, self.batch), dtype=np.int64)
        else:
            y = rng.standard_normal((count, *output_shape), dtype=np.float32)
        return x, y


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
    "mlp": _mlp,
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
    )
}
