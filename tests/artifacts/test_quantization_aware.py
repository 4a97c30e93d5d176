"""Quantization-aware training of a QDQ model, as ONNX Runtime's QAT example prepares it, against PyTorch's.

A float model exported from torch is quantized by ``onnxruntime.quantization.quantize_static``
in the QDQ format with a ``QuantizeLinear -> DequantizeLinear`` pair on each weight
(``AddQDQPairToWeight``, per output channel, int8) and activation (per tensor, uint8), and
float biases (``QuantizeBias=False``). ``generate_artifacts`` trains the float weights and
biases through the pairs with the straight-through estimator; PyTorch's
``fake_quantize_per_tensor_affine`` and ``fake_quantize_per_channel_affine`` at the same places,
with the same scales and zero points, give the reference: the loss and every parameter's gradient.
A LoRA adapter over the int8 weights of a statically quantized model (weights stored quantized,
activations fake-quantized) gets its gradient through the activations' pairs the same way. A PyTorch
model that fake-quantizes itself (quantization-aware training in torch, exported by the TorchScript
exporter as the pairs) trains as torch trains it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from onnxtrain import api, artifacts
from onnxtrain.lora import add_adapters
from tests.helpers import export_for_training

torch = pytest.importorskip("torch")
quantization = pytest.importorskip("onnxruntime.quantization")


class Calibration(quantization.CalibrationDataReader):  # type: ignore[misc,name-defined]
    """Four batches of ``shape`` drawn from a normal distribution."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self._batches: Iterator[dict[str, np.ndarray]] = iter(
            {"x": np.random.default_rng(i).normal(size=shape).astype(np.float32)} for i in range(4)
        )

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._batches, None)


def quantized(
    module: Any, shape: tuple[int, ...], folder: Path, *, weight_pairs: bool, operators: bool = False
) -> Path:
    """``module`` exported for training and quantized by ``quantize_static`` (QDQ, or QOperator with
    ``operators``); the quantized model's path."""
    float_path, path = folder / "float.onnx", folder / "qdq.onnx"
    exported = export_for_training(
        module, (torch.randn(*shape),), ["x"], ["logits"], opset=17, dynamic_axes={"x": {0: "N"}, "logits": {0: "N"}}
    )
    onnx.save(exported, float_path)
    quantization.quantize_static(
        str(float_path),
        str(path),
        Calibration(shape),
        quant_format=quantization.QuantFormat.QOperator if operators else quantization.QuantFormat.QDQ,
        activation_type=quantization.QuantType.QUInt8,
        weight_type=quantization.QuantType.QInt8,
        per_channel=weight_pairs,
        extra_options={"AddQDQPairToWeight": weight_pairs, "QuantizeBias": False},
    )
    return path


def torch_forward(model: onnx.ModelProto, values: Mapping[str, Any]) -> Any:
    """The graph's output computed by PyTorch, each ``QuantizeLinear -> DequantizeLinear`` pair a fake quantization
    (the few operators these exports hold); ``values``: the inputs and the trained parameters as tensors."""
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    env: dict[str, Any] = dict(values)
    quantizers: dict[str, onnx.NodeProto] = {}

    def tensor(name: str) -> Any:
        return env[name] if name in env else torch.tensor(constants[name])

    def attribute(node: onnx.NodeProto, name: str, default: Any) -> Any:
        return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)

    def fake_quantized(node: onnx.NodeProto) -> Any:
        x, scale, zero = node.input
        scale_value, zero_value = constants[scale], constants[zero]
        low, high = (0, 255) if zero_value.dtype == np.uint8 else (-128, 127)
        if scale_value.size == 1:
            return torch.fake_quantize_per_tensor_affine(tensor(x), float(scale_value), int(zero_value), low, high)
        zeros = torch.tensor(zero_value.astype(np.int32))
        axis = attribute(node, "axis", 1)
        return torch.fake_quantize_per_channel_affine(tensor(x), torch.tensor(scale_value), zeros, axis, low, high)

    def dequantized(node: onnx.NodeProto) -> Any:
        codes, scale, zero = node.input
        if codes in quantizers:
            return fake_quantized(quantizers[codes])
        levels = torch.tensor(constants[codes].astype(np.float32) - constants[zero].astype(np.float32))
        return levels * torch.tensor(constants[scale])  # a weight stored quantized, per tensor

    def gemm(node: onnx.NodeProto) -> Any:
        b = tensor(node.input[1])
        product = tensor(node.input[0]) @ (b.T if attribute(node, "transB", 0) else b)
        return product + tensor(node.input[2]) if len(node.input) > 2 else product

    def conv(node: onnx.NodeProto) -> Any:
        bias = tensor(node.input[2]) if len(node.input) > 2 else None
        pads = attribute(node, "pads", [0, 0, 0, 0])
        return torch.nn.functional.conv2d(
            tensor(node.input[0]), tensor(node.input[1]), bias, attribute(node, "strides", [1, 1]), pads[:2]
        )

    operators: dict[str, Callable[[onnx.NodeProto], Any]] = {
        "DequantizeLinear": dequantized,
        "Gemm": gemm,
        "MatMul": lambda node: tensor(node.input[0]) @ tensor(node.input[1]),
        "Add": lambda node: tensor(node.input[0]) + tensor(node.input[1]),
        "Mul": lambda node: tensor(node.input[0]) * tensor(node.input[1]),
        "Transpose": lambda node: tensor(node.input[0]).permute(*attribute(node, "perm", [1, 0])),
        "Conv": conv,
        "Relu": lambda node: torch.relu(tensor(node.input[0])),
        "Flatten": lambda node: torch.flatten(tensor(node.input[0]), attribute(node, "axis", 1)),
    }
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear":
            quantizers[node.output[0]] = node
            continue
        env[node.output[0]] = operators[node.op_type](node)
    return env[model.graph.output[0].name]


