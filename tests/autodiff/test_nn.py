"""Neural-network rules beyond finite differences: training-mode operators and forward outputs
the rules reuse (Dropout's mask, MaxPool's indices), BatchNormalization in training mode against
torch, and the forms the spec table cannot check (onnx's inference or checker gets in the way)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

from onnxtrain.autodiff import RuleContext, build_gradients, builtin_registry
from onnxtrain.autodiff.context import OutputRequest
from onnxtrain.graph import GraphBuilder, versions
from tests.helpers import BOOL, DOUBLE, FLOAT, make_model, run_model, skip_unless_onnxruntime_loads

Grads = Sequence["str | None"]


def _init(name: str, value: object, dtype: object = np.float64) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def _projected(nodes: list[onnx.NodeProto], y: str) -> list[onnx.NodeProto]:
    """``loss = sum(y * c)`` appended to ``nodes`` (``c`` a graph input)."""
    return [
        *nodes,
        helper.make_node("Mul", [y, "c"], ["yc"]),
        helper.make_node("ReduceSum", ["yc"], ["loss"], keepdims=0),
    ]


def _nodes_of(model: onnx.ModelProto, op_type: str) -> list[onnx.NodeProto]:
    return [node for node in model.graph.node if node.op_type == op_type]


# ------------------------------------------------------------------ BatchNormalization


def _batch_norm_model(momentum: float, eps: float, opset: int = 15) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    params = {
        "scale": rng.normal(size=3),
        "bias": rng.normal(size=3),
        "mean": rng.normal(size=3),
        "var": rng.uniform(0.5, 2.0, size=3),
    }
    node = helper.make_node(
        "BatchNormalization",
        ["x", "scale", "bias", "mean", "var"],
        ["y", "running_mean", "running_var"],
        training_mode=1,
        momentum=momentum,
        epsilon=eps,
        name="bn",
    )
    model = make_model(
        {"x": (DOUBLE, [4, 3, 5, 5]), "c": (DOUBLE, [4, 3, 5, 5])},
        _projected([node], "y"),
        {"loss": (DOUBLE, [])},
        initializers=[_init(name, value) for name, value in params.items()],
        opset=opset,
    )
    return model, params


def _train_batch_norm(momentum: float = 0.9, eps: float = 1e-5) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """Loss, y, the running statistics and the gradients of x, scale and bias, from onnxruntime."""
    model, params = _batch_norm_model(momentum, eps)
    builder = GraphBuilder(model)
    grads = build_gradients(builder, "loss", ["x", "scale", "bias"])
    builder.set_outputs(["loss", "y", "running_mean", "running_var", *grads.values()])
    rng = np.random.default_rng(1)
    feeds = {"x": rng.normal(2.0, 3.0, size=(4, 3, 5, 5)), "c": rng.normal(size=(4, 3, 5, 5))}
    return run_model(builder.finalize(), feeds), {**params, **feeds}


def test_batch_norm_training_updates_running_statistics() -> None:
    """The forward node's running mean and variance (batch statistics, biased variance) are outputs."""
    momentum = 0.8
    (_, y, running_mean, running_var, *_), values = _train_batch_norm(momentum)
    x = values["x"]
    batch_mean, batch_var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    np.testing.assert_allclose(running_mean, momentum * values["mean"] + (1 - momentum) * batch_mean, rtol=1e-6)
    np.testing.assert_allclose(running_var, momentum * values["var"] + (1 - momentum) * batch_var, rtol=1e-6)
    xhat = (x - batch_mean[:, None, None]) / np.sqrt(batch_var[:, None, None] + 1e-5)
    np.testing.assert_allclose(y, values["scale"][:, None, None] * xhat + values["bias"][:, None, None], atol=1e-9)


def test_batch_norm_training_gradient_matches_torch() -> None:
    """d loss / d (x, scale, bias) through the batch statistics, as torch.nn.functional.batch_norm."""
    torch = pytest.importorskip("torch")
    momentum, eps = 0.9, 1e-5
    (_, y, running_mean, _, dx, dscale, dbias), values = _train_batch_norm(momentum, eps)
    x = torch.tensor(values["x"], requires_grad=True)
    weight = torch.tensor(values["scale"], requires_grad=True)
    bias = torch.tensor(values["bias"], requires_grad=True)
    stats = torch.tensor(values["mean"]), torch.tensor(values["var"])
    expected = torch.nn.functional.batch_norm(x, *stats, weight, bias, training=True, momentum=1 - momentum, eps=eps)
    (expected * torch.tensor(values["c"])).sum().backward()
    np.testing.assert_allclose(y, expected.detach().numpy(), atol=1e-10)
    np.testing.assert_allclose(running_mean, stats[0].numpy(), rtol=1e-6)  # torch updated it in place
    for ours, theirs in ((dx, x), (dscale, weight), (dbias, bias)):
        np.testing.assert_allclose(ours, theirs.grad.numpy(), rtol=1e-8, atol=1e-10)


# ------------------------------------------------------------------------------ Dropout


def _dropout_model(training: bool = True, ratio: float = 0.5) -> onnx.ModelProto:
    node = helper.make_node("Dropout", ["x", "ratio", "training"], ["y"], name="drop", seed=7)
    return make_model(
        {"x": (DOUBLE, [6, 5]), "c": (DOUBLE, [6, 5])},
        _projected([node], "y"),
        {"loss": (DOUBLE, [])},
        initializers=[_init("ratio", ratio), _init("training", training, np.bool_)],
    )


