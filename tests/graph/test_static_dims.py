"""``fold_static_dims``: the shape computations a model's static dimensions decide, folded before the gradient is
built, and the gradients built on them (a rotary embedding's half-slices get a ``Pad``, not a scatter).

Each model is run before and after the fold at several sizes of its symbolic dimensions, 1 included; the
gradients of the folded model's artifacts are compared with those of the unfolded one's at each size.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnxtrain import api, artifacts
from onnxtrain.artifacts import generate
from onnxtrain.graph.fold import evaluate_constant
from onnxtrain.graph.passes.static_shapes import fold_static_dims
from onnxtrain.graph.versions import stamp_ir_version
from onnxtrain.sessions import inference_session

HEADS, HEAD = 2, 4
FEATURES = HEADS * HEAD


def rotary_model() -> onnx.ModelProto:
    """Queries split into heads ``[batch, 2, seq, 4]``, then ``rotate_half`` as Llama's export writes it: halves
    sliced up to and from ``Shape(q)[3] / 2`` (computed from a static dimension, through ``Constant`` nodes),
    the second negated and put first, mixed back into ``q``; and the batch size read from ``Shape(x)[0]``
    (symbolic: it stays computed)."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.normal(size=(FEATURES, FEATURES)).astype(np.float32) * 0.3, "W")

    def constant(name: str, value: object) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(value, np.int64)))

    nodes = [
        constant("three", 3),
        constant("two", 2),
        constant("zero_axis", [0]),
        constant("last", [3]),
        constant("start", [0]),
        constant("unit", [1]),
        constant("big", [2**63 - 1]),
        constant("heads", [0, 0, HEADS, HEAD]),
        helper.make_node("MatMul", ["x", "W"], ["flat"]),
        helper.make_node("Reshape", ["flat", "heads"], ["split"]),
        helper.make_node("Transpose", ["split"], ["q"], perm=[0, 2, 1, 3]),
        helper.make_node("Shape", ["q"], ["q_shape"]),
        helper.make_node("Gather", ["q_shape", "three"], ["head"]),
        helper.make_node("Div", ["head", "two"], ["half"]),
        helper.make_node("Unsqueeze", ["half", "zero_axis"], ["half_1d"]),
        helper.make_node("Slice", ["q", "start", "half_1d", "last", "unit"], ["first"]),
        helper.make_node("Slice", ["q", "half_1d", "big", "last", "unit"], ["second"]),
        helper.make_node("Neg", ["second"], ["negated"]),
        helper.make_node("Concat", ["negated", "first"], ["rotated"], axis=-1),
        helper.make_node("Add", ["q", "rotated"], ["mixed"]),
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Gather", ["x_shape", "start"], ["batch"]),
        helper.make_node("Cast", ["batch"], ["batch_float"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["mixed", "batch_float"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "rotary",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", HEADS, "seq", HEAD])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    stamp_ir_version(model)  # the IR version opset 17 needs, which every supported onnxruntime loads
    return model


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return inference_session(model.SerializeToString()).run(None, {"x": x})[0]


def test_what_the_static_dimensions_decide_is_folded_and_the_batch_is_not():
    folded = fold_static_dims(rotary_model())
    constants = {t.name: numpy_helper.to_array(t) for t in folded.graph.initializer}
    assert constants["half_1d"].tolist() == [2]  # Shape(q)[3] / 2, read by both slices
    ops = [node.op_type for node in folded.graph.node]
    assert ops.count("Shape") == 1 and "Div" not in ops  # Shape(x) stays: its first dimension is the batch
    assert ops.count("Gather") == 1 and "batch" not in constants
    for batch, seq in ((1, 1), (2, 3), (3, 7)):
        x = np.random.default_rng(batch).normal(size=(batch, seq, FEATURES)).astype(np.float32)
        np.testing.assert_array_equal(_run(folded, x), _run(rotary_model(), x))


def test_kept_values_and_outputs_stay_computed():
    folded = fold_static_dims(rotary_model(), keep=["half"])
    assert "half" not in {t.name for t in folded.graph.initializer}
    assert "Div" in [node.op_type for node in folded.graph.node]


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [(7, 2, 3), (0, 5, 0), (-7, 2, None), (7, -2, None)],
)
def test_integer_division_folds_only_where_truncating_and_flooring_agree(a, b, expected):
    node = helper.make_node("Div", ["a", "b"], ["c"])
    value = evaluate_constant(node, [np.array(a, np.int64), np.array(b, np.int64)], 17)
    assert (value is None) if expected is None else (value == expected and value.dtype == np.int64)


@pytest.fixture(scope="module")
def both_ways(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The rotary model's artifacts with the static dimensions folded, and without (the slices' ends computed at
    run time: their gradients scatter)."""
    folder = tmp_path_factory.mktemp("rotary")
    onnx.save(rotary_model(), folder / "model.onnx")
    made = {}
    for way in ("folded", "computed"):
        with pytest.MonkeyPatch.context() as patch:
            if way == "computed":
                patch.setattr(generate, "fold_static_dims", lambda model, **_: model)
            made[way] = folder / way
            artifacts.generate_artifacts(
                str(folder / "model.onnx"),
                requires_grad=["W"],
                loss=artifacts.LossType.MSELoss,
                optimizer=artifacts.OptimType.AdamW,
                artifact_directory=made[way],
            )
    return made


def _ops(directory: Path) -> list[str]:
    return [node.op_type for node in onnx.load(str(directory / "training_model.onnx")).graph.node]


def test_the_half_slices_gradients_are_pads(both_ways):
    folded, computed = _ops(both_ways["folded"]), _ops(both_ways["computed"])
    assert folded.count("Pad") == 2 and "ScatterElements" not in folded
    assert computed.count("ScatterElements") == 2 and "Pad" not in computed
    assert len(folded) < len(computed)


def _gradient(directory: Path, x: np.ndarray, target: np.ndarray) -> tuple[float, np.ndarray]:
    state = api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module = api.Module(str(directory / "training_model.onnx"), state, str(directory / "eval_model.onnx"))
    loss = float(module(x, target))
    return loss, np.array(state.parameters["W"].grad)


@settings(max_examples=10, deadline=None)
@given(batch=st.sampled_from([1, 2, 3]), seq=st.sampled_from([1, 2, 5]), seed=st.integers(0, 2**16))
def test_the_gradients_equal_those_of_the_computed_slices(both_ways, batch, seq, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch, seq, FEATURES)).astype(np.float32)
    target = rng.normal(size=(batch, HEADS, seq, HEAD)).astype(np.float32)
    loss, grad = _gradient(both_ways["folded"], x, target)
    reference_loss, reference = _gradient(both_ways["computed"], x, target)
    assert loss == pytest.approx(reference_loss, rel=1e-6)
    np.testing.assert_allclose(grad, reference, rtol=1e-5, atol=1e-6)


def _table_model() -> onnx.ModelProto:
    """``y = x * table[1]``, beside an initializer nothing reads and a node whose output nothing reads."""
    initializers = [
        numpy_helper.from_array(np.array([[1, 2], [3, 4]], np.float32), "table"),
        numpy_helper.from_array(np.array(1, np.int64), "second"),
        numpy_helper.from_array(np.array([5], np.int64), "spare"),
        numpy_helper.from_array(np.array([7], np.int64), "seven"),
    ]
    nodes = [
        helper.make_node("Gather", ["table", "second"], ["row"]),
        helper.make_node("Mul", ["x", "row"], ["y"]),
        helper.make_node("Add", ["seven", "seven"], ["dead"]),
    ]
    graph = helper.make_graph(
        nodes,
        "table",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    stamp_ir_version(model)  # the IR version opset 17 needs, which every supported onnxruntime loads
    return model


@pytest.mark.parametrize("variables", [["table"], []], ids=["a parameter", "a constant"])
def test_parameters_are_never_constants_and_the_model_s_own_values_stay(variables):
    """A parameter's row is computed at every step whatever indexes it; a constant's folds. Either way the
    model's initializers all stay, and a value nothing reads stays computed (a name checks may look for)."""
    folded = fold_static_dims(_table_model(), variables=variables)
    ops = [node.op_type for node in folded.graph.node]
    initializers = {t.name for t in folded.graph.initializer}
    assert ("Gather" in ops) == bool(variables) and ("row" in initializers) == (not variables)
    assert {"table", "second", "spare", "seven"} <= initializers
    assert "Add" in ops  # "dead" stays
    x = np.ones((3, 2), np.float32)
    np.testing.assert_array_equal(_run(folded, x), _run(_table_model(), x))