def session_options() -> ort.SessionOptions:
    """One thread, onnxruntime's graph optimizations off: it would fuse the pairs into integer kernels, whose
    rounding differs from the float reference."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return options


def one_step(paths: dict[str, Path], x: np.ndarray, labels: np.ndarray) -> tuple[float, api.CheckpointState]:
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state, paths["eval_model"], session_options=session_options())
    module.train()
    return float(module(x, labels)), state


def torch_step(
    model: onnx.ModelProto, x: np.ndarray, labels: np.ndarray, names: list[str]
) -> tuple[float, dict[str, np.ndarray]]:
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    parameters = {name: torch.tensor(constants[name], requires_grad=True) for name in names}
    logits = torch_forward(model, {"x": torch.tensor(x), **parameters})
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor(labels))
    loss.backward()
    return float(loss.detach()), {name: p.grad.numpy() for name, p in parameters.items()}


def generated(model: onnx.ModelProto | Path, names: list[str], folder: Path) -> dict[str, Path]:
    """The artifacts of ``model`` (``names`` trained), cross-entropy and AdamW, in ``folder / "artifacts"``."""
    return artifacts.generate_artifacts(
        model if isinstance(model, onnx.ModelProto) else str(model),
        requires_grad=names,
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=folder / "artifacts",
    )


def assert_trains_as_pytorch(
    model: onnx.ModelProto, names: list[str], x: np.ndarray, labels: np.ndarray, folder: Path
) -> None:
    """One train step of ``model``'s artifacts (``names`` trained) gives PyTorch's loss and every gradient, none
    of them zero."""
    paths = generated(model, names, folder)
    loss, state = one_step(paths, x, labels)
    expected_loss, expected = torch_step(model, x, labels, names)
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    for name in names:
        grad = state.parameters[name].grad
        assert grad is not None
        np.testing.assert_allclose(grad, expected[name], rtol=1e-4, atol=1e-6, err_msg=name)
        assert np.abs(expected[name]).max() > 0, name


def mlp() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))


def cnn() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 3, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 4)
    )


@pytest.mark.parametrize(("make", "shape"), [(mlp, (7, 6)), (cnn, (5, 1, 6, 6))], ids=["mlp", "cnn"])
def test_every_gradient_equals_pytorchs_fake_quantization(
    make: Callable[[], Any], shape: tuple[int, ...], tmp_path: Path
) -> None:
    path = quantized(make(), shape, tmp_path, weight_pairs=True)
    names = artifacts.trainable_parameters(path)
    model = onnx.load(path)
    weights = {n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear"} & set(names)
    assert len(weights) == 2 and len(names) == 4, names  # both weights, through their pairs, and both biases
    rng = np.random.default_rng(1)
    x = (2 * rng.normal(size=shape)).astype(np.float32)  # some activations beyond the calibrated range: clipped
    assert_trains_as_pytorch(model, names, x, rng.integers(0, 4, size=shape[0]).astype(np.int64), tmp_path)


def test_lora_over_a_statically_quantized_model(tmp_path: Path) -> None:
    """Adapters beside the int8 weights: their gradients flow back through the activations' pairs."""
    path = quantized(mlp(), (7, 6), tmp_path, weight_pairs=False)
    model = onnx.load(path)
    stored = [t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT8 and len(t.dims) == 2]
    adapted, names = add_adapters(model, targets=stored, rank=2, alpha=4.0)
    rng = np.random.default_rng(2)
    for tensor in adapted.graph.initializer:  # B starts at zero, which gives A no gradient: as if trained a while
        if tensor.name.endswith(".lora_B"):
            values = rng.normal(0, 0.5, size=tuple(tensor.dims)).astype(np.float32)
            tensor.CopyFrom(numpy_helper.from_array(values, tensor.name))
    x = rng.normal(size=(7, 6)).astype(np.float32)
    assert_trains_as_pytorch(adapted, names, x, rng.integers(0, 4, size=7).astype(np.int64), tmp_path)