def test_dropout_reuses_the_forward_mask() -> None:
    """Training mode: the forward node gets a mask output, the gradient reads it, no second Dropout."""
    builder = GraphBuilder(_dropout_model())
    grads = build_gradients(builder, "loss", ["x"])
    (dropout,) = _nodes_of(builder.model, "Dropout")
    assert len(dropout.output) == 2 and dropout.output[1]
    mask = dropout.output[1]
    assert any(mask in node.input for node in builder.model.graph.node if node is not dropout)
    builder.set_outputs(["y", mask, grads["x"]])
    rng = np.random.default_rng(0)
    x, c = rng.normal(size=(6, 5)), rng.normal(size=(6, 5))
    y, mask_value, dx = run_model(builder.finalize(), {"x": x, "c": c})
    assert mask_value.dtype == np.bool_ and 0 < mask_value.sum() < mask_value.size
    np.testing.assert_allclose(y, x * mask_value / 0.5)
    np.testing.assert_allclose(dx, c * mask_value / 0.5)


def test_dropout_gradient_equals_that_of_its_fixed_mask() -> None:
    """With the mask the forward pass drew, dropout is y = x * mask / (1 - ratio): same gradient."""
    builder = GraphBuilder(_dropout_model(ratio=0.25))
    grads = build_gradients(builder, "loss", ["x"])
    mask = _nodes_of(builder.model, "Dropout")[0].output[1]
    builder.set_outputs([mask, grads["x"]])
    rng = np.random.default_rng(3)
    x, c = rng.normal(size=(6, 5)), rng.normal(size=(6, 5))
    mask_value, dx = run_model(builder.finalize(), {"x": x, "c": c})
    fixed = make_model(
        {"x": (DOUBLE, [6, 5]), "c": (DOUBLE, [6, 5])},
        _projected([helper.make_node("Mul", ["x", "scaled_mask"], ["y"])], "y"),
        {"loss": (DOUBLE, [])},
        initializers=[_init("scaled_mask", mask_value / 0.75)],
    )
    fixed_builder = GraphBuilder(fixed)
    fixed_grads = build_gradients(fixed_builder, "loss", ["x"])
    fixed_builder.set_outputs([fixed_grads["x"]])
    (expected,) = run_model(fixed_builder.finalize(), {"x": x, "c": c})
    np.testing.assert_allclose(dx, expected, rtol=1e-15)


def test_dropout_in_inference_mode_needs_no_mask() -> None:
    """training_mode=False: the gradient is g, and the forward node keeps its single output."""
    builder = GraphBuilder(_dropout_model(training=False))
    build_gradients(builder, "loss", ["x"])
    assert list(_nodes_of(builder.model, "Dropout")[0].output) == ["y"]


def _custom_registry(rule_for: str, fn: object) -> object:
    registry = builtin_registry().copy()
    registry.rule(rule_for, domain="test.nn")(fn)  # type: ignore[arg-type]
    return registry


def test_unused_forward_output_request_is_undone() -> None:
    """A mask the surviving gradient graph does not read is not added to the forward node."""

    def stop(ctx: RuleContext, grads: Grads) -> list[str | None]:
        """no gradient"""
        return [None]

    registry = _custom_registry("Stop", stop)
    nodes = [
        helper.make_node("Stop", ["w"], ["s"], domain="test.nn"),
        helper.make_node("Dropout", ["s", "ratio", "training"], ["y"], name="drop"),
    ]
    model = make_model(
        {"w": (DOUBLE, [6, 5]), "c": (DOUBLE, [6, 5])},
        _projected(nodes, "y"),
        {"loss": (DOUBLE, [])},
        initializers=[_init("ratio", 0.5), _init("training", True, np.bool_)],
        extra_opsets={"test.nn": 1},
    )
    model.graph.value_info.append(helper.make_tensor_value_info("s", DOUBLE, [6, 5]))
    builder = GraphBuilder(model)
    build_gradients(builder, "loss", ["w"], registry=registry)  # type: ignore[arg-type]
    assert list(_nodes_of(builder.model, "Dropout")[0].output) == ["y"]
    assert not any(node.op_type == "Dropout" and len(node.output) > 1 for node in builder.model.graph.node)


def test_failed_build_gives_the_forward_node_its_outputs_back() -> None:
    """A rule that declared a forward output and then failed leaves the model as it was."""
    registry = builtin_registry().copy()

    @registry.rule("Dropout", replace=True)
    def broken(ctx: RuleContext, grads: Grads) -> list[str | None]:
        """declares the mask, then fails"""
        ctx.ensure_output(1)
        raise ZeroDivisionError("broken rule")

    builder = GraphBuilder(_dropout_model())
    before = onnx.ModelProto()
    before.CopyFrom(builder.model)
    with pytest.raises(ZeroDivisionError):
        build_gradients(builder, "loss", ["x"], registry=registry)
    assert builder.model == before


def test_undoing_one_request_keeps_the_others() -> None:
    """Requests for outputs 2 then 1 of one node: dropping the first leaves the second in place."""
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y"])
    info = onnx.ValueInfoProto()
    inv = OutputRequest(node, 2, "inv", 1, info)
    node.output[:] = ["y", "", "inv"]
    mean = OutputRequest(node, 1, "mean", 3, info)
    node.output[1] = "mean"
    inv.undo()
    assert list(node.output) == ["y", "mean"]
    mean.undo()
    assert list(node.output) == ["y", ""]  # as it was when the mean was requested, less the mean


