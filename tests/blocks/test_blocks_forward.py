"""Forward values of every elementary block against NumPy (and torch, where installed).

Each block is built as a ForwardBlock on a small base model whose inputs are
the test arrays (some with a symbolic ``batch`` dimension), run in
onnxruntime, and compared with a NumPy oracle on shapes drawn by Hypothesis.
The declared output types are checked against the results too, so wrong type
inference fails here. ``FORWARD_CASES`` maps each block to its test; a
meta-test checks that every block of ``onnxtrain.blocks`` has one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st

import onnxtrain.onnxblock as onnxblock
from onnxtrain import blocks
from onnxtrain.graph import dtypes
from tests.helpers import make_model, run_model, tolerance

FLOATS = [np.float32, np.float64]

#: Block name -> the test that checks its forward value.
FORWARD_CASES: dict[str, Callable[..., Any]] = {}


def covers(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Record that the decorated test checks the forward value of blocks ``names``."""

    def register(test: Callable[..., Any]) -> Callable[..., Any]:
        for name in names:
            FORWARD_CASES[name] = test
        return test

    return register


# --------------------------------------------------------------------- harness


class Fn(onnxblock.ForwardBlock):
    """A ForwardBlock whose build is a given function of the input names."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def build(self, *names: str) -> Any:
        return self.fn(*names)


def _input_dims(arrays: dict[str, np.ndarray], symbolic: bool) -> tuple[dict[str, list[int | str]], int | None]:
    """Static shapes, or with the leading axis named "batch" on the inputs of highest rank that share it."""
    dims = {name: list(array.shape) for name, array in arrays.items()}
    if not symbolic or not arrays:
        return dims, None
    top = max(array.ndim for array in arrays.values())
    if top == 0:
        return dims, None
    batch = max(array.shape[0] for array in arrays.values() if array.ndim == top)
    for name, array in arrays.items():
        if array.ndim == top and array.shape[0] == batch:
            dims[name][0] = "batch"
    return dims, batch


def _check_declared(model: onnx.ModelProto, results: Sequence[Any], batch: int | None) -> None:
    """The output types the builder inferred agree with what onnxruntime returned."""
    for value, result in zip(model.graph.output, results, strict=True):
        type_proto = value.type
        if type_proto.HasField("sequence_type"):
            assert isinstance(result, list)
            type_proto = type_proto.sequence_type.elem_type
            results_to_check = result
        else:
            results_to_check = [result]
        tensor = type_proto.tensor_type
        for array in results_to_check:
            array = np.asarray(array)
            expected = dtypes.to_numpy_dtype(tensor.elem_type)
            assert array.dtype == expected, (value.name, array.dtype, expected)
            if not tensor.HasField("shape") or value.type.HasField("sequence_type"):
                continue
            assert len(tensor.shape.dim) == array.ndim, (value.name, tensor.shape, array.shape)
            for dim, size in zip(tensor.shape.dim, array.shape, strict=True):
                if dim.HasField("dim_value"):
                    assert dim.dim_value == size, (value.name, tensor.shape, array.shape)
                elif dim.dim_param == "batch":
                    assert size == batch, (value.name, tensor.shape, array.shape)


def run_blocks(
    fn: Callable[..., Any],
    arrays: dict[str, np.ndarray],
    *,
    symbolic: bool = False,
    opset: int = 17,
    feeds: dict[str, np.ndarray] | None = None,
) -> list[Any]:
    """Build ``fn(*input_names)`` on a model with ``arrays`` as inputs; run it; check declared types.

    ``feeds`` are extra values for inputs the build adds (InputLike, loss targets).
    """
    dims, batch = _input_dims(arrays, symbolic)
    block = Fn(fn)
    if arrays:
        inputs = {name: (dtypes.to_elem_type(array.dtype), dims[name]) for name, array in arrays.items()}
        model = make_model(inputs, opset=opset)
        with onnxblock.base(model):
            block(*arrays)
    else:
        with onnxblock.empty_base(opset):
            block()
    built = block.to_model_proto()
    results = run_model(built, {**arrays, **(feeds or {})})
    _check_declared(built, results, batch)
    return results


def assert_close(actual: Any, expected: Any, dtype: Any, scale: Any = 0.0) -> None:
    """``actual`` has ``dtype`` and matches ``expected``; ``scale`` widens atol for sums with cancellation."""
    actual = np.asarray(actual)
    assert actual.dtype == np.dtype(dtype)
    tol = tolerance(dtype)
    atol = tol["atol"] + tol["rtol"] * float(np.max(scale, initial=0.0))
    np.testing.assert_allclose(actual, np.asarray(expected, dtype=np.float64), rtol=tol["rtol"], atol=atol)


def floats(dtype: Any, lo: float, hi: float) -> st.SearchStrategy[float]:
    """Floats in ``[lo, hi]`` representable in ``dtype`` (no subnormals)."""
    width = 32 if np.dtype(dtype) == np.float32 else 64
    return st.floats(lo, hi, width=width, allow_subnormal=False, allow_nan=False, allow_infinity=False)


def draw_array(
    data: st.DataObject, dtype: Any, shape: Sequence[int], lo: float = -10.0, hi: float = 10.0
) -> np.ndarray:
    """An array of ``shape`` with elements in ``[lo, hi]``."""
    return data.draw(hnp.arrays(np.dtype(dtype), tuple(shape), elements=floats(dtype, lo, hi)))


def nonzero_array(data: st.DataObject, dtype: Any, shape: Sequence[int]) -> np.ndarray:
    """An array with magnitudes in ``[0.5, 10]`` and either sign (denominators)."""
    elements = st.one_of(floats(dtype, -10.0, -0.5), floats(dtype, 0.5, 10.0))
    return data.draw(hnp.arrays(np.dtype(dtype), tuple(shape), elements=elements))


shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=4)
nonscalar_shapes = hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4)


def _f64(array: np.ndarray) -> np.ndarray:
    return np.asarray(array, dtype=np.float64)


# ------------------------------------------------------------------ unary ops


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


#: name -> (NumPy oracle in float64, input range)
UNARY: dict[str, tuple[Callable[[np.ndarray], np.ndarray], tuple[float, float]]] = {
    "Abs": (np.abs, (-10.0, 10.0)),
    "Exp": (np.exp, (-10.0, 10.0)),
    "Identity": (lambda x: x, (-10.0, 10.0)),
    "Log": (np.log, (0.0625, 100.0)),
    "Neg": (np.negative, (-10.0, 10.0)),
    "Relu": (lambda x: np.maximum(x, 0.0), (-10.0, 10.0)),
    "Sigmoid": (_sigmoid, (-10.0, 10.0)),
    "Sqrt": (np.sqrt, (0.0, 100.0)),
    "Tanh": (np.tanh, (-5.0, 5.0)),
}


@covers(*UNARY)
@pytest.mark.parametrize("name", sorted(UNARY))
@given(data=st.data(), dtype=st.sampled_from(FLOATS), shape=shapes, symbolic=st.booleans())
def test_unary(name: str, data: st.DataObject, dtype: type, shape: tuple[int, ...], symbolic: bool) -> None:
    """``op(x)`` element-wise."""
    oracle, (lo, hi) = UNARY[name]
    x = draw_array(data, dtype, shape, lo, hi)
    (out,) = run_blocks(lambda a: getattr(blocks, name)()(a), {"x": x}, symbolic=symbolic)
    assert out.shape == x.shape
    assert_close(out, oracle(_f64(x)), dtype)


# ----------------------------------------------------------------- binary ops

BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Div": np.divide,
}


@covers(*BINARY)
@pytest.mark.parametrize("name", sorted(BINARY))
@given(
    data=st.data(),
    dtype=st.sampled_from(FLOATS),
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=4),
    symbolic=st.booleans(),
)
def test_binary(name: str, data: st.DataObject, dtype: type, shapes: Any, symbolic: bool) -> None:
    """``a op b`` with NumPy broadcasting."""
    (shape_a, shape_b), result_shape = shapes
    a = draw_array(data, dtype, shape_a)
    b = nonzero_array(data, dtype, shape_b) if name == "Div" else draw_array(data, dtype, shape_b)
    (out,) = run_blocks(lambda x, y: getattr(blocks, name)()(x, y), {"a": a, "b": b}, symbolic=symbolic)
    assert out.shape == result_shape
    assert_close(out, BINARY[name](_f64(a), _f64(b)), dtype)


@covers("Pow")
@given(
    data=st.data(),
    dtype=st.sampled_from(FLOATS),
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=4),
    exponent=st.sampled_from([2.0, 0.5, -1.0, 3.0, 1.5, -0.5]),
    symbolic=st.booleans(),
)
def test_pow(data: st.DataObject, dtype: type, shapes: Any, exponent: float, symbolic: bool) -> None:
    """``x ** exponent`` with a constant exponent, and ``base ** exponent`` with two inputs."""
    (shape_a, shape_b), result_shape = shapes
    base = draw_array(data, dtype, shape_a, 0.125, 4.0)
    (out,) = run_blocks(lambda x: blocks.Pow(exponent)(x), {"x": base}, symbolic=symbolic)
    assert out.shape == base.shape
    assert_close(out, _f64(base) ** exponent, dtype)
    powers = draw_array(data, dtype, shape_b, -3.0, 3.0)
    (out,) = run_blocks(lambda x, y: blocks.Pow()(x, y), {"x": base, "y": powers}, symbolic=symbolic)
    assert out.shape == result_shape
    assert_close(out, _f64(base) ** _f64(powers), dtype)


# --------------------------------------------------------------- variadic ops

VARIADIC: dict[str, Callable[[list[np.ndarray]], np.ndarray]] = {
    "Max": lambda xs: np.maximum.reduce(np.broadcast_arrays(*xs)),
    "Min": lambda xs: np.minimum.reduce(np.broadcast_arrays(*xs)),
    "Sum": lambda xs: np.sum(np.broadcast_arrays(*xs), axis=0),
    "Mean": lambda xs: np.mean(np.broadcast_arrays(*xs), axis=0),
}


@covers(*VARIADIC)
@pytest.mark.parametrize("name", sorted(VARIADIC))
@given(
    data=st.data(),
    dtype=st.sampled_from(FLOATS),
    count=st.integers(1, 4),
    symbolic=st.booleans(),
)
def test_variadic(name: str, data: st.DataObject, dtype: type, count: int, symbolic: bool) -> None:
    """``op(x1, ..., xn)`` over 1-4 inputs broadcast together."""
    shapes, result_shape = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=count, max_dims=4, max_side=4))
    arrays = {f"x{i}": draw_array(data, dtype, shape) for i, shape in enumerate(shapes)}
    (out,) = run_blocks(lambda *names: getattr(blocks, name)()(*names), arrays, symbolic=symbolic)
    assert out.shape == result_shape
    inputs = [_f64(a) for a in arrays.values()]
    scale = np.sum([np.abs(np.broadcast_to(a, result_shape)) for a in inputs], axis=0)
    assert_close(out, VARIADIC[name](inputs), dtype, scale)


@covers("Where")
@given(
    data=st.data(),
    dtype=st.sampled_from([*FLOATS, np.int64]),
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=4, max_side=4),
    symbolic=st.booleans(),
)
def test_where(data: st.DataObject, dtype: type, shapes: Any, symbolic: bool) -> None:
    """``condition ? x : y`` with three-way broadcasting."""
    (shape_c, shape_x, shape_y), result_shape = shapes
    condition = data.draw(hnp.arrays(np.bool_, shape_c))
    x = np.arange(1, math.prod(shape_x) + 1, dtype=dtype).reshape(shape_x)
    y = np.asarray(-draw_array(data, np.float64, shape_y, 0.0, 50.0), dtype=dtype)
    arrays = {"c": condition, "x": x, "y": y}
    (out,) = run_blocks(lambda c, a, b: blocks.Where()(c, a, b), arrays, symbolic=symbolic)
    assert out.shape == result_shape
    np.testing.assert_array_equal(out, np.where(condition, x, y))
    assert out.dtype == np.dtype(dtype)


@covers("Clip")
@given(
    data=st.data(),
    dtype=st.sampled_from([*FLOATS, np.int32, np.int64]),
    shape=shapes,
    bounds=st.tuples(st.none() | st.integers(-8, 8), st.none() | st.integers(-8, 8)),
    halves=st.booleans(),
    symbolic=st.booleans(),
)
def test_clip(
    data: st.DataObject,
    dtype: type,
    shape: tuple[int, ...],
    bounds: tuple[int | None, int | None],
    halves: bool,
    symbolic: bool,
) -> None:
    """``min(max(x, lo), hi)``; an open bound is ``None``; bounds take the input's type."""
    lo, hi = bounds
    if lo is not None and hi is not None and lo > hi:
        lo, hi = hi, lo
    is_float = np.dtype(dtype).kind == "f"
    if halves and is_float:  # non-integer bounds on floats
        lo = None if lo is None else lo + 0.5
        hi = None if hi is None else hi + 0.5
    x = (
        draw_array(data, np.float64, shape).astype(dtype)
        if is_float
        else data.draw(hnp.arrays(dtype, shape, elements=st.integers(-20, 20)))
    )
    (out,) = run_blocks(lambda a: blocks.Clip(lo, hi)(a), {"x": x}, symbolic=symbolic)
    np.testing.assert_array_equal(
        out, np.clip(x, -np.inf if lo is None else lo, np.inf if hi is None else hi).astype(dtype)
    )
    assert out.dtype == np.dtype(dtype)


