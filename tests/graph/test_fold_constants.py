"""``fold_constants``: what a graph computes from its small constants, folded so that shape inference sees it.

torch's TorchScript exporter (training mode, no constant folding) gives
``Resize`` its scales as ``Concat(Constant, Constant)``; onnx's shape inference
reads the values of ``Constant`` nodes and initializers, not of a ``Concat`` of
them, so the ``Resize``'s output shape stayed unknown.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnxtrain.graph.fold import MAX_ELEMENTS
from onnxtrain.graph.io import copy_model, inferred_skeleton, load_base_model
from onnxtrain.graph.passes import constants, fold_constants
from onnxtrain.sessions import inference_session
from tests.helpers import FLOAT, INT64, make_model


def _constant(name: str, values: list[float]) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.float32(values), name))


def _concat_scales_model() -> onnx.ModelProto:
    """``y = Resize(x, scales = Concat(Constant [1, 1], Constant [2, 2]))`` for ``x: float[N, 2, 3, 3]``."""
    nodes = [
        _constant("ones", [1.0, 1.0]),
        _constant("twos", [2.0, 2.0]),
        helper.make_node("Concat", ["ones", "twos"], ["scales"], axis=0),
        helper.make_node(
            "Resize", ["x", "", "scales"], ["y"], mode="nearest",
            coordinate_transformation_mode="asymmetric", nearest_mode="floor",
        ),
    ]  # fmt: skip
    return make_model({"x": (FLOAT, ["N", 2, 3, 3])}, nodes, {"y": (FLOAT, ["N", 2, "H", "W"])})


def _inferred_dims(model: onnx.ModelProto, name: str) -> list[int | str | None]:
    graph = inferred_skeleton(model).graph
    value = next(v for v in (*graph.value_info, *graph.output) if v.name == name)
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in value.type.tensor_type.shape.dim]


def test_concat_of_constants_becomes_a_constant_and_the_model_is_not_changed() -> None:
    model = _concat_scales_model()
    before = model.SerializeToString()
    folded = fold_constants(copy_model(model))
    assert model.SerializeToString() == before
    assert [node.op_type for node in folded.graph.node] == ["Constant", "Constant", "Constant", "Resize"]
    scales = numpy_helper.to_array(folded.graph.node[2].attribute[0].t)
    np.testing.assert_array_equal(scales, np.float32([1, 1, 2, 2]))
    assert folded.graph.node[2].output[0] == "scales"
    onnx.checker.check_model(folded, full_check=True)
    x = np.random.default_rng(0).normal(size=(3, 2, 3, 3)).astype(np.float32)
    (got,) = inference_session(folded.SerializeToString()).run(None, {"x": x})
    (expected,) = inference_session(model.SerializeToString()).run(None, {"x": x})
    np.testing.assert_array_equal(got, expected)


def test_shape_inference_sees_through_the_concat() -> None:
    """The skeleton that types the base model folds first: ``Resize``'s output is ``[N, 2, 6, 6]``."""
    assert _inferred_dims(_concat_scales_model(), "y") == ["N", 2, 6, 6]


def test_chains_fold_in_order_and_other_values_stay_computed() -> None:
    """``Cast`` of a ``Concat`` of a ``Constant`` and an ``Unsqueeze`` of a small initializer folds; what reads
    the graph input does not."""
    nodes = [
        helper.make_node("Constant", [], ["one"], value_ints=[1, 1]),
        helper.make_node("Unsqueeze", ["three", "axis"], ["three_1"]),
        helper.make_node("Concat", ["one", "three_1"], ["shape"], axis=0),
        helper.make_node("Cast", ["shape"], ["shape_f"], to=FLOAT),
        helper.make_node("Add", ["x", "shape_f"], ["y"]),
    ]
    initializers = [("three", np.int64(3)), ("axis", np.int64([0]))]
    model = make_model({"x": (FLOAT, [3])}, nodes, {"y": (FLOAT, [3])}, initializers)
    folded = fold_constants(copy_model(model))
    assert [node.op_type for node in folded.graph.node] == ["Constant", "Constant", "Constant", "Constant", "Add"]
    np.testing.assert_array_equal(numpy_helper.to_array(folded.graph.node[3].attribute[0].t), np.float32([1, 1, 3]))
    x = np.float32([0.5, 1.5, 2.5])
    (got,) = inference_session(folded.SerializeToString()).run(None, {"x": x})
    np.testing.assert_array_equal(got, x + np.float32([1, 1, 3]))