# ------------------------------------------------------------------------ loss operators


@pytest.mark.parametrize("op_type", ["SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"])
def test_mean_loss_over_ignored_targets_only_has_zero_gradient(op_type: str) -> None:
    """Every target ignored: the mean is 0 / 0 (nan), but the gradient is 0, as in torch."""
    node = helper.make_node(op_type, ["x", "t"], ["loss"], ignore_index=1)
    model = make_model({"x": (DOUBLE, [2, 3]), "t": (onnx.TensorProto.INT64, [2])}, [node], {"loss": (DOUBLE, [])})
    builder = GraphBuilder(model)
    grads = build_gradients(builder, "loss", ["x"])
    builder.set_outputs(["loss", grads["x"]])
    x = np.random.default_rng(0).normal(size=(2, 3))
    loss, dx = run_model(builder.finalize(), {"x": x, "t": np.array([1, 1])})
    assert np.isnan(loss)
    np.testing.assert_array_equal(dx, np.zeros((2, 3)))
    _, dx = run_model(builder.finalize(), {"x": x, "t": np.array([1, 2])})
    assert np.all(np.isfinite(dx)) and np.any(dx[1] != 0) and not np.any(dx[0])


# ------------------------------------------------------------------------------ MaxPool


def _max_pool_model(opset: int, **attrs: object) -> onnx.ModelProto:
    node = helper.make_node("MaxPool", ["x"], ["y"], name="pool", **attrs)  # type: ignore[arg-type]
    return make_model(
        {"x": (DOUBLE, [2, 3, 6, 6]), "c": (DOUBLE, ["n", 3, "h", "w"])},
        _projected([node], "y"),
        {"loss": (DOUBLE, [])},
        opset=opset,
    )


@pytest.mark.parametrize("opset", [13, 17])
def test_max_pool_reuses_the_forward_indices(opset: int) -> None:
    """Overlapping 3x3 windows: the gradient scatters into the argmax the forward pass found.

    Opset 17 adds with ScatterElements(reduction="add"); opset 13 has no reduction and scatters
    the 9 classes of disjoint windows one by one.
    """
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    builder = GraphBuilder(_max_pool_model(opset, **attrs))
    grads = build_gradients(builder, "loss", ["x"])
    (pool,) = _nodes_of(builder.model, "MaxPool")
    assert len(pool.output) == 2 and pool.output[1]
    scatters = _nodes_of(builder.model, "ScatterElements")
    assert len(scatters) == (9 if opset == 13 else 1)
    builder.set_outputs([grads["x"]])
    rng = np.random.default_rng(opset)
    x, c = rng.normal(size=(2, 3, 6, 6)), rng.normal(size=(2, 3, 6, 6))
    (dx,) = run_model(builder.finalize(), {"x": x, "c": c})
    padded = np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)], constant_values=-np.inf)
    expected = np.zeros((2, 3, 8, 8))
    for n, ch, i, j in np.ndindex(2, 3, 6, 6):
        window = padded[n, ch, i : i + 3, j : j + 3]
        a, b = np.unravel_index(np.argmax(window), (3, 3))
        expected[n, ch, i + a, j + b] += c[n, ch, i, j]
    np.testing.assert_allclose(dx, expected[:, :, 1:-1, 1:-1], rtol=1e-14)


# --------------------------------------------------------- forms the spec table cannot run