#: The ways to name a target type: onnx enum, NumPy dtype, name.
CAST_TARGETS: list[tuple[Any, type]] = [
    (onnx.TensorProto.FLOAT, np.float32),
    (np.float64, np.float64),
    ("float16", np.float16),
    (onnx.TensorProto.INT32, np.int32),
    (np.int64, np.int64),
    ("bool", np.bool_),
    (np.dtype("int8"), np.int8),
]


@covers("Cast")
@given(
    data=st.data(),
    dtype=st.sampled_from(FLOATS),
    shape=shapes,
    target=st.sampled_from(CAST_TARGETS),
    symbolic=st.booleans(),
)
def test_cast(
    data: st.DataObject, dtype: type, shape: tuple[int, ...], target: tuple[Any, type], symbolic: bool
) -> None:
    """``x.astype(to)``, with ``to`` given as an onnx enum, a NumPy dtype or a name."""
    to, np_type = target
    x = draw_array(data, dtype, shape, -100.0, 100.0)
    (out,) = run_blocks(lambda a: blocks.Cast(to)(a), {"x": x}, symbolic=symbolic)
    assert out.dtype == np.dtype(np_type)
    if np_type == np.float16:  # double -> half may round twice (via float): allow one half-ulp step
        np.testing.assert_allclose(
            out.astype(np.float64), x.astype(np.float16).astype(np.float64), rtol=1e-3, atol=2.0**-24
        )
    else:
        np.testing.assert_array_equal(out, x.astype(np_type))


