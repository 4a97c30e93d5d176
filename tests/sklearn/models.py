"""Small models for the scikit-learn-style tests: a float64 MLP with regression and probability heads."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from tests.helpers import DOUBLE, make_model

N_FEATURES = 3
N_HIDDEN = 4


def mlp(n_outputs: int, head: str = "none", dtype: int = DOUBLE, seed: int = 0) -> onnx.ModelProto:
    """``x [batch, 3] -> tanh(x W1 + b1) W2 + b2 -> head``: ``"none"``, ``"softmax"`` or ``"sigmoid"``.

    Initializers ``W1``, ``b1``, ``W2``, ``b2``; one output ``y``.
    """
    rng = np.random.default_rng(seed)
    np_dtype = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    weights = {
        "W1": rng.normal(size=(N_FEATURES, N_HIDDEN)),
        "b1": rng.normal(size=(N_HIDDEN,)) * 0.1,
        "W2": rng.normal(size=(N_HIDDEN, n_outputs)),
        "b2": rng.normal(size=(n_outputs,)) * 0.1,
    }
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Tanh", ["h1"], ["h"]),
        helper.make_node("MatMul", ["h", "W2"], ["z0"]),
        helper.make_node("Add", ["z0", "b2"], ["z" if head != "none" else "y"]),
    ]
    if head == "softmax":
        nodes.append(helper.make_node("Softmax", ["z"], ["y"], axis=1))
    elif head == "sigmoid":
        nodes.append(helper.make_node("Sigmoid", ["z"], ["y"]))
    return make_model(
        {"x": (dtype, ["batch", N_FEATURES])},
        nodes,
        {"y": (dtype, ["batch", n_outputs])},
        [(name, value.astype(np_dtype)) for name, value in weights.items()],
        opset=17,
    )


def weights_of(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The model's initializers by name."""
    return {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}


def forward(weights: dict[str, np.ndarray], x: np.ndarray, head: str) -> np.ndarray:
    """The NumPy oracle of :func:`mlp`."""
    z = np.tanh(x @ weights["W1"] + weights["b1"]) @ weights["W2"] + weights["b2"]
    if head == "softmax":
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    if head == "sigmoid":
        return 1 / (1 + np.exp(-z))
    return z
