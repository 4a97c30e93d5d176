"""The host check of ids against the rows of the tables they look up (onnxtrain.training.lookups): ids given as
an input, as a column or slice of one (``emb_i(cats[:, i])``), as codes cast from a float input
(``X[:, 0].long()``), and as int32; what it leaves unchecked."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from onnxtrain import api
from onnxtrain.artifacts import LossType
from onnxtrain.training.lookups import lookups
from tests.helpers import FLOAT, INT32, INT64, make_model, run_model
from tests.training import models


def _constant(name: str, value: object) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(value, np.int64), name))


def _tables(**rows: int) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(len(rows))
    return [(name, rng.normal(size=(n, 2)).astype(np.float32)) for name, n in rows.items()]


def _error(model: onnx.ModelProto, value: np.ndarray, user_inputs: tuple[str, ...] = ("x",)) -> str | None:
    """The message of the first lookup of ``model`` that refuses ``value`` (its one user input)."""
    for lookup in lookups(model, user_inputs):
        error = lookup.error(value, "step")
        if error is not None:
            return str(error)
    return None


def _columns_model(elem_type: int = INT64) -> onnx.ModelProto:
    """``e0(cats[:, 0])`` and ``e1(cats[:, 1])`` as torch's exporter writes them: a ``Gather`` on axis 1 of a
    scalar ``Constant``, then the lookup."""
    nodes = [
        _constant("c0", 0),
        _constant("c1", 1),
        helper.make_node("Gather", ["x", "c0"], ["col0"], axis=1),
        helper.make_node("Gather", ["e0", "col0"], ["v0"]),
        helper.make_node("Gather", ["x", "c1"], ["col1"], axis=1),
        helper.make_node("Gather", ["e1", "col1"], ["v1"]),
        helper.make_node("Concat", ["v0", "v1"], ["y"], axis=1),
    ]
    return make_model({"x": (elem_type, ["b", 2])}, nodes, ["y"], _tables(e0=5, e1=3))


def test_each_column_is_checked_against_its_own_table_at_its_position_in_the_input() -> None:
    """A -1 in column 0 read e0's last row without a word; now named at its place in ``cats``. Column 1's
    ids are checked against e1's 3 rows, column 0's against e0's 5 (4 is a row of e0, not of e1)."""
    model = _columns_model()
    found = lookups(model, ["x"])
    assert [(lookup.ids, lookup.table, lookup.rows) for lookup in found] == [("x", "e0", 5), ("x", "e1", 3)]
    assert _error(model, np.array([[4, 2], [0, 0]])) is None
    said = "step: input 'x' holds 1 id(s) outside the 5 rows of the table 'e0' it looks up (Gather): -1 at [1, 0] "
    assert _error(model, np.array([[1, 2], [-1, 0]])).startswith(said)
    said = "step: input 'x' holds 2 id(s) outside the 3 rows of the table 'e1' it looks up (Gather): 4 at [0, 1], "
    assert _error(model, np.array([[1, 4], [0, -2]])).startswith(said + "-2 at [1, 1] ")


@pytest.mark.parametrize("slicing", ["gather", "slice", "slice-torch"])
def test_codes_cast_from_a_float_input_are_checked_and_its_other_columns_are_not(slicing: str) -> None:
    """``emb(X[:, 0].long())``, ``X[:, 0:1]`` squeezed, and a Slice whose bounds torch computes (``Unsqueeze`` of
    ``Constant``s): only column 0 holds ids; column 1's -3.5 and 7.0 are numbers, not ids."""
    if slicing == "gather":
        pick = [_constant("zero", 0), helper.make_node("Gather", ["x", "zero"], ["code"], axis=1)]
    else:
        bounds = [_constant("s", [0]), _constant("e", [1]), _constant("a", [1])]
        if slicing == "slice-torch":
            bounds = [_constant("s0", 0), _constant("e0", 1), _constant("a0", 1), _constant("unit", [0])]
            bounds += [helper.make_node("Unsqueeze", [f"{n}0", "unit"], [n]) for n in "sea"]
        pick = [
            *bounds,
            _constant("axis", [1]),
            helper.make_node("Slice", ["x", "s", "e", "a"], ["column"]),
            helper.make_node("Squeeze", ["column", "axis"], ["code"]),
        ]
    nodes = [
        *pick,
        helper.make_node("Cast", ["code"], ["ids"], to=INT64),
        helper.make_node("Gather", ["emb", "ids"], ["y"]),
    ]
    model = make_model({"x": (FLOAT, ["n", 2])}, nodes, ["y"], _tables(emb=4))
    x = np.array([[0, 1.0], [3, -3.5], [1.9, 7.0]], np.float32)
    np.testing.assert_array_equal(run_model(model, {"x": x})[0], _tables_value(model, "emb")[[0, 3, 1]])
    assert _error(model, x) is None
    x[1, 0] = -1
    said = "step: input 'x' holds 1 id(s) outside the 4 rows of the table 'emb' it looks up (Gather): -1 at [1, 0] "
    assert _error(model, x).startswith(said)
    x[1, 0], x[2, 0] = 4.5, np.nan  # onnxruntime's cast truncates, as torch's .long(); NaN is no row
    assert "2 id(s)" in _error(model, x) and "4 at [1, 0], " in _error(model, x)