def _gradients(model: onnx.ModelProto, wrt: list[str], feeds: dict[str, np.ndarray], check: bool = True):
    builder = GraphBuilder(model)
    grads = build_gradients(builder, "loss", wrt)
    builder.set_outputs(["y", *grads.values()])
    if check:
        return run_model(builder.finalize(), feeds)
    final = onnx.ModelProto()
    final.CopyFrom(builder.model)
    versions.stamp_ir_version(final)
    return run_model(final, feeds)


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs", "pads"),
    [
        ([1, 2, 3, 3], [2, 3, 3, 3], {"strides": [2, 2], "output_shape": [6, 7]}, [1, 0, 0, 0]),
        ([2, 4, 3], [4, 1, 2], {"strides": [3], "group": 2, "output_shape": [7]}, [1, 0]),
        ([1, 2, 4], [2, 2, 3], {"strides": [2], "dilations": [2], "output_shape": [9]}, [1, 1]),
    ],
)
def test_conv_transpose_with_output_shape(
    x_shape: list[int], w_shape: list[int], attrs: dict[str, object], pads: list[int]
) -> None:
    """output_shape (pads derived from it: the odd one at the beginning) equals explicit pads.

    Not in the spec table: for some output_shape values onnx infers an output of the wrong rank.
    """
    rng = np.random.default_rng(0)
    x, w = rng.normal(size=x_shape).astype(np.float32), rng.normal(size=w_shape).astype(np.float32)
    results = []
    explicit = {k: v for k, v in attrs.items() if k != "output_shape"} | {"pads": pads}
    for node_attrs in (attrs, explicit):
        node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], **node_attrs)
        model = make_model(
            {"x": (FLOAT, x_shape), "w": (FLOAT, w_shape), "c": (FLOAT, None)},
            _projected([node], "y"),
            {"loss": (FLOAT, [])},
        )
        y_shape = run_model(make_model({"x": (FLOAT, x_shape), "w": (FLOAT, w_shape)}, [node]), {"x": x, "w": w})[0]
        c = np.random.default_rng(1).normal(size=y_shape.shape).astype(np.float32)
        results.append(_gradients(model, ["x", "w"], {"x": x, "w": w, "c": c}))
    for ours, theirs in zip(*results, strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_group_normalization_opset18_scales_per_group() -> None:
    """Opset 18 (deprecated: the onnx checker refuses it): one scale per group equals opset 21
    with that scale repeated over the group's channels; scale gradients sum over the group."""
    rng = np.random.default_rng(0)
    x, c = rng.normal(size=(2, 6, 4)), rng.normal(size=(2, 6, 4))
    scale, bias = rng.normal(size=3), rng.normal(size=3)
    results = []
    for opset, s, b in ((18, scale, bias), (21, np.repeat(scale, 2), np.repeat(bias, 2))):
        node = helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=3, epsilon=1e-3)
        model = make_model(
            {"x": (FLOAT, [2, 6, 4]), "c": (FLOAT, [2, 6, 4])},
            _projected([node], "y"),
            {"loss": (FLOAT, [])},
            initializers=[_init("scale", s, np.float32), _init("bias", b, np.float32)],
            opset=opset,
        )
        model.graph.value_info.append(helper.make_tensor_value_info("y", FLOAT, [2, 6, 4]))
        feeds = {"x": x.astype(np.float32), "c": c.astype(np.float32)}
        results.append(_gradients(model, ["x", "scale", "bias"], feeds, check=opset >= 21))
    (y18, dx18, ds18, db18), (y21, dx21, ds21, db21) = results
    np.testing.assert_allclose(y18, y21, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dx18, dx21, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ds18, ds21.reshape(3, 2).sum(axis=1), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(db18, db21.reshape(3, 2).sum(axis=1), rtol=1e-4, atol=1e-5)


# ------------------------------------------------- sampling and attention against torch


def _grid_sample_gradients(x: np.ndarray, grid: np.ndarray, c: np.ndarray, **attrs: object) -> list[np.ndarray]:
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], **attrs)
    model = make_model(
        {"x": (DOUBLE, list(x.shape)), "grid": (DOUBLE, list(grid.shape)), "c": (DOUBLE, list(c.shape))},
        _projected([node], "y"),
        {"loss": (DOUBLE, [])},
        opset=20,
    )
    return _gradients(model, ["x", "grid"], {"x": x, "grid": grid, "c": c})


@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize(
    ("spatial", "mode"),
    [((4, 5), "linear"), ((4, 5), "nearest"), ((4, 5), "cubic"), ((3, 4, 2), "linear"), ((3, 4, 2), "nearest")],
)
def test_grid_sample_gradients_match_torch(spatial: tuple[int, ...], mode: str, align: int, padding: str) -> None:
    """dx and dgrid of GridSample as torch.nn.functional.grid_sample's, 4-D and 5-D, in float64.

    Also for reflection padding, whose forward pass onnxruntime computes in float32 (the spec
    table checks it in float32 only): the gradient graph itself is all float64. Cubic: 4-D only,
    as in torch and onnxruntime.
    """
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(len(spatial) * 100 + align * 10 + len(padding))
    n = len(spatial)
    x = rng.normal(size=(2, 3, *spatial))
    grid = rng.uniform(-1.6, 1.6, size=(2, *[3] * n, n))
    for k in range(n):  # pixel coordinates away from the kinks, at multiples of 0.5
        size = spatial[n - 1 - k]
        c = (grid[..., k] + 1) / 2 * (size - 1) if align else ((grid[..., k] + 1) * size - 1) / 2
        c = np.floor(2 * c) / 2 + 0.1 + 0.3 * rng.random(c.shape)
        grid[..., k] = 2 * c / (size - 1) - 1 if align else (2 * c + 1) / size - 1
    y_shape = (2, 3, *[3] * n)
    proj = rng.normal(size=y_shape)
    y, dx, dgrid = _grid_sample_gradients(x, grid, proj, mode=mode, padding_mode=padding, align_corners=align)
    tx, tgrid = torch.tensor(x, requires_grad=True), torch.tensor(grid, requires_grad=True)
    torch_mode = {"linear": "bilinear", "nearest": "nearest", "cubic": "bicubic"}[mode]
    expected = torch.nn.functional.grid_sample(tx, tgrid, torch_mode, padding, align_corners=bool(align))
    (expected * torch.tensor(proj)).sum().backward()
    np.testing.assert_allclose(y, expected.detach().numpy(), rtol=1e-5, atol=1e-6)  # reflection: float32 in ORT
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dgrid, tgrid.grad.numpy(), rtol=1e-10, atol=1e-12)


def _attention_gradients(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, c: np.ndarray, **attrs: object
) -> list[np.ndarray]:
    inputs = {"q": q, "k": k, "v": v} | ({"mask": mask} if mask is not None else {})
    types = {name: (BOOL if a.dtype == np.bool_ else DOUBLE, list(a.shape)) for name, a in inputs.items()}
    node = helper.make_node("Attention", list(inputs), ["y"], **attrs)
    model = make_model(
        {**types, "c": (DOUBLE, list(c.shape))}, _projected([node], "y"), {"loss": (DOUBLE, [])}, opset=23
    )
    wrt = ["q", "k", "v"] + (["mask"] if mask is not None and mask.dtype != np.bool_ else [])
    return _gradients(model, wrt, {**inputs, "c": c})


