"""Base models and artifacts for the runtime tests.

Artifacts are generated once per test session (:func:`artifacts`) into a
temporary folder: generating them is the slow part.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

from onnxtrain import artifacts as artifacts_api
from tests.helpers import DOUBLE, FLOAT, make_model


def mlp(sizes: Sequence[int] = (4, 8, 3), *, seed: int = 0, elem_type: int = FLOAT) -> onnx.ModelProto:
    """``x -> (MatMul, Add, Relu)* -> y`` with weights ``fc{i}.weight`` and biases ``fc{i}.bias``."""
    dtype = np.float64 if elem_type == DOUBLE else np.float32
    rng = np.random.default_rng(seed)
    initializers: list[tuple[str, np.ndarray]] = []
    nodes = []
    current = "x"
    layers = len(sizes) - 1
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        initializers.append((f"fc{i}.weight", (rng.normal(size=(n_in, n_out)) / np.sqrt(n_in)).astype(dtype)))
        initializers.append((f"fc{i}.bias", (0.1 * rng.normal(size=n_out)).astype(dtype)))
        nodes.append(helper.make_node("MatMul", [current, f"fc{i}.weight"], [f"mm{i}"]))
        last = i == layers - 1
        nodes.append(helper.make_node("Add", [f"mm{i}", f"fc{i}.bias"], ["y" if last else f"h{i}"]))
        if not last:
            nodes.append(helper.make_node("Relu", [f"h{i}"], [f"a{i}"]))
            current = f"a{i}"
    return make_model(
        {"x": (elem_type, ["batch", sizes[0]])}, nodes, {"y": (elem_type, ["batch", sizes[-1]])}, initializers
    )


def batchnorm_mlp(seed: int = 0) -> onnx.ModelProto:
    """``x[batch, 4] -> MatMul W -> BatchNormalization (training mode) -> y[batch, 3]``; bn.mean/bn.var frozen."""
    rng = np.random.default_rng(seed)
    initializers = [
        ("W", rng.normal(size=(4, 3)).astype(np.float32)),
        ("bn.scale", np.ones(3, np.float32)),
        ("bn.bias", np.zeros(3, np.float32)),
        ("bn.mean", np.zeros(3, np.float32)),
        ("bn.var", np.ones(3, np.float32)),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"]),
        helper.make_node(
            "BatchNormalization",
            ["h", "bn.scale", "bn.bias", "bn.mean", "bn.var"],
            ["y", "bn.mean.out", "bn.var.out"],
            training_mode=1,
            momentum=0.9,
        ),
    ]
    return make_model({"x": (FLOAT, ["batch", 4])}, nodes, {"y": (FLOAT, ["batch", 3])}, initializers, opset=15)


def mixed_dtypes(seed: int = 0) -> onnx.ModelProto:
    """``y = Cast<double>(x @ W) + b``: W float32[3, 2], b float64[2] (parameters of two dtypes)."""
    rng = np.random.default_rng(seed)
    initializers = [("W", rng.normal(size=(3, 2)).astype(np.float32)), ("b", rng.normal(size=2))]
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["xw"]),
        helper.make_node("Cast", ["xw"], ["xw64"], to=DOUBLE),
        helper.make_node("Add", ["xw64", "b"], ["y"]),
    ]
    return make_model({"x": (FLOAT, ["batch", 3])}, nodes, {"y": (DOUBLE, ["batch", 2])}, initializers)


def generate(directory: Path, model: onnx.ModelProto, **kwargs: Any) -> dict[str, Path]:
    """``generate_artifacts`` with every initializer trainable unless ``requires_grad`` is given."""
    kwargs.setdefault("requires_grad", [t.name for t in model.graph.initializer])
    return artifacts_api.generate_artifacts(model, artifact_directory=directory, **kwargs)
