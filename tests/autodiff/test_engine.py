"""The engine's shared work: accumulation, pruning, un-broadcasting, naming and errors."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnxtrain.autodiff import MissingGradientError, RuleError, build_gradients, builtin_registry
from onnxtrain.autodiff.context import RuleContext
from onnxtrain.graph import GraphBuilder
from tests.helpers import DOUBLE, FLOAT, INT64, make_model, run_model

CUSTOM = "test.custom"


def _init(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def _train(builder: GraphBuilder, loss: str, wrt: Sequence[str], **kw: object) -> onnx.ModelProto:
    grads = build_gradients(builder, loss, wrt, **kw)  # type: ignore[arg-type]
    builder.set_outputs([loss, *(grads[name] for name in wrt)])
    return builder.finalize()


def _new_nodes(builder: GraphBuilder, before: int) -> list[onnx.NodeProto]:
    return list(builder.model.graph.node[before:])


# -------------------------------------------------------------- accumulation


def test_fan_out_contributions_are_summed() -> None:
    """a = exp(w) feeds a*a and sin(a): dL/dw = (2a + cos(a)) * a, accumulated with Sum."""
    w = np.array([0.3, -0.7, 1.1])
    nodes = [
        helper.make_node("Exp", ["w"], ["a"]),
        helper.make_node("Mul", ["a", "a"], ["sq"]),
        helper.make_node("Sin", ["a"], ["s"]),
        helper.make_node("Add", ["sq", "s"], ["t"]),
        helper.make_node("ReduceSum", ["t"], ["loss"], keepdims=0),
    ]
    model = make_model({}, nodes, {"loss": (DOUBLE, [])}, initializers=[_init("w", w)])
    builder = GraphBuilder(model)
    before = len(builder.model.graph.node)
    trained = _train(builder, "loss", ["w"])
    assert any(node.op_type == "Sum" for node in _new_nodes(builder, before))
    loss, grad = run_model(trained, {})
    a = np.exp(w)
    np.testing.assert_allclose(loss, np.sum(a * a + np.sin(a)))
    np.testing.assert_allclose(grad, (2 * a + np.cos(a)) * a, rtol=1e-12)


def test_gradient_of_an_intermediate_value_and_a_parameter() -> None:
    """wrt may name intermediate values; both gradients come out under their _grad names."""
    w = np.array([0.5, 2.0])
    nodes = [helper.make_node("Mul", ["w", "w"], ["h"]), helper.make_node("ReduceSum", ["h"], ["loss"], keepdims=0)]
    model = make_model({}, nodes, {"loss": (DOUBLE, [])}, initializers=[_init("w", w)])
    trained = _train(GraphBuilder(model), "loss", ["h", "w"])
    assert [o.name for o in trained.graph.output] == ["loss", "h_grad", "w_grad"]
    _, dh, dw = run_model(trained, {})
    np.testing.assert_allclose(dh, np.ones(2))
    np.testing.assert_allclose(dw, 2 * w)


def test_rules_emit_nothing_for_inputs_that_need_no_gradient() -> None:
    """Mul(x, w) differentiated for w only: no node computes the (unwanted) gradient of x."""
    nodes = [helper.make_node("Mul", ["x", "w"], ["y"]), helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0)]
    model = make_model({"x": (DOUBLE, [3])}, nodes, {"loss": (DOUBLE, [])}, initializers=[_init("w", np.ones(3))])
    builder = GraphBuilder(model)
    before = len(builder.model.graph.node)
    _train(builder, "loss", ["w"])
    new = _new_nodes(builder, before)
    assert not any("w" in node.input for node in new), [(n.op_type, list(n.input)) for n in new]


# ------------------------------------------------------------------- pruning


def _cube_function() -> onnx.FunctionProto:
    """``test.custom::Cube(X) = X * X * X``, a model-local function so onnxruntime can run it."""
    return helper.make_function(
        CUSTOM,
        "Cube",
        ["X"],
        ["Y"],
        [helper.make_node("Mul", ["X", "X"], ["X2"]), helper.make_node("Mul", ["X2", "X"], ["Y"])],
        [helper.make_opsetid("", 17)],
    )


def _cube_model(cube_input: str) -> onnx.ModelProto:
    """loss = sum(Cube(cube_input) * w)."""
    nodes = [
        helper.make_node("Cube", [cube_input], ["c"], domain=CUSTOM, name="cube_node"),
        helper.make_node("Mul", ["c", "w"], ["p"], name="mul_node"),
        helper.make_node("ReduceSum", ["p"], ["loss"], keepdims=0, name="sum_node"),
    ]
    model = make_model(
        {"x": (DOUBLE, [3])},
        nodes,
        {"loss": (DOUBLE, [])},
        initializers=[_init("w", np.array([1.0, -2.0, 0.5]))],
        extra_opsets={CUSTOM: 1},
    )
    model.functions.append(_cube_function())
    return model


def test_operator_without_rule_off_the_path_is_fine() -> None:
    """Cube(x) has no rule, but x is data: d loss / d w = x**3."""
    trained = _train(GraphBuilder(_cube_model("x")), "loss", ["w"])
    x = np.array([0.5, 1.5, -2.0])
    _, grad = run_model(trained, {"x": x})
    np.testing.assert_allclose(grad, x**3)


def test_operator_without_rule_on_the_path_names_operator_node_and_path() -> None:
    """Cube(w) on the path: MissingGradientError names Cube, its domain and opset, the node and the path."""
    model = _cube_model("w")
    model.graph.node[1].input[:] = ["c", "x"]
    builder = GraphBuilder(model)
    n_nodes = len(builder.model.graph.node)
    with pytest.raises(MissingGradientError) as error:
        build_gradients(builder, "loss", ["w"])
    message = str(error.value)
    for part in ("Cube", CUSTOM, "opset 1", "cube_node", "'w' -> Cube 'cube_node' -> Mul 'mul_node' -> ReduceSum"):
        assert part in message, message
    assert isinstance(error.value, ValueError)
    assert len(builder.model.graph.node) == n_nodes  # nothing was appended


def test_custom_rule_on_a_registry_copy() -> None:
    """A user's rule for test.custom::Cube on a copy of the registry; the built-in one is untouched."""
    registry = builtin_registry().copy()

    @registry.rule("Cube", domain=CUSTOM)
    def cube(ctx: RuleContext, grads: Sequence[str | None]) -> list[str | None]:
        """dx = 3 * g * x**2"""
        (g,) = grads
        return [ctx.mul(ctx.mul(g, 3.0), ctx.square(ctx.inputs[0]))]

    model = _cube_model("w")
    model.graph.node[1].input[:] = ["c", "x"]
    trained = _train(GraphBuilder(model), "loss", ["w"], registry=registry)
    x = np.array([0.5, 1.5, -2.0])
    _, grad = run_model(trained, {"x": x})
    np.testing.assert_allclose(grad, 3 * np.array([1.0, -2.0, 0.5]) ** 2 * x)
    assert builtin_registry().lookup("Cube", CUSTOM) is None
    with pytest.raises(RuntimeError, match="frozen"):
        builtin_registry().rule("Cube", domain=CUSTOM)(cube)


