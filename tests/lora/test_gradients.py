"""The adapters' gradients in the training model equal torch's, over float and quantized bases, and central
finite differences in float64 through a weight read by a ``Transpose``.

torch computes the same model with each adapted weight ``W`` (for a quantized
base: the float value its codes stand for) replaced by ``W + (alpha / rank) A B``
(``(A B)^T`` for the ``Linear`` lm_head, a Gemm with ``transB=1``), with random
nonzero ``A`` and ``B`` (with ``B = 0`` every ``dA`` would be zero).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxtrain import artifacts
from onnxtrain.checkpoint import CheckpointState
from onnxtrain.lora import adapters_of, add_adapters, merge_adapters
from tests.lora.helpers import ALPHA, BASE_KINDS, RANK, TARGETS, Base, BaseKind, generate, run, with_values
from tests.lora.models import toy_task


def _torch_gradients(
    module: Any, base: Base, adapters: dict[str, tuple[np.ndarray, np.ndarray]]
) -> tuple[float, dict[str, np.ndarray]]:
    """torch's cross-entropy (mean) and its gradients for each adapter's ``A`` and ``B``.

    GPT-2's ``Conv1D`` weights are ``[in, out]``, the ``Linear`` lm_head's ``[out, in]``.
    """
    import torch

    ids, labels = toy_task()
    overrides: dict[str, Any] = {}
    leaves: dict[str, Any] = {}
    scale = ALPHA / RANK
    for weight, (a, b) in adapters.items():
        name = base.torch_name(weight)
        value = base.dequantized.get(name, None)
        w = torch.tensor(value) if value is not None else dict(module.named_parameters())[name].detach()
        leaves[f"{weight}.lora_A"] = ta = torch.tensor(a, requires_grad=True)
        leaves[f"{weight}.lora_B"] = tb = torch.tensor(b, requires_grad=True)
        update = scale * (ta @ tb)
        overrides[name] = w + (update.T if name == "lm_head.weight" else update)
    for name, value in base.dequantized.items():  # quantized weights without adapters
        overrides.setdefault(name, torch.tensor(value))
    logits = torch.func.functional_call(module, overrides, (torch.tensor(ids),))
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor(labels))
    loss.backward()
    return loss.item(), {name: leaf.grad.numpy() for name, leaf in leaves.items()}


@pytest.mark.parametrize("kind", BASE_KINDS)
def test_adapter_gradients_match_torch(
    gpt: tuple[Any, Any], bases: dict[BaseKind, Base], kind: BaseKind, tmp_path: Path
) -> None:
    base = bases[kind]
    adapted, names = add_adapters(base.model, TARGETS, RANK, ALPHA)
    rng = np.random.default_rng(1)
    values = {name: rng.normal(0.0, 0.3, size=_shape(adapted, name)).astype(np.float32) for name in names}
    adapted = with_values(adapted, values)
    records = {a.weight: a for a in adapters_of(adapted)}
    assert {r.kind for r in records.values()} == (
        {"MatMul", "Gemm"} if kind == "float" else {"Gemm", "MatMulNBits" if kind == "nbits" else "DequantizeLinear"}
    )
    folder = generate(adapted, names, tmp_path)
    training = onnx.load(folder / "training_model.onnx")
    # the int8 weights of a DequantizeLinear base feed only their DequantizeLinear (nothing differentiates
    # them); the gradient of MatMulNBits reads its B, scales and zero points to dequantize them
    int8 = {n.input[0] for n in base.model.graph.node if n.op_type == "DequantizeLinear"}
    assert {n.op_type for n in training.graph.node if int8 & set(n.input)} <= {"DequantizeLinear"}
    assert all(n.domain in ("", "ai.onnx") for n in training.graph.node if n.op_type != "MatMulNBits")
    ids, labels = toy_task()
    feeds = {"input_ids": ids, "labels": labels, **values, "lazy_reset_grad": np.array([True])}
    feeds.update({f"{name}_grad.accumulation.buffer": np.zeros_like(v) for name, v in values.items()})
    outputs = dict(zip([o.name for o in training.graph.output], run(training, feeds, optimized=False), strict=True))
    adapters = {w: (values[f"{w}.lora_A"], values[f"{w}.lora_B"]) for w in records}
    loss, expected = _torch_gradients(gpt[0], base, adapters)
    assert float(outputs[training.graph.output[0].name]) == pytest.approx(loss, rel=1e-5)
    for name in names:
        got = outputs[f"{name}_grad.accumulation.out"]
        np.testing.assert_allclose(got, expected[name], rtol=1e-3, atol=1e-5 * float(np.abs(expected[name]).max()))
        assert np.abs(expected[name]).max() > 1e-4, f"the gradient of {name} is zero: the check would be empty"


def _shape(model: Any, name: str) -> list[int]:
    return next(list(t.dims) for t in model.graph.initializer if t.name == name)


@pytest.mark.parametrize("kind", ["nbits", "dql"])
def test_sessions_keep_no_float_copy_of_quantized_weights(
    bases: dict[BaseKind, Base], kind: BaseKind, tmp_path: Path
) -> None:
    """onnxruntime folds constant subgraphs into initializers when a session loads: the gradient's
    dequantization must not become a float copy of every quantized weight (QLoRA's memory saving)."""
    base = bases[kind]
    adapted, names = add_adapters(base.model, TARGETS, RANK, ALPHA)
    folder = generate(adapted, names, tmp_path)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(folder / "training_model.onnx", options)
    optimized = onnx.load(tmp_path / "optimized.onnx")
    shapes = {tuple(v.shape) for v in base.dequantized.values()} | {tuple(v.T.shape) for v in base.dequantized.values()}
    float_weights = {t.name for t in base.model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    copies = [
        t.name
        for t in optimized.graph.initializer
        if t.data_type == onnx.TensorProto.FLOAT and tuple(t.dims) in shapes and t.name not in float_weights
    ]
    assert not copies, f"float copies of quantized weights folded by onnxruntime: {copies}"


def _transposing_model() -> onnx.ModelProto:
    """float64 ``y = Gemm(MatMul(x, Transpose(W)), Transpose(V), transB=1) + c``: ``W: [out=5, in=4]`` (torch's
    ``Linear`` as TorchScript exports it), ``V: [in=5, out=2]`` (transposed twice: stored as the product reads it)."""
    rng = np.random.default_rng(0)
    weights = {"W": rng.normal(size=(5, 4)), "V": rng.normal(size=(5, 2)), "c": rng.normal(size=(2,))}
    nodes = [
        helper.make_node("Transpose", ["W"], ["Wt"], name="/fc1/Transpose", perm=[1, 0]),
        helper.make_node("MatMul", ["x", "Wt"], ["h"], name="/fc1/MatMul"),
        helper.make_node("Transpose", ["V"], ["Vt"], name="/fc2/Transpose"),
        helper.make_node("Gemm", ["h", "Vt", "c"], ["y"], name="/fc2/Gemm", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [3, 2])],
        [numpy_helper.from_array(value, name) for name, value in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_adapters_through_a_transpose_match_finite_differences(tmp_path: Path) -> None:
    """Targeted by module (``fc1``, ``fc2``: the nodes' name paths), the adapters compute ``x (W + s (A B)^T)^T``
    and ``h (V + s A B)``; their float64 gradients equal central differences of the loss, and merging folds
    ``s (A B)^T`` into ``W`` and ``s A B`` into ``V``, the Transposes kept."""
    model = _transposing_model()
    adapted, names = add_adapters(model, ["fc1", "fc2"], 2, 3.0)
    records = {a.weight: a for a in adapters_of(adapted)}
    assert {w: (r.transposed, r.kind) for w, r in records.items()} == {"W": (True, "MatMul"), "V": (False, "Gemm")}
    rng = np.random.default_rng(1)
    shapes = {t.name: list(t.dims) for t in adapted.graph.initializer}
    values = {name: rng.normal(size=shapes[name]) for name in names}
    x, target = rng.normal(size=(3, 4)), rng.normal(size=(3, 2))
    artifacts.generate_artifacts(
        adapted,
        requires_grad=names,
        frozen_params=[],
        loss=artifacts.LossType.MSELoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=tmp_path,
    )
    training = onnx.load(tmp_path / "training_model.onnx")
    output_names = [o.name for o in training.graph.output]

    def outputs(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feeds = {"x": x, "target": target, **params, "lazy_reset_grad": np.array([True])}
        feeds.update({f"{name}_grad.accumulation.buffer": np.zeros_like(v) for name, v in params.items()})
        return dict(zip(output_names, run(training, feeds, optimized=False), strict=True))

    got = outputs(values)
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    s = 1.5
    w = weights["W"] + s * (values["W.lora_A"] @ values["W.lora_B"]).T
    v = weights["V"] + s * values["V.lora_A"] @ values["V.lora_B"]
    assert float(got[output_names[0]]) == pytest.approx(np.mean((x @ w.T @ v + weights["c"] - target) ** 2), rel=1e-12)
    eps = 1e-6
    for name in names:
        numeric = np.zeros_like(values[name])
        for index in np.ndindex(*numeric.shape):
            plus, minus = dict(values), dict(values)
            plus[name], minus[name] = values[name].copy(), values[name].copy()
            plus[name][index] += eps
            minus[name][index] -= eps
            difference = float(outputs(plus)[output_names[0]]) - float(outputs(minus)[output_names[0]])
            numeric[index] = difference / (2 * eps)
        np.testing.assert_allclose(got[f"{name}_grad.accumulation.out"], numeric, rtol=1e-6, atol=1e-8, err_msg=name)

    merged = merge_adapters(adapted, CheckpointState(trainable=values))
    assert [n.op_type for n in merged.graph.node] == ["Transpose", "MatMul", "Transpose", "Gemm"]
    merged_weights = {t.name: numpy_helper.to_array(t) for t in merged.graph.initializer}
    np.testing.assert_allclose(merged_weights["W"], w, rtol=1e-12)
    np.testing.assert_allclose(merged_weights["V"], v, rtol=1e-12)
    (expected,) = run(with_values(adapted, values), {"x": x})
    np.testing.assert_allclose(run(merged, {"x": x})[0], expected, rtol=1e-12, atol=1e-12)