def _attention_model(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, **attrs: object
) -> onnx.ModelProto:
    """Attention alone, on inputs of these shapes and types (no loss, no gradient)."""
    inputs = {"q": q, "k": k, "v": v} | ({"mask": mask} if mask is not None else {})
    types = {name: (BOOL if a.dtype == np.bool_ else DOUBLE, list(a.shape)) for name, a in inputs.items()}
    return make_model(types, [helper.make_node("Attention", list(inputs), ["y"], **attrs)], ["y"], opset=23)


def _skip_if_onnxruntime_alone_differs(
    y: np.ndarray, expected: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, **attrs
) -> None:
    """Skip when onnxruntime's Attention output ``y`` differs from torch's while onnx.reference agrees with
    torch: the operator's kernel in the installed release is wrong (onnxruntime 1.23), not its gradient."""
    inputs = {"q": q, "k": k, "v": v} | ({"mask": mask} if mask is not None else {})
    (reference,) = ReferenceEvaluator(_attention_model(q, k, v, mask, **attrs)).run(None, inputs)
    if np.allclose(reference, expected, rtol=1e-6, atol=1e-9):
        pytest.skip(
            f"onnxruntime {ort.__version__} computes Attention itself otherwise than torch and onnx.reference here "
            f"(largest difference {np.max(np.abs(y - expected)):.3g})"
        )