def test_the_family_helpers_register_a_custom_domains_operator() -> None:
    """``unary``, ``derivative`` and ``linear`` take ``domain=`` as ``rule`` does: test.custom::Cube in one line."""
    for register in ("unary", "derivative"):
        registry = builtin_registry().copy()
        if register == "unary":
            registry.unary("Cube", "dx = 3 g x^2", lambda c, g, x, y: c.mul(c.mul(g, 3.0), c.square(x)), domain=CUSTOM)
        else:

            @registry.derivative("Cube", domain=CUSTOM)
            def cube(ctx: RuleContext, x: str, y: str) -> str:
                """dx = g * 3 x^2"""
                return ctx.mul(ctx.square(x), 3.0)

        model = _cube_model("w")
        model.graph.node[1].input[:] = ["c", "x"]
        _, grad = run_model(
            _train(GraphBuilder(model), "loss", ["w"], registry=registry), {"x": np.array([0.5, 1.5, -2.0])}
        )
        np.testing.assert_allclose(grad, 3 * np.array([1.0, -2.0, 0.5]) ** 2 * np.array([0.5, 1.5, -2.0]))
        assert registry.lookup("Cube", CUSTOM) is not None and builtin_registry().lookup("Cube", CUSTOM) is None
    linear = builtin_registry().copy()
    linear.linear("Twice", "dx = 2 g", lambda c, g: c.mul(g, 2.0), domain=CUSTOM)
    assert linear.lookup("Twice", CUSTOM) is not None and linear.lookup("Twice", "") is None