# ------------------------------------------------------------------- values


CONSTANT_DTYPES = [np.bool_, np.int32, np.int64, np.float16, np.float32, np.float64]


@covers("Constant")
@given(
    data=st.data(),
    dtype=st.sampled_from(CONSTANT_DTYPES),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
)
def test_constant_array(data: st.DataObject, dtype: type, shape: tuple[int, ...]) -> None:
    """A NumPy array keeps its dtype and shape."""
    value = data.draw(hnp.arrays(dtype, shape, elements={"allow_nan": False} if np.dtype(dtype).kind == "f" else None))
    (out,) = run_blocks(lambda: blocks.Constant(value)(), {})
    assert out.dtype == value.dtype and out.shape == value.shape
    np.testing.assert_array_equal(out, value)


@pytest.mark.parametrize(
    ("value", "dtype", "expected"),
    [
        (0.4, None, np.float32(0.4)),
        (-3.0, None, np.float32(-3.0)),
        (7, None, np.int64(7)),
        (True, None, np.bool_(True)),
        ([1.5, 2.5], None, np.array([1.5, 2.5], np.float32)),
        ([[1, 2], [3, 4]], np.int32, np.array([[1, 2], [3, 4]], np.int32)),
        (0.1, np.float64, np.float64(0.1)),
        (2, onnx.TensorProto.FLOAT16, np.float16(2)),
        (np.float64(0.1), None, np.float64(0.1)),
    ],
)
def test_constant_python_values(value: Any, dtype: Any, expected: Any) -> None:
    """Python floats are float32 (ONNX Runtime's choice), ints int64; ``dtype`` overrides."""
    (out,) = run_blocks(lambda: blocks.Constant(value, dtype)(), {})
    expected = np.asarray(expected)
    assert out.dtype == expected.dtype and out.shape == expected.shape
    np.testing.assert_array_equal(out, expected)


