"""A torch ``nn.Dropout1d/2d/3d`` that torch's dynamo exporter wrote as its random mask's operators is its input
in the eval model and the inference export, as torch's ``eval()`` computes.

The exporter writes ``nn.Dropout`` as a ``Dropout`` node, which the eval model
runs in inference mode; ``Dropout2d`` becomes ``RandomUniformLike``, ``Less``,
``Div`` and a ``Mul`` by the mask, which the eval model ran as the training
model does: two evaluations of one batch differed by 0.35, and the exported
inference model dropped channels at random.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from onnxtrain import api, artifacts


@pytest.mark.parametrize(("dims", "optimize"), [(1, False), (2, False), (2, True)])
def test_a_feature_dropout_is_its_input_in_eval_and_export_and_still_drops_in_training(
    tmp_path: Path, dims: int, optimize: bool
) -> None:
    """``optimize=True`` (the exporter's default) inserts a ``Cast`` into the mask's chain that carries no module
    scopes: it is part of the call all the same."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    conv, dropout = (torch.nn.Conv1d, torch.nn.Dropout1d) if dims == 1 else (torch.nn.Conv2d, torch.nn.Dropout2d)
    torch.manual_seed(0)
    net = torch.nn.Sequential(conv(3, 8, 3, padding=1), dropout(0.5), torch.nn.Flatten(), torch.nn.LazyLinear(3))
    x = torch.randn(6, 3, *([5] * dims))
    net(x)  # the lazy layer's size
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's notes
        program = torch.onnx.export(
            net.train(), (x,), dynamo=True, optimize=optimize, input_names=["x"], output_names=["y"],
            training=torch.onnx.TrainingMode.TRAINING, dynamic_shapes=({0: torch.export.Dim("batch")},),
        )  # fmt: skip
    model = program.model_proto
    assert "RandomUniformLike" in {node.op_type for node in model.graph.node}
    paths = artifacts.generate_artifacts(
        model, requires_grad=[name for name, _ in net.named_parameters()], loss=artifacts.LossType.CrossEntropyLoss,
        artifact_directory=tmp_path, additional_output_names=["y"],
    )  # fmt: skip
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state, paths["eval_model"])
    labels = np.zeros(6, np.int64)
    trained = [module(x.numpy(), labels)[1] for _ in range(3)]  # accumulating: no parameter changes
    assert not np.array_equal(trained[1], trained[2])  # training still draws a mask at each step
    module.eval()
    with torch.no_grad():
        expected = net.eval()(x).numpy()
    for _ in range(2):
        np.testing.assert_allclose(module(x.numpy(), labels)[1], expected, rtol=1e-5, atol=1e-6)
    module.export_model_for_inferencing(str(tmp_path / "inference.onnx"), ["y"])
    session = ort.InferenceSession(str(tmp_path / "inference.onnx"))
    assert "RandomUniformLike" not in {node.op_type for node in _nodes(tmp_path / "inference.onnx")}
    np.testing.assert_allclose(session.run(None, {"x": x.numpy()})[0], expected, rtol=1e-5, atol=1e-6)


def _nodes(path: Path) -> list:
    import onnx

    return list(onnx.load(str(path)).graph.node)