def test_a_rule_that_returns_a_gradient_of_another_shape_is_named() -> None:
    """A custom rule for a broadcasting operator registered without ``broadcasting=True`` returns the output's
    shape for a smaller input: the engine says so, naming the rule, instead of a failure at the first run."""
    registry = builtin_registry().copy()

    @registry.rule("Scale", domain=CUSTOM)
    def scale(ctx: RuleContext, grads: Sequence[str | None]) -> list[str | None]:
        """dx = g * w, dw = g * x (not reduced over the broadcast axis)"""
        (g,) = grads
        return [ctx.mul(g, ctx.inputs[1]), ctx.mul(g, ctx.inputs[0])]

    nodes = [
        helper.make_node("Scale", ["x", "w"], ["y"], domain=CUSTOM),
        helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
    ]
    model = make_model({"x": (DOUBLE, [5, 4])}, nodes, {"loss": (DOUBLE, [])}, initializers=[_init("w", np.ones(4))])
    model.opset_import.append(helper.make_opsetid(CUSTOM, 1))
    model.graph.value_info.append(helper.make_tensor_value_info("y", DOUBLE, [5, 4]))  # no schema says it
    with pytest.raises(RuleError, match=r"Scale rule .*scale returned a gradient of shape \[5, 4\] for input 1 "
                       r"\('w'\), of shape \[4\].*broadcasting=True"):  # fmt: skip
        _train(GraphBuilder(model), "loss", ["w"], registry=registry)


def test_non_differentiable_operator_stops_the_gradient() -> None:
    """loss = sum(floor(w) * x) + sum(w): Floor contributes nothing, d loss / d w = 1."""
    nodes = [
        helper.make_node("Floor", ["w"], ["f"]),
        helper.make_node("Mul", ["f", "x"], ["fx"]),
        helper.make_node("Add", ["fx", "w"], ["t"]),
        helper.make_node("ReduceSum", ["t"], ["loss"], keepdims=0),
    ]
    model = make_model({"x": (DOUBLE, [3])}, nodes, {"loss": (DOUBLE, [])}, initializers=[_init("w", np.ones(3) * 1.5)])
    _, grad = run_model(_train(GraphBuilder(model), "loss", ["w"]), {"x": np.arange(3.0)})
    np.testing.assert_allclose(grad, np.ones(3))


def test_integer_inputs_get_no_gradient() -> None:
    """An int64 input cast to float on the path: the engine never tries to differentiate it."""
    nodes = [
        helper.make_node("Cast", ["k"], ["kf"], to=DOUBLE),
        helper.make_node("Mul", ["kf", "w"], ["p"]),
        helper.make_node("ReduceSum", ["p"], ["loss"], keepdims=0),
    ]
    model = make_model({"k": (INT64, [2])}, nodes, {"loss": (DOUBLE, [])}, initializers=[_init("w", np.ones(2))])
    _, grad = run_model(_train(GraphBuilder(model), "loss", ["w"]), {"k": np.array([3, -4])})
    np.testing.assert_allclose(grad, [3.0, -4.0])