def _tables_value(model: onnx.ModelProto, name: str) -> np.ndarray:
    return next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == name)


def test_ids_computed_otherwise_are_not_checked() -> None:
    """Ids shifted (``Add``), picked at computed positions, or cast to float and back carry other values than
    the input's: no check (onnxruntime reports what it reports)."""
    nodes = [
        _constant("one", 1),
        helper.make_node("Add", ["x", "one"], ["shifted"]),
        helper.make_node("Gather", ["e0", "shifted"], ["y0"]),
        helper.make_node("ArgMax", ["x"], ["where"], axis=1, keepdims=0),
        helper.make_node("Gather", ["x", "where"], ["picked"], axis=1),
        helper.make_node("Gather", ["e1", "picked"], ["y1"]),
        helper.make_node("Cast", ["x"], ["real"], to=FLOAT),
        helper.make_node("Cast", ["real"], ["back"], to=INT64),
        helper.make_node("Gather", ["e2", "back"], ["y2"]),
    ]
    model = make_model({"x": (INT64, ["b", 2])}, nodes, ["y0", "y1", "y2"], _tables(e0=5, e1=5, e2=5))
    assert lookups(model, ["x"]) == ()


def test_views_and_selections_follow_the_values_to_their_positions() -> None:
    """Columns 2 and 0 (``Gather`` of ``[2, 0]``), flattened, reshaped, unsqueezed, squeezed and cast to int32:
    the ids are those onnxruntime computes, and each bad one is named where it is in the input."""
    nodes = [
        _constant("cols", [2, 0]),
        _constant("flat", [-1]),
        _constant("ax", [0]),
        helper.make_node("Gather", ["x", "cols"], ["picked"], axis=1),
        helper.make_node("Flatten", ["picked"], ["flattened"], axis=0),
        helper.make_node("Reshape", ["flattened", "flat"], ["line"]),
        helper.make_node("Unsqueeze", ["line", "ax"], ["row"]),
        helper.make_node("Identity", ["row"], ["same"]),
        helper.make_node("Squeeze", ["same", "ax"], ["back"]),
        helper.make_node("Cast", ["back"], ["ids"], to=INT32),
        helper.make_node("Gather", ["emb", "ids"], ["y"]),
    ]
    model = make_model({"x": (INT64, ["b", 3])}, nodes, ["y", "ids"], _tables(emb=6))
    x = np.array([[0, -9, 5], [2, 99, 1]])  # column 1 is never looked up
    (lookup,) = lookups(model, ["x"])
    np.testing.assert_array_equal(lookup.looked_up(x), run_model(model, {"x": x})[1])
    assert _error(model, x) is None
    x[0, 2], x[1, 0] = 6, -7
    said = "step: input 'x' holds 2 id(s) outside the 6 rows of the table 'emb' it looks up (Gather): 6 at [0, 2], "
    assert _error(model, x).startswith(said + "-7 at [1, 0] ")


@st.composite
def _selections(draw: st.DrawFn) -> tuple[list[onnx.NodeProto], np.ndarray]:
    """A float or int ``x`` of ``[rows, cols]`` and a chain of constant selections of it cast to int64."""
    rows, cols = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    nodes: list[onnx.NodeProto] = []
    if draw(st.booleans()):  # a Gather on axis 1, scalar or vector of constant (negative too) positions
        index = draw(st.one_of(st.integers(-cols, cols - 1), st.lists(st.integers(-cols, cols - 1), max_size=3)))
        nodes += [_constant("i", index), helper.make_node("Gather", ["x", "i"], ["picked"], axis=1)]
    else:  # a Slice on either axis, steps of both signs, bounds out of range
        axis, step = draw(st.integers(0, 1)), draw(st.sampled_from([-2, -1, 1, 2]))
        start, end = draw(st.integers(-6, 6)), draw(st.integers(-6, 6))
        nodes += [_constant(n, [v]) for n, v in (("s", start), ("e", end), ("a", axis), ("t", step))]
        nodes.append(helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["picked"]))
    nodes.append(helper.make_node("Cast", ["picked"], ["ids"], to=INT64))
    x = draw(st.lists(st.integers(-3, 8), min_size=rows * cols, max_size=rows * cols))
    return nodes, np.array(x).reshape(rows, cols).astype(draw(st.sampled_from([np.int64, np.float32])))


