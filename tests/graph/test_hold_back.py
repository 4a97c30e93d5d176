"""Holds: copies placed before a backward node wait for a gradient it reads, through ``Where(c, x, x)``.

The promise: a hold changes no value (bit for bit, an empty gradient and a
scalar value included); each copy that reads a value the backward may have
early is held, once, and a copy of a held copy is not held again; what
cannot or need not be held (constants, bfloat16 values, copies before the
first backward node) is left as it is.
"""

from __future__ import annotations

import copy
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from onnxtrain.graph.naming import names_in
from onnxtrain.graph.passes.hold_back import HELD_TYPES, MULTIPLIED_TYPES, hold_copies
from tests.helpers import FLOAT, make_model

ELEM_TYPES = {"x": FLOAT, "s": FLOAT, "g0": FLOAT, "g1": FLOAT, "g2": FLOAT, "w": FLOAT, "b": TensorProto.BFLOAT16}


def _backward() -> list[onnx.NodeProto]:
    """``g0 = -x``, ``g1 = g0 * r``, ``g2 = g1 + t + s``: the gradients, ``r`` and ``t`` recomputed."""
    return [
        helper.make_node("Neg", ["x"], ["g0"], name="B0"),
        helper.make_node("Mul", ["g0", "r"], ["g1"], name="B1"),
        helper.make_node("Add", ["g1", "t"], ["t1"], name="B2"),
        helper.make_node("Add", ["t1", "s"], ["g2"], name="B3"),
    ]


def _placed() -> dict[int, list[onnx.NodeProto]]:
    """``r = Relu(x)`` before B1; ``t = Sigmoid(r) * Exp(w) * Abs(s)`` before B2 (``w`` an initializer)."""
    return {
        1: [helper.make_node("Relu", ["x"], ["r"], name="r.recomputed")],
        2: [
            helper.make_node("Sigmoid", ["r"], ["q"], name="q.recomputed"),
            helper.make_node("Exp", ["w"], ["e"], name="e.recomputed"),
            helper.make_node("Abs", ["s"], ["a"], name="a.recomputed"),
            helper.make_node("Mul", ["q", "e"], ["qe"], name="qe.recomputed"),
            helper.make_node("Mul", ["qe", "a"], ["t"], name="t.recomputed"),
        ],
    }


def _model(backward: list[onnx.NodeProto], placed: dict[int, list[onnx.NodeProto]]) -> onnx.ModelProto:
    nodes = [n for index, node in enumerate(backward) for n in [*placed.get(index, []), node]]
    return make_model(
        {"x": (FLOAT, ["n", 3]), "s": (FLOAT, None)},
        nodes,
        {"g2": (FLOAT, None)},
        [("w", np.linspace(-1, 1, 3).astype(np.float32))],
    )


def _hold(
    backward: list[onnx.NodeProto],
    placed: dict[int, list[onnx.NodeProto]],
    elem_types: dict[str, int] = ELEM_TYPES,
    small: frozenset[str] = frozenset(),
    ranks: dict[str, int] | None = None,
) -> tuple[onnx.ModelProto, int]:
    """The model of ``backward`` and ``placed``, and the number of holds ``hold_copies`` added to them."""
    model = _model(backward, placed)
    holds = hold_copies(
        model.graph,
        backward,
        placed,
        available={"w"},
        elem_type=elem_types.get,
        rank=(ranks or {}).get,
        small=small.__contains__,
        taken=names_in(model.graph),
        opset=17,
    )
    return model, holds


def _held(
    elem_types: dict[str, int] = ELEM_TYPES, ranks: dict[str, int] | None = None
) -> tuple[onnx.ModelProto, dict[int, list[onnx.NodeProto]], int]:
    backward, placed = _backward(), _placed()
    model, holds = _hold(backward, placed, elem_types, ranks=ranks)
    del model.graph.node[:]
    model.graph.node.extend(_model(backward, placed).graph.node)
    return model, placed, holds


def _holds(nodes: list[onnx.NodeProto]) -> dict[str, str]:
    """``{held: value}`` of the holds among ``nodes``: ``Mul(value, one)`` (floats), ``Where(c, value, value)``."""
    found = {}
    for node in nodes:
        if node.op_type == "Mul" and re.search(r"\.held(_\d+)?$", node.output[0]):
            found[node.output[0]] = node.input[0]
        elif node.op_type == "Where":
            assert node.input[1] == node.input[2]
            found[node.output[0]] = node.input[1]
    return found