def test_value_the_loss_does_not_depend_on_gets_zeros() -> None:
    """An unused parameter gets a zero gradient of its shape and type."""
    nodes = [helper.make_node("ReduceSum", ["w"], ["loss"], keepdims=0)]
    model = make_model(
        {},
        nodes,
        {"loss": (FLOAT, [])},
        initializers=[_init("w", np.ones(2, np.float32)), _init("u", np.ones((2, 3), np.float32))],
    )
    _, dw, du = run_model(_train(GraphBuilder(model), "loss", ["w", "u"]), {})
    np.testing.assert_array_equal(dw, np.ones(2, np.float32))
    assert du.dtype == np.float32 and du.shape == (2, 3) and not du.any()


# ----------------------------------------------------------- un-broadcasting


def _broadcast_model(scale_shape: Sequence[int | str | None]) -> onnx.ModelProto:
    """loss = sum((x * scale + b) ** 2), x: [batch, 3], b: [3]."""
    nodes = [
        helper.make_node("Mul", ["x", "scale"], ["xs"]),
        helper.make_node("Add", ["xs", "b"], ["z"]),
        helper.make_node("Mul", ["z", "z"], ["z2"]),
        helper.make_node("ReduceSum", ["z2"], ["loss"], keepdims=0),
    ]
    return make_model(
        {"x": (DOUBLE, ["batch", 3]), "scale": (DOUBLE, list(scale_shape))},
        nodes,
        {"loss": (DOUBLE, [])},
        initializers=[_init("b", np.array([0.1, -0.2, 0.3]))],
    )


