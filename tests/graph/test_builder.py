"""The graph builder: no mutation, rollback on failure, hand-made nodes, names."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import onnxtrain.onnxblock as onnxblock
from onnxtrain import blocks
from onnxtrain.graph.builder import describe_type
from onnxtrain.graph.naming import names_in
from tests.helpers import DOUBLE, FLOAT, INT64, make_model, run_model

ROOT = Path(__file__).resolve().parents[2]


def base_model() -> onnx.ModelProto:
    """x: float[batch,3], xd: double[batch,3]; outputs y = Relu(x) and yd = Neg(xd)."""
    return make_model(
        {"x": (FLOAT, ["batch", 3]), "xd": (DOUBLE, ["batch", 3])},
        [helper.make_node("Relu", ["x"], ["y"], name="relu"), helper.make_node("Neg", ["xd"], ["yd"], name="neg")],
        ["y", "yd"],
    )


class Fn(onnxblock.ForwardBlock):
    """A ForwardBlock whose build is a given function."""

    def __init__(self, fn: Callable[..., object]) -> None:
        super().__init__()
        self.fn = fn

    def build(self, *args: str) -> object:
        return self.fn(*args)


class Composite(onnxblock.Block):
    """A Block whose build is a given function (sub-blocks roll back with it)."""

    def __init__(self, fn: Callable[..., object]) -> None:
        super().__init__()
        self.fn = fn

    def build(self, *args: str) -> object:
        return self.fn(*args)


class HandRelu(onnxblock.Block):
    """Appends a Relu node and an initializer to ``self.base.graph`` by hand (ONNX Runtime style)."""

    def build(self, x: str) -> str:
        self.base.graph.node.append(helper.make_node("Relu", [x], ["hand_relu"], name="hand_relu_node"))
        self.base.graph.initializer.append(numpy_helper.from_array(np.array(2.0, np.float32), "hand_two"))
        return "hand_relu"


def sample_build() -> bytes:
    """A build touching most kinds of names: nodes, constants, parameters, inputs, ml domain."""
    model = base_model()

    def fn(y: str, yd: str) -> list[str]:
        hidden = blocks.Relu()(blocks.Linear(3, 4)(y))
        logits = blocks.Linear(4, 2, bias=False)(hidden)
        target = blocks.InputLike(logits)("target")
        loss = blocks.ReduceMean(keepdims=False)(blocks.Pow(2.0)(blocks.Sub()(logits, target)))
        clipped = blocks.Clip(0.0, 1.0)(blocks.Sigmoid()(logits))
        codes = blocks.LabelEncoder(keys_int64s=[0, 1], values_floats=[0.5, 2.0])(blocks.Cast(INT64)(clipped))
        total = blocks.Sum()(blocks.ReduceSum(keepdims=False)(codes), loss, blocks.Constant(1.0)())
        norm = blocks.ReduceAllL2()(yd, blocks.Transpose()(yd))
        return [total, norm]

    block = Fn(fn)
    with onnxblock.base(model):
        block("y", "yd")
    return block.to_model_proto().SerializeToString()


def test_caller_model_is_not_mutated() -> None:
    """Building on a model (blocks, a new input, new outputs) never changes the caller's proto."""
    model = base_model()
    before = model.SerializeToString()
    with onnxblock.base(model) as b:
        assert b.model is not model
        blocks.Add()("y", blocks.Constant(np.float32(1))())
    assert model.SerializeToString() == before
    built = onnx.ModelProto.FromString(sample_build())
    assert model.SerializeToString() == before
    assert len(built.graph.node) > len(model.graph.node)


def _snapshot_failures(b, failures: list[tuple[Callable[[], object], type[Exception], str]]) -> None:
    """Each failing call raises as expected and leaves ``b.model`` byte-identical."""
    for call, error, pattern in failures:
        before = b.model.SerializeToString()
        with pytest.raises(error, match=pattern):
            call()
        assert b.model.SerializeToString() == before, pattern


class _AppendsThenFails(onnxblock.Block):
    """Appends through the builder and by hand, then raises."""

    def build(self, x: str) -> str:
        blocks.Relu()(blocks.Constant(np.ones(3, np.float32))())
        self.base.graph.node.append(helper.make_node("Neg", [x], ["will_vanish"]))
        self.base.graph.input.append(helper.make_tensor_value_info("extra_in", FLOAT, [3]))
        self.builder.ensure_opset("ai.onnx.ml")
        raise RuntimeError("late failure")