@covers("InputLike")
@given(data=st.data(), dtype=st.sampled_from(FLOATS), shape=nonscalar_shapes, named=st.booleans())
def test_input_like(data: st.DataObject, dtype: type, shape: tuple[int, ...], named: bool) -> None:
    """A new graph input with ``like``'s type and shape (the symbolic batch dimension kept)."""
    x = draw_array(data, dtype, shape)
    other = draw_array(data, dtype, shape)
    created: list[str] = []

    def build(a: str) -> list[str]:
        new = blocks.InputLike(a)("other" if named else None)
        created.append(new)
        return [new, blocks.Sub()(new, a)]

    block = Fn(build)
    model = make_model({"x": (dtypes.to_elem_type(dtype), ["batch", *shape[1:]])})
    with onnxblock.base(model):
        block("x")
    built = block.to_model_proto()
    (name,) = created
    if named:
        assert name == "other"
    new_input = next(value for value in built.graph.input if value.name == name)
    assert new_input.type == model.graph.input[0].type
    same, difference = run_model(built, {"x": x, name: other})
    np.testing.assert_array_equal(same, other)
    assert_close(difference, _f64(other) - _f64(x), dtype)


@covers("PassThrough")
@given(data=st.data(), dtype=st.sampled_from(FLOATS), shape=shapes, count=st.integers(1, 3))
def test_pass_through(data: st.DataObject, dtype: type, shape: tuple[int, ...], count: int) -> None:
    """Returns its input names unchanged: the outputs are the inputs, and no node is added."""
    arrays = {f"x{i}": draw_array(data, dtype, shape) for i in range(count)}
    block = Fn(lambda *names: list(blocks.PassThrough()(*names)))
    model = make_model({name: (dtypes.to_elem_type(dtype), list(shape)) for name in arrays})
    with onnxblock.base(model):
        assert block(*arrays) == list(arrays)
    built = block.to_model_proto()
    assert len(built.graph.node) == 0
    for out, array in zip(run_model(built, arrays), arrays.values(), strict=True):
        np.testing.assert_array_equal(out, array)


@covers("SequenceConstruct")
@given(data=st.data(), dtype=st.sampled_from(FLOATS), count=st.integers(1, 3), symbolic=st.booleans())
def test_sequence_construct(data: st.DataObject, dtype: type, count: int, symbolic: bool) -> None:
    """A sequence of the input tensors, in order (they may differ in shape)."""
    arrays = {f"x{i}": draw_array(data, dtype, data.draw(shapes)) for i in range(count)}
    (out,) = run_blocks(lambda *names: blocks.SequenceConstruct()(*names), arrays, symbolic=symbolic)
    assert isinstance(out, list) and len(out) == count
    for item, array in zip(out, arrays.values(), strict=True):
        assert item.dtype == array.dtype
        np.testing.assert_array_equal(item, array)


#: (keys kind, values kind) pairs onnxruntime's LabelEncoder supports.
LABEL_KINDS = [
    ("int64s", "floats"),
    ("floats", "int64s"),
    ("int64s", "int64s"),
    ("strings", "int64s"),
    ("int64s", "strings"),
]


@covers("LabelEncoder")
@given(data=st.data(), kinds=st.sampled_from(LABEL_KINDS), size=st.integers(1, 5), shape=nonscalar_shapes)
def test_label_encoder(data: st.DataObject, kinds: tuple[str, str], size: int, shape: tuple[int, ...]) -> None:
    """Each key maps to its value; unknown keys map to the default of the values' type."""
    key_kind, value_kind = kinds
    keys_int = data.draw(st.lists(st.integers(-5, 5), min_size=size, max_size=size, unique=True))
    values_int = data.draw(st.lists(st.integers(-100, 100), min_size=size, max_size=size))
    convert = {
        "int64s": lambda v: [int(i) for i in v],
        "floats": lambda v: [float(i) / 2 for i in v],
        "strings": lambda v: [f"s{i}" for i in v],
    }
    keys, values = convert[key_kind](keys_int), convert[value_kind](values_int)
    defaults = {"floats": -0.25, "int64s": -7, "strings": "unknown"}
    encoder = blocks.LabelEncoder(
        default_float=defaults["floats"],
        default_int64=defaults["int64s"],
        default_string=defaults["strings"],
        **{f"keys_{key_kind}": keys, f"values_{value_kind}": values},
    )
    raw = data.draw(hnp.arrays(np.int64, shape, elements=st.integers(-7, 7)))
    x = np.array(convert[key_kind](raw.ravel().tolist()), dtype=object if key_kind == "strings" else None)
    x = x.astype({"int64s": np.int64, "floats": np.float32, "strings": object}[key_kind]).reshape(shape)
    (out,) = run_blocks(lambda a: encoder(a), {"x": x})
    table = dict(zip(keys, values, strict=True))
    expected = np.array([table.get(k, defaults[value_kind]) for k in x.ravel().tolist()], dtype=object).reshape(shape)
    assert out.shape == shape
    if value_kind == "strings":
        assert out.tolist() == expected.tolist()
    else:
        np.testing.assert_array_equal(out, expected.astype(out.dtype))
        assert out.dtype == (np.float32 if value_kind == "floats" else np.int64)


# ------------------------------------------------------------ nn blocks