def _expected(x: np.ndarray, scale: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    dz = 2 * (x * scale + b)
    dscale = dz * x
    axes = tuple(range(dscale.ndim - scale.ndim)) + tuple(
        i + dscale.ndim - scale.ndim for i, d in enumerate(scale.shape) if d == 1
    )
    return dz.sum(axis=0), dscale.sum(axis=axes, keepdims=True).reshape(scale.shape)


@pytest.mark.parametrize("batch", [0, 1, 7, 64])
def test_dynamic_unbroadcast_with_symbolic_batch(batch: int) -> None:
    """scale has unknown dims, so which axes were broadcast is decided at run time: none of them, some, all; and
    an empty batch, which onnxruntime 1.23 would sum over every axis were the axes empty."""
    model = _train(GraphBuilder(_broadcast_model([None, None])), "loss", ["b", "scale"])
    assert any(node.op_type == "NonZero" for node in model.graph.node)  # the dynamic form
    rng = np.random.default_rng(batch)
    x = rng.normal(size=(batch, 3))
    b = np.array([0.1, -0.2, 0.3])
    for scale_shape in [(1, 3), (batch, 1), (1, 1), (batch, 3)]:
        scale = rng.normal(size=scale_shape)
        _, db, dscale = run_model(model, {"x": x, "scale": scale})
        want_db, want_dscale = _expected(x, scale, b)
        np.testing.assert_allclose(db, want_db, rtol=1e-12)
        np.testing.assert_allclose(dscale, want_dscale, rtol=1e-12)


@pytest.mark.parametrize("batch", [1, 7, 64])
def test_static_unbroadcast_needs_no_shape_ops(batch: int) -> None:
    """With x: [batch, 3] and scale: [1, 3], b: [3], the broadcast axes are known while building."""
    model = _train(GraphBuilder(_broadcast_model([1, 3])), "loss", ["b", "scale"])
    assert "NonZero" not in {node.op_type for node in model.graph.node}
    rng = np.random.default_rng(batch)
    x, scale = rng.normal(size=(batch, 3)), rng.normal(size=(1, 3))
    _, db, dscale = run_model(model, {"x": x, "scale": scale})
    want_db, want_dscale = _expected(x, scale, np.array([0.1, -0.2, 0.3]))
    np.testing.assert_allclose(db, want_db, rtol=1e-12)
    np.testing.assert_allclose(dscale, want_dscale, rtol=1e-12)


@pytest.mark.parametrize("fused", [False, True], ids=["MatMul", "FusedMatMul"])
@pytest.mark.parametrize("batch", [1, 3])
def test_a_batched_product_s_gradients_take_their_shape_from_the_output(fused: bool, batch: int) -> None:
    """A [batch, 2, 3, 4] @ B [batch, 2, 4, 5] with a symbolic batch: the incoming gradient's shape is not inferred
    (it comes through the sum's ``Expand`` to ``Shape(Y)``), but the product's output and operands say that nothing
    was broadcast: no sum is decided at run time, and the gradients are exact (batch 1 included). FusedMatMul in
    float32: onnxruntime 1.23 has no float64 kernel of it."""
    ms = "com.microsoft"
    kind, dtype, rtol = (FLOAT, np.float32, 1e-5) if fused else (DOUBLE, np.float64, 1e-12)
    node = (
        helper.make_node("FusedMatMul", ["a_t", "b"], ["y"], domain=ms, transA=1, alpha=1.0)
        if fused
        else helper.make_node("MatMul", ["a", "b"], ["y"])
    )
    shapes = {"a": (kind, ["batch", 2, 3, 4]), "b": (kind, ["batch", 2, 4, 5])}
    if fused:  # op(A) = A^T: A is given as [batch, 2, 4, 3]
        shapes = {"a_t": (kind, ["batch", 2, 4, 3]), "b": shapes["b"]}
    nodes = [
        node,
        helper.make_node("Mul", ["y", "y"], ["y2"]),
        helper.make_node("ReduceSum", ["y2"], ["loss"], keepdims=0),
    ]
    model = make_model(shapes, nodes, {"loss": (kind, [])}, extra_opsets={ms: 1} if fused else None)
    if fused:  # onnx types no com.microsoft output: declared, as onnxruntime's symbolic inference would
        model.graph.value_info.append(helper.make_tensor_value_info("y", kind, ["batch", 2, 3, 5]))
    first = "a_t" if fused else "a"
    trained = _train(GraphBuilder(model), "loss", [first, "b"])
    assert "NonZero" not in {n.op_type for n in trained.graph.node}
    rng = np.random.default_rng(batch)
    a, b = rng.normal(size=(batch, 2, 3, 4)).astype(dtype), rng.normal(size=(batch, 2, 4, 5)).astype(dtype)
    feeds = {"a_t": np.swapaxes(a, -1, -2), "b": b} if fused else {"a": a, "b": b}
    _, da, db = run_model(trained, feeds)
    dy = 2 * (a @ b)
    want_da, want_db = dy @ np.swapaxes(b, -1, -2), np.swapaxes(a, -1, -2) @ dy
    np.testing.assert_allclose(da, np.swapaxes(want_da, -1, -2) if fused else want_da, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(db, want_db, rtol=rtol, atol=rtol)


@pytest.mark.parametrize(
    ("x_shape", "b_shape"),
    [((5, 3), (3,)), ((5,), ()), ((2, 4, 3), (3,)), ((2, 1, 3), (1, 3)), ((2, 4, 3), (4, 3)), ((6, 2, 3), ())],
    ids=str,
)
@pytest.mark.parametrize("elem_type", [FLOAT, DOUBLE], ids=["float", "double"])
def test_static_sums_over_leading_axes_are_products_with_ones(
    x_shape: tuple[int, ...], b_shape: tuple[int, ...], elem_type: int
) -> None:
    """loss = sum((x + b) ** 3) with fixed shapes: db sums over x's leading axes as ones @ g, no ReduceSum."""
    dtype = helper.tensor_dtype_to_np_dtype(elem_type)
    rng = np.random.default_rng(len(x_shape) + len(b_shape))
    b = rng.normal(size=b_shape).astype(dtype)
    nodes = [
        helper.make_node("Add", ["x", "b"], ["z"]),
        helper.make_node("Mul", ["z", "z"], ["z2"]),
        helper.make_node("Mul", ["z2", "z"], ["z3"]),
        helper.make_node("ReduceSum", ["z3"], ["loss"], keepdims=0),
    ]
    model = make_model(
        {"x": (elem_type, list(x_shape))}, nodes, {"loss": (elem_type, [])}, initializers=[_init("b", b)]
    )
    builder = GraphBuilder(model)
    before = len(builder.model.graph.node)
    trained = _train(builder, "loss", ["b"])
    backward = [node.op_type for node in _new_nodes(builder, before)]
    assert "MatMul" in backward and "ReduceSum" not in backward
    x = rng.normal(size=x_shape).astype(dtype)
    _, db = run_model(trained, {"x": x})
    lead = len(x_shape) - len(b_shape)
    want = (3 * (x + b).astype(np.float64) ** 2).sum(axis=tuple(range(lead))).reshape(b_shape)
    assert db.shape == b_shape and db.dtype == dtype
    np.testing.assert_allclose(db, want, rtol=1e-12 if elem_type == DOUBLE else 1e-5)


def test_float16_sums_over_leading_axes_stay_reductions() -> None:
    """The product form is for float and double; other types keep ReduceSum."""
    nodes = [helper.make_node("Add", ["x", "b"], ["z"]), helper.make_node("ReduceSum", ["z"], ["loss"], keepdims=0)]
    model = make_model(
        {"x": (onnx.TensorProto.FLOAT16, [4, 3])},
        nodes,
        {"loss": (onnx.TensorProto.FLOAT16, [])},
        initializers=[_init("b", np.zeros(3, np.float16))],
    )
    builder = GraphBuilder(model)
    before = len(builder.model.graph.node)
    trained = _train(builder, "loss", ["b"])
    assert "ReduceSum" in {node.op_type for node in _new_nodes(builder, before)}
    _, db = run_model(trained, {"x": np.ones((4, 3), np.float16)})
    np.testing.assert_array_equal(db, np.full(3, 4, np.float16))


# ------------------------------------------------------------ naming, domain


def test_gradients_are_named_value_grad_and_use_only_ai_onnx() -> None:
    model = _broadcast_model([1, 3])
    builder = GraphBuilder(model)
    before = len(builder.model.graph.node)
    grads = build_gradients(builder, "loss", ["b", "scale"])
    assert grads == {"b": "b_grad", "scale": "scale_grad"}
    assert all(node.domain in ("", "ai.onnx") for node in _new_nodes(builder, before))
    assert builder.has("b_grad") and builder.has("scale_grad")


def test_two_values_with_one_gradient_get_two_names() -> None:
    """y = Identity(w): dL/dy and dL/dw are the same value, exposed under both names."""
    nodes = [helper.make_node("Identity", ["w"], ["y"]), helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0)]
    model = make_model({}, nodes, {"loss": (DOUBLE, [])}, initializers=[_init("w", np.ones(2))])
    trained = _train(GraphBuilder(model), "loss", ["w", "y"])
    _, dw, dy = run_model(trained, {})
    np.testing.assert_array_equal(dw, dy)


def test_taken_gradient_name_is_an_error() -> None:
    model = _broadcast_model([1, 3])
    model.graph.initializer.append(_init("b_grad", np.zeros(3)))
    with pytest.raises(ValueError, match="'b_grad'"):
        build_gradients(GraphBuilder(model), "loss", ["b"])


# ------------------------------------------------------------------ bad input


def test_non_scalar_loss_is_an_error_naming_it_and_its_shape() -> None:
    nodes = [helper.make_node("Mul", ["x", "b"], ["y"])]
    model = make_model({"x": (DOUBLE, ["batch", 3])}, nodes, ["y"], initializers=[_init("b", np.ones(3))])
    with pytest.raises(ValueError, match=r"'y' has shape double\[batch,3\], not a scalar"):
        build_gradients(GraphBuilder(model), "y", ["b"])


def test_integer_loss_is_an_error() -> None:
    nodes = [helper.make_node("ReduceSum", ["k"], ["s"], keepdims=0)]
    model = make_model({"k": (INT64, [3])}, nodes, ["s"], initializers=[_init("w", np.ones(2))])
    with pytest.raises(ValueError, match=r"'s' is int64.*not a floating-point tensor"):
        build_gradients(GraphBuilder(model), "s", ["w"])


def test_unknown_wrt_lists_float_candidates() -> None:
    with pytest.raises(ValueError, match=r"'bias'.*no such value.*\['b', 'x', 'scale'\]"):
        build_gradients(GraphBuilder(_broadcast_model([1, 3])), "loss", ["bias"])


def test_integer_wrt_is_an_error_listing_candidates() -> None:
    nodes = [
        helper.make_node("Cast", ["k"], ["kf"], to=DOUBLE),
        helper.make_node("Mul", ["kf", "w"], ["p"]),
        helper.make_node("ReduceSum", ["p"], ["loss"], keepdims=0),
    ]
    model = make_model({"k": (INT64, [2])}, nodes, {"loss": (DOUBLE, [])}, initializers=[_init("w", np.ones(2))])
    with pytest.raises(ValueError, match=r"'k' of type int64\[2\].*\['w'\]"):
        build_gradients(GraphBuilder(model), "loss", ["k"])


def test_wrt_as_a_bare_string_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"\['b'\]"):
        build_gradients(GraphBuilder(_broadcast_model([1, 3])), "loss", "b")  # type: ignore[arg-type]