def test_failing_blocks_leave_base_unchanged_and_builder_usable() -> None:
    """Unknown names, dtype mismatches and late failures roll back; later builds match a clean build."""
    model = base_model()
    with onnxblock.base(model) as b:
        first = blocks.Exp()("y")
        _snapshot_failures(
            b,
            [
                (lambda: blocks.Add()("nope", "y"), ValueError, "'nope'"),
                (lambda: blocks.Add()("x", "xd"), TypeError, "Add"),
                (lambda: Composite(lambda: blocks.Mul()(first, blocks.Constant(np.float64(2))()))(), TypeError, "Mul"),
                (lambda: _AppendsThenFails()("x"), RuntimeError, "late failure"),
                (lambda: Fn(lambda: blocks.Add()("y", "missing"))(), ValueError, "missing"),
                (lambda: Fn(lambda: None)(), ValueError, "must return"),
                (lambda: blocks.Squeeze([0])(blocks.Identity()("nope2")), ValueError, "nope2"),
            ],
        )
        assert not b.has("will_vanish") and not b.has("extra_in")
        assert [o.domain for o in b.model.opset_import] == [""]
        block = Fn(lambda y: blocks.Mul()(y, blocks.Constant(np.float32(3))()))
        block(first)
        after_failures = block.to_model_proto()
    clean_block = Fn(lambda y: blocks.Mul()(y, blocks.Constant(np.float32(3))()))
    with onnxblock.base(model):
        clean_block(blocks.Exp()("y"))
    assert after_failures.SerializeToString() == clean_block.to_model_proto().SerializeToString()
    x = np.array([[-1.0, 0.0, 0.5]], np.float32)
    (out,) = run_model(after_failures, {"x": x, "xd": x.astype(np.float64)})
    np.testing.assert_allclose(out, np.exp(np.maximum(x, 0)) * 3, rtol=1e-6)


def test_unknown_name_error_lists_inputs_and_outputs() -> None:
    """The message names the missing value and lists graph inputs, outputs and close matches."""
    with onnxblock.base(base_model()), pytest.raises(ValueError) as info:
        blocks.Relu()("yy")
    message = str(info.value)
    assert "'yy'" in message
    assert "Graph inputs: ['x', 'xd']" in message
    assert "graph outputs: ['y', 'yd']" in message
    assert "similar names" in message and "'y'" in message


def test_dtype_mismatch_names_op_and_inputs() -> None:
    """Add(float, double) raises TypeError naming the op, both inputs and their types."""
    with onnxblock.base(base_model()) as b, pytest.raises(TypeError) as info:
        blocks.Add()("y", "yd")
    message = str(info.value)
    assert message.startswith("Add (opset 17)")
    assert "'y': float[batch,3]" in message and "'yd': double[batch,3]" in message
    assert "Cast" in message
    assert describe_type(b.type_of("yd")) == "double[batch,3]"


def test_a_node_of_the_wrong_arity_is_told_to_follow_the_schema_not_to_cast() -> None:
    """``ReduceLogSumExp`` given its axes as an input at opset 17, whose schema takes them as an attribute."""
    with onnxblock.base(base_model()) as b, pytest.raises(TypeError) as info:
        b.add_node("ReduceLogSumExp", ["y", "y"])
    message = str(info.value)
    assert message.startswith("ReduceLogSumExp (opset 17)") and "input size 2" in message
    assert "ReduceLogSumExp's schema at opset 17" in message and "Cast" not in message


def test_hand_appended_nodes_are_picked_up() -> None:
    """Nodes and initializers appended to self.base.graph get types and can feed later blocks."""
    model = base_model()

    class Model(onnxblock.ForwardBlock):
        def build(self, y: str) -> str:
            relu = HandRelu()(y)
            b = self.builder
            assert describe_type(b.type_of(relu)) == "float[batch,3]"
            assert describe_type(b.type_of("hand_two")) == "float[]"
            # appended by hand inside this very build, then used by a builder block at once
            self.base.graph.node.append(helper.make_node("Abs", [relu], ["hand_abs"]))
            scaled = blocks.Mul()("hand_abs", "hand_two")
            assert describe_type(b.type_of(scaled)) == "float[batch,3]"
            return blocks.Add()(scaled, "hand_relu")

    block = Model()
    with onnxblock.base(model) as b:
        out = block("y")
        for name in ("hand_relu", "hand_two", "hand_abs", "hand_relu_node"):
            assert name in b.names
    built = block.to_model_proto()
    assert [n.op_type for n in built.graph.node] == ["Relu", "Neg", "Relu", "Abs", "Mul", "Add"]
    assert built.graph.output[0].name == out
    x = np.array([[-1.0, 2.0, 3.5], [0.5, -0.25, 0.0]], np.float32)
    (result,) = run_model(built, {"x": x, "xd": x.astype(np.float64)})
    np.testing.assert_allclose(result, 3 * np.maximum(x, 0), rtol=1e-6)


def test_same_build_twice_is_byte_identical() -> None:
    """Two builds of the same blocks on the same model give the same bytes (names, weights)."""
    assert sample_build() == sample_build()