@covers("MatMul")
@given(
    data=st.data(),
    dtype=st.sampled_from(FLOATS),
    shapes=hnp.mutually_broadcastable_shapes(signature="(m?,n),(n,p?)->(m?,p?)", max_dims=4, max_side=4),
    symbolic=st.booleans(),
)
def test_matmul(data: st.DataObject, dtype: type, shapes: Any, symbolic: bool) -> None:
    """``a @ b`` with NumPy's batching and 1-D rules."""
    (shape_a, shape_b), result_shape = shapes
    a, b = draw_array(data, dtype, shape_a), draw_array(data, dtype, shape_b)
    (out,) = run_blocks(lambda x, y: blocks.MatMul()(x, y), {"a": a, "b": b}, symbolic=symbolic)
    assert out.shape == result_shape
    assert_close(out, _f64(a) @ _f64(b), dtype, np.abs(_f64(a)) @ np.abs(_f64(b)))


@covers("Gemm")
@given(
    data=st.data(),
    dtype=st.sampled_from(FLOATS),
    sizes=st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4)),
    trans=st.tuples(st.booleans(), st.booleans()),
    scalars=st.tuples(st.sampled_from([1.0, 0.5, -2.0]), st.sampled_from([1.0, 0.25, -1.0])),
    c_shape=st.sampled_from(["none", "scalar", "row", "column", "full"]),
)
def test_gemm(
    data: st.DataObject,
    dtype: type,
    sizes: tuple[int, int, int],
    trans: tuple[bool, bool],
    scalars: tuple[float, float],
    c_shape: str,
) -> None:
    """``alpha * op(a) @ op(b) + beta * c`` with optional transposes and a broadcast ``c``."""
    m, k, n = sizes
    (trans_a, trans_b), (alpha, beta) = trans, scalars
    a = draw_array(data, dtype, (k, m) if trans_a else (m, k))
    b = draw_array(data, dtype, (n, k) if trans_b else (k, n))
    arrays = {"a": a, "b": b}
    c_dims = {"scalar": (), "row": (n,), "column": (m, 1), "full": (m, n)}.get(c_shape)
    if c_dims is not None:
        arrays["c"] = draw_array(data, dtype, c_dims)
    gemm = blocks.Gemm(alpha=alpha, beta=beta, transA=trans_a, transB=trans_b)
    (out,) = run_blocks(lambda *names: gemm(*names), arrays, symbolic=True)
    op_a = _f64(a).T if trans_a else _f64(a)
    op_b = _f64(b).T if trans_b else _f64(b)
    expected = alpha * op_a @ op_b + (beta * _f64(arrays["c"]) if "c" in arrays else 0.0)
    assert out.shape == (m, n)
    assert_close(out, expected, dtype, abs(alpha) * np.abs(op_a) @ np.abs(op_b) + abs(beta) * 10)


def _linear_params(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer if t.name.startswith("linear")}


@covers("Linear")
@given(
    data=st.data(),
    dtype=st.sampled_from(FLOATS),
    sizes=st.tuples(st.integers(1, 4), st.integers(1, 6), st.integers(1, 5)),
    bias=st.booleans(),
    scalars=st.tuples(st.sampled_from([1.0, 0.5]), st.sampled_from([1.0, -2.0])),
)
def test_linear(
    data: st.DataObject, dtype: type, sizes: tuple[int, int, int], bias: bool, scalars: tuple[float, float]
) -> None:
    """``alpha * x @ W + beta * b`` with W of shape (in, out) drawn from U(-1/sqrt(in), 1/sqrt(in))."""
    batch, n_in, n_out = sizes
    alpha, beta = scalars
    x = draw_array(data, dtype, (batch, n_in))
    linear = blocks.Linear(n_in, n_out, bias=bias, alpha=alpha, beta=beta, dtype=dtype)
    block = Fn(lambda a: linear(a))
    with onnxblock.base(make_model({"x": (dtypes.to_elem_type(dtype), ["batch", n_in])})):
        block("x")
    built = block.to_model_proto()
    params = _linear_params(built)
    weights = [v for k, v in params.items() if "weight" in k]
    biases = [v for k, v in params.items() if "bias" in k]
    assert len(weights) == 1 and len(biases) == int(bias)
    (weight,) = weights
    assert weight.shape == (n_in, n_out) and weight.dtype == np.dtype(dtype)
    assert np.all(np.abs(weight) <= 1 / np.sqrt(n_in))
    (out,) = run_model(built, {"x": x})
    expected = alpha * _f64(x) @ _f64(weight)
    if bias:
        assert biases[0].shape == (n_out,)
        expected = expected + beta * _f64(biases[0])
    assert out.shape == (batch, n_out)
    assert_close(out, expected, dtype, np.abs(_f64(x)) @ np.abs(_f64(weight)) + 2)


def test_linear_deterministic_and_distinct() -> None:
    """The same build gives the same weights; two layers of one build differ; ``seed`` pins them."""

    def build_two() -> tuple[onnx.ModelProto, list[np.ndarray]]:
        block = Fn(lambda a: blocks.Linear(8, 8)(blocks.Linear(8, 8)(a)))
        with onnxblock.base(make_model({"x": (onnx.TensorProto.FLOAT, ["batch", 8])})):
            block("x")
        built = block.to_model_proto()
        return built, [v for k, v in _linear_params(built).items() if "weight" in k]

    first, (w1, w2) = build_two()
    second, (w1_again, w2_again) = build_two()
    np.testing.assert_array_equal(w1, w1_again)
    np.testing.assert_array_equal(w2, w2_again)
    assert first.SerializeToString() == second.SerializeToString()
    assert not np.allclose(w1, w2)
    assert np.std(w1) > 0.1  # spread over U(-1/sqrt(8), 1/sqrt(8)), std ~0.2

    seeded = [Fn(lambda a: blocks.Linear(3, 2, seed=7)(a)) for _ in range(2)]
    for block, model in zip(
        seeded,
        [make_model({"x": (onnx.TensorProto.FLOAT, [1, 3])}), make_model({"y": (onnx.TensorProto.FLOAT, [1, 3])})],
        strict=True,
    ):
        with onnxblock.base(model):
            block(model.graph.input[0].name)
    ws = [next(v for k, v in _linear_params(b.to_model_proto()).items() if "weight" in k) for b in seeded]
    np.testing.assert_array_equal(ws[0], ws[1])


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return np.exp(shifted) / np.sum(np.exp(shifted), axis=axis, keepdims=True)