@pytest.mark.parametrize("mask_kind", [None, "bool", "float"])
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_attention_gradients_match_torch(mask_kind: str | None, causal: int, kv_heads: int) -> None:
    """dQ, dK, dV (and d mask for a float mask) of Attention as torch's scaled_dot_product_attention
    (GQA via enable_gqa), cross attention with Sq < Sk, in float64."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(kv_heads * 10 + causal)
    batch, heads, sq, sk, depth = 2, 4, 3, 5, 4
    q = rng.normal(size=(batch, heads, sq, depth))
    k, v = rng.normal(size=(batch, kv_heads, sk, depth)), rng.normal(size=(batch, kv_heads, sk, 3))
    mask = None
    if mask_kind == "bool":
        mask = rng.random((batch, 1, sq, sk)) < 0.7
        mask[..., 0] = True  # every query keeps a key (torch gives NaN rows otherwise)
    elif mask_kind == "float":
        mask = rng.normal(size=(sq, sk))
    proj = rng.normal(size=(batch, heads, sq, 3))
    try:
        y, *grads = _attention_gradients(q, k, v, mask, proj, is_causal=causal, scale=0.25)
    except ort_errors.NotImplemented as error:  # onnxruntime 1.31: no double kernel for a float mask with is_causal
        pytest.skip(f"the installed onnxruntime has no kernel for this Attention: {error}")
    except ort_errors.Fail:  # onnxruntime 1.23 cannot load Attention itself with a double float mask
        skip_unless_onnxruntime_loads(_attention_model(q, k, v, mask, is_causal=causal, scale=0.25), "this Attention")
        raise
    tensors = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    leaf_mask = None if mask is None else torch.tensor(mask, requires_grad=mask_kind == "float")
    t_mask = leaf_mask
    if causal:  # torch does not take both: add the causal mask (top-left aligned, as onnx without a cache)
        allowed = torch.ones(sq, sk, dtype=torch.bool).tril()
        if t_mask is None:
            t_mask = allowed
        elif mask_kind == "float":
            t_mask = t_mask.masked_fill(~allowed, float("-inf"))
        else:
            t_mask = t_mask & allowed
    expected = torch.nn.functional.scaled_dot_product_attention(
        *tensors, attn_mask=t_mask, scale=0.25, enable_gqa=kv_heads != heads
    )
    (expected * torch.tensor(proj)).sum().backward()
    if not np.allclose(y, expected.detach().numpy(), rtol=1e-6, atol=1e-9):
        _skip_if_onnxruntime_alone_differs(y, expected.detach().numpy(), q, k, v, mask, is_causal=causal, scale=0.25)
    np.testing.assert_allclose(y, expected.detach().numpy(), rtol=1e-6, atol=1e-9)  # onnxruntime's, near float32
    for ours, theirs in zip(grads, [*tensors, *([leaf_mask] if mask_kind == "float" else [])], strict=True):
        np.testing.assert_allclose(ours, theirs.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_attention_debug_output_has_no_gradient() -> None:
    """A loss through qk_matmul_output (output 3) is refused with a ValueError naming it."""
    node = helper.make_node("Attention", ["q", "k", "v"], ["y", "", "", "qk"])
    model = make_model(
        {"q": (DOUBLE, [1, 1, 2, 2]), "k": (DOUBLE, [1, 1, 2, 2]), "v": (DOUBLE, [1, 1, 2, 2]), "c": (DOUBLE, None)},
        _projected([node], "qk"),
        {"loss": (DOUBLE, [])},
        opset=23,
    )
    with pytest.raises(ValueError, match="qk_matmul_output"):
        build_gradients(GraphBuilder(model), "loss", ["q"])


# ------------------------------------------------------------------ Conv's weight gradient, unfolded or not


def _conv_weight_grad(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict[str, object]
) -> tuple[np.ndarray, np.ndarray, onnx.ModelProto]:
    """``d sum(Conv(x, w) * c) / d w`` from onnxruntime, the same by NumPy (the Conv's windows summed
    directly), and the gradient model."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=x_shape).astype(np.float32)
    w = rng.normal(size=w_shape).astype(np.float32)
    conv = [helper.make_node("Conv", ["x", "w"], ["y"], **attrs)]
    probe = make_model({"x": (FLOAT, list(x_shape))}, conv, {"y": (FLOAT, None)}, [numpy_helper.from_array(w, "w")])
    (y,) = run_model(probe, {"x": x})
    c = rng.normal(size=y.shape).astype(np.float32)
    model = make_model(
        {"x": (FLOAT, list(x_shape)), "c": (FLOAT, list(y.shape))},
        _projected([helper.make_node("Conv", ["x", "w"], ["y"], **attrs)], "y"),
        {"loss": (FLOAT, [])},
        initializers=[numpy_helper.from_array(w, "w")],
    )
    builder = GraphBuilder(model)
    grads = build_gradients(builder, "loss", ["w"])
    builder.set_outputs(["loss", grads["w"]])
    built = builder.finalize()
    _, got = run_model(built, {"x": x, "c": c})
    # NumPy: dw[m, ch, *k] = sum over n and output positions o of c[n, m, o] * x_padded[n, ch, o * s + k * d]
    n = len(x_shape) - 2
    strides, dilations = attrs.get("strides", [1] * n), attrs.get("dilations", [1] * n)
    pads = attrs.get("pads", [0] * 2 * n)
    padded = np.pad(x.astype(np.float64), [(0, 0), (0, 0), *zip(pads[:n], pads[n:], strict=True)])
    want = np.zeros(w_shape)
    for k in np.ndindex(*w_shape[2:]):
        window = tuple(
            slice(k[i] * dilations[i], k[i] * dilations[i] + (y.shape[2 + i] - 1) * strides[i] + 1, strides[i])
            for i in range(n)
        )
        taps = padded[(slice(None), slice(None), *window)]  # [N, C, *O]
        flat_c, flat_taps = c.reshape(*c.shape[:2], -1).astype(np.float64), taps.reshape(*taps.shape[:2], -1)
        want[(slice(None), slice(None), *k)] = np.einsum("nml,ncl->mc", flat_c, flat_taps)
    return got, want, built


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs", "product"),
    [
        ((2, 3, 7, 6), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}, "MatMul"),  # 42 positions >= 2 x 4 outputs
        ((2, 3, 5, 4), (16, 3, 3, 3), {"pads": [1, 1, 1, 1]}, "Gemm"),  # 20 positions < 2 x 16 outputs
        ((2, 3, 9, 8), (5, 3, 3, 2), {"strides": [2, 1], "dilations": [1, 2], "pads": [1, 0, 2, 1]}, "MatMul"),
        ((2, 3, 9, 8), (20, 3, 3, 2), {"strides": [2, 1], "dilations": [1, 2], "pads": [1, 0, 2, 1]}, "Gemm"),
        ((3, 4, 11), (2, 4, 3), {"strides": [2], "pads": [1, 1]}, "MatMul"),  # 1-D
        ((2, 6, 5, 5), (3, 6, 1, 1), {}, "MatMul"),  # 1x1, stride 1: the input is its own unfolding
        ((2, 6, 5, 5), (13, 6, 1, 1), {}, "Gemm"),
        ((2, 6, 5, 5), (5, 6, 1, 1), {"strides": [2, 2]}, "Gemm"),  # 9 positions < 2 x 5
    ],
)
def test_convs_weight_gradient_is_one_product_of_the_unfolded_input_below_the_limit(
    monkeypatch: pytest.MonkeyPatch, x_shape, w_shape, attrs, product
) -> None:
    """Below :data:`UNFOLD_LIMIT` the weight gradient is one product of the unfolded input: per sample and
    summed (``MatMul``, ``ReduceSum``) where the output has at least twice as many positions as channels, else
    one ``Gemm`` of the batch; at a limit of 0 the batch-transposed ``Conv``; all equal NumPy's sum over the
    windows."""
    from onnxtrain.autodiff.rules import convolution

    got, want, built = _conv_weight_grad(x_shape, w_shape, attrs)
    assert [node.op_type for node in built.graph.node if node.op_type in ("Gemm", "MatMul")] == [product]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    monkeypatch.setattr(convolution, "UNFOLD_LIMIT", 0)
    got, want, built = _conv_weight_grad(x_shape, w_shape, attrs)
    assert not _nodes_of(built, "Gemm") and not _nodes_of(built, "MatMul")
    assert len(_nodes_of(built, "Conv")) == 2, "above it: a Conv of the batch"
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_large_input_or_a_large_kernel_keeps_the_convolution_form() -> None:
    """One sample's unfolded input just over :data:`UNFOLD_LIMIT` elements (channels x 9 positions x 24 x 24
    outputs), or a 5x5 kernel (over :data:`UNFOLD_POSITIONS`): the batch-transposed Conv, equal to NumPy's."""
    from onnxtrain.autodiff.rules import convolution

    channels = convolution.UNFOLD_LIMIT // (9 * 24 * 24) + 1  # one sample's unfolding just over the limit
    got, want, built = _conv_weight_grad((1, channels, 24, 24), (2, channels, 3, 3), {"pads": [1, 1, 1, 1]})
    assert not _nodes_of(built, "Gemm") and not _nodes_of(built, "MatMul")
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
    got, want, built = _conv_weight_grad((2, 3, 9, 9), (2, 3, 5, 5), {"pads": [2, 2, 2, 2]})
    assert not _nodes_of(built, "Gemm") and not _nodes_of(built, "MatMul")
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ Conv's input gradient, mirrored or transposed


