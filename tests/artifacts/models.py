"""Base models and helpers shared by the artifacts tests.

The main base model, :func:`dense`: ``y = Sigmoid((x @ W) * S + B + C)``,
``x: float[batch, 3]``, ``y: float[batch, 4]``, initializers in the order
``W, S, B, C``. ``W`` and ``B`` are trainable, ``S`` is frozen and ``C`` is
neither (it stays a constant of the graphs), so the parameters' input order
(initializer order, trainable and frozen mixed) differs from the order of the
``requires_grad`` list ``["B", "W"]``. The sigmoid keeps ``y`` in ``(0, 1)``,
a valid input for every built-in loss.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from onnxtrain.artifacts.generate import INITIAL_STATE_KEY
from onnxtrain.sessions import inference_session
from tests.helpers import BOOL, DOUBLE, FLOAT, INT64, make_model

#: Initializers of :func:`dense`, in initializer order.
PARAMETERS = ("W", "S", "B", "C")
TRAINABLE = ("W", "B")  # in initializer order
REQUIRES_GRAD = ["B", "W"]  # deliberately not in initializer order
FROZEN = ["S"]
CONSTANT = "C"  # neither trainable nor frozen

#: A value's signature: (name, element type, dims), dims as ints and symbolic names.
Signature = tuple[str, int, tuple[int | str, ...] | None]


def dense_values(dtype: Any = np.float32, seed: int = 0) -> dict[str, np.ndarray]:
    """Values of the initializers of :func:`dense`."""
    rng = np.random.default_rng(seed)
    return {
        "W": rng.normal(size=(3, 4)).astype(dtype),
        "S": (rng.uniform(0.5, 1.5, size=4)).astype(dtype),
        "B": rng.normal(size=4).astype(dtype),
        "C": rng.normal(size=4).astype(dtype),
    }


def dense(elem_type: int = FLOAT, opset: int = 17, *, ir_version: int | None = None, seed: int = 0) -> onnx.ModelProto:
    """``y = Sigmoid(h)``, ``h = (x @ W) * S + B + C`` (an intermediate value); see the module docstring."""
    dtype = np.float64 if elem_type == DOUBLE else np.float32
    values = dense_values(dtype, seed)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["xw"]),
        helper.make_node("Mul", ["xw", "S"], ["xws"]),
        helper.make_node("Add", ["xws", "B"], ["xwsb"]),
        helper.make_node("Add", ["xwsb", "C"], ["h"]),
        helper.make_node("Sigmoid", ["h"], ["y"]),
    ]
    return make_model(
        {"x": (elem_type, ["batch", 3])},
        nodes,
        {"y": (elem_type, ["batch", 4])},
        [(name, values[name]) for name in PARAMETERS],
        opset=opset,
        ir_version=ir_version,
    )


def batchnorm(opset: int = 15) -> onnx.ModelProto:
    """Training-mode BatchNormalization: ``y, mean.running, var.running = BN(x, scale, bias, mean, var)``."""
    nodes = [helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"],
                              ["y", "m_out", "v_out"], training_mode=1, momentum=0.9)]  # fmt: skip
    rng = np.random.default_rng(1)
    initializers = [
        ("scale", rng.uniform(0.5, 1.5, size=2).astype(np.float32)),
        ("bias", rng.normal(size=2).astype(np.float32)),
        ("mean", rng.normal(size=2).astype(np.float32)),
        ("var", rng.uniform(0.5, 1.5, size=2).astype(np.float32)),
    ]
    return make_model({"x": (FLOAT, ["batch", 2, 3])}, nodes, {"y": (FLOAT, ["batch", 2, 3])}, initializers, opset)


def signature(values: Any) -> list[Signature]:
    """``[(name, elem_type, dims)]`` of graph inputs or outputs (dims ``None``: unknown rank)."""
    result = []
    for value in values:
        tensor = value.type.tensor_type
        dims = None
        if tensor.HasField("shape"):
            dims = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in tensor.shape.dim)
        result.append((value.name, tensor.elem_type, dims))
    return result


def names(values: Any) -> list[str]:
    return [value.name for value in values]


def load(path: str | Path) -> onnx.ModelProto:
    return onnx.load(str(path))


def session(model: onnx.ModelProto | str | Path) -> ort.InferenceSession:
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return inference_session(source)


def run(sess: ort.InferenceSession, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """All outputs of ``sess`` by name."""
    out_names = [o.name for o in sess.get_outputs()]
    return dict(zip(out_names, sess.run(None, dict(feeds)), strict=True))


def flag(value: bool) -> np.ndarray:
    """A ``lazy_reset_grad`` feed."""
    return np.array([value], dtype=np.bool_)


def initial_states(optimizer_model: onnx.ModelProto, params: Mapping[str, np.ndarray]) -> dict[str, list[np.ndarray]]:
    """The optimizer state before the first step, from the model's ``INITIAL_STATE_KEY`` metadata."""
    meta = {entry.key: entry.value for entry in optimizer_model.metadata_props}
    initial = json.loads(meta[INITIAL_STATE_KEY])
    return {name: [np.full_like(value, v) for v in initial] for name, value in params.items()}


__all__ = [
    "BOOL",
    "CONSTANT",
    "DOUBLE",
    "FLOAT",
    "FROZEN",
    "INT64",
    "PARAMETERS",
    "REQUIRES_GRAD",
    "TRAINABLE",
    "batchnorm",
    "dense",
    "dense_values",
    "flag",
    "initial_states",
    "load",
    "names",
    "run",
    "session",
    "signature",
]