def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


@covers("Softmax", "LogSoftmax")
@pytest.mark.parametrize("name", ["Softmax", "LogSoftmax"])
@given(data=st.data(), dtype=st.sampled_from(FLOATS), shape=nonscalar_shapes, symbolic=st.booleans())
def test_softmax(name: str, data: st.DataObject, dtype: type, shape: tuple[int, ...], symbolic: bool) -> None:
    """(Log-)softmax along ``axis`` (negative axes too; default -1)."""
    axis = data.draw(st.integers(-len(shape), len(shape) - 1) | st.none())
    x = draw_array(data, dtype, shape, -20.0, 20.0)
    block = getattr(blocks, name)() if axis is None else getattr(blocks, name)(axis=axis)
    (out,) = run_blocks(lambda a: block(a), {"x": x}, symbolic=symbolic)
    oracle = _softmax if name == "Softmax" else _log_softmax
    assert_close(out, oracle(_f64(x), -1 if axis is None else axis), dtype, 1.0 if name == "LogSoftmax" else 0.0)


# ---------------------------------------------------------------- reductions

REDUCE: dict[str, Callable[..., np.ndarray]] = {
    "ReduceSum": np.sum,
    "ReduceMean": np.mean,
    "ReduceMax": np.max,
    "ReduceMin": np.min,
}


@covers(*REDUCE)
@pytest.mark.parametrize("name", sorted(REDUCE))
@given(
    data=st.data(),
    dtype=st.sampled_from(FLOATS),
    shape=nonscalar_shapes,
    keepdims=st.booleans(),
    opset=st.sampled_from([13, 17, 18, 21]),
    symbolic=st.booleans(),
)
def test_reduce(
    name: str, data: st.DataObject, dtype: type, shape: tuple[int, ...], keepdims: bool, opset: int, symbolic: bool
) -> None:
    """``op`` over ``axes`` (unique, maybe negative; all when ``None`` or empty), any opset's form."""
    rank = len(shape)
    axes = data.draw(st.none() | st.lists(st.integers(-rank, rank - 1), max_size=rank, unique_by=lambda a: a % rank))
    x = draw_array(data, dtype, shape)
    (out,) = run_blocks(
        lambda a: getattr(blocks, name)(axes, keepdims=keepdims)(a), {"x": x}, symbolic=symbolic, opset=opset
    )
    numpy_axes = None if not axes else tuple(axes)
    expected = REDUCE[name](_f64(x), axis=numpy_axes, keepdims=keepdims)
    assert out.shape == expected.shape
    assert_close(out, expected, dtype, np.sum(np.abs(_f64(x))))


@covers("ReduceAllL2")
@given(data=st.data(), dtype=st.sampled_from(FLOATS), count=st.integers(1, 4), symbolic=st.booleans())
def test_reduce_all_l2(data: st.DataObject, dtype: type, count: int, symbolic: bool) -> None:
    """``sqrt(sum_i sum(x_i**2))`` across inputs of any shapes, in standard-domain ops only."""
    arrays = {f"x{i}": draw_array(data, dtype, data.draw(shapes)) for i in range(count)}
    block = Fn(lambda *names: blocks.ReduceAllL2()(*names))
    dims, _ = _input_dims(arrays, symbolic)
    model = make_model({name: (dtypes.to_elem_type(dtype), dims[name]) for name in arrays})
    with onnxblock.base(model):
        block(*arrays)
    built = block.to_model_proto()
    assert all(node.domain == "" for node in built.graph.node)
    assert [o.domain for o in built.opset_import] == [""]
    (out,) = run_model(built, arrays)
    assert out.shape == ()
    assert_close(out, np.sqrt(sum(np.sum(_f64(a) ** 2) for a in arrays.values())), dtype)


# ------------------------------------------------------------- shape blocks


@covers("Concat")
@given(
    data=st.data(),
    dtype=st.sampled_from(FLOATS),
    shape=nonscalar_shapes,
    count=st.integers(1, 3),
    symbolic=st.booleans(),
)
def test_concat(data: st.DataObject, dtype: type, shape: tuple[int, ...], count: int, symbolic: bool) -> None:
    """The inputs joined along ``axis`` (negative too), each with its own size there."""
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    arrays = {}
    for i in range(count):
        own = list(shape)
        own[axis] = data.draw(st.integers(1, 3))
        arrays[f"x{i}"] = draw_array(data, dtype, own)
    (out,) = run_blocks(lambda *names: blocks.Concat(axis)(*names), arrays, symbolic=symbolic)
    np.testing.assert_array_equal(out, np.concatenate(list(arrays.values()), axis=axis))