def test_unknown_loss_name_is_an_error() -> None:
    with pytest.raises(ValueError, match="'nope'"):
        build_gradients(GraphBuilder(_broadcast_model([1, 3])), "nope", ["b"])


def test_rule_returning_the_wrong_arity_or_type_is_a_rule_error() -> None:
    """The engine checks what a rule returns: one entry per input, of the input's element type."""
    nodes = [helper.make_node("Cube", ["w"], ["c"], domain=CUSTOM), helper.make_node("ReduceSum", ["c"], ["loss"])]
    model = make_model(
        {}, nodes, {"loss": (DOUBLE, [1])}, initializers=[_init("w", np.ones(2))], extra_opsets={CUSTOM: 1}
    )
    model.functions.append(_cube_function())
    registry = builtin_registry().copy()
    registry.rule("Cube", domain=CUSTOM)(lambda ctx, grads: [grads[0], None])
    with pytest.raises(RuleError, match=r"returned 2 gradients.*1 inputs"):
        build_gradients(GraphBuilder(model), "loss", ["w"], registry=registry)
    registry.rule("Cube", domain=CUSTOM, replace=True)(lambda ctx, grads: [ctx.cast(grads[0], FLOAT)])
    with pytest.raises(RuleError, match=r"float gradient.*double"):
        build_gradients(GraphBuilder(model), "loss", ["w"], registry=registry)


