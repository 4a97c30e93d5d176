"""add_adapters on a GPT-2-style model: adapters only where targeted, the base's outputs unchanged at the start."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from onnxtrain.lora import adapters_of, add_adapters
from tests.lora.helpers import ALPHA, BASE_KINDS, RANK, TARGETS, Base, BaseKind, run
from tests.lora.models import toy_task


def _products(model: onnx.ModelProto) -> dict[str, str]:
    """``{weight: op_type}`` for every product reading an initializer (or a dequantized one) as its weight."""
    initializers = {t.name for t in model.graph.initializer}
    dequantized = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    found = {}
    for node in model.graph.node:
        if node.op_type in ("MatMul", "Gemm", "MatMulNBits") and len(node.input) > 1:
            weight = dequantized.get(node.input[1], node.input[1])
            if weight in initializers:
                found[weight] = node.op_type
    return found


@pytest.mark.parametrize("kind", BASE_KINDS)
def test_adapters_go_only_beside_the_targeted_weights(bases: dict[BaseKind, Base], kind: BaseKind) -> None:
    base = bases[kind]
    before = base.model.SerializeToString()
    products = _products(base.model)
    adapted, names = add_adapters(base.model, ["*attn.c_attn.weight*", "lm_head.weight*"], RANK, ALPHA)
    assert base.model.SerializeToString() == before, "the caller's model was changed"
    targeted = [w for w in products if w.startswith(("h0.attn.c_attn.weight", "lm_head.weight"))]
    assert len(targeted) == 2
    assert names == [f"{w}.lora_{x}" for w in targeted for x in "AB"]
    # each targeted product now feeds an Add of the adapter; the other products are as they were
    adapters = {a.weight: a for a in adapters_of(adapted)}
    assert set(adapters) == set(targeted)
    outputs = {p.output: p for a in adapters.values() for p in a.placements}
    adds = [n for n in adapted.graph.node if n.output and n.output[0] in outputs]
    assert [n.op_type for n in adds] == ["Add", "Add"]
    untouched = [n for n in base.model.graph.node if n.op_type in ("MatMul", "Gemm", "MatMulNBits")]
    assert sum(n.op_type in ("MatMul", "Gemm", "MatMulNBits") for n in adapted.graph.node) == len(untouched) + 2 * 2
    initializers = {t.name: t for t in adapted.graph.initializer}
    for weight in targeted:
        a, b = initializers[f"{weight}.lora_A"], initializers[f"{weight}.lora_B"]
        site = adapters[weight]
        assert a.dims[1] == RANK and b.dims[0] == RANK
        assert not onnx.numpy_helper.to_array(b).any(), "B starts at zero"
        assert site.scale == ALPHA / RANK
    # lm_head is a Gemm with transB=1: A is [in=16, r], B [r, out=12]
    head_a, head_b = (initializers[n] for n in names if n.startswith("lm_head"))
    assert list(head_a.dims) == [16, RANK] and list(head_b.dims) == [RANK, 12]
    onnx.checker.check_model(adapted)


@pytest.mark.parametrize("kind", BASE_KINDS)
def test_adapted_model_starts_equal_to_the_base(bases: dict[BaseKind, Base], kind: BaseKind) -> None:
    base = bases[kind]
    adapted, _ = add_adapters(base.model, TARGETS, RANK, ALPHA, dropout=0.1)
    ids, _ = toy_task()
    (expected,) = run(base.model, {"input_ids": ids}, optimized=kind != "dql")
    (got,) = run(adapted, {"input_ids": ids}, optimized=kind != "dql")
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_initialisation_follows_peft() -> None:
    """A: Kaiming-uniform (bound 1/sqrt(in), PEFT's default) or Gaussian (sd 1/rank), from the seed; B: zeros."""
    weight = onnx.numpy_helper.from_array(np.ones((400, 30), np.float32), "W")
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 400])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 30])
    graph = onnx.helper.make_graph([onnx.helper.make_node("MatMul", ["x", "W"], ["y"])], "g", [x], [y], [weight])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    values = {}
    for init in ("kaiming", "gaussian"):
        adapted, _ = add_adapters(model, "W", 8, 16, init=init, seed=3)
        values[init] = {t.name: onnx.numpy_helper.to_array(t) for t in adapted.graph.initializer}
    kaiming, gaussian = values["kaiming"]["W.lora_A"], values["gaussian"]["W.lora_A"]
    assert kaiming.shape == gaussian.shape == (400, 8)
    assert np.abs(kaiming).max() <= 1 / 20 and np.abs(kaiming).max() > 0.95 / 20
    assert abs(float(gaussian.std()) - 1 / 8) < 0.01
    again, _ = add_adapters(model, "W", 8, 16, init="kaiming", seed=3)
    assert np.array_equal(onnx.numpy_helper.to_array(again.graph.initializer[1]), kaiming)


def test_a_weight_read_through_identity_copies_gets_one_adapter_for_every_use() -> None:
    """torch's TorchScript exporter reads a layer applied twice (ALBERT's shared layer) through an ``Identity``
    per use: one adapter beside the weight serves both, as PEFT's does (it was refused as read elsewhere)."""
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(3, 3)).astype(np.float32)
    nodes = [
        onnx.helper.make_node("Identity", ["W"], ["w_use1"]),
        onnx.helper.make_node("Identity", ["W"], ["w_use2"]),
        onnx.helper.make_node("MatMul", ["x", "w_use1"], ["h"]),
        onnx.helper.make_node("MatMul", ["h", "w_use2"], ["y"]),
    ]
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])
    graph = onnx.helper.make_graph(nodes, "shared", [x], [y], [onnx.numpy_helper.from_array(weight, "W")])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    adapted, _ = add_adapters(model, "W", 2, 4)
    (adapter,) = adapters_of(adapted)
    assert adapter.weight == "W" and len(adapter.placements) == 2
    values = {t.name: onnx.numpy_helper.to_array(t) for t in adapted.graph.initializer}
    a, b = values["W.lora_A"], rng.normal(size=(2, 3)).astype(np.float32)
    for tensor in adapted.graph.initializer:
        if tensor.name == "W.lora_B":
            tensor.CopyFrom(onnx.numpy_helper.from_array(b, "W.lora_B"))
    inputs = rng.normal(size=(2, 3)).astype(np.float32)
    effective = weight + (4 / 2) * a @ b  # both uses read the adapted weight
    (got,) = run(adapted, {"x": inputs})
    np.testing.assert_allclose(got, inputs @ effective @ effective, rtol=1e-5, atol=1e-6)