@covers("Flatten")
@given(data=st.data(), dtype=st.sampled_from(FLOATS), shape=nonscalar_shapes, symbolic=st.booleans())
def test_flatten(data: st.DataObject, dtype: type, shape: tuple[int, ...], symbolic: bool) -> None:
    """Axes before ``axis`` become rows, the rest columns (``axis`` in [-r, r])."""
    axis = data.draw(st.integers(-len(shape), len(shape)))
    x = draw_array(data, dtype, shape)
    (out,) = run_blocks(lambda a: blocks.Flatten(axis)(a), {"x": x}, symbolic=symbolic)
    rows = math.prod(shape[: axis + len(shape) if axis < 0 else axis])
    np.testing.assert_array_equal(out, x.reshape(rows, -1))


@st.composite
def reshapes(draw: st.DrawFn) -> tuple[tuple[int, ...], list[int], tuple[int, ...]]:
    """(input shape, shape argument with 0s and one -1, resulting shape)."""
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4))
    dims = list(shape)
    order = draw(st.permutations(range(len(dims))))
    cuts = sorted(draw(st.lists(st.integers(0, len(dims)), max_size=3)))
    groups, start = [], 0
    for cut in [*cuts, len(dims)]:
        groups.append(math.prod(dims[i] for i in order[start:cut]))
        start = max(start, cut)
    target = tuple(groups)
    argument = list(target)
    for i, size in enumerate(target):
        if i < len(shape) and size == shape[i] and draw(st.booleans()):
            argument[i] = 0  # copy the input's dimension
    if draw(st.booleans()):
        argument[draw(st.integers(0, len(argument) - 1))] = -1
    return shape, argument, target


@covers("Reshape")
@given(data=st.data(), dtype=st.sampled_from(FLOATS), case=reshapes(), as_input=st.booleans(), symbolic=st.booleans())
def test_reshape(
    data: st.DataObject,
    dtype: type,
    case: tuple[tuple[int, ...], list[int], tuple[int, ...]],
    as_input: bool,
    symbolic: bool,
) -> None:
    """A constant shape (with 0 copying a dimension and -1 inferred), or the shape as an input."""
    shape, argument, target = case
    x = draw_array(data, dtype, shape)
    if as_input:
        arrays = {"x": x, "shape": np.asarray(argument, dtype=np.int64)}
        (out,) = run_blocks(lambda a, s: blocks.Reshape()(a, s), arrays)
    else:
        (out,) = run_blocks(lambda a: blocks.Reshape(argument)(a), {"x": x}, symbolic=symbolic)
    assert out.shape == target
    np.testing.assert_array_equal(out, x.reshape(target))


@covers("Transpose")
@given(data=st.data(), dtype=st.sampled_from(FLOATS), shape=shapes, symbolic=st.booleans())
def test_transpose(data: st.DataObject, dtype: type, shape: tuple[int, ...], symbolic: bool) -> None:
    """Axes permuted by ``perm``, reversed when ``None``."""
    perm = data.draw(st.none() | st.permutations(range(len(shape))))
    x = draw_array(data, dtype, shape)
    (out,) = run_blocks(lambda a: blocks.Transpose(perm)(a), {"x": x}, symbolic=symbolic)
    np.testing.assert_array_equal(out, np.transpose(x, perm))


@covers("Squeeze")
@given(
    data=st.data(),
    dtype=st.sampled_from(FLOATS),
    shape=hnp.array_shapes(min_dims=1, max_dims=5, min_side=1, max_side=3),
    symbolic=st.booleans(),
)
def test_squeeze(data: st.DataObject, dtype: type, shape: tuple[int, ...], symbolic: bool) -> None:
    """Size-1 axes removed: the ones in ``axes`` (negative too), or all when ``None``."""
    rank = len(shape)
    ones = [axis for axis, size in enumerate(shape) if size == 1]
    axes = data.draw(st.none() | st.lists(st.sampled_from(ones), min_size=1, unique=True) if ones else st.none())
    if axes:
        axes = [axis - rank if data.draw(st.booleans()) else axis for axis in axes]
    x = draw_array(data, dtype, shape)
    (out,) = run_blocks(lambda a: blocks.Squeeze(axes)(a), {"x": x}, symbolic=symbolic and shape[0] != 1)
    np.testing.assert_array_equal(out, np.squeeze(x, axis=None if axes is None else tuple(axes)))


@covers("Unsqueeze")
@given(data=st.data(), dtype=st.sampled_from(FLOATS), shape=shapes, symbolic=st.booleans())
def test_unsqueeze(data: st.DataObject, dtype: type, shape: tuple[int, ...], symbolic: bool) -> None:
    """New size-1 axes at ``axes`` of the output (negative too)."""
    count = data.draw(st.integers(1, 3))
    rank = len(shape) + count
    axes = data.draw(
        st.lists(st.integers(-rank, rank - 1), min_size=count, max_size=count, unique_by=lambda a: a % rank)
    )
    x = draw_array(data, dtype, shape)
    (out,) = run_blocks(lambda a: blocks.Unsqueeze(axes)(a), {"x": x}, symbolic=symbolic)
    np.testing.assert_array_equal(out, np.expand_dims(x, tuple(axes)))


# ------------------------------------------------------------------- torch


TORCH_ACTIVATIONS: dict[str, Callable[[Any, int], Any]] = {
    "Relu": lambda torch, x, axis: torch.nn.functional.relu(x),
    "Sigmoid": lambda torch, x, axis: torch.sigmoid(x),
    "Tanh": lambda torch, x, axis: torch.tanh(x),
    "Exp": lambda torch, x, axis: torch.exp(x),
    "Abs": lambda torch, x, axis: torch.abs(x),
    "Softmax": lambda torch, x, axis: torch.nn.functional.softmax(x, dim=axis),
    "LogSoftmax": lambda torch, x, axis: torch.nn.functional.log_softmax(x, dim=axis),
}


