"""The memory of scatter-based gradients: large zeros made at run time, and no one-hot over a whole table.

The scatter-based rules (MaxPool, Gather, GatherND, GatherElements, strided
Slice) and the engine's zeros for values the loss ignores start from a zero
tensor as large as the input. Over ``FOLDED_ZEROS_LIMIT`` elements its size
comes from ``Size`` at run time, so that onnxruntime keeps no folded copy per
session; the gradients are those of the constant form. Below opset 16, where
scatters cannot add, repeated indices are summed over their distinct values.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from onnxtrain.autodiff import build_gradients, context
from onnxtrain.graph import GraphBuilder
from tests.helpers import FLOAT, INT64, make_model, run_model

Case = tuple[onnx.ModelProto, list[str], dict[str, np.ndarray]]


def _sum(y: str) -> onnx.NodeProto:
    return helper.make_node("ReduceSum", [y], ["loss"], keepdims=0)


def _max_pool(rng: np.random.Generator) -> Case:
    x = rng.normal(size=(2, 4, 32, 32)).astype(np.float32)
    nodes = [
        helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        _sum("y"),
    ]
    return make_model({"x": (FLOAT, list(x.shape))}, nodes, {"loss": (FLOAT, [])}), ["x"], {"x": x}


def _gather(rng: np.random.Generator) -> Case:
    table = rng.normal(size=(128, 48)).astype(np.float32)
    ids = rng.integers(0, 128, size=(4, 5))
    nodes = [helper.make_node("Gather", ["E", "ids"], ["e"]), _sum("e")]
    inputs = {"E": (FLOAT, list(table.shape)), "ids": (INT64, [4, 5])}
    return make_model(inputs, nodes, {"loss": (FLOAT, [])}), ["E"], {"E": table, "ids": ids}


def _gather_nd(rng: np.random.Generator) -> Case:
    x = rng.normal(size=(64, 8, 16)).astype(np.float32)
    idx = rng.integers(0, 8, size=(6, 2))
    idx[:, 0] = rng.integers(0, 64, size=6)
    nodes = [helper.make_node("GatherND", ["x", "i"], ["y"]), _sum("y")]
    inputs = {"x": (FLOAT, list(x.shape)), "i": (INT64, [6, 2])}
    return make_model(inputs, nodes, {"loss": (FLOAT, [])}), ["x"], {"x": x, "i": idx}


def _gather_elements(rng: np.random.Generator) -> Case:
    x = rng.normal(size=(64, 96)).astype(np.float32)
    idx = rng.integers(0, 64, size=(10, 96))
    nodes = [
        helper.make_node("GatherElements", ["x", "i"], ["y"], axis=0),
        _sum("y"),
    ]
    inputs = {"x": (FLOAT, list(x.shape)), "i": (INT64, [10, 96])}
    return make_model(inputs, nodes, {"loss": (FLOAT, [])}), ["x"], {"x": x, "i": idx}


def _strided_slice(rng: np.random.Generator) -> Case:
    x = rng.normal(size=(80, 80)).astype(np.float32)
    ints = [("starts", [1, 0]), ("ends", [80, 80]), ("axes", [0, 1]), ("steps", [3, 2])]
    initializers = [numpy_helper.from_array(np.array(v, np.int64), name) for name, v in ints]
    nodes = [
        helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"]),
        _sum("y"),
    ]
    return make_model({"x": (FLOAT, [80, 80])}, nodes, {"loss": (FLOAT, [])}, initializers), ["x"], {"x": x}


def _ignored_input(rng: np.random.Generator) -> Case:
    x, w = rng.normal(size=(100, 50)).astype(np.float32), rng.normal(size=(3,)).astype(np.float32)
    nodes = [_sum("w")]
    inputs = {"x": (FLOAT, [100, 50]), "w": (FLOAT, [3])}
    return make_model(inputs, nodes, {"loss": (FLOAT, [])}), ["x", "w"], {"x": x, "w": w}


CASES: dict[str, Callable[[np.random.Generator], Case]] = {
    "MaxPool": _max_pool,
    "Gather": _gather,
    "GatherND": _gather_nd,
    "GatherElements": _gather_elements,
    "strided Slice": _strided_slice,
    "a value the loss ignores": _ignored_input,
}


def _gradient_model(model: onnx.ModelProto, wrt: list[str]) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    builder = GraphBuilder(copy)
    grads = build_gradients(builder, "loss", wrt)
    builder.set_outputs([grads[name] for name in wrt])
    return builder.finalize()


def _constant_shapes(model: onnx.ModelProto) -> list[int]:
    """The element counts of the ConstantOfShape nodes whose shape is a constant (onnxruntime folds those)."""
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    constants.update(
        {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in model.graph.node if n.op_type == "Constant"}
    )
    return [
        int(np.prod(constants[n.input[0]]))
        for n in model.graph.node
        if n.op_type == "ConstantOfShape" and n.input[0] in constants
    ]


@pytest.mark.parametrize("case", list(CASES))
def test_large_zeros_are_made_at_run_time_with_the_same_gradients(case, monkeypatch, tmp_path: Path):
    model, wrt, feeds = CASES[case](np.random.default_rng(0))
    at_run_time = _gradient_model(model, wrt)
    assert all(count <= context.FOLDED_ZEROS_LIMIT for count in _constant_shapes(at_run_time))
    assert any(n.op_type == "Size" for n in at_run_time.graph.node)

    monkeypatch.setattr(context, "FOLDED_ZEROS_LIMIT", 1 << 40)
    constant = _gradient_model(model, wrt)
    assert any(count > 4096 for count in _constant_shapes(constant))  # the case reaches the limit
    for got, want, name in zip(run_model(at_run_time, feeds), run_model(constant, feeds), wrt, strict=True):
        np.testing.assert_array_equal(got, want, err_msg=name)

    # what onnxruntime keeps: no initializer as large as the zeros
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    ort.InferenceSession(at_run_time.SerializeToString(), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp_path / "optimized.onnx"))
    largest = max((int(np.prod(t.dims)) for t in optimized.graph.initializer), default=0)
    assert largest <= context.FOLDED_ZEROS_LIMIT


@pytest.mark.parametrize("op", ["Gather", "GatherND"])
def test_below_opset_16_repeated_indices_add_up_without_a_one_hot_over_the_table(op):
    """Without ScatterND's reduction (opset 16), the updates of each distinct index are summed first (Unique):
    no intermediate as large as (indices) x (rows of the table), which for an embedding is the vocabulary."""
    rng = np.random.default_rng(3)
    table = rng.normal(size=(20000, 16)).astype(np.float32)
    ids = rng.integers(0, 6, size=(8, 5))  # few distinct rows, each many times
    ids[0, 0] = 19999
    indices = ids if op == "Gather" else ids[..., None]
    nodes = [helper.make_node(op, ["E", "ids"], ["e"]), _sum("e")]
    inputs = {"E": (FLOAT, [20000, 16]), "ids": (INT64, list(indices.shape))}
    model = make_model(inputs, nodes, {"loss": (FLOAT, [])}, opset=13)
    gradient = _gradient_model(model, ["E"])
    assert any(n.op_type == "Unique" for n in gradient.graph.node)
    inferred = onnx.shape_inference.infer_shapes(gradient)
    sizes = [
        int(np.prod([d.dim_value for d in v.type.tensor_type.shape.dim]))
        for v in inferred.graph.value_info
        if v.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in v.type.tensor_type.shape.dim)
    ]
    assert max(sizes) <= table.size  # the zeros and the gradient, nothing larger
    (got,) = run_model(gradient, {"E": table, "ids": indices})
    expected = np.zeros_like(table)
    np.add.at(expected, ids.reshape(-1), 1.0)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def _ancestors(model: onnx.ModelProto, name: str) -> set[str]:
    """Every value ``name`` is computed from, at any distance."""
    producer = {out: node for node in model.graph.node for out in node.output}
    seen, stack = set(), [name]
    while stack:
        node = producer.get(stack.pop())
        for value in node.input if node is not None else ():
            if value and value not in seen:
                seen.add(value)
                stack.append(value)
    return seen


@pytest.mark.parametrize("case", [name for name in CASES if name != "a value the loss ignores"])
def test_large_zeros_wait_for_the_gradient_they_receive(case):
    """Made at run time from ``Size(x)`` alone, the zeros are ready when the run starts and onnxruntime may make
    them then, to hold them through the whole forward pass; they are made from the size of the gradient they
    receive too (``Size(after)``), so that they wait for it. (Zeros for a value the loss ignores receive none.)"""
    model, wrt, _ = CASES[case](np.random.default_rng(0))
    gradients = _gradient_model(model, wrt)
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in gradients.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    made = [node.output[0] for node in gradients.graph.node if node.op_type == "ConstantOfShape"]
    assert made
    for zeros in made:
        flowing, scatters = [zeros], []
        while flowing:  # through Reshape to the scatter that receives the gradient
            for node in readers.get(flowing.pop(), []):
                (scatters if node.op_type.startswith("Scatter") else flowing).append(
                    node if node.op_type.startswith("Scatter") else node.output[0]
                )
        received = {scatter.input[2] for scatter in scatters}
        received |= {value for name in received for value in _ancestors(gradients, name)}
        assert _ancestors(gradients, zeros) & received - {t.name for t in gradients.graph.initializer}, zeros


def _tied(rng: np.random.Generator, ids: np.ndarray, gathers: int, dtype: int = FLOAT) -> Case:
    """``loss = sum((Gather(E, ids) @ E^T) * r)`` with ``gathers`` gathers of the table (an embedding tied to
    the output layer): its gradient has ``gathers`` scatters and the product's contribution."""
    np_type = np.float64 if dtype == onnx.TensorProto.DOUBLE else np.float32
    table = rng.normal(size=(30, 7)).astype(np_type)
    weights = rng.normal(size=(*ids.shape, 30)).astype(np_type)
    nodes = [helper.make_node("Transpose", ["E"], ["Et"])]
    summed = []
    for k in range(gathers):
        nodes.append(helper.make_node("Gather", ["E", "ids"], [f"e{k}"]))
        summed.append(f"e{k}")
    if gathers > 1:
        nodes.append(helper.make_node("Sum", summed, ["e"]))
    else:
        nodes.append(helper.make_node("Identity", summed, ["e"]))
    nodes += [helper.make_node("MatMul", ["e", "Et"], ["y"]), helper.make_node("Mul", ["y", "r"], ["yr"]), _sum("yr")]
    inputs = {"E": (dtype, [30, 7]), "ids": (INT64, list(ids.shape)), "r": (dtype, list(weights.shape))}
    feeds = {"E": table, "ids": ids, "r": weights}
    return make_model(inputs, nodes, {"loss": (dtype, [])}), ["E"], feeds


