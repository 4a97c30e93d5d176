"""onnxblock.save_checkpoint and load_checkpoint_to_model, and ONNX Runtime's words before a block is built."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import onnxtrain.onnxblock as onnxblock
from onnxtrain import checkpoint
from tests.helpers import DOUBLE, MSETraining, make_model, run_model

RNG = np.random.default_rng(3)
W, B, SCALE = RNG.normal(size=(3, 4)), RNG.normal(size=(4,)), RNG.normal(size=(4,))


def _forward() -> onnx.ModelProto:
    """y = tanh(x @ W + B) * SCALE."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h0"]),
        helper.make_node("Add", ["h0", "B"], ["h"]),
        helper.make_node("Tanh", ["h"], ["t"]),
        helper.make_node("Mul", ["t", "SCALE"], ["y"]),
    ]
    return make_model(
        {"x": (DOUBLE, ["batch", 3])}, nodes, {"y": (DOUBLE, ["batch", 4])}, [("W", W), ("B", B), ("SCALE", SCALE)]
    )


def _built() -> MSETraining:
    block = MSETraining()
    block.requires_grad("W")
    block.requires_grad("B")
    block.requires_grad("SCALE", False)
    with onnxblock.base(_forward()):
        block("y")
    return block


def test_save_checkpoint_writes_the_blocks_parameters(tmp_path: Path):
    onnxblock.save_checkpoint(_built().parameters(), tmp_path / "checkpoint")
    state = checkpoint.load(tmp_path / "checkpoint")
    assert sorted(state.trainable) == ["B", "W"] and sorted(state.frozen) == ["SCALE"]
    for name, value in {"W": W, "B": B, "SCALE": SCALE}.items():
        np.testing.assert_array_equal(state.parameters[name], value)
    assert state.optimizer is None and not state.is_nominal

    onnxblock.save_checkpoint(_built().parameters(), tmp_path / "nominal", nominal_checkpoint=True)
    nominal = checkpoint.load(tmp_path / "nominal")
    assert nominal.is_nominal and nominal == state.nominal()


def test_load_checkpoint_to_model_puts_the_values_into_an_inference_model(tmp_path: Path):
    trained = {"W": W + 1.0, "B": B - 2.0}
    checkpoint.save(checkpoint.CheckpointState(trained, {"SCALE": SCALE * 3}), tmp_path / "trained")
    model = _forward()
    model.graph.initializer.append(numpy_helper.from_array(np.ones(2), "unrelated"))  # not in the checkpoint
    onnxblock.load_checkpoint_to_model(tmp_path / "trained", model)
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    np.testing.assert_array_equal(values["W"], W + 1.0)
    np.testing.assert_array_equal(values["B"], B - 2.0)
    np.testing.assert_array_equal(values["SCALE"], SCALE * 3)
    np.testing.assert_array_equal(values["unrelated"], np.ones(2))
    x = RNG.normal(size=(5, 3))
    (y,) = run_model(model, {"x": x})
    np.testing.assert_allclose(y, np.tanh(x @ (W + 1.0) + B - 2.0) * SCALE * 3, rtol=1e-12)


def test_load_checkpoint_to_model_refuses_what_does_not_fit_and_leaves_the_model(tmp_path: Path):
    checkpoint.save(checkpoint.CheckpointState({"B": B, "W": np.zeros((4, 3))}), tmp_path / "other")
    model = _forward()
    before = model.SerializeToString()
    with pytest.raises(ValueError, match=r"'W' is float64\[4, 3\].*float64\[3, 4\].*another model"):
        onnxblock.load_checkpoint_to_model(tmp_path / "other", model)
    assert model.SerializeToString() == before  # B was not replaced either
    checkpoint.save(checkpoint.CheckpointState({"W": W}).nominal(), tmp_path / "nominal")
    with pytest.raises(ValueError, match=r"nominal checkpoint.*load a full checkpoint"):
        onnxblock.load_checkpoint_to_model(tmp_path / "nominal", model)
    with pytest.raises(TypeError, match="ModelProto"):
        onnxblock.load_checkpoint_to_model(tmp_path / "other", b"bytes")  # type: ignore[arg-type]


def test_save_checkpoint_without_parameters_raises_onnxruntimes_error(tmp_path: Path):
    with pytest.raises(RuntimeError, match=r"^No checkpoint parameters provided\.$"):
        onnxblock.save_checkpoint(None, tmp_path / "checkpoint")
    with pytest.raises(TypeError, match=r"\(trainable, frozen\)"):
        onnxblock.save_checkpoint([numpy_helper.from_array(W, "W")], tmp_path / "checkpoint")  # type: ignore[arg-type]
    assert not (tmp_path / "checkpoint").exists()


def test_a_block_not_built_yet_answers_in_onnxruntimes_words():
    block = MSETraining()
    with pytest.raises(RuntimeError) as raised:
        block.parameters()
    assert str(raised.value).startswith(
        "Please build the training model first before trying to retrieve the parameters."
    )
    with pytest.raises(RuntimeError) as raised:
        block.to_model_proto()
    assert str(raised.value).startswith(
        "Please build the training and eval models first before trying to retrieve them."
    )