def test_build_in_subprocess_is_byte_identical(tmp_path: Path) -> None:
    """A fresh interpreter (with other hash seeds) builds exactly the same bytes."""
    expected = sample_build()
    code = (
        "import sys; from tests.graph.test_builder import sample_build; open(sys.argv[1], 'wb').write(sample_build())"
    )
    for seed in ("0", "12345"):
        out = tmp_path / f"model_{seed}.onnx"
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(
            [sys.executable, "-c", code, str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert out.read_bytes() == expected


def _trap_model(trap: list[str], in_subgraph: bool) -> onnx.ModelProto:
    """A model using every name in ``trap`` as value and node names, in the graph or an If branch."""
    chain = []
    previous = "x"
    for i, name in enumerate(trap[0::2]):
        node_name = trap[2 * i + 1] if 2 * i + 1 < len(trap) else f"trap_node_{i}"
        chain.append(helper.make_node("Identity", [previous], [name], name=node_name))
        previous = name
    if in_subgraph:
        then_branch = helper.make_graph(
            chain, "then", [], [helper.make_tensor_value_info(previous, FLOAT, ["batch", 3])]
        )
        else_branch = helper.make_graph(
            [helper.make_node("Neg", ["x"], ["else_out"])],
            "else",
            [],
            [helper.make_tensor_value_info("else_out", FLOAT, ["batch", 3])],
        )
        nodes = [helper.make_node("If", ["flag"], ["z"], then_branch=then_branch, else_branch=else_branch)]
    else:
        nodes = [*chain, helper.make_node("Identity", [previous], ["z"])]
    return make_model(
        {"x": (FLOAT, ["batch", 3]), "flag": (onnx.TensorProto.BOOL, []), "xd": (DOUBLE, ["batch", 3])},
        [*nodes, helper.make_node("Add", ["z", "zero"], ["y"]), helper.make_node("Neg", ["xd"], ["yd"])],
        {"y": (FLOAT, ["batch", 3]), "yd": (DOUBLE, ["batch", 3])},
        [("zero", np.zeros(3, np.float32))],
    )


@pytest.mark.parametrize("in_subgraph", [False, True], ids=["graph", "if_branch"])
def test_generated_names_never_collide_with_existing_ones(in_subgraph: bool) -> None:
    """A base model already using every name a build generates still gets fresh, unique names."""
    plain = onnx.ModelProto.FromString(sample_build())
    generated = sorted(names_in(plain.graph) - names_in(base_model().graph) - {"target"})
    assert len(generated) > 20
    trap = _trap_model(generated, in_subgraph)
    existing = set(generated) | names_in(trap.graph)

    def fn(y: str, yd: str) -> list[str]:
        hidden = blocks.Relu()(blocks.Linear(3, 4)(y))
        logits = blocks.Linear(4, 2, bias=False)(hidden)
        target = blocks.InputLike(logits)("target")
        loss = blocks.ReduceMean(keepdims=False)(blocks.Pow(2.0)(blocks.Sub()(logits, target)))
        return [loss, blocks.ReduceAllL2()(yd, blocks.Transpose()(yd))]

    block = Fn(fn)
    with onnxblock.base(trap):
        block("y", "yd")
    built = block.to_model_proto()  # checked by onnx.checker (SSA) in finalize
    new_nodes = built.graph.node[len(trap.graph.node) :]
    new_values = [name for node in new_nodes for name in node.output]
    new_values += [t.name for t in built.graph.initializer[len(trap.graph.initializer) :]]
    new_values += [v.name for v in built.graph.input[len(trap.graph.input) :] if v.name != "target"]
    new_node_names = [node.name for node in new_nodes]
    assert not (set(new_values) | set(new_node_names)) & existing
    assert len(set(new_values)) == len(new_values)
    all_node_names = [n.name for n in built.graph.node if n.name]
    assert len(set(all_node_names)) == len(all_node_names)
    x = np.array([[1.0, -2.0, 0.5]], np.float32)
    feeds = {"x": x, "flag": np.array(True), "xd": x.astype(np.float64), "target": np.zeros((1, 2), np.float32)}
    loss, norm = run_model(built, feeds)
    assert np.isfinite(loss) and loss.shape == ()
    np.testing.assert_allclose(norm, np.sqrt(2 * np.sum(x.astype(np.float64) ** 2)), rtol=1e-10)


def test_explicit_output_name_clash_is_an_error() -> None:
    """add_node with an explicit output name already in the model raises and adds nothing."""
    with onnxblock.base(base_model()) as b:
        before = b.model.SerializeToString()
        with pytest.raises(ValueError, match="'y' is already used"):
            b.add_node("Relu", ["x"], ["y"])
        assert b.model.SerializeToString() == before
        (out,) = b.add_node("Relu", ["x"], ["fresh_out"])
        assert out == "fresh_out" and b.has("fresh_out")