def test_loss_of_unknown_rank_is_seeded_at_run_time() -> None:
    """ReduceSum(keepdims=0) of a value of unknown rank is a scalar that inference cannot see."""
    nodes = [
        helper.make_node("Reshape", ["w", "shape"], ["r"]),
        helper.make_node("Mul", ["r", "r"], ["r2"]),
        helper.make_node("ReduceSum", ["r2"], ["loss"], keepdims=0),
    ]
    model = make_model({"shape": (INT64, [None])}, nodes, ["r"], initializers=[_init("w", np.arange(4.0))])
    builder = GraphBuilder(model)
    assert builder.shape("loss") is None
    trained = _train(builder, "loss", ["w"])
    _, grad = run_model(trained, {"shape": np.array([2, 2])})
    np.testing.assert_allclose(grad, 2 * np.arange(4.0))


# -------------------------------------------------------------- stacked transposes


def test_transposed_weight_gradient_has_no_stacked_transposes() -> None:
    """h = x @ W^T with a 3-D x (PyTorch's nn.Linear): no Transpose(Transpose(W)), no Transpose(Gemm)."""
    rng = np.random.default_rng(0)
    w, c = rng.normal(size=(5, 4)), rng.normal(size=(2, 3, 5))
    nodes = [
        helper.make_node("Transpose", ["W"], ["wt"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "wt"], ["h"]),
        helper.make_node("Mul", ["h", "c"], ["hc"]),
        helper.make_node("ReduceSum", ["hc"], ["loss"], keepdims=0),
    ]
    model = make_model({"x": (DOUBLE, [2, 3, 4])}, nodes, ["h"], initializers=[_init("W", w), _init("c", c)])
    builder = GraphBuilder(model)
    before = len(builder.model.graph.node)
    trained = _train(builder, "loss", ["W", "x"])
    producer = {out: node for node in trained.graph.node for out in node.output}
    for node in trained.graph.node[before:]:
        if node.op_type == "Transpose":
            assert producer[node.input[0]].op_type not in ("Transpose", "Gemm"), node
    x = rng.normal(size=(2, 3, 4))
    _, grad_w, grad_x = run_model(trained, {"x": x})
    np.testing.assert_allclose(grad_w, np.einsum("btj,bti->ji", c, x), rtol=1e-12)
    np.testing.assert_allclose(grad_x, c @ w, rtol=1e-12)


