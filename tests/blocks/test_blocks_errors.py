"""Bad input to blocks: clear errors, and the base model left exactly as it was."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper

import onnxtrain.onnxblock as onnxblock
from onnxtrain import blocks
from onnxtrain.graph import NoBaseModelError
from tests.helpers import DOUBLE, FLOAT, INT64, make_model


def base_model() -> onnx.ModelProto:
    """x: float[batch,3], xd: double[batch,3], k: int64[batch]; outputs y = Relu(x), m: float[3,4]."""
    return make_model(
        {"x": (FLOAT, ["batch", 3]), "xd": (DOUBLE, ["batch", 3]), "k": (INT64, ["batch"]), "m": (FLOAT, [4, 5])},
        [helper.make_node("Relu", ["x"], ["y"])],
        ["y"],
    )


class Fn(onnxblock.ForwardBlock):
    """A ForwardBlock whose build is a given function."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def build(self, *args: str) -> Any:
        return self.fn(*args)


def assert_fails_cleanly(call: Callable[[], Any], error: type[Exception], pattern: str) -> str:
    """``call`` raises ``error`` matching ``pattern`` inside a base context and changes nothing.

    The model must stay byte-identical, and the builder must still work afterwards.
    """
    model = base_model()
    original = model.SerializeToString()
    with onnxblock.base(model) as b:
        blocks.Exp()("y")  # some earlier state, kept
        before = b.model.SerializeToString()
        with pytest.raises(error, match=pattern) as info:
            call()
        assert b.model.SerializeToString() == before
        after = blocks.Neg()("y")
        assert b.model.graph.node[-1].output[0] == after
    assert model.SerializeToString() == original
    return str(info.value)


# --------------------------------------------------------------- no context


@pytest.mark.parametrize(
    "call",
    [
        lambda: blocks.Relu()("x"),
        lambda: blocks.Add()("x", "x"),
        lambda: blocks.Constant(1.0)(),
        lambda: blocks.Linear(3, 2)("x"),
        lambda: blocks.ReduceAllL2()("x"),
        lambda: Fn(lambda: "x")(),
    ],
    ids=["Relu", "Add", "Constant", "Linear", "ReduceAllL2", "ForwardBlock"],
)
def test_block_outside_context(call: Callable[[], Any]) -> None:
    """Any block called outside ``with base(...)`` raises NoBaseModelError saying what to do."""
    with pytest.raises(NoBaseModelError, match=r"outside a base model context.*with onnxblock\.base\(model\)"):
        call()


# ------------------------------------------------------------ unknown names

UNKNOWN_NAME_CALLS: dict[str, Callable[[], Any]] = {
    "Relu": lambda: blocks.Relu()("nope"),
    "Add": lambda: blocks.Add()("x", "nope"),
    "Sum": lambda: blocks.Sum()("x", "y", "nope"),
    "Where": lambda: blocks.Where()("nope", "x", "y"),
    "Clip": lambda: blocks.Clip(0.0, 1.0)("nope"),
    "Pow": lambda: blocks.Pow(2.0)("nope"),
    "Cast": lambda: blocks.Cast(DOUBLE)("nope"),
    "ReduceMean": lambda: blocks.ReduceMean([1])("nope"),
    "ReduceAllL2": lambda: blocks.ReduceAllL2()("x", "nope"),
    "Linear": lambda: blocks.Linear(3, 2)("nope"),
    "Gemm": lambda: blocks.Gemm()("x", "nope"),
    "Softmax": lambda: blocks.Softmax()("nope"),
    "Concat": lambda: blocks.Concat(1)("x", "nope"),
    "Reshape": lambda: blocks.Reshape([-1])("nope"),
    "Transpose": lambda: blocks.Transpose([1, 0])("nope"),
    "Squeeze": lambda: blocks.Squeeze([0])("nope"),
    "Unsqueeze": lambda: blocks.Unsqueeze([0])("nope"),
    "PassThrough": lambda: blocks.PassThrough()("x", "nope"),
    "SequenceConstruct": lambda: blocks.SequenceConstruct()("nope"),
    "InputLike": lambda: blocks.InputLike("nope")("target"),
    "LabelEncoder": lambda: blocks.LabelEncoder(keys_int64s=[1], values_floats=[1.0])("nope"),
    "ForwardBlock": lambda: Fn(lambda: "nope")(),
}


@pytest.mark.parametrize("name", sorted(UNKNOWN_NAME_CALLS))
def test_unknown_input_name(name: str) -> None:
    """An input name that is not in the model: ValueError listing the model's inputs and outputs."""
    message = assert_fails_cleanly(UNKNOWN_NAME_CALLS[name], ValueError, "'nope'")
    assert "Graph inputs: ['x', 'xd', 'k', 'm']" in message
    assert "graph outputs: ['y']" in message


