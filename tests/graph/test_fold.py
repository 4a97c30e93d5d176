"""``fold_static_shapes``: shape computations of fixed shapes become constants, with the values onnxruntime computes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from onnxtrain.graph.fold import MAX_ELEMENTS, evaluate_constant
from onnxtrain.graph.io import copy_model
from onnxtrain.graph.passes import fold_static_shapes
from onnxtrain.sessions import inference_session
from tests.helpers import FLOAT, make_model


def _mean_gradient_model() -> onnx.ModelProto:
    """What the autodiff emits for ``ReduceMean``'s gradient: ``Expand(Cast(Size(y)) / Cast(Size(x)), Shape(x))``."""
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["m"], keepdims=0),
        helper.make_node("Size", ["x"], ["n"]),
        helper.make_node("Cast", ["n"], ["nf"], to=FLOAT),
        helper.make_node("Size", ["m"], ["k"]),
        helper.make_node("Cast", ["k"], ["kf"], to=FLOAT),
        helper.make_node("Div", ["kf", "nf"], ["scale"]),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Expand", ["scale", "shape"], ["scales"]),
        helper.make_node("Mul", ["scales", "x"], ["y"]),
    ]
    return make_model({"x": (FLOAT, ["batch", 3])}, nodes, {"y": (FLOAT, ["batch", 3]), "m": (FLOAT, [])})


def _run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    return inference_session(model.SerializeToString()).run(None, {"x": x})


def test_fixed_shapes_fold_the_computations_into_constants() -> None:
    model = _mean_gradient_model()
    folded = fold_static_shapes(copy_model(model), shapes={"x": [7, 3]})
    assert [node.op_type for node in folded.graph.node] == ["ReduceMean", "Mul"]
    onnx.checker.check_model(folded, full_check=True)
    x = np.random.default_rng(0).normal(size=(7, 3)).astype(np.float32)
    for got, expected in zip(_run(folded, x), _run(model, x), strict=True):
        np.testing.assert_array_equal(got, expected)  # the same bits as computed at run time
    assert {t.name for t in folded.graph.initializer} == {"scales"}  # the folded nodes' inputs are dropped


def test_unknown_sizes_stay_computed() -> None:
    model = _mean_gradient_model()
    folded = fold_static_shapes(copy_model(model), shapes={})  # the batch size unknown: only the scalar mean's size is
    assert [node.op_type for node in folded.graph.node] == [
        "ReduceMean",
        "Size",
        "Cast",
        "Div",
        "Shape",
        "Expand",
        "Mul",
    ]
    assert len(model.graph.node) == 9  # the input is not changed
    x = np.random.default_rng(1).normal(size=(5, 3)).astype(np.float32)
    for got, expected in zip(_run(folded, x), _run(model, x), strict=True):
        np.testing.assert_array_equal(got, expected)


def test_graph_outputs_and_large_values_stay_computed() -> None:
    model = _mean_gradient_model()
    model.graph.output.append(helper.make_tensor_value_info("scale", FLOAT, []))
    rows = MAX_ELEMENTS  # `scales` would have 3 * MAX_ELEMENTS elements
    folded = fold_static_shapes(copy_model(model), shapes={"x": [rows, 3]})
    kept = [node.op_type for node in folded.graph.node]
    assert "Div" in kept and "Expand" in kept and "Size" not in kept and "Shape" not in kept