@pytest.mark.parametrize("gathers", [1, 2])
@pytest.mark.parametrize("repeated", [False, True])
def test_a_gathered_tables_gradient_scatters_onto_its_other_contributions(gathers: int, repeated: bool) -> None:
    """A tied embedding's gradient: the gather's rows are scattered (adding) onto the product's contribution
    instead of onto zeros then summed: no zeros, no Sum, one tensor of the table's size fewer. The gradient is
    the finite differences' in float64, with rows gathered once or several times."""
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 30, size=(2, 3)) if repeated else rng.permutation(30)[:6].reshape(2, 3)
    model, wrt, feeds = _tied(rng, ids, gathers, onnx.TensorProto.DOUBLE)
    gradient = _gradient_model(model, wrt)
    ops = [n.op_type for n in gradient.graph.node]
    scatters = [n for n in gradient.graph.node if n.op_type == "ScatterElements"]
    assert len(scatters) == gathers and "ConstantOfShape" not in ops, ops
    producer = {out: n for n in gradient.graph.node for out in n.output}
    assert producer[scatters[0].input[0]].op_type != "ConstantOfShape"
    (got,) = run_model(gradient, feeds)

    def loss(table: np.ndarray) -> float:
        e = table[ids] * gathers
        return float(np.sum((e @ table.T) * feeds["r"]))

    expected = np.zeros_like(feeds["E"])
    for index in np.ndindex(*expected.shape):
        step = np.zeros_like(expected)
        step[index] = 1e-6
        expected[index] = (loss(feeds["E"] + step) - loss(feeds["E"] - step)) / 2e-6
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


def test_rows_scattered_once_give_the_sum_bit_for_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where each row is gathered once, adding onto the other contribution gives the sum of the scatter onto
    zeros and it, bit for bit (in float32). (A row that receives several updates adds them in another order.)"""
    from onnxtrain.autodiff import engine

    rng = np.random.default_rng(5)
    ids = rng.permutation(30)[:6].reshape(2, 3)
    model, wrt, feeds = _tied(rng, ids, 1)
    (got,) = run_model(_gradient_model(model, wrt), feeds)
    monkeypatch.setattr(engine._Backward, "_scattered_onto_zeros", lambda self, part, value: False)
    summed = _gradient_model(model, wrt)
    assert "ConstantOfShape" in [n.op_type for n in summed.graph.node]
    (want,) = run_model(summed, feeds)
    np.testing.assert_array_equal(got, want)
