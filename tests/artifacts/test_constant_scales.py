"""A decoder whose ``Resize`` takes its scales from a ``Concat`` of ``Constant`` nodes trains at any batch size.

torch's TorchScript exporter in training mode writes ``nn.Upsample``'s scales
as ``Concat(Constant, Constant)``. onnx's shape inference could not see
through the ``Concat``, so a flattened output declared ``[N, N]`` (one
``dynamic_axes`` name reused) was neither checked nor corrected, the MSE
target copied ``[N, N]``, and the first step failed with ``input 'target' of
the training model has N = 512, but input 'z' has N = 5``. Constant
subgraphs are now folded before inference (:func:`onnxtrain.graph.fold.fold_constants`),
so the declaration is refuted and the target takes ``[N, 512]``.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnxtrain import api, artifacts
from onnxtrain.graph.declared import DeclaredShapeWarning
from tests.helpers import FLOAT, make_model


def _dims(value: onnx.ValueInfoProto) -> list[int | str | None]:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in value.type.tensor_type.shape.dim]


def _target(paths: dict[str, Path]) -> onnx.ValueInfoProto:
    return next(value for value in onnx.load(paths["training_model"]).graph.input if value.name == "target")


def _generate(model: onnx.ModelProto, directory: Path, requires_grad: list[str]) -> dict[str, Path]:
    before = model.SerializeToString()
    with pytest.warns(DeclaredShapeWarning, match=r"output 'y' of the model is declared float\[N, N\]"):
        paths = artifacts.generate_artifacts(
            model, requires_grad=requires_grad, loss=artifacts.LossType.MSELoss, artifact_directory=directory
        )
    assert model.SerializeToString() == before, "the base model was changed"
    return paths


def _step(paths: dict[str, Path], *inputs: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
    """One training step from zero gradients: the loss and every parameter's gradient."""
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state, paths["eval_model"])
    module.lazy_reset_grad()
    loss = float(module(*inputs))
    return loss, {name: parameter.grad for name, parameter in state.parameters}


# ---------------------------------------------------------------- the exact form, built by hand


def _hand_built_decoder() -> onnx.ModelProto:
    """``y = Flatten(Resize(x * w + b, scales = Concat(Constant [1, 1], Constant [2, 2])))`` for
    ``x: float[N, 2, 3, 3]``, nearest (asymmetric, floor) as torch exports it; really ``float[N, 72]``,
    declared ``float[N, N]``."""
    constant = [
        helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.float32(values), name))
        for name, values in (("ones", [1.0, 1.0]), ("twos", [2.0, 2.0]))
    ]
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["h"]),
        *constant,
        helper.make_node("Concat", ["ones", "twos"], ["scales"], axis=0),
        helper.make_node(
            "Resize", ["h", "", "scales"], ["r"], mode="nearest",
            coordinate_transformation_mode="asymmetric", nearest_mode="floor",
        ),
        helper.make_node("Flatten", ["r"], ["y"], axis=1),
    ]  # fmt: skip
    w, b = np.float32([0.5, -1.5]).reshape(1, 2, 1, 1), np.float32([0.25, 2.0]).reshape(1, 2, 1, 1)
    initializers = [("w", w), ("b", b)]
    return make_model({"x": (FLOAT, ["N", 2, 3, 3])}, nodes, {"y": (FLOAT, ["N", "N"])}, initializers)


def _numpy_step(x: np.ndarray, target: np.ndarray, w: np.ndarray, b: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
    """The hand-built decoder's MSE loss and its gradients, in float64."""
    h = x * w + b
    y = h.repeat(2, axis=2).repeat(2, axis=3).reshape(len(x), -1)
    grad_y = 2 * (y - target) / y.size
    n, c, height, width = h.shape
    grad_h = grad_y.reshape(n, c, height, 2, width, 2).sum(axis=(3, 5))
    grads = {"w": (grad_h * x).sum(axis=(0, 2, 3)).reshape(w.shape), "b": grad_h.sum(axis=(0, 2, 3)).reshape(b.shape)}
    return float(np.mean((y - target) ** 2)), grads


def test_hand_built_concat_scales_decoder_trains_with_the_exact_gradients(tmp_path: Path) -> None:
    model = _hand_built_decoder()
    paths = _generate(model, tmp_path, ["w", "b"])
    assert _dims(_target(paths)) == ["N", 72]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 2, 3, 3)).astype(np.float32)
    target = rng.normal(size=(3, 72)).astype(np.float32)
    loss, grads = _step(paths, x, target)
    weights = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    want_loss, want = _numpy_step(x.astype(np.float64), target.astype(np.float64), weights["w"], weights["b"])
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    for name, expected in want.items():
        np.testing.assert_allclose(grads[name], expected, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- torch's exporter, end to end


def _decoder(torch: Any) -> Any:
    class Decoder(torch.nn.Module):
        """A linear layer to a 2x4x4 map, ``nn.Upsample`` by 2, a conv to 8 channels, flattened: 512 per row."""

        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(8, 2 * 4 * 4)
            self.upsample = torch.nn.Upsample(scale_factor=2)
            self.conv = torch.nn.Conv2d(2, 8, 3, padding=1)

        def forward(self, z: Any) -> Any:
            h = self.upsample(torch.relu(self.linear(z)).reshape(-1, 2, 4, 4))
            return torch.flatten(self.conv(h), 1)

    torch.manual_seed(0)
    return Decoder()


def _export(torch: Any, module: Any) -> onnx.ModelProto:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(
            module,
            (torch.zeros(5, 8),),
            buffer,
            dynamo=False,
            opset_version=17,
            training=torch.onnx.TrainingMode.TRAINING,
            do_constant_folding=False,
            input_names=["z"],
            output_names=["y"],
            dynamic_axes={"z": {0: "N"}, "y": {0: "N", 1: "N"}},  # "N" reused: the quirk
        )
    return onnx.load_from_string(buffer.getvalue())


def test_torch_upsample_decoder_declared_n_by_n_trains_with_torchs_gradients(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    module = _decoder(torch)
    model = _export(torch, module)
    resize = next(node for node in model.graph.node if node.op_type == "Resize")
    producers = {output: node for node in model.graph.node for output in node.output}
    scales = producers[resize.input[2]]
    assert scales.op_type == "Concat", "the exporter no longer writes the scales as a Concat: the case is gone"
    assert [producers[name].op_type for name in scales.input] == ["Constant", "Constant"]
    assert _dims(model.graph.output[0]) == ["N", "N"]
    parameters = [name for name, _ in module.named_parameters()]
    paths = _generate(model, tmp_path, parameters)
    assert _dims(_target(paths)) == ["N", 512]
    rng = np.random.default_rng(0)
    z = rng.normal(size=(3, 8)).astype(np.float32)  # not the export's batch of 5
    target = rng.normal(size=(3, 512)).astype(np.float32)
    loss, grads = _step(paths, z, target)
    want = torch.nn.functional.mse_loss(module(torch.from_numpy(z)), torch.from_numpy(target))
    want.backward()
    np.testing.assert_allclose(loss, want.item(), rtol=1e-5)
    for name, parameter in module.named_parameters():
        expected = parameter.grad.numpy()
        np.testing.assert_allclose(
            grads[name], expected, rtol=1e-4, atol=1e-6 * max(1.0, float(np.abs(expected).max()))
        )