def test_each_copy_reading_an_early_value_waits_for_a_gradient_and_held_copies_are_not_held_again():
    _, placed, holds = _held()
    assert holds == 2
    assert _holds(placed[1]) == {"x.held": "x"}
    assert placed[1][-1].input[:] == ["x.held"]
    assert _holds(placed[2]) == {"s.held": "s"}  # r is held already; w is a constant
    by_name = {node.name: node for node in placed[2]}
    assert by_name["q.recomputed"].input[:] == ["r"]
    assert by_name["e.recomputed"].input[:] == ["w"]
    assert by_name["a.recomputed"].input[:] == ["s.held"]
    order = [node.name or node.op_type for node in placed[2]]
    assert order.index("s.held") == order.index("a.recomputed") - 1  # each hold right before its copy
    reshape = next(node for node in placed[2] if node.op_type == "Reshape")
    assert reshape.input[0] == "g1"  # the float input of B2 made by an earlier backward node


@pytest.mark.parametrize(
    ("inputs", "small", "held"),
    [
        (["k", "s"], {"k"}, "s"),
        (["k", "s"], {"k", "s"}, "k"),
        (["x", "m"], set(), "m"),  # x is a graph input (a parameter, say), m a forward value
        (["x", "m"], {"m"}, "x"),
    ],
)
def test_one_input_is_held_and_not_a_small_one_nor_a_graph_input_where_there_is_a_choice(
    inputs: list[str], small: set[str], held: str
):
    backward, placed = _backward(), {1: [helper.make_node("Mul", inputs, ["r"], name="r.recomputed")]}
    _, holds = _hold(backward, placed, {**ELEM_TYPES, "k": FLOAT, "m": FLOAT}, frozenset(small))
    assert holds == 1
    assert list(_holds(placed[1]).values()) == [held]


@pytest.mark.parametrize(
    ("rows", "s_shape"),
    [(2, (2, 3)), (0, (0, 3)), (2, ())],
    ids=["a batch", "an empty gradient", "a scalar held"],
)
def test_holds_change_no_value(rows: int, s_shape: tuple[int, ...]):
    held, _, _ = _held()
    plain = _model(_backward(), _placed())
    rng = np.random.default_rng(rows)
    x = rng.normal(size=(rows, 3)).astype(np.float32)
    x[0:1, 0] = np.nan if rows else x[0:1, 0]
    feeds = {"x": x, "s": rng.normal(size=s_shape).astype(np.float32)}
    for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        got, want = (
            ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)
            for m in (held, plain)
        )
        np.testing.assert_array_equal(got[0], want[0])
        assert got[0].shape == want[0].shape


@pytest.mark.parametrize("elem_type", sorted(HELD_TYPES))
def test_onnxruntime_has_a_where_for_every_type_held_by_where(elem_type: int):
    """The claim :data:`HELD_TYPES` makes, checked on this onnxruntime (CI runs the oldest and the newest): a
    ``Where`` of that type loads and runs on the CPU. (Bool has none: ALBERT's and Qwen2's checkpointed steps,
    whose attention masks test ``IsNaN``, failed to load when bool was held by ``Where``.)"""
    dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
    node = helper.make_node("Where", ["c", "x", "x"], ["y"])
    model = make_model({"c": (TensorProto.BOOL, [2]), "x": (elem_type, [2])}, [node], {"y": (elem_type, [2])}, opset=16)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.array([1, 0]).astype(dtype)
    np.testing.assert_array_equal(session.run(None, {"c": np.array([True, False]), "x": x})[0], x)


@pytest.mark.parametrize("elem_type", sorted(MULTIPLIED_TYPES))
def test_a_float_held_by_a_product_is_the_same_bit_for_bit(elem_type: int):
    """``x * Cast(c)``, ``c`` true, on this onnxruntime (CI runs the oldest and the newest): ``x``'s bits, signed
    zeros, infinities, NaN and the smallest subnormal included."""
    dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
    nodes = [helper.make_node("Cast", ["c"], ["one"], to=elem_type), helper.make_node("Mul", ["x", "one"], ["y"])]
    model = make_model({"c": (TensorProto.BOOL, []), "x": (elem_type, [7])}, nodes, {"y": (elem_type, [7])})
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    tiny = np.finfo(dtype).smallest_subnormal
    x = np.array([1.5, -0.0, 0.0, np.inf, -np.inf, np.nan, tiny], dtype=dtype)
    assert session.run(None, {"c": np.array(True), "x": x})[0].tobytes() == x.tobytes()


