"""Shape and data-movement rules beyond the spec table: constants in a graph, the forms emitted, refusals."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnxtrain.autodiff import build_gradients
from onnxtrain.graph import GraphBuilder
from tests.helpers import DOUBLE, make_model, run_model, skip_unless_onnxruntime_loads


def _train(model: onnx.ModelProto, loss: str, wrt: list[str]) -> tuple[onnx.ModelProto, list[str]]:
    """The model with ``d loss / d wrt`` as outputs, and the op types of the gradient nodes."""
    builder = GraphBuilder(model)
    before = len(builder.model.graph.node)
    grads = build_gradients(builder, loss, wrt)
    builder.set_outputs([loss, *(grads[name] for name in wrt)])
    new = [node.op_type for node in builder.model.graph.node[before:]]
    return builder.finalize(), new


def test_constants_in_a_graph_differentiate() -> None:
    """loss = sum(x * c + ConstantOfShape(shape(x), 2) * x): dx = c + 2, dc = sum of x over rows."""
    c = np.array([0.5, -1.0, 3.0])
    nodes = [
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(c)),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("ConstantOfShape", ["s"], ["two"], value=numpy_helper.from_array(np.array([2.0]))),
        helper.make_node("Mul", ["x", "c"], ["xc"]),
        helper.make_node("Mul", ["two", "x"], ["x2"]),
        helper.make_node("Add", ["xc", "x2"], ["t"]),
        helper.make_node("ReduceSum", ["t"], ["loss"], keepdims=0),
    ]
    model = make_model({"x": (DOUBLE, ["batch", 3])}, nodes, {"loss": (DOUBLE, [])})
    trained, _ = _train(model, "loss", ["x", "c", "two"])
    x = np.random.default_rng(0).normal(size=(4, 3))
    _, dx, dc, dtwo = run_model(trained, {"x": x})
    np.testing.assert_allclose(dx, np.broadcast_to(c + 2.0, x.shape))
    np.testing.assert_allclose(dc, x.sum(axis=0))
    np.testing.assert_allclose(dtwo, x)


def test_unit_step_slice_with_known_bounds_is_a_pad() -> None:
    """x[:, 1:3] with constant bounds: the gradient is one Pad of g, no scatter."""
    inits = [numpy_helper.from_array(np.array(v, dtype=np.int64), n) for n, v in (("s", [1]), ("e", [3]), ("a", [1]))]
    nodes = [
        helper.make_node("Slice", ["x", "s", "e", "a"], ["y"]),
        helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
    ]
    model = make_model({"x": (DOUBLE, ["batch", 5])}, nodes, {"loss": (DOUBLE, [])}, initializers=inits)
    trained, ops = _train(model, "loss", ["x"])
    assert "Pad" in ops and "ScatterElements" not in ops, ops
    (_, dx) = run_model(trained, {"x": np.zeros((2, 5))})
    np.testing.assert_array_equal(dx, [[0, 1, 1, 0, 0]] * 2)


@pytest.mark.parametrize(("opset", "form"), [(13, "CumSum"), (18, "ScatterElements")])
def test_embedding_gradient_adds_repeated_rows(opset: int, form: str) -> None:
    """Gather(table, ids) with repeated ids: rows add up (ScatterElements add from opset 16; before, the rows
    sorted by id and summed per id with a running CumSum, in memory linear in the ids, then scattered)."""
    table = np.arange(12.0).reshape(4, 3)
    ids = np.array([[1, 3, 1], [-3, 0, 0]])  # -3 is row 1
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"]), helper.make_node("ReduceSum", ["e"], ["loss"])]
    model = make_model(
        {"ids": (onnx.TensorProto.INT64, ["batch", 3])},
        nodes,
        {"loss": (DOUBLE, [1, 1, 1])},
        initializers=[("table", table)],
        opset=opset,
    )
    trained, ops = _train(model, "loss", ["table"])
    assert form in ops and "Einsum" not in ops, ops
    (_, dtable) = run_model(trained, {"ids": ids})
    np.testing.assert_array_equal(dtable, np.array([2, 3, 0, 1])[:, None] * np.ones((1, 3)))


@pytest.mark.parametrize(("op", "depth"), [("Gather", None), ("GatherND", 1), ("GatherND", "depth")])
def test_repeated_rows_add_up_on_onnxruntimes_threads(op: str, depth: int | str | None) -> None:
    """2,048 ids over 1,000 rows of 256, each row read about twice, in a session of 2 and 4 threads, 5 runs
    each: the gradient is NumPy's sum of the rows. onnxruntime's CPU ``ScatterND(reduction="add")`` splits the
    updates between its threads and lost additions into a shared row (errors of 2.4-3.7 in most runs on 2
    threads, onnxruntime 1.23 and 1.32); the rules scatter with ``ScatterElements``, which adds them all.
    GatherND's index depth declared (1) or not (``"depth"``: the rule cannot flatten by rows, and scatters each
    element at its flat position)."""
    import onnxruntime as ort

    rows, width, count = 1000, 256, 2048
    rng = np.random.default_rng(0)
    ids = rng.integers(0, rows, size=(count,))
    indices = ids if op == "Gather" else ids[:, None]
    weights = rng.normal(size=(count, width)).astype(np.float32)
    nodes = [
        helper.make_node(op, ["table", "ids"], ["e"]),
        helper.make_node("Mul", ["e", "w"], ["ew"]),
        helper.make_node("ReduceSum", ["ew"], ["loss"], keepdims=0),
    ]
    model = make_model(
        {"table": (onnx.TensorProto.FLOAT, [rows, width]),
         "ids": (onnx.TensorProto.INT64, [count] if depth is None else [count, depth]),
         "w": (onnx.TensorProto.FLOAT, [count, width])},
        nodes, {"loss": (onnx.TensorProto.FLOAT, [])}, opset=18,
    )  # fmt: skip
    trained, ops = _train(model, "loss", ["table"])
    assert "ScatterND" not in ops, ops
    want = np.zeros((rows, width))
    np.add.at(want, ids, weights.astype(np.float64))
    feeds = {"table": np.zeros((rows, width), np.float32), "ids": indices, "w": weights}
    for threads in (2, 4):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(trained.SerializeToString(), options, providers=["CPUExecutionProvider"])
        for _ in range(5):
            np.testing.assert_allclose(session.run(None, feeds)[1], want, atol=1e-5)


@pytest.mark.parametrize("depth", [1, "depth"], ids=["depth declared", "depth unknown"])
def test_scatter_nd_products_on_onnxruntimes_threads(depth: int | str) -> None:
    """ScatterND(x, ids, u, reduction="mul") over 2,048 slices into 1,000 rows of 256 (each row written about
    twice, a tenth of the updates exactly 0), sessions of 1, 2 and 4 threads, 3 runs each: dx = w P and
    du = w x (the product of the row's other updates), as NumPy computes them. onnxruntime's CPU ``ScatterND``
    splits the updates between threads and loses products and sums into a shared slice (with it, the rule's
    products and counts of zeros were off by up to 1.6 in 88 elements on 2 threads, onnxruntime 1.32); the
    rule scatters with ``ScatterElements``, by rows where the index depth is declared, else element by
    element."""
    import onnxruntime as ort

    rows, width, count = 1000, 256, 2048
    rng = np.random.default_rng(1)
    ids = rng.integers(0, rows, size=(count,))
    x = rng.normal(size=(rows, width))
    u = rng.uniform(0.5, 1.5, size=(count, width)) * (rng.random((count, width)) > 0.1)
    w = rng.normal(size=(rows, width))
    nodes = [
        helper.make_node("ScatterND", ["x", "ids", "u"], ["y"], reduction="mul"),
        helper.make_node("Mul", ["y", "w"], ["yw"]),
        helper.make_node("ReduceSum", ["yw"], ["loss"], keepdims=0),
    ]
    model = make_model(
        {"x": (DOUBLE, [rows, width]), "ids": (onnx.TensorProto.INT64, [count, depth]), "u": (DOUBLE, [count, width]),
         "w": (DOUBLE, [rows, width])},
        nodes, {"loss": (DOUBLE, [])}, opset=18,
    )  # fmt: skip
    trained, ops = _train(model, "loss", ["x", "u"])
    assert "ScatterND" not in ops, ops
    products = np.ones((rows, width))
    others = np.empty_like(u)
    for row in np.unique(ids):
        slices = np.flatnonzero(ids == row)
        products[row] = np.prod(u[slices], axis=0)
        for s in slices:
            others[s] = np.prod(u[slices[slices != s]], axis=0)
    want_dx, want_du = w * products, (w * x)[ids] * others
    feeds = {"x": x, "ids": ids[:, None], "u": u, "w": w}
    for threads in (1, 2, 4):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(trained.SerializeToString(), options, providers=["CPUExecutionProvider"])
        for _ in range(3):
            _, dx, du = session.run(None, feeds)
            np.testing.assert_allclose(dx, want_dx, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(du, want_du, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("reduction", ["max", "min"])
def test_scatter_max_min_ties_share_the_gradient_equally(reduction: str) -> None:
    """Where data and updates tie for a position, the winners share its gradient equally, as torch's
    ``scatter_reduce`` with amax/amin does (finite differences cannot see ties); the losers get none."""
    sign = 1.0 if reduction == "max" else -1.0
    nodes = [
        helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], reduction=reduction),
        helper.make_node("Mul", ["y", "w"], ["yw"]),
        helper.make_node("ReduceSum", ["yw"], ["loss"], keepdims=0),
    ]
    weights = np.array([1.0, 2.0, 3.0, 4.0])
    inits = [("i", np.array([1, 1, 1, 2])), ("w", weights)]
    inputs = {"x": (DOUBLE, [4]), "u": (DOUBLE, [4])}
    model = make_model(inputs, nodes, {"loss": (DOUBLE, [])}, initializers=inits, opset=18)
    trained, _ = _train(model, "loss", ["x", "u"])
    x = sign * np.array([0.0, 5.0, 3.0, 7.0])  # position 1: data ties with updates 0 and 1; 2: data wins
    u = sign * np.array([5.0, 5.0, 3.0, 2.0])
    (_, dx, du) = run_model(trained, {"x": x, "u": u})
    np.testing.assert_allclose(dx, [1.0, 2.0 / 3, 3.0, 4.0])  # unwritten positions pass g through
    np.testing.assert_allclose(du, [2.0 / 3, 2.0 / 3, 0.0, 0.0])
    torch = pytest.importorskip("torch")
    tx, tu = torch.tensor(x, requires_grad=True), torch.tensor(u, requires_grad=True)
    index = torch.tensor([1, 1, 1, 2])
    y = tx.scatter_reduce(0, index, tu, "amax" if reduction == "max" else "amin", include_self=True)
    (y * torch.tensor(weights)).sum().backward()
    np.testing.assert_allclose(dx, tx.grad.numpy())
    np.testing.assert_allclose(du, tu.grad.numpy())


def test_resize_with_antialias_is_refused_naming_the_attribute() -> None:
    nodes = [
        helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear", antialias=1),
        helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
    ]
    scales = ("scales", np.array([1.0, 1.0, 0.5, 0.5], dtype=np.float32))
    model = make_model(
        {"x": (onnx.TensorProto.FLOAT, [1, 1, 4, 4])},
        nodes,
        {"loss": (onnx.TensorProto.FLOAT, [])},
        initializers=[scales],
        opset=18,
    )
    with pytest.raises(ValueError, match=r"antialias"):
        _train(model, "loss", ["x"])


def _cumprod_jacobian(x: np.ndarray, exclusive: int, reverse: int) -> np.ndarray:
    """d y_i / d x_j of a 1-D cumulative product, by brute force."""
    n = len(x)
    jac = np.zeros((n, n))
    for i, j in itertools.product(range(n), repeat=2):
        span = [k for k in range(n) if (k >= i if reverse else k <= i) and (k != i or not exclusive)]
        if j in span:
            jac[i, j] = np.prod([x[k] for k in span if k != j])
    return jac


@pytest.mark.parametrize(("exclusive", "reverse"), [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumprod_gradient_through_zeros(exclusive: int, reverse: int) -> None:
    """Slices with no zero, one zero, two zeros (only the first in scan order gets a gradient) and all zeros."""
    x = np.array([[2.0, -1.5, 3.0, 0.5, 4.0], [2.0, 0.0, 3.0, 0.5, 4.0], [0.0, 1.5, 0.0, 2.0, 3.0], [0.0] * 5])
    g = np.random.default_rng(0).normal(size=x.shape)
    nodes = [
        helper.make_node("CumProd", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse),
        helper.make_node("Mul", ["y", "g"], ["yg"]),
        helper.make_node("ReduceSum", ["yg"], ["loss"], keepdims=0),
    ]
    inits = [("axis", np.array(1)), ("g", g)]
    model = make_model({"x": (DOUBLE, [4, 5])}, nodes, {"loss": (DOUBLE, [])}, initializers=inits, opset=26)
    skip_unless_onnxruntime_loads(model, "CumProd (opset 26)")
    trained, _ = _train(model, "loss", ["x"])
    (_, dx) = run_model(trained, {"x": x})
    expected = np.stack([row_g @ _cumprod_jacobian(row, exclusive, reverse) for row, row_g in zip(x, g, strict=True)])
    np.testing.assert_allclose(dx, expected, atol=1e-12)


def test_compress_with_a_constant_condition_scatters_to_constant_positions() -> None:
    """A constant condition is folded: no NonZero in the gradient."""
    nodes = [
        helper.make_node("Compress", ["x", "c"], ["y"], axis=1),
        helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
    ]
    inits = [("c", np.array([True, False, True]))]
    model = make_model({"x": (DOUBLE, ["batch", 3])}, nodes, {"loss": (DOUBLE, [])}, initializers=inits)
    trained, ops = _train(model, "loss", ["x"])
    assert "NonZero" not in ops, ops
    (_, dx) = run_model(trained, {"x": np.zeros((2, 3))})
    np.testing.assert_array_equal(dx, [[1, 0, 1]] * 2)


def test_inverse_one_sided_dft_with_other_bin_counts_is_refused() -> None:
    """IRFFT of n bins into dft_length L needs n = L // 2 + 1: onnxruntime reads other counts its own way."""
    nodes = [
        helper.make_node("DFT", ["x", "length"], ["y"], inverse=1, onesided=1),
        helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
    ]
    inits = [("length", np.array(12))]
    model = make_model({"x": (DOUBLE, [1, 3, 2])}, nodes, {"loss": (DOUBLE, [])}, initializers=inits, opset=20)
    with pytest.raises(ValueError, match=r"dft_length // 2 \+ 1 input bins, not 3 bins for dft_length 12"):
        _train(model, "loss", ["x"])