@pytest.mark.parametrize("name", sorted(TORCH_ACTIVATIONS))
@given(data=st.data(), dtype=st.sampled_from(FLOATS), shape=nonscalar_shapes)
def test_activations_match_torch(name: str, data: st.DataObject, dtype: type, shape: tuple[int, ...]) -> None:
    """Activations agree with torch.nn.functional in the input's precision."""
    torch = pytest.importorskip("torch")
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = draw_array(data, dtype, shape, -8.0, 8.0)
    block = getattr(blocks, name)(axis=axis) if name in ("Softmax", "LogSoftmax") else getattr(blocks, name)()
    (out,) = run_blocks(lambda a: block(a), {"x": x})
    expected = TORCH_ACTIVATIONS[name](torch, torch.from_numpy(x), axis).numpy()
    assert expected.dtype == out.dtype
    np.testing.assert_allclose(out, expected, **tolerance(dtype))


TORCH_REDUCTIONS = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "amax", "ReduceMin": "amin"}


@pytest.mark.parametrize("name", sorted(TORCH_REDUCTIONS))
@given(data=st.data(), dtype=st.sampled_from(FLOATS), shape=nonscalar_shapes, keepdims=st.booleans())
def test_reductions_match_torch(
    name: str, data: st.DataObject, dtype: type, shape: tuple[int, ...], keepdims: bool
) -> None:
    """Reductions over axes agree with torch's sum/mean/amax/amin over ``dim``."""
    torch = pytest.importorskip("torch")
    rank = len(shape)
    axes = data.draw(st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank, unique_by=lambda a: a % rank))
    x = draw_array(data, dtype, shape)
    (out,) = run_blocks(lambda a: getattr(blocks, name)(axes, keepdims=keepdims)(a), {"x": x})
    expected = getattr(torch, TORCH_REDUCTIONS[name])(torch.from_numpy(x), dim=tuple(axes), keepdim=keepdims).numpy()
    assert out.shape == expected.shape
    tol = tolerance(dtype)
    np.testing.assert_allclose(out, expected, rtol=tol["rtol"], atol=tol["atol"] + tol["rtol"] * np.sum(np.abs(x)))


@given(data=st.data(), sizes=st.tuples(st.integers(1, 4), st.integers(1, 6), st.integers(1, 5)), bias=st.booleans())
def test_linear_matches_torch(data: st.DataObject, sizes: tuple[int, int, int], bias: bool) -> None:
    """Linear equals torch.nn.functional.linear with weight W.T (ONNX Runtime's layout is (in, out))."""
    torch = pytest.importorskip("torch")
    batch, n_in, n_out = sizes
    x = draw_array(data, np.float64, (batch, n_in))
    block = Fn(lambda a: blocks.Linear(n_in, n_out, bias=bias, dtype=np.float64)(a))
    with onnxblock.base(make_model({"x": (onnx.TensorProto.DOUBLE, ["batch", n_in])})):
        block("x")
    built = block.to_model_proto()
    params = _linear_params(built)
    weight = next(v for k, v in params.items() if "weight" in k)
    bias_value = next((v for k, v in params.items() if "bias" in k), None)
    expected = torch.nn.functional.linear(
        torch.from_numpy(x),
        torch.from_numpy(weight.T.copy()),
        None if bias_value is None else torch.from_numpy(bias_value.copy()),
    ).numpy()
    (out,) = run_model(built, {"x": x})
    np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------- meta


@covers("Gradient")
@given(data=st.data(), dtype=st.sampled_from(FLOATS), shape=shapes, symbolic=st.booleans())
def test_gradient(data: st.DataObject, dtype: type, shape: tuple[int, ...], symbolic: bool) -> None:
    """``d sum(tanh(x) * w) / dx = (1 - tanh(x)**2) * w``; with ``grad_output=v``, the same times ``v``; the second
    derivative ``d/dx sum(dy/dx) = -2 tanh(x) (1 - tanh(x)**2) w``; a list ``wrt`` gives a tuple."""
    x, w, v = (draw_array(data, dtype, shape, -2.0, 2.0) for _ in range(3))

    def build(a: str, b: str, c: str) -> list[str]:
        y = blocks.Mul()(blocks.Tanh()(a), b)
        first = blocks.Gradient(wrt=a)(y)
        weighted, weight = blocks.Gradient(wrt=[a, b], grad_output=c)(y)
        return [first, blocks.Gradient(wrt=a)(first), weighted, weight]

    first, second, weighted, weight = run_blocks(build, {"x": x, "w": w, "v": v}, symbolic=symbolic)
    t = np.tanh(_f64(x))
    assert first.shape == second.shape == weighted.shape == weight.shape == x.shape
    assert_close(first, (1 - t**2) * _f64(w), dtype)
    assert_close(second, -2 * t * (1 - t**2) * _f64(w), dtype)
    assert_close(weighted, (1 - t**2) * _f64(w) * _f64(v), dtype)
    assert_close(weight, t * _f64(v), dtype)


def test_every_block_has_a_forward_test() -> None:
    """Every block exported by onnxtrain.blocks (but the base classes) is covered above."""
    exported = set(blocks.__all__) - {"Block", "ForwardBlock"}
    assert exported - set(FORWARD_CASES) == set(), "blocks without a forward test"
    assert set(FORWARD_CASES) - exported == set(), "tests for blocks that are not exported"
    for name, test in FORWARD_CASES.items():
        assert globals()[test.__name__] is test, name
    assert set(onnxblock.blocks.__all__) == set(blocks.__all__)
