"""Parameters a loss block adds (a projection head of ``blocks.Linear``, a learnable temperature) can be named in
``generate_artifacts``' lists, as ONNX Runtime reads the parameters after the loss is built."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnxtrain import api, onnxblock
from onnxtrain.artifacts import generate_artifacts
from tests.helpers import FLOAT, make_model


def _tower() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    return make_model(
        {"x": (FLOAT, ["n", 6])},
        [helper.make_node("Gemm", ["x", "weight", "bias"], ["emb"], transB=1)],
        {"emb": (FLOAT, ["n", 4])},
        [("weight", rng.normal(size=(4, 6)).astype(np.float32)), ("bias", np.zeros(4, np.float32))],
    )


class ScaledMSE(onnxblock.Block):
    """MSE of ``exp(t) * emb`` against the targets, ``t`` a temperature of the loss's own (CLIP's logit scale)."""

    def build(self, emb: str) -> str:
        self.base.graph.initializer.append(numpy_helper.from_array(np.array(0.5, np.float32), "temperature"))
        scale = onnxblock.blocks.Exp()("temperature")
        return onnxblock.loss.MSELoss()(onnxblock.blocks.Mul()(scale, emb))


def test_a_parameter_the_loss_block_adds_is_trained_when_named(tmp_path):
    """It was refused ("not an initializer of the model"): the names were checked against the base model before
    the loss was built."""
    paths = generate_artifacts(
        _tower(), requires_grad=["weight", "bias", "temperature"], loss=ScaledMSE(), optimizer="SGD",
        artifact_directory=tmp_path,
    )  # fmt: skip
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state, paths["eval_model"])
    rng = np.random.default_rng(1)
    x, target = rng.normal(size=(5, 6)).astype(np.float32), rng.normal(size=(5, 4)).astype(np.float32)
    module(x, target)
    weight, bias = state.parameters["weight"].data, state.parameters["bias"].data
    emb = x @ weight.T + bias
    scale = np.exp(np.float32(0.5))
    expected = np.sum(2 * (scale * emb - target) * scale * emb) / target.size  # d/dt mean((e^t emb - y)^2)
    np.testing.assert_allclose(state.parameters["temperature"].grad, expected, rtol=1e-5)
    assert state.parameters["temperature"].requires_grad


def test_a_name_neither_the_model_nor_the_loss_block_has_is_still_refused(tmp_path):
    with pytest.raises(ValueError, match="requires_grad names 'temprature', which is not an initializer"):
        generate_artifacts(
            _tower(), requires_grad=["weight", "temprature"], loss=ScaledMSE(), artifact_directory=tmp_path
        )
    assert not any(tmp_path.iterdir())
