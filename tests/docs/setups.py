"""What the snippets of README.md and docs/ assume exists: files in the working directory and names in scope.

Each setup takes the (empty, temporary) working directory and returns the
names the snippet reads but does not define. A snippet names its setup in
the comment above it: ``<!-- snippet: setup mlp_artifacts -->``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

from tests.helpers import FLOAT, INT64, MSETraining, make_model

Namespace = dict[str, Any]


def _mlp(names: tuple[str, str], features: int = 4, hidden: int = 8, classes: int = 3) -> onnx.ModelProto:
    """``input [batch, features] -> Linear -> Relu -> Linear -> output [batch, classes]``, layers named ``names``."""
    rng = np.random.default_rng(0)
    first, second = names
    initializers = [
        (f"{first}.weight", (rng.normal(size=(features, hidden)) / 2).astype(np.float32)),
        (f"{first}.bias", np.zeros(hidden, np.float32)),
        (f"{second}.weight", (rng.normal(size=(hidden, classes)) / 3).astype(np.float32)),
        (f"{second}.bias", np.zeros(classes, np.float32)),
    ]
    nodes = [
        helper.make_node("Gemm", ["input", f"{first}.weight", f"{first}.bias"], ["h"]),
        helper.make_node("Relu", ["h"], ["a"]),
        helper.make_node("Gemm", ["a", f"{second}.weight", f"{second}.bias"], ["output"]),
    ]
    return make_model(
        {"input": (FLOAT, ["batch", features])}, nodes, {"output": (FLOAT, ["batch", classes])}, initializers
    )


def _classes(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``x [rows, 4]`` and the class of each row (0, 1 or 2), learnable from x."""
    x = np.random.default_rng(seed).normal(size=(rows, 4)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0).astype(np.int64)


def mlp_model(folder: Path) -> Namespace:
    """``model.onnx``: an MLP with ``fc1.weight``, ``fc1.bias``, ``fc2.weight``, ``fc2.bias``, output ``output``,
    and ``train.npz`` (``X``, ``y``: 100 samples of 3 classes, not a multiple of the batch)."""
    onnx.save(_mlp(("fc1", "fc2")), folder / "model.onnx")
    x, y = _classes(100)
    np.savez(folder / "train.npz", X=x, y=y)
    return {}


def mlp_artifacts(folder: Path) -> Namespace:
    """The artifacts of :func:`mlp_model` in ``artifacts/``, and the loop's ``batches`` (the last one short),
    ``x_val`` and ``labels_val``."""
    from onnxtrain import artifacts

    mlp_model(folder)
    artifacts.generate_artifacts(
        "model.onnx", requires_grad=["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"], frozen_params=[],
        loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.OptimType.AdamW, artifact_directory="artifacts",
    )  # fmt: skip
    x, labels = _classes(100)
    batches = [(x[i : i + 32], labels[i : i + 32]) for i in range(0, 100, 32)]
    x_val, labels_val = _classes(20, seed=1)
    return {"batches": batches, "x_val": x_val, "labels_val": labels_val}


def distributed_loop(folder: Path) -> Namespace:
    """:func:`mlp_artifacts` and the names of docs/distributed.md's loop: ``x``, ``y``, ``epochs``,
    ``batch_size``."""
    names = mlp_artifacts(folder)
    x, labels = _classes(100)
    return {**names, "x": x, "y": labels, "epochs": 2, "batch_size": 32}


def epoch_loop(folder: Path) -> Namespace:
    """The names of train_epoch's per-step loop (docs/runtime.md): a module, its optimizer and scheduler, data."""
    from math import ceil

    from onnxtrain.api import CheckpointState, LinearLRScheduler, Module, Optimizer

    mlp_artifacts(folder)
    state = CheckpointState.load_checkpoint("artifacts/checkpoint")
    module = Module("artifacts/training_model.onnx", state, "artifacts/eval_model.onnx")
    optimizer = Optimizer("artifacts/optimizer_model.onnx", module)
    scheduler = LinearLRScheduler(optimizer, warmup_step_count=2, total_step_count=10, initial_lr=1e-3)
    x, labels = _classes(100)
    return {
        "np": np, "ceil": ceil, "module": module, "optimizer": optimizer, "scheduler": scheduler, "inputs": [x],
        "labels": labels, "n": 100, "batch_size": 32, "shuffle": True, "seed": 0,
    }  # fmt: skip