def _conv_input_grad(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict[str, object], declared: list[object] | None = None
) -> tuple[np.ndarray, onnx.ModelProto]:
    """``d sum(Conv(x, w) * c) / d x`` from onnxruntime and the gradient model; ``declared``: ``x``'s declared
    shape (default: its shape)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=x_shape).astype(np.float32)
    w = rng.normal(size=w_shape).astype(np.float32)
    conv = helper.make_node("Conv", ["x", "w"], ["y"], **attrs)
    probe = make_model({"x": (FLOAT, list(x_shape))}, [conv], {"y": (FLOAT, None)}, [numpy_helper.from_array(w, "w")])
    (y,) = run_model(probe, {"x": x})
    c = rng.normal(size=y.shape).astype(np.float32)
    model = make_model(
        {
            "x": (FLOAT, declared or list(x_shape)),
            "c": (FLOAT, ["n", y.shape[1], *[f"o{i}" for i in range(len(x_shape) - 2)]]),
        },
        _projected([conv], "y"),
        {"loss": (FLOAT, [])},
        initializers=[numpy_helper.from_array(w, "w")],
    )
    builder = GraphBuilder(model)
    grads = build_gradients(builder, "loss", ["x"])
    builder.set_outputs([grads["x"]])
    built = builder.finalize()
    (got,) = run_model(built, {"x": x, "c": c})
    return got, built


@pytest.mark.parametrize(
    ("form", "x_shape", "w_shape", "attrs", "declared"),
    [
        # depthwise: stride 1, one input channel per group, pads that keep the size; the kernel mirrored
        ("_mirrored_input_grad", (2, 4, 6, 5), (4, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}, None),
        ("_mirrored_input_grad", (2, 3, 9), (3, 1, 4), {"group": 3, "pads": [3, 0]}, None),  # causal (Mamba)
        ("_mirrored_input_grad", (1, 3, 7, 8), (6, 1, 3, 2), {"group": 3, "dilations": [2, 1], "pads": [4, 0, 0, 1]},
         None),  # 2 per channel
        ("_mirrored_input_grad", (2, 4, 6, 5), (4, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}, ["n", 4, "h", "w"]),
        # pointwise: a 1x1 kernel of stride 1, no pads, one group; the kernel's channel axes swapped
        ("_pointwise_input_grad", (2, 6, 5, 4), (3, 6, 1, 1), {}, None),
        ("_pointwise_input_grad", (2, 3, 7), (8, 3, 1), {}, None),  # 1-D, widening
        ("_pointwise_input_grad", (1, 2, 3, 4, 2), (5, 2, 1, 1, 1), {"dilations": [2, 1, 3]}, None),  # 3-D
        ("_pointwise_input_grad", (2, 6, 5, 4), (3, 6, 1, 1), {}, ["n", 6, "h", "w"]),  # sizes at run time
    ],
)  # fmt: skip
def test_depthwise_and_pointwise_input_gradients_are_convs(
    monkeypatch: pytest.MonkeyPatch, form, x_shape, w_shape, attrs, declared
) -> None:
    """A depthwise Conv of stride 1 that keeps its size, and a 1x1 Conv of stride 1: ``dx`` is a ``Conv`` (no
    ``ConvTranspose``), equal to the ``ConvTranspose`` the rule builds otherwise (checked against finite
    differences in the spec table)."""
    from onnxtrain.autodiff.rules import convolution

    got, built = _conv_input_grad(x_shape, w_shape, attrs, declared)
    assert not _nodes_of(built, "ConvTranspose") and len(_nodes_of(built, "Conv")) == 2
    monkeypatch.setattr(convolution, form, lambda *args: None)
    want, built = _conv_input_grad(x_shape, w_shape, attrs, declared)
    assert _nodes_of(built, "ConvTranspose")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs"),
    [
        ((2, 4, 6, 5), (4, 1, 3, 3), {"group": 4, "strides": [2, 1], "pads": [1, 1, 1, 1]}),  # a stride of 2
        ((2, 4, 6, 5), (4, 1, 1, 1), {"group": 4, "pads": [1, 0, 0, 1]}),  # pads beyond the 1x1 kernel's reach
        ((2, 4, 8, 5), (4, 1, 3, 3), {"group": 4}),  # no pads: the output smaller than the input
        ((2, 4, 6, 5), (4, 2, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),  # two input channels per group
        ((2, 4, 6, 5), (3, 4, 3, 3), {"pads": [1, 1, 1, 1]}),  # one group: the ConvTranspose is as fast or faster
        ((2, 4, 6, 5), (3, 4, 1, 1), {"strides": [2, 2]}),  # a 1x1 kernel of stride 2
        ((2, 4, 6, 5), (3, 4, 1, 1), {"pads": [0, 1, 0, 1]}),  # a 1x1 kernel with pads
        ((2, 4, 6, 5), (6, 2, 1, 1), {"group": 2}),  # a 1x1 kernel in two groups
    ],
)
def test_other_convs_keep_the_transposed_input_gradient(x_shape, w_shape, attrs) -> None:
    got, built = _conv_input_grad(x_shape, w_shape, attrs)
    assert len(_nodes_of(built, "ConvTranspose")) == 1
    assert np.all(np.isfinite(got)) and got.shape == x_shape


# ------------------------------------------------------------------ pools with a kernel past the input


@pytest.mark.parametrize("op_type", ["AveragePool", "LpPool"])
def test_a_kernel_past_the_padded_input_is_spread_back_cut_to_it(op_type: str) -> None:
    """transformers' EfficientNet pools its last 3 x 3 map with a 640 x 640 kernel (``ceil_mode``, strides of
    the kernel): the gradient spreads each window's value with a kernel cut to the input, not over 640 x 640
    positions (2.3 s of a step on 2 cores); the whole-input pool's gradient ``g / 9`` (``g x / y`` for LpPool)."""
    attrs = {"kernel_shape": [640, 640], "strides": [640, 640]} | ({"ceil_mode": 1} if op_type == "AveragePool" else {})
    node = helper.make_node(op_type, ["x"], ["y"], **attrs)  # type: ignore[arg-type]
    opset = 17 if op_type == "AveragePool" else 22
    if op_type == "LpPool":
        node.attribute.extend([helper.make_attribute("ceil_mode", 1)])
    model = make_model(
        {"x": (FLOAT, [2, 5, 3, 3]), "c": (FLOAT, [2, 5, 1, 1])}, _projected([node], "y"), {"loss": (FLOAT, [])},
        opset=opset,
    )  # fmt: skip
    builder = GraphBuilder(model)
    grads = build_gradients(builder, "loss", ["x"])
    builder.set_outputs(["y", grads["x"]])
    built = builder.finalize()
    (spread,) = _nodes_of(built, "ConvTranspose")
    inferred = onnx.shape_inference.infer_shapes(built, data_prop=True).graph
    kernels = [list(t.dims) for t in inferred.initializer if t.name == spread.input[1]]
    kernels += [
        [d.dim_value for d in v.type.tensor_type.shape.dim] for v in inferred.value_info if v.name == spread.input[1]
    ]
    assert kernels == [[1, 1, 3, 3]]
    rng = np.random.default_rng(0)
    x, c = rng.normal(size=(2, 5, 3, 3)).astype(np.float32), rng.normal(size=(2, 5, 1, 1)).astype(np.float32)
    y, dx = run_model(built, {"x": x, "c": c})
    want = np.broadcast_to(c / 9, x.shape) if op_type == "AveragePool" else c * x / y
    np.testing.assert_allclose(dx, want, rtol=1e-5, atol=1e-6)