def test_floats_are_held_by_a_product_and_integers_by_where():
    """``s`` (float32, as the gradient it waits for) by ``Mul`` with the gradient's own 1, no cast and no bool
    condition; ``x`` of int64 by ``Where`` on a true condition; a float16 ``x`` by ``Mul`` with that true cast."""
    _, placed, holds = _held({**ELEM_TYPES, "x": TensorProto.INT64})
    assert holds == 2
    assert [n.op_type for n in placed[1] if n.output[0] == "x.held"] == ["Where"]
    assert [n.op_type for n in placed[2] if n.output[0] == "s.held"] == ["Mul"]
    assert not [n for n in placed[2] if n.op_type in ("Cast", "Where")]
    _, placed, _ = _held({**ELEM_TYPES, "x": TensorProto.FLOAT16})
    made = {n.output[0]: n for n in placed[1]}
    one = made[made["x.held"].input[1]]
    assert one.op_type == "Cast" and one.attribute[0].i == TensorProto.FLOAT16


@pytest.mark.parametrize("elem_type", [TensorProto.BFLOAT16, TensorProto.BOOL])
def test_values_where_lacks_a_kernel_for_are_held_by_appending_nothing_and_scalars_of_them_not_at_all(
    elem_type: int,
):
    assert elem_type not in HELD_TYPES
    types = {**ELEM_TYPES, "x": elem_type, "s": elem_type}
    _, placed, holds = _held(types, ranks={"x": 2, "s": 0})
    assert holds == 1
    concat = next(node for node in placed[1] if node.output[0] == "x.held")
    assert concat.op_type == "Concat" and concat.input[0] == "x"
    assert [node.op_type for node in placed[2]] == [node.op_type for node in _placed()[2]]  # s: a scalar


def test_a_value_held_by_appending_nothing_is_the_same_bit_for_bit():
    """``x`` of bfloat16 (made from a float input: NumPy feeds no bfloat16), held before ``Identity``, for a
    batch and an empty one, with onnxruntime's optimizations on and off."""
    backward = [
        helper.make_node("Neg", ["f"], ["g0"], name="B0"),
        helper.make_node("Cast", ["r"], ["g1"], name="B1", to=FLOAT),
        helper.make_node("Add", ["g1", "g0"], ["g2"], name="B2"),
    ]

    def model(placed: dict[int, list[onnx.NodeProto]]) -> onnx.ModelProto:
        built = make_model(
            {"f": (FLOAT, ["n", 3])},
            [helper.make_node("Cast", ["f"], ["x"], to=TensorProto.BFLOAT16), *_model(backward, placed).graph.node],
            {"g2": (FLOAT, None)},
        )
        return built

    plain = model({1: [helper.make_node("Identity", ["x"], ["r"], name="r.recomputed")]})
    placed = {1: [helper.make_node("Identity", ["x"], ["r"], name="r.recomputed")]}
    held = model(placed)
    holds = hold_copies(
        held.graph,
        backward,
        placed,
        available=set(),
        elem_type={"x": TensorProto.BFLOAT16, "g0": FLOAT, "f": FLOAT}.get,
        rank={"x": 2}.get,
        small=lambda name: False,
        taken=names_in(held.graph),
        opset=17,
    )
    assert holds == 1
    del held.graph.node[1:]
    held.graph.node.extend(_model(backward, placed).graph.node)
    for rows in (3, 0):
        feeds = {"f": np.random.default_rng(rows).normal(size=(rows, 3)).astype(np.float32)}
        for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
            options = ort.SessionOptions()
            options.graph_optimization_level = level
            got, want = (
                ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(
                    None, feeds
                )
                for m in (held, plain)
            )
            np.testing.assert_array_equal(got[0], want[0])


def test_without_a_gradient_read_the_copies_wait_for_the_node_before():
    backward, placed = _backward(), _placed()
    backward[1] = helper.make_node("Mul", ["x", "r"], ["g1"], name="B1")  # reads no backward value
    _hold(backward, placed)
    reshape = next(node for node in placed[1] if node.op_type == "Reshape")
    assert reshape.input[0] == "g0"


def test_copies_before_the_first_backward_node_are_not_held():
    backward, placed = _backward(), {0: copy.deepcopy(_placed()[1])}
    _, holds = _hold(backward, placed)
    assert holds == 0
    assert [node.op_type for node in placed[0]] == ["Relu"]


