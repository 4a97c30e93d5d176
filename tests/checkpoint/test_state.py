"""CheckpointState: validation, immutability, nominal states, from_tensors."""

from __future__ import annotations

import dataclasses
import math

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from onnxtrain.checkpoint import CheckpointState, OptimizerState, from_tensors


def test_arrays_are_read_only_copies():
    weight = np.arange(6, dtype=np.float32).reshape(2, 3)
    state = CheckpointState({"w": weight})
    weight[0, 0] = 99.0
    assert state.trainable["w"][0, 0] == 0.0
    with pytest.raises(ValueError, match="read-only"):
        state.trainable["w"][0, 0] = 1.0
    with pytest.raises(TypeError):
        state.trainable["x"] = weight  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.is_nominal = True  # type: ignore[misc]


def test_non_native_and_non_contiguous_arrays_become_native_c_order():
    big_endian = np.arange(6, dtype=">f4").reshape(2, 3).T
    state = CheckpointState(frozen={"x": big_endian})
    stored = state.frozen["x"]
    assert stored.dtype == np.float32 and stored.dtype.isnative
    assert stored.flags.c_contiguous
    np.testing.assert_array_equal(stored, big_endian)


def test_parameters_lists_trainable_then_frozen():
    state = CheckpointState({"b": np.zeros(1), "a": np.ones(1)}, {"c": np.zeros(2)})
    assert list(state.parameters) == ["b", "a", "c"]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"trainable": {"w": np.zeros(1)}, "frozen": {"w": np.zeros(1)}}, ValueError, "both trainable and frozen"),
        ({"trainable": {"": np.zeros(1)}}, ValueError, "must not be empty"),
        ({"trainable": {1: np.zeros(1)}}, TypeError, "must be str"),
        ({"frozen": {"s": np.array(["a"])}}, TypeError, "cannot be stored"),
        ({"frozen": {"o": np.array([object()])}}, TypeError, "cannot be stored"),
        ({"frozen": {"i4": np.zeros(2, ml_dtypes.int4)}}, TypeError, "cannot be stored"),
        ({"trainable": [np.zeros(1)]}, TypeError, "mapping of name -> array"),
        ({"properties": {"flag": True}}, TypeError, "is a bool"),
        ({"properties": {"x": [1]}}, TypeError, "int, float or str"),
        ({"properties": {"big": 2**63}}, ValueError, "int64"),
        ({"properties": {"huge": 1e300}}, ValueError, "float32"),
        ({"is_nominal": 1}, TypeError, "is_nominal must be a bool"),
        ({"optimizer": {"w": []}}, TypeError, "OptimizerState"),
    ],
)
def test_invalid_states_name_the_problem(kwargs, error, match):
    with pytest.raises(error, match=match):
        CheckpointState(**kwargs)


def test_optimizer_moments_must_match_trainable_parameters():
    w = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="not a trainable parameter"):
        CheckpointState({"w": w}, {"f": w}, OptimizerState({"f": [w]}))
    with pytest.raises(ValueError, match=r"momentum1 of 'w' has shape \(3, 2\)"):
        CheckpointState({"w": w}, optimizer=OptimizerState({"w": [w, w.T]}))
    with pytest.raises(ValueError, match="nominal checkpoint holds no optimizer state"):
        CheckpointState({"w": w}, optimizer=OptimizerState({"w": [w]}), is_nominal=True)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"step": -1}, ValueError, "outside"),
        ({"step": 1.5}, TypeError, "must be an int"),
        ({"step": 2**63}, ValueError, "int64"),
        ({"initial_learning_rate": "0.1"}, TypeError, "must be a float"),
        ({"moments": {"w": np.zeros(3)}}, TypeError, "list of arrays"),
    ],
)
def test_invalid_optimizer_states(kwargs, error, match):
    with pytest.raises(error, match=match):
        OptimizerState(**kwargs)