def two_outputs_model(folder: Path) -> Namespace:
    """``model.onnx`` with two outputs, ``output1`` and ``output2`` (README's weighted-average loss)."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["output1"]),
        helper.make_node("MatMul", ["x", "w2"], ["output2"]),
    ]
    initializers = [("w1", np.ones((3, 2), np.float32)), ("w2", np.ones((3, 2), np.float32))]
    outputs = {"output1": (FLOAT, ["batch", 2]), "output2": (FLOAT, ["batch", 2])}
    onnx.save(make_model({"x": (FLOAT, ["batch", 3])}, nodes, outputs, initializers), folder / "model.onnx")
    return {}


def critic(folder: Path) -> Namespace:
    """``critic.onnx``, a discriminator ``x [N, 2] -> score [N, 1]``, and its ``parameters``; ``onnxblock`` and
    ``artifacts`` imported (README's gradient penalty)."""
    import onnxtrain.onnxblock as onnxblock
    from onnxtrain import artifacts

    rng = np.random.default_rng(0)
    initializers = [
        ("w1", rng.normal(size=(2, 8)).astype(np.float32)),
        ("b1", np.zeros(8, np.float32)),
        ("w2", rng.normal(size=(8, 1)).astype(np.float32)),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Tanh", ["h1"], ["h"]),
        helper.make_node("MatMul", ["h", "w2"], ["score"]),
    ]
    model = make_model({"x": (FLOAT, ["N", 2])}, nodes, {"score": (FLOAT, ["N", 1])}, initializers)
    onnx.save(model, folder / "critic.onnx")
    return {"onnxblock": onnxblock, "artifacts": artifacts, "parameters": ["w1", "b1", "w2"]}


def embedding_classifier(folder: Path) -> Namespace:
    """``model.onnx``: ``embedding.weight`` (frozen in docs/artifacts.md), then ``fc.weight``, ``fc.bias``."""
    rng = np.random.default_rng(0)
    initializers = [
        ("embedding.weight", rng.normal(size=(20, 4)).astype(np.float32)),
        ("fc.weight", rng.normal(size=(4, 3)).astype(np.float32)),
        ("fc.bias", np.zeros(3, np.float32)),
    ]
    nodes = [
        helper.make_node("Gather", ["embedding.weight", "tokens"], ["embedded"]),
        helper.make_node("ReduceMean", ["embedded"], ["pooled"], axes=[1], keepdims=0),
        helper.make_node("Gemm", ["pooled", "fc.weight", "fc.bias"], ["output"]),
    ]
    model = make_model({"tokens": (INT64, ["batch", "length"])}, nodes, {"output": (FLOAT, ["batch", 3])}, initializers)
    onnx.save(model, folder / "model.onnx")
    return {}


def token_tagger(folder: Path) -> Namespace:
    """``tagger.onnx``: ``tokens [batch, seq]`` -> ``embedding.weight`` -> ``head.weight``, ``head.bias`` ->
    ``logits [batch, seq, 5]``, a score per token and tag (docs/artifacts.md, "A language model's logits")."""
    rng = np.random.default_rng(0)
    initializers = [
        ("embedding.weight", rng.normal(size=(20, 4)).astype(np.float32)),
        ("head.weight", rng.normal(size=(4, 5)).astype(np.float32)),
        ("head.bias", np.zeros(5, np.float32)),
    ]
    nodes = [
        helper.make_node("Gather", ["embedding.weight", "tokens"], ["embedded"]),
        helper.make_node("MatMul", ["embedded", "head.weight"], ["scores"]),
        helper.make_node("Add", ["scores", "head.bias"], ["logits"]),
    ]
    inputs = {"tokens": (INT64, ["batch", "seq"])}
    model = make_model(inputs, nodes, {"logits": (FLOAT, ["batch", "seq", 5])}, initializers)
    onnx.save(model, folder / "tagger.onnx")
    return {}


def training_block(folder: Path) -> Namespace:
    """``training_block``: a built TrainingBlock (an MSE loss over :func:`mlp_model`'s MLP), as docs/artifacts.md's
    optimizer snippet receives it."""
    import onnxtrain.onnxblock as onnxblock

    block = MSETraining()
    model = _mlp(("fc1", "fc2"))
    for tensor in model.graph.initializer:
        block.requires_grad(tensor.name)
    with onnxblock.base(model):
        block("output")
    return {"training_block": block}


def checkpoint_arrays(folder: Path) -> Namespace:
    """What docs/checkpoint.md's snippet stores: the arrays ``w``, ``b``, ``e`` and the moments of ``w`` and ``b``;
    and ``trainable_initializers``, ``frozen_initializers`` (TensorProtos) of a model in ``model_dir``."""
    rng = np.random.default_rng(0)
    w, b, e = rng.normal(size=(4, 3)), rng.normal(size=3), rng.normal(size=(10, 4))
    arrays = {"w": w, "b": b, "e": e, "m_w": w * 0.1, "v_w": w * w, "m_b": b * 0.1, "v_b": b * b}
    names: Namespace = {name: value.astype(np.float32) for name, value in arrays.items()}
    model = _mlp(("fc1", "fc2"))
    names["trainable_initializers"] = list(model.graph.initializer[:2])
    names["frozen_initializers"] = list(model.graph.initializer[2:])
    names["model_dir"] = folder
    return names


def gpt2_model(folder: Path) -> Namespace:
    """``gpt2.onnx``: a GPT-2-style model with GPT-2's names (tests/lora/models.py; needs torch) and ``batches``
    of its token ids and next-token labels (docs/lora.md)."""
    from tests.lora import models

    onnx.save(models.export(models.tiny_gpt(), batch=4), folder / "gpt2.onnx")
    return {"batches": [models.toy_task(4, seed=seed) for seed in range(3)]}


def sklearn_regression(folder: Path) -> Namespace:
    """onnxcustom's names: ``X``, ``y``, ``X_train``, ``y_train``, ``w_train``, ``skl2onnx``, ``LinearRegression``."""
    import skl2onnx
    from sklearn.linear_model import LinearRegression

    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 3)).astype(np.float32)
    y = (x @ np.array([1.5, -2.0, 0.5]) + 0.3).astype(np.float32)
    w = (rng.random(120) + 0.5).astype(np.float32)
    return {
        "X": x, "y": y, "X_train": x[:100], "y_train": y[:100], "w_train": w[:100],
        "skl2onnx": skl2onnx, "LinearRegression": LinearRegression,
    }  # fmt: skip


def qdq_model(folder: Path) -> Namespace:
    """``model.onnx``: :func:`mlp_model`'s MLP, and ``calibration_reader``: onnxruntime's reader of four batches of
    its input (docs/artifacts.md's quantization-aware training)."""
    from onnxruntime.quantization import CalibrationDataReader

    onnx.save(_mlp(("fc1", "fc2")), folder / "model.onnx")

    class Batches(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._batches = iter({"input": _classes(16, seed)[0]} for seed in range(4))

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._batches, None)

    return {"calibration_reader": Batches()}


SETUPS: dict[str, Callable[[Path], Namespace]] = {
    setup.__name__: setup
    for setup in (
        mlp_model, mlp_artifacts, distributed_loop, epoch_loop, two_outputs_model, critic, embedding_classifier,
        token_tagger, training_block, checkpoint_arrays, gpt2_model, sklearn_regression, qdq_model,
    )
}  # fmt: skip