def test_non_string_input_name() -> None:
    """A value that is not a name (an array, a number) is a TypeError saying a str is needed."""
    assert_fails_cleanly(lambda: blocks.Relu()(np.ones(3)), TypeError, "value name \\(str\\)")
    assert_fails_cleanly(lambda: blocks.Add()("x", 1.0), TypeError, "value name \\(str\\)")


# --------------------------------------------------------- bad arguments


def test_clip_min_above_max() -> None:
    """Clip(min > max) raises ValueError giving both bounds."""
    assert_fails_cleanly(lambda: blocks.Clip(2.0, 1.0)("x"), ValueError, r"clip_min <= clip_max, got 2.0 > 1.0")


@pytest.mark.parametrize("shape", [[-1, -1], [2, -1, -1], [-1, 3, -1]])
def test_reshape_two_minus_ones(shape: list[int]) -> None:
    """Reshape allows one -1 at most."""
    assert_fails_cleanly(lambda: blocks.Reshape(shape)("x"), ValueError, "at most one -1")


def test_reshape_shape_twice_or_never() -> None:
    """A shape in the constructor and as an input, or neither: ValueError."""
    with_shape_input = make_model({"x": (FLOAT, [2, 3]), "s": (INT64, [2])})
    for call, pattern in (
        (lambda: blocks.Reshape([3, 2])("x", "s"), "both"),
        (lambda: blocks.Reshape()("x"), "needs two inputs"),
    ):
        with onnxblock.base(with_shape_input) as b:
            before = b.model.SerializeToString()
            with pytest.raises(ValueError, match=pattern):
                call()
            assert b.model.SerializeToString() == before


@pytest.mark.parametrize("perm", [[0, 0], [0, 2], [1, 0, 2], [0], []], ids=str)
def test_transpose_bad_perm(perm: list[int]) -> None:
    """A perm that is not a permutation of the input's axes: ValueError naming perm and rank."""
    assert_fails_cleanly(
        lambda: blocks.Transpose(perm)("x"), ValueError, r"Transpose perm \[.*rank|permutation of the 2 axes"
    )


@pytest.mark.parametrize("to", ["banana", 999, 0, None, 1.5, "float128"], ids=repr)
def test_cast_to_non_type(to: Any) -> None:
    """Cast to something that is no element type: TypeError saying what to pass."""
    assert_fails_cleanly(lambda: blocks.Cast(to)("x"), TypeError, "element type")


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"keys_int64s": [1, 2], "values_floats": [1.0]}, "2 keys but 1 values"),
        ({"keys_int64s": [1], "values_floats": [1.0, 2.0]}, "1 keys but 2 values"),
        ({"keys_int64s": [1], "keys_strings": ["a"], "values_floats": [1.0]}, "exactly one keys_"),
        ({"keys_int64s": [1]}, "one values_"),
        ({"values_floats": [1.0]}, "exactly one keys_"),
        ({"keys_int64s": [1], "values_floats": [1.0], "values_int64s": [1]}, "one values_"),
    ],
)
def test_label_encoder_mismatched_keys_values(kwargs: dict[str, Any], pattern: str) -> None:
    """LabelEncoder needs one keys list and one values list of the same length."""
    assert_fails_cleanly(lambda: blocks.LabelEncoder(**kwargs)("k"), ValueError, pattern)


def test_pow_exponent_twice_or_never() -> None:
    """Pow with a constant exponent takes one input; without one it needs two."""
    assert_fails_cleanly(lambda: blocks.Pow(2.0)("x", "y"), ValueError, "both")
    assert_fails_cleanly(lambda: blocks.Pow()("x"), ValueError, "needs two inputs")


@pytest.mark.parametrize(
    "block",
    [blocks.Concat, blocks.Sum, blocks.Max, blocks.Min, blocks.Mean, blocks.SequenceConstruct, blocks.ReduceAllL2],
)
def test_variadic_without_inputs(block: type) -> None:
    """Variadic blocks need at least one input."""
    assert_fails_cleanly(lambda: block()(), ValueError, "at least one input")


def test_bad_axes_and_sizes() -> None:
    """Empty Unsqueeze/Squeeze axes and non-positive Linear sizes are refused up front."""
    with pytest.raises(ValueError, match="at least one axis"):
        blocks.Unsqueeze([])
    with pytest.raises(ValueError, match="axes=\\[\\]"):
        blocks.Squeeze([])
    with pytest.raises(ValueError, match="positive sizes"):
        blocks.Linear(0, 3)