@given(_selections())
def test_the_checked_ids_are_those_onnxruntime_looks_up(drawn: tuple[list[onnx.NodeProto], np.ndarray]) -> None:
    """For any constant Gather or Slice of an int64 or float input: the host's ids equal onnxruntime's, the
    count of bad ones is that of the input's positions they come from, and each named position holds the id
    named."""
    nodes, x = drawn
    inputs = {"x": (INT64 if x.dtype == np.int64 else FLOAT, ["r", "c"])}
    (ids,) = run_model(make_model(inputs, nodes, ["ids"]), {"x": x})  # without the lookup, which would fail
    lookup_node = helper.make_node("Gather", ["emb", "ids"], ["y"])
    (lookup,) = lookups(make_model(inputs, [*nodes, lookup_node], ["y"], _tables(emb=5)), ["x"])
    if ids.size == 0:
        return
    np.testing.assert_array_equal(lookup.looked_up(x), ids)
    error = lookup.error(x, "step")
    # the positions in x that onnxruntime's selection reads: the same chain run on the positions themselves
    at = run_model(make_model(inputs, nodes, ["ids"]), {"x": np.arange(x.size).reshape(x.shape).astype(x.dtype)})[0]
    bad = len(set(at[(ids < 0) | (ids >= 5)].tolist()))
    assert (error is None) == (bad == 0)
    if error is not None:
        assert f"holds {bad} id(s) outside the 5 rows" in str(error)
        listed = re.findall(r"(-?\d+) at \[([\d, ]+)\]", str(error))
        assert listed
        for value, position in listed:
            assert int(x[tuple(int(p) for p in position.split(", "))]) == int(value)


def _int32_lookup_model() -> onnx.ModelProto:
    """A Keras-style embedding: int32 ids, mean over the sequence, a dense head."""
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["vectors"]),
        helper.make_node("ReduceMean", ["vectors"], ["pooled"], axes=[1], keepdims=0),
        helper.make_node("MatMul", ["pooled", "head"], ["scores"]),
    ]
    rng = np.random.default_rng(0)
    inits = [
        (name, rng.normal(size=shape).astype(np.float32)) for name, shape in (("table", (20, 6)), ("head", (6, 2)))
    ]
    return make_model({"ids": (INT32, ["batch", 7])}, nodes, {"scores": (FLOAT, ["batch", 2])}, inits, opset=17)


def test_int32_ids_train_their_rows_and_are_checked(tmp_path: Path) -> None:
    """TensorFlow's and Keras's exports look up int32 ids: generate_artifacts failed in the Gather gradient
    (``Mod`` of int32 ids by an int64 row count). The step trains exactly the rows looked up; a -1 is refused
    before it runs."""
    paths = models.generate(tmp_path, _int32_lookup_model(), loss=LossType.CrossEntropyLoss)
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state)
    ids = np.array([[3, 3, 5, 0, 1, 1, 19]] * 2, np.int32)
    module(ids, np.array([0, 1]))
    touched = np.flatnonzero(np.abs(state.parameters["table"].grad).sum(axis=1))
    assert touched.tolist() == [0, 1, 3, 5, 19]
    ids[1, 6] = -1
    said = r"^train step 2: input 'ids' holds 1 id\(s\) outside the 20 rows of the table 'table' .*: -1 at \[1, 6\]"
    with pytest.raises(ValueError, match=said):
        module(ids, np.array([0, 1]))


def test_a_column_of_the_input_is_checked_in_a_train_step(tmp_path: Path) -> None:
    """``emb_i(cats[:, i])`` end to end: the step with a -1 in column 0 is refused and trains nothing (it
    trained e0's last row)."""
    model = _columns_model()
    model.graph.node.extend([_constant("sum_axes", [1]), helper.make_node("ReduceSum", ["y", "sum_axes"], ["score"])])
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("score", FLOAT, ["b", 1]))
    paths = models.generate(tmp_path, model, loss=LossType.MSELoss)
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state, paths["eval_model"])
    target = np.ones((2, 1), np.float32)
    said = r"input 'x' holds 1 id\(s\) outside the 5 rows of the table 'e0' it looks up \(Gather\): -1 at \[1, 0\]"
    with pytest.raises(ValueError, match=rf"^train step 1: {said}"):
        module(np.array([[1, 2], [-1, 0]]), target)
    module.eval()
    with pytest.raises(ValueError, match=rf"^eval step: {said}"):
        module(np.array([[1, 2], [-1, 0]]), target)
    module.train()
    assert module.train_step_count == 0
    module(np.array([[1, 2], [4, 0]]), target)
    assert np.flatnonzero(np.abs(state.parameters["e0"].grad).sum(axis=1)).tolist() == [1, 4]