CASES = {
    "Add": ([np.float32([1.5, 2.25]), np.float32(3.0)], {}),
    "Sub": ([np.float64([1.0, -2.0]), np.float64([0.5, 0.25])], {}),
    "Mul": ([np.int64([3, 4]), np.int64([5, 6])], {}),
    "Div": ([np.float32([1.0, 2.0]), np.float32([3.0, 7.0])], {}),
    "Neg": ([np.float32([1.0, -2.0])], {}),
    "Sqrt": ([np.float32([2.0, 3.0])], {}),
    "Reciprocal": ([np.float32([3.0, 7.0])], {}),
    "Identity": ([np.int64([1, 2])], {}),
    "Cast": ([np.int64([7, 32])], {"to": onnx.TensorProto.FLOAT}),
    "Concat": ([np.int64([1]), np.int64([2, 3])], {"axis": 0}),
    "Expand": ([np.float32(0.25), np.int64([3, 1])], {}),
    "Gather": ([np.int64([4, 5, 6]), np.int64([-1, 0])], {"axis": 0}),
    "Reshape": ([np.arange(6, dtype=np.float32).reshape(2, 3), np.int64([0, -1])], {}),
    "Unsqueeze": ([np.float32([1.0, 2.0]), np.int64([0, -1])], {}),
    "Squeeze": ([np.float32([[1.0, 2.0]]), np.int64([0])], {}),
    "ConstantOfShape": ([np.int64([2, 3])], {"value": numpy_helper.from_array(np.int64([7]))}),
    "Transpose": ([np.arange(6, dtype=np.int64).reshape(3, 2)], {"perm": [1, 0]}),
    # torch's F.pad reverses its pads so: from the last row to the first, by -1
    "Slice": ([np.arange(8, dtype=np.int64).reshape(4, 2), *np.int64([[-1], [-(2**63)], [0], [-1]])], {}),
}


@pytest.mark.parametrize("op", sorted(CASES))
def test_each_foldable_operator_computes_what_onnx_defines(op: str) -> None:
    from onnx.reference import ReferenceEvaluator

    inputs, attrs = CASES[op]
    names = [f"i{k}" for k in range(len(inputs))]
    node = helper.make_node(op, names, ["out"], **attrs)
    graph = helper.make_graph(
        [node], "one", [], [helper.make_empty_tensor_value_info("out")],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in zip(names, inputs, strict=True)],
    )  # fmt: skip
    expected = ReferenceEvaluator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])).run(None, {})
    got = evaluate_constant(node, [np.asarray(v) for v in inputs], 17)
    assert got is not None and got.dtype == expected[0].dtype
    np.testing.assert_array_equal(got, expected[0])


def test_onnxruntime_infers_the_same_shapes_without_loading_onnx_schemas() -> None:
    from onnxtrain.sessions import inferred_shapes

    model = _mean_gradient_model()
    model.ir_version = 8
    fixed = {"x": [7, 3]}
    by_onnx = fold_static_shapes(copy_model(model), shapes=fixed)
    by_onnxruntime = fold_static_shapes(copy_model(model), shapes=fixed, shapes_of=inferred_shapes)
    assert [n.op_type for n in by_onnxruntime.graph.node] == [n.op_type for n in by_onnx.graph.node]
    assert inferred_shapes(model, ["m", "shape", "nowhere"]) == {
        "m": None,
        "shape": [2],
        "nowhere": None,
    }  # [] or unknown


_BOUNDS = st.sampled_from([-(2**63), 2**63 - 1, -(2**31) - 1, 2**31 - 1]) | st.integers(-7, 7)


@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3), data=st.data())
def test_a_folded_slice_equals_onnxruntimes(shape: list[int], data: st.DataObject) -> None:
    """Any starts, ends, axes and steps, the extremes of int32 and int64 too (onnxruntime reads an end of the
    largest int32 or int64 as no end, which ONNX's text would clamp to the last element with a negative step):
    the fold gives onnxruntime's values and shape, or nothing where the result is empty."""
    x = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    rank = len(shape)
    axes = data.draw(st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank, unique_by=lambda a: a % rank))
    starts = [data.draw(_BOUNDS) for _ in axes]
    ends = [data.draw(_BOUNDS) for _ in axes]
    steps = [data.draw(st.sampled_from([1, 2, 3, -1, -2])) for _ in axes]
    bounds = [np.int64(v) for v in (starts, ends, axes, steps)]
    node = helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"])
    names = ("starts", "ends", "axes", "steps")
    model = make_model(
        {"x": (onnx.TensorProto.INT64, shape)}, [node], {"y": (onnx.TensorProto.INT64, None)},
        initializers=[numpy_helper.from_array(v, n) for n, v in zip(names, bounds, strict=True)],
    )  # fmt: skip
    (want,) = inference_session(model.SerializeToString()).run(None, {"x": x})
    got = evaluate_constant(node, [x, *bounds], 17)
    if got is None:
        assert want.size == 0
    else:
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)
