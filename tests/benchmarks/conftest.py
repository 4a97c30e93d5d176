"""Fixtures shared by the benchmarks' tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxtrain import artifacts


@pytest.fixture(scope="module")
def linear_artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Artifacts of ``Gemm(input [batch, 10], W [1, 10]^T, b [1])`` with MSE and AdamW: 11 parameters, 44 bytes."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((1, 10), dtype=np.float32), "weight"),
        numpy_helper.from_array(np.zeros(1, np.float32), "bias"),
    ]
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["input", "weight", "bias"], ["output"], transB=1)],
        "linear",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 10])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 1])],
        weights,
    )
    folder = tmp_path_factory.mktemp("linear")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "model.onnx")
    artifacts.generate_artifacts(
        str(folder / "model.onnx"),
        requires_grad=["weight", "bias"],
        loss=artifacts.LossType.MSELoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=folder / "artifacts",
    )
    return folder / "artifacts"