def test_fold_transposes_composes_chains_and_gemm() -> None:
    """Transpose(Transpose(Gemm)) is the Gemm; three transposes of [1, 0] are one."""
    from onnx.reference import ReferenceEvaluator

    from onnxtrain.graph.passes import fold_transposes

    def nodes() -> list[onnx.NodeProto]:
        return [
            helper.make_node("Gemm", ["a", "b"], ["g"], transA=1),
            helper.make_node("Transpose", ["g"], ["t1"], perm=[1, 0]),
            helper.make_node("Transpose", ["t1"], ["t2"], perm=[1, 0]),
            helper.make_node("Relu", ["t2"], ["r"]),
            helper.make_node("Transpose", ["r"], ["t3"], perm=[1, 0]),
            helper.make_node("Transpose", ["t3"], ["t4"], perm=[1, 0]),
            helper.make_node("Transpose", ["t4"], ["out"], perm=[1, 0]),
        ]

    def run(graph_nodes: list[onnx.NodeProto], feeds: dict[str, np.ndarray]) -> np.ndarray:
        inputs = [helper.make_tensor_value_info(k, DOUBLE, v.shape) for k, v in feeds.items()]
        graph = helper.make_graph(graph_nodes, "g", inputs, [helper.make_tensor_value_info("out", DOUBLE, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
        return ReferenceEvaluator(model).run(None, feeds)[0]

    rng = np.random.default_rng(1)
    feeds = {"a": rng.normal(size=(3, 4)), "b": rng.normal(size=(3, 5))}
    graph = helper.make_graph(nodes(), "g", [], [helper.make_tensor_value_info("out", DOUBLE, None)])
    folded = list(fold_transposes(helper.make_model(graph)).graph.node)
    used = {name for node in folded for name in node.input} | {"out"}
    live = [node for node in folded if node.output[0] in used]
    assert [node.op_type for node in live] == ["Gemm", "Relu", "Transpose"]
    np.testing.assert_array_equal(run(live, feeds), run(nodes(), feeds))