def test_int_axes_are_taken_as_one_axis_and_other_types_refused() -> None:
    """torch's ``dim=1`` habit: ``ReduceSum(axes=1)``, ``Unsqueeze(2)``."""
    assert blocks.ReduceSum(axes=1)._axes == [1] and blocks.ReduceMax(np.int64(-1))._axes == [-1]
    assert blocks.Unsqueeze(2)._axes == [2] and blocks.Squeeze(1)._axes == [1]
    assert blocks.ReduceMean([0, 1])._axes == [0, 1]
    for bad in ("1", 1.5, [1.0], True):
        with pytest.raises(TypeError, match="takes axes as an int or a list of ints"):
            blocks.ReduceSum(axes=bad)


def test_an_integer_constant_mixed_with_floats_is_told_to_be_written_as_a_float() -> None:
    """``Constant(2)`` is an int64 here: a float loss times it says to write ``Constant(2.0)``; ONNX Runtime's
    ``onnxblock.blocks.Constant(2)`` is a float32, as there."""
    with onnxblock.base(base_model()), pytest.raises(TypeError, match="Mul") as error:
        blocks.Mul()(blocks.Constant(2)(), "x")
    assert str(error.value).endswith("is the integer constant 2: for a float, write Constant(2.0)")
    assert onnxblock.blocks.Constant(2)._value.dtype == np.float32 and blocks.Constant(2)._value.dtype == np.int64
    assert onnxblock.blocks.Constant([1, 2])._value.dtype == np.int64  # a list or an array keeps its type
    assert onnxblock.blocks.Constant(2, dtype=np.int32)._value.dtype == np.int32
    assert onnxblock.blocks.Add is blocks.Add


def test_constant_of_strings() -> None:
    """Constant holds numbers or booleans."""
    with pytest.raises(TypeError, match="string"):
        blocks.Constant(["a", "b"])


# ------------------------------------------------------------ type errors


@pytest.mark.parametrize(
    ("call", "op"),
    [
        (lambda: blocks.Add()("x", "xd"), "Add"),
        (lambda: blocks.Where()("x", "x", "x"), "Where"),
        (lambda: blocks.MatMul()("x", "m"), "MatMul"),
        (lambda: blocks.Concat(1)("x", "xd"), "Concat"),
        (lambda: blocks.Sqrt()("k"), "Sqrt"),
        (lambda: blocks.Linear(3, 2)("xd"), "Gemm"),
        (lambda: blocks.Linear(4, 2)("x"), "Gemm"),
        (lambda: blocks.Softmax()("k"), "Softmax"),
    ],
    ids=[
        "Add-dtype",
        "Where-cond",
        "MatMul-shape",
        "Concat-dtype",
        "Sqrt-int",
        "Linear-dtype",
        "Linear-size",
        "Softmax-int",
    ],
)
def test_inputs_the_operator_cannot_take(call: Callable[[], Any], op: str) -> None:
    """Types or shapes an operator cannot take: TypeError naming the op and its inputs, nothing added."""
    message = assert_fails_cleanly(call, TypeError, op)
    assert "cannot take the inputs" in message


def test_input_like_with_existing_name_of_other_type() -> None:
    """InputLike with the name of an existing input of another type: ValueError naming both types."""
    assert_fails_cleanly(lambda: blocks.InputLike("x")("xd"), ValueError, r"'xd' exists with type double\[batch,3\]")
    assert_fails_cleanly(lambda: blocks.InputLike("x")("y"), ValueError, "'y' already names a value")


# ----------------------------------------------------------- ForwardBlock


@pytest.mark.parametrize("returned", [None, [], 3, ["y", None]], ids=repr)
def test_forward_block_build_must_return_names(returned: Any) -> None:
    """A ForwardBlock whose build returns no name raises ValueError; what it added is removed."""

    def build(y: str) -> Any:
        blocks.Relu()(blocks.Neg()(y))
        return returned

    block = Fn(build)
    assert_fails_cleanly(lambda: block("y"), ValueError, "must return the name")
    with pytest.raises(RuntimeError, match="has not been built"):
        block.to_model_proto()


def test_to_model_proto_before_build() -> None:
    """to_model_proto() before the block was called raises RuntimeError saying to call it first."""
    with pytest.raises(RuntimeError, match=r"Fn has not been built yet.*with onnxblock\.base\(model\)"):
        Fn(lambda: "x").to_model_proto()


def test_failed_forward_block_keeps_outputs() -> None:
    """A ForwardBlock that fails after an earlier one succeeded leaves that model and the outputs alone."""
    with onnxblock.base(base_model()) as b:
        first = Fn(lambda y: blocks.Exp()(y))
        out = first("y")
        assert [o.name for o in b.model.graph.output] == [out]
        kept = first.to_model_proto().SerializeToString()
        before = b.model.SerializeToString()
        with pytest.raises(TypeError, match="Add"):
            Fn(lambda y: blocks.Add()(blocks.Neg()(y), "xd"))("y")
        assert b.model.SerializeToString() == before
        assert first.to_model_proto().SerializeToString() == kept