def test_large_and_external_tensors_are_never_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tensor over :data:`MAX_ELEMENTS`, or stored outside the model, is not a constant to fold: its values are
    never converted (a model over 2 GB keeps its weights on disk)."""
    large = numpy_helper.from_array(np.zeros(MAX_ELEMENTS + 1, np.float32), "large")
    external = onnx.TensorProto(name="external", data_type=FLOAT, dims=[4])
    external.data_location = onnx.TensorProto.EXTERNAL
    external.external_data.add(key="location", value="no_such_file.bin")
    big_constant = numpy_helper.from_array(np.zeros(MAX_ELEMENTS + 1, np.float32), "big")
    nodes = [
        helper.make_node("Constant", [], ["big"], value=big_constant),
        helper.make_node("Identity", ["large"], ["large_copy"]),
        helper.make_node("Neg", ["external"], ["external_neg"]),
        helper.make_node("Identity", ["big"], ["big_copy"]),
        helper.make_node("Identity", ["small"], ["small_copy"]),
    ]
    model = make_model(
        {}, nodes, {n: (FLOAT, None) for n in ("large_copy", "external_neg", "big_copy", "small_copy")},
        [large, external, ("small", np.float32([1.0]))],
    )  # fmt: skip
    read: list[str] = []
    to_array = numpy_helper.to_array

    def recorded(tensor: onnx.TensorProto, *args: object) -> np.ndarray:
        read.append(tensor.name)
        return to_array(tensor, *args)

    monkeypatch.setattr(constants.numpy_helper, "to_array", recorded)
    folded = fold_constants(copy_model(model))
    assert read == ["small"]
    assert [node.op_type for node in folded.graph.node] == ["Constant", "Identity", "Neg", "Identity", "Constant"]


def test_an_expand_to_a_huge_shape_is_not_materialized() -> None:
    """``Expand`` of a constant to ``2**40`` elements would need terabytes: it is left to run time."""
    nodes = [
        helper.make_node("Constant", [], ["one"], value_float=1.0),
        helper.make_node("Constant", [], ["shape"], value_ints=[1 << 20, 1 << 20]),
        helper.make_node("Expand", ["one", "shape"], ["y"]),
    ]
    folded = fold_constants(copy_model(make_model({}, nodes, {"y": (FLOAT, None)})))
    assert [node.op_type for node in folded.graph.node] == ["Constant", "Constant", "Expand"]


def test_malformed_nodes_are_left_as_they_are() -> None:
    """A ``Concat`` without its ``axis``, of mismatched ranks or of mismatched types is onnxruntime's to refuse,
    not the folding's."""
    nodes = [
        helper.make_node("Constant", [], ["a"], value_ints=[1, 2]),
        helper.make_node("Constant", [], ["b"], value_int=3),
        helper.make_node("Concat", ["a", "a"], ["no_axis"]),
        helper.make_node("Concat", ["a", "b"], ["ranks"], axis=0),
        helper.make_node("Constant", [], ["c"], value_floats=[1.0]),
        helper.make_node("Concat", ["a", "c"], ["types"], axis=0),
    ]
    outputs = {name: (INT64, None) for name in ("no_axis", "ranks", "types")}
    folded = fold_constants(copy_model(make_model({}, nodes, outputs)))
    assert [node.op_type for node in folded.graph.node] == [*["Constant"] * 2, *["Concat"] * 2, "Constant", "Concat"]


def test_a_model_given_by_path_folds_without_its_external_data(tmp_path: Path) -> None:
    """The weights of a model loaded from a path stay on disk: inference folds and infers with the data file gone."""
    weight = numpy_helper.from_array(np.ones((2, 2, 1, 1), np.float32), "w")
    model = _concat_scales_model()
    model.graph.node.insert(0, helper.make_node("Conv", ["x0", "w"], ["x"]))
    model.graph.input[0].name = "x0"
    model.graph.initializer.append(weight)
    onnx.save(model, tmp_path / "model.onnx", save_as_external_data=True, size_threshold=0, location="w.bin")
    loaded, _ = load_base_model(tmp_path / "model.onnx")
    (tmp_path / "w.bin").unlink()
    assert _inferred_dims(loaded, "y") == ["N", 2, 6, 6]
    assert loaded.graph.initializer[0].data_location == onnx.TensorProto.EXTERNAL