def _scalar_case(values_only: bool) -> tuple[onnx.ModelProto, onnx.ModelProto, dict[int, list[onnx.NodeProto]], int]:
    """GPT-2's GELU copies in small: ``r = Pow(x, three) + c`` before B1 (``three`` a float scalar initializer,
    ``c`` a ``Constant`` node of shape ``[1]``) and ``t = Cast(Mul(h, half)) + x * c`` before B2 (``h`` a float16
    forward value, ``half`` a float16 ``[1, 1]``): the held model, the plain one, the copies placed, the holds."""
    forward = [
        helper.make_node("Cast", ["x"], ["h"], name="F0", to=TensorProto.FLOAT16),
        helper.make_node("Constant", [], ["c"], name="F1", value=onnx.numpy_helper.from_array(np.array([0.25], "f"))),
    ]
    backward = [
        helper.make_node("Neg", ["x"], ["g0"], name="B0"),
        helper.make_node("Mul", ["g0", "r"], ["g1"], name="B1"),
        helper.make_node("Add", ["g1", "t"], ["g2"], name="B2"),
    ]

    def placed() -> dict[int, list[onnx.NodeProto]]:
        return {
            1: [
                helper.make_node("Pow", ["x", "three"], ["p"], name="p.recomputed"),
                helper.make_node("Add", ["p", "c"], ["r"], name="r.recomputed"),
            ],
            2: [
                helper.make_node("Mul", ["h", "half"], ["t16"], name="t16.recomputed"),
                helper.make_node("Cast", ["t16"], ["t32"], name="t32.recomputed", to=FLOAT),
                helper.make_node("Mul", ["x", "c"], ["xc"], name="xc.recomputed"),
                helper.make_node("Add", ["t32", "xc"], ["t"], name="t.recomputed"),
            ],
        }

    def model(copies: dict[int, list[onnx.NodeProto]]) -> onnx.ModelProto:
        nodes = [*forward, *(n for i, node in enumerate(backward) for n in [*copies.get(i, []), node])]
        return make_model(
            {"x": (FLOAT, ["n", 3])},
            nodes,
            {"g2": (FLOAT, None)},
            [("three", np.array(3.0, np.float32)), ("half", np.array([[0.5]], np.float16))],
        )

    copies = placed()
    held = model(copies)
    holds = hold_copies(
        held.graph,
        backward,
        copies,
        available={"three", "half", "c"},
        elem_type={"x": FLOAT, "h": TensorProto.FLOAT16, "g0": FLOAT, "g1": FLOAT}.get,
        rank={"x": 2, "h": 2}.get,
        small=lambda name: False,
        taken=names_in(held.graph),
        opset=17,
        values_only=lambda node: values_only,
    )
    del held.graph.node[:]
    held.graph.node.extend(model(copies).graph.node)
    return held, model(placed()), copies, holds


def test_an_elementwise_copy_holds_its_one_element_constant_not_the_value_it_reads():
    """No pass over ``x`` or ``h``: ``three`` (the gradient's type: taken from ``Concat(first, [3])``), ``c``
    (the same, reshaped to ``[1]``) before B2 and ``half`` (float16: times a cast ``True``) are held; before B1,
    ``c`` is read by a copy that waits for ``p`` already."""
    _, _, placed, holds = _scalar_case(values_only=True)
    assert holds == 3
    made = {node.output[0]: node for nodes in placed.values() for node in nodes}
    assert [n.input[:] for n in placed[1] if n.name == "p.recomputed"] == [["x", "three.held"]]
    assert [n.input[:] for n in placed[1] if n.name == "r.recomputed"] == [["p", "c"]]
    assert [n.input[:] for n in placed[2] if n.name == "t16.recomputed"] == [["h", "half.held"]]
    assert [n.input[:] for n in placed[2] if n.name == "xc.recomputed"] == [["x", "c.held"]]
    assert made["three.held"].op_type == "Gather"
    assert made[made["three.held"].input[0]].op_type == "Concat"
    assert made["c.held"].op_type == "Reshape" and made[made["c.held"].input[0]].op_type == "Gather"
    half = made["half.held"]
    assert half.op_type == "Mul" and half.input[0] == "half"
    assert made[half.input[1]].op_type == "Cast" and made[half.input[1]].attribute[0].i == TensorProto.FLOAT16
    assert _holds([n for nodes in placed.values() for n in nodes]) == {"half.held": "half"}  # nothing of x or h


def test_a_copy_that_may_read_its_inputs_as_shapes_holds_the_value():
    _, _, placed, holds = _scalar_case(values_only=False)
    assert holds == 3
    assert _holds(placed[1]) == {"x.held": "x"}
    assert _holds(placed[2]) == {"h.held": "h", "x.held_1": "x"}


@pytest.mark.parametrize("rows", [2, 0], ids=["a batch", "an empty gradient"])
def test_held_constants_change_no_value(rows: int):
    held, plain, _, _ = _scalar_case(values_only=True)
    x = np.random.default_rng(rows).normal(size=(rows, 3)).astype(np.float32)
    for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        got, want = (
            ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})
            for m in (held, plain)
        )
        assert got[0].tobytes() == want[0].tobytes()
        assert got[0].shape == want[0].shape