class FakeQuantized(torch.nn.Module):  # type: ignore[misc,name-defined]
    """A convolution and a linear layer, their inputs and weights fake-quantized by PyTorch itself: per tensor
    (uint8 activations, int8 weights) and per output channel (the convolution's int8 weight). The hidden
    activations take codes 0..127 (``torch.ao``'s x86 and fbgemm configurations: the TorchScript exporter writes
    a ``Clip`` of the codes), and the linear weight's scale is its largest magnitude over 127.5 (PyTorch's
    symmetric observers': that weight lies at ``x / s = 127.5`` exactly, inside the range for PyTorch)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3)
        self.fc = torch.nn.Linear(4 * 4 * 4, 5)
        self.fc_scale = float(self.fc.weight.detach().abs().max()) / 127.5

    def forward(self, x: Any) -> Any:
        x = torch.fake_quantize_per_tensor_affine(x, 0.02, 128, 0, 255)
        scales, zeros = torch.full((4,), 0.01), torch.zeros(4, dtype=torch.int32)
        weight = torch.fake_quantize_per_channel_affine(self.conv.weight, scales, zeros, 0, -128, 127)
        h = torch.relu(torch.nn.functional.conv2d(x, weight, self.conv.bias))
        h = torch.fake_quantize_per_tensor_affine(h, 0.01, 0, 0, 127).flatten(1)
        weight = torch.fake_quantize_per_tensor_affine(self.fc.weight, self.fc_scale, 0, -128, 127)
        return torch.nn.functional.linear(h, weight, self.fc.bias)


def _dynamo_export(net: Any, x: Any) -> onnx.ModelProto:
    pytest.importorskip("onnxscript")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's notes
        program = torch.onnx.export(net, (x,), dynamo=True, optimize=False, input_names=["x"], output_names=["y"])
    return program.model_proto


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_a_model_pytorch_fake_quantizes_trains_as_in_pytorch(exporter: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = FakeQuantized().train()
    x = 2 * torch.randn(3, 1, 6, 6)  # inputs and activations beyond their ranges: clipped
    if exporter == "dynamo":
        exported = _dynamo_export(net, x)
    else:
        exported = export_for_training(net, (x,), ["x"], ["y"], opset=17, dynamic_axes={"x": {0: "N"}, "y": {0: "N"}})
    assert {"QuantizeLinear", "DequantizeLinear"} <= {node.op_type for node in exported.graph.node}
    if exporter == "torchscript":  # the codes of 0..127 clipped between the two
        quantized = {node.output[0] for node in exported.graph.node if node.op_type == "QuantizeLinear"}
        assert any(node.op_type == "Clip" and node.input[0] in quantized for node in exported.graph.node)
    names = artifacts.trainable_parameters(exported)
    assert names == [name for name, _ in net.named_parameters()]
    paths = generated(exported, names, tmp_path)
    labels = torch.tensor([0, 3, 4])
    loss, state = one_step(paths, x.numpy(), labels.numpy())
    expected = torch.nn.functional.cross_entropy(net(x), labels)
    expected.backward()
    assert loss == pytest.approx(float(expected.detach()), rel=1e-6)
    for name, parameter in net.named_parameters():
        np.testing.assert_allclose(state.parameters[name].grad, parameter.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_a_qoperator_model_is_told_to_be_quantized_in_the_qdq_format(tmp_path: Path) -> None:
    """Its products are integer kernels (``QLinearMatMul``, ``QGemm``): no float weight is left to train."""
    path = quantized(mlp(), (7, 6), tmp_path, weight_pairs=False, operators=True)
    names = artifacts.trainable_parameters(path)
    with pytest.raises(ValueError, match=r"needs trainable parameters.*quantized kernels.*QuantFormat\.QDQ"):
        generated(path, names, tmp_path)


def test_a_qdq_model_of_integer_weights_is_told_the_options_that_keep_them_float(tmp_path: Path) -> None:
    """quantize_static's default QDQ model stores each weight as int8 read by ``DequantizeLinear``: no float weight
    is left, and the error said only that an optimizer needs trainable parameters."""
    float_path, path = tmp_path / "float.onnx", tmp_path / "qdq.onnx"
    onnx.save(export_for_training(mlp(), (torch.randn(7, 6),), ["x"], ["logits"], opset=17), float_path)
    quantization.quantize_static(
        str(float_path), str(path), Calibration((7, 6)), quant_format=quantization.QuantFormat.QDQ
    )
    assert artifacts.trainable_parameters(path) == []  # int8 weights, int32 biases
    said = r"needs trainable parameters.*stores its weights as integers.*'AddQDQPairToWeight': True.*LoRA"
    with pytest.raises(ValueError, match=said):
        generated(path, [], tmp_path)
