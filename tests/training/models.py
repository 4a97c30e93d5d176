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
from tests.helpers import DOUBLE, FLOAT, INT64, make_model

STRING = onnx.TensorProto.STRING


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


def classes_model(classes: int | str, log_probs: bool, *, bias: bool = False) -> onnx.ModelProto:
    """``y = w * x`` (``+ b`` with ``bias``; ``LogSoftmax`` of it with ``log_probs``), ``x: [batch, classes]``,
    ``w`` and ``b`` trainable scalars: class scores for a count that is fixed (an int) or symbolic (a name)."""
    scores = "s" if log_probs else "y"
    nodes = [helper.make_node("Mul", ["x", "w"], ["wx" if bias else scores])]
    initializers = [("w", np.array([1.5], np.float32))]
    if bias:
        nodes.append(helper.make_node("Add", ["wx", "b"], [scores]))
        initializers.append(("b", np.array([0.25], np.float32)))
    if log_probs:
        nodes.append(helper.make_node("LogSoftmax", ["s"], ["y"], axis=1))
    shape = ["batch", classes]
    return make_model({"x": (FLOAT, shape)}, nodes, {"y": (FLOAT, shape)}, initializers)


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


#: The string-encoder models' vocabulary: ``LabelEncoder`` maps each key to its value, any other string to -3.
ENCODER_KEYS = ("a", "b", "cé", "nan")
ENCODER_VALUES = (0.5, -1.0, 2.0, float("nan"))
ENCODER_DEFAULT = -3.0


def encode(strings: Any) -> np.ndarray:
    """The NumPy oracle of the string encoder's ``LabelEncoder``: the float32 codes of ``strings``."""
    table = dict(zip(ENCODER_KEYS, ENCODER_VALUES, strict=True))
    items = [s.decode() if isinstance(s, bytes) else str(s) for s in np.asarray(strings, dtype=object).ravel()]
    return np.array([table.get(s, ENCODER_DEFAULT) for s in items], np.float32)


def string_encoder(*, strings: bool = True, seed: int = 0) -> onnx.ModelProto:
    """``y = (code(x)[:, None] @ W + b) * s`` with ``W: float32[1, 3]``, ``b: float32[3]``, ``s: float32[3]``.

    With ``strings``, ``x: string[batch]`` goes through the ``ai.onnx.ml``
    ``LabelEncoder`` of :data:`ENCODER_KEYS`, and a copy of it is the string
    output ``x_copy``; without, ``x`` is ``float32[batch]``, the codes
    themselves: the same computation on floats.
    """
    rng = np.random.default_rng(seed)
    initializers = [
        ("W", rng.normal(size=(1, 3)).astype(np.float32)),
        ("b", rng.normal(size=3).astype(np.float32)),
        ("s", (1.0 + 0.5 * rng.normal(size=3)).astype(np.float32)),
        ("column", np.array([-1, 1], np.int64)),
    ]
    nodes = [
        helper.make_node("Reshape", ["code", "column"], ["code2"]),
        helper.make_node("MatMul", ["code2", "W"], ["h"]),
        helper.make_node("Add", ["h", "b"], ["hb"]),
        helper.make_node("Mul", ["hb", "s"], ["y"]),
    ]
    if not strings:
        nodes.insert(0, helper.make_node("Identity", ["x"], ["code"]))
        return make_model({"x": (FLOAT, ["batch"])}, nodes, {"y": (FLOAT, ["batch", 3])}, initializers)
    encoder = helper.make_node(
        "LabelEncoder",
        ["x"],
        ["code"],
        domain="ai.onnx.ml",
        keys_strings=list(ENCODER_KEYS),
        values_floats=list(ENCODER_VALUES),
        default_float=ENCODER_DEFAULT,
    )
    copy = helper.make_node("Identity", ["x"], ["x_copy"])
    return make_model(
        {"x": (STRING, ["batch"])},
        [copy, encoder, *nodes],
        {"y": (FLOAT, ["batch", 3]), "x_copy": (STRING, ["batch"])},
        initializers,
        extra_opsets={"ai.onnx.ml": 2},
    )


def embedding_model(seed: int = 0) -> onnx.ModelProto:
    """``y = Gather(E, ids) + x @ W``: an index out of range fails inside onnxruntime, and the ``Gather``
    depends on ``E`` alone, so that onnxruntime may run it before ``W``'s update unless the update runs first."""
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Gather", ["E", "ids"], ["e"]),
        helper.make_node("MatMul", ["x", "W"], ["xw"]),
        helper.make_node("Add", ["e", "xw"], ["y"]),
    ]
    initializers = [
        ("E", rng.normal(size=(5, 2)).astype(np.float32)),
        ("W", rng.normal(size=(3, 2)).astype(np.float32)),
    ]
    inputs = {"ids": (INT64, ["batch"]), "x": (FLOAT, ["batch", 3])}
    return make_model(inputs, nodes, {"y": (FLOAT, ["batch", 2])}, initializers)


def generate(directory: Path, model: onnx.ModelProto, **kwargs: Any) -> dict[str, Path]:
    """``generate_artifacts`` with every initializer trainable unless ``requires_grad`` is given."""
    kwargs.setdefault("requires_grad", [t.name for t in model.graph.initializer])
    return artifacts_api.generate_artifacts(model, artifact_directory=directory, **kwargs)