def test_floats_are_rounded_to_float32_as_stored():
    state = CheckpointState(properties={"lr": 0.1, "n": np.int32(3), "f": np.float16(0.5), "s": "x"})
    assert state.properties["lr"] == float(np.float32(0.1))
    assert type(state.properties["n"]) is int and type(state.properties["f"]) is float
    assert OptimizerState(initial_learning_rate=0.1).initial_learning_rate == float(np.float32(0.1))
    assert math.isinf(CheckpointState(properties={"inf": math.inf}).properties["inf"])


def test_equality_is_bitwise():
    nan = np.array([np.nan], np.float32)
    assert CheckpointState({"x": nan}) == CheckpointState({"x": nan.copy()})
    assert CheckpointState({"x": np.zeros(1)}) != CheckpointState({"x": -np.zeros(1)})
    assert CheckpointState({"x": np.zeros(1, np.float32)}) != CheckpointState({"x": np.zeros(1, np.float64)})
    assert CheckpointState({"x": np.zeros(1)}) != CheckpointState(frozen={"x": np.zeros(1)})
    assert CheckpointState(properties={"p": 1}) != CheckpointState(properties={"p": 1.0})
    assert CheckpointState({"a": np.zeros(1), "b": np.ones(1)}) == CheckpointState({"b": np.ones(1), "a": np.zeros(1)})


def test_nominal_keeps_names_dtypes_and_shapes_without_memory():
    state = CheckpointState(
        {"w": np.ones((1000, 1000), np.float32)},
        {"bf": np.ones(3, ml_dtypes.bfloat16)},
        OptimizerState({"w": [np.ones((1000, 1000), np.float32)]}),
        {"epoch": 2},
    )
    nominal = state.nominal()
    assert nominal.is_nominal and nominal.optimizer is None
    assert nominal.properties == {"epoch": 2}
    w = nominal.trainable["w"]
    assert w.shape == (1000, 1000) and w.dtype == np.float32 and w.strides == (0, 0)
    assert nominal.frozen["bf"].dtype == ml_dtypes.bfloat16
    assert nominal == CheckpointState(
        {"w": np.zeros((1000, 1000), np.float32)},
        {"bf": np.zeros(3, ml_dtypes.bfloat16)},
        properties={"epoch": 2},
        is_nominal=True,
    )
    assert nominal != state


def test_from_tensors_reads_initializers():
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    ids = numpy_helper.from_array(np.arange(3, dtype=np.int64), "ids")
    state = from_tensors([w], [ids])
    assert list(state.trainable) == ["w"] and list(state.frozen) == ["ids"]
    np.testing.assert_array_equal(state.frozen["ids"], [0, 1, 2])
    assert from_tensors([w], [ids], nominal=True) == state.nominal()


def test_from_tensors_reads_external_data_without_touching_the_protos(tmp_path):
    weight = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
    tensor = numpy_helper.from_array(weight, "w")
    graph = onnx.helper.make_graph([], "g", [], [], initializer=[tensor])
    onnx.save(
        onnx.helper.make_model(graph),
        tmp_path / "m.onnx",
        save_as_external_data=True,
        location="m.data",
        size_threshold=0,
    )
    model = onnx.load(tmp_path / "m.onnx", load_external_data=False)
    external = model.graph.initializer[0]
    before = external.SerializeToString()
    with pytest.raises(ValueError, match="pass base_dir"):
        from_tensors([external])
    state = from_tensors([external], base_dir=tmp_path)
    np.testing.assert_array_equal(state.trainable["w"], weight)
    assert external.SerializeToString() == before


def test_from_tensors_rejects_duplicates_and_strings():
    t = numpy_helper.from_array(np.zeros(1, np.float32), "t")
    with pytest.raises(ValueError, match="appears twice"):
        from_tensors([t, t])
    with pytest.raises(ValueError, match="both trainable and frozen"):
        from_tensors([t], [t])
    strings = onnx.helper.make_tensor("s", onnx.TensorProto.STRING, [1], [b"a"])
    with pytest.raises(TypeError, match="holds strings"):
        from_tensors([], [strings])
    with pytest.raises(TypeError, match=r"onnx\.TensorProto"):
        from_tensors([np.zeros(1)])  # type: ignore[list-item]