def test_a_pad_of_zeros_passes_the_gradient_through() -> None:
    """transformers' MobileNetV2 pads every convolution's input as TensorFlow does, by amounts computed from
    the sizes: 0 before each 1x1 convolution. Once folded to constants, a ``Pad`` of zeros gets ``dx = g``, not a
    ``Pad`` that copies ``g``."""
    pads = numpy_helper.from_array(np.zeros(8, np.int64), "pads")
    node = helper.make_node("Pad", ["x", "pads"], ["y"], mode="constant")
    model = make_model(
        {"x": (FLOAT, [2, 3, 4, 4]), "c": (FLOAT, [2, 3, 4, 4])}, _projected([node], "y"), {"loss": (FLOAT, [])},
        initializers=[pads],
    )  # fmt: skip
    builder = GraphBuilder(model)
    grads = build_gradients(builder, "loss", ["x"])
    builder.set_outputs([grads["x"]])
    built = builder.finalize()
    assert len(_nodes_of(built, "Pad")) == 1  # the forward's own
    c = np.random.default_rng(0).normal(size=(2, 3, 4, 4)).astype(np.float32)
    (dx,) = run_model(built, {"x": np.zeros_like(c), "c": c})
    np.testing.assert_array_equal(dx, c)


def test_group_normalization_opset18_generates_artifacts(tmp_path) -> None:
    """The artifacts of an opset-18 GroupNormalization (which onnx's checker refuses as deprecated and onnxruntime
    runs) are written, and train: the scale's and bias's gradients those of the loss, by central differences."""
    from onnxtrain.artifacts import LossType, generate_artifacts
    from tests.helpers import session

    rng = np.random.default_rng(1)
    node = helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=2, epsilon=1e-3)
    scale, bias = rng.normal(size=2).astype(np.float32), rng.normal(size=2).astype(np.float32)
    model = make_model(
        {"x": (FLOAT, ["n", 4, 3])},
        [node],
        {"y": (FLOAT, ["n", 4, 3])},
        initializers=[_init("scale", scale, np.float32), _init("bias", bias, np.float32)],
        opset=18,
    )
    paths = generate_artifacts(
        model, requires_grad=["scale", "bias"], loss=LossType.MSELoss, artifact_directory=tmp_path
    )
    train, evaluate = session(str(paths["training_model"])), session(str(paths["eval_model"]))
    x, target = rng.normal(size=(5, 4, 3)).astype(np.float32), rng.normal(size=(5, 4, 3)).astype(np.float32)
    feeds = {"x": x, "target": target, "scale": scale, "bias": bias, "lazy_reset_grad": np.array([True])}
    feeds |= {f"{p}_grad.accumulation.buffer": np.zeros(2, np.float32) for p in ("scale", "bias")}
    outputs = dict(zip([o.name for o in train.get_outputs()], train.run(None, feeds), strict=True))
    for name, value in (("scale", scale), ("bias", bias)):
        numeric = []
        for k in range(2):
            step = np.zeros(2, np.float32)
            step[k] = 1e-2
            losses = [
                evaluate.run(None, {"x": x, "target": target, "scale": scale, "bias": bias, name: value + sign * step})[
                    0
                ]
                for sign in (1, -1)
            ]
            numeric.append((float(losses[0]) - float(losses[1])) / 2e-2)
        np.testing.assert_allclose(outputs[f"{name}_grad.accumulation.out"], numeric, rtol=2e-3, atol=1e-4)
