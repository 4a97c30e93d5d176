"""Forward values of the loss blocks against NumPy oracles (and PyTorch where installed).

Every loss is built with ``onnxblock.base(model)`` and a ``ForwardBlock`` on a
small base model ``y = 2 * x`` whose output has a symbolic batch dimension,
then run in onnxruntime on data drawn by Hypothesis, in float32 and float64.
The data are drawn in the loss's domain as values of ``y``; the model is fed
``x = y / 2``, which is exact in binary floating point.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from onnx import helper

import onnxtrain
import onnxtrain.onnxblock as onnxblock
from onnxtrain.sessions import inference_session
from tests.helpers import DOUBLE, FLOAT, INT32, INT64, make_model, tolerance
from tests.losses import oracles

DTYPES = [np.float32, np.float64]
ELEM_TYPE = {np.float32: FLOAT, np.float64: DOUBLE}
REDUCTIONS = ["mean", "sum", "none"]
N_CLASSES = 3

Shape = Sequence[int | str | None] | None


# ----------------------------------------------------------------- helpers


def scaled_model(shape: Shape, elem_type: int, opset: int = 17) -> onnx.ModelProto:
    """The base model ``y = 2 * x``; ``x`` and ``y`` have ``shape`` (``None``: unknown rank)."""
    dtype = helper.tensor_dtype_to_np_dtype(elem_type)
    return make_model(
        {"x": (elem_type, shape)},
        [helper.make_node("Mul", ["x", "two"], ["y"])],
        {"y": (elem_type, shape)},
        initializers=[("two", np.array(2, dtype=dtype))],
        opset=opset,
    )


class LossHead(onnxblock.ForwardBlock):
    """A forward model whose one output is ``loss`` applied to the base model's output."""

    def __init__(self, loss: onnxblock.Block, target_name: str | None = None) -> None:
        super().__init__()
        self._loss = loss
        self._target_name = target_name

    def build(self, output_name: str) -> str:
        if self._target_name is None:
            return self._loss(output_name)
        return self._loss(output_name, self._target_name)


def build_loss_model(
    loss: onnxblock.Block,
    shape: Shape,
    elem_type: int,
    *,
    opset: int = 17,
    target_name: str | None = None,
    model: onnx.ModelProto | None = None,
) -> onnx.ModelProto:
    """``loss`` stacked on ``scaled_model(shape)`` (or on ``model``'s output ``y``)."""
    base_model = scaled_model(shape, elem_type, opset) if model is None else model
    head = LossHead(loss, target_name)
    with onnxblock.base(base_model):
        head("y")
    return head.to_model_proto()


def dims_of(value: onnx.ValueInfoProto) -> list[int | str | None] | None:
    """The dimensions of a tensor value (``None`` for unknown rank)."""
    tensor_type = value.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else d.dim_param if d.HasField("dim_param") else None
            for d in tensor_type.shape.dim]  # fmt: skip


def inputs_of(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    return {value.name: value for value in model.graph.input}


def assert_loss_close(actual: np.ndarray, expected: np.ndarray, dtype: Any, scale: Any = None) -> None:
    """``|actual - expected| <= atol + rtol |expected|`` with the dtype's tolerance, ``nan`` where expected.

    ``scale`` (the reduced absolute values of terms that a loss adds up
    with mixed signs) widens ``atol`` to the rounding error such a sum can
    carry: ``rtol * scale``.
    """
    tol = tolerance(dtype)
    atol = tol["atol"] if scale is None else np.maximum(tol["atol"], tol["rtol"] * np.asarray(scale))
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == np.dtype(dtype), f"loss computed in {actual.dtype}, expected {np.dtype(dtype)}"
    assert actual.shape == expected.shape, f"loss shape {actual.shape}, expected {expected.shape}"
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected), err_msg="nan pattern differs from the oracle")
    error = np.abs(actual.astype(np.float64) - expected)
    bound = atol + tol["rtol"] * np.abs(expected)
    bad = ~np.isnan(expected) & ~(error <= bound)
    assert not bad.any(), (
        f"loss {actual} != oracle {expected}: error {error[bad]} > allowed {np.broadcast_to(bound, error.shape)[bad]}"
    )


# -------------------------------------------------------------------- cases


@dataclass
class Case:
    """One loss configuration: which block, its arguments, and the data family it takes."""

    loss: str
    family: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    shape: tuple[int | str, ...] = ("batch", N_CLASSES)

    @property
    def id(self) -> str:
        args = ",".join(f"{k}={getattr(v, '__name__', v)}" for k, v in self.kwargs.items())
        return f"{self.loss}({args})[{','.join(map(str, self.shape))}]"

    @property
    def reductions(self) -> list[str]:
        return [*REDUCTIONS, "batchmean"] if self.loss == "KLDivLoss" else REDUCTIONS

    def block(self, reduction: str) -> onnxblock.Block:
        return getattr(onnxblock.loss, self.loss)(reduction=reduction, **self.kwargs)

    @property
    def target_name(self) -> str:
        return "labels" if self.loss == "CrossEntropyLoss" else "target"

    @property
    def label_dtype(self) -> Any:
        return np.dtype(self.kwargs.get("label_dtype", np.int64))


W = [0.5, 2.0, 1.25]  # class weights, exact in float32
POS_W = [3.0, 0.5, 1.5]

REGRESSION = [
    ("MSELoss", {}),
    ("L1Loss", {}),
    ("HuberLoss", {}),
    ("HuberLoss", {"delta": 0.5}),
    ("HuberLoss", {"delta": 2.5}),
    ("SmoothL1Loss", {}),
    ("SmoothL1Loss", {"beta": 0.5}),
    ("SmoothL1Loss", {"beta": 0.0}),
]
CLASSIFICATION: list[tuple[str, dict[str, Any], tuple[int | str, ...]]] = [
    ("CrossEntropyLoss", {}, ("batch", N_CLASSES)),
    ("CrossEntropyLoss", {"weight": W}, ("batch", N_CLASSES)),
    ("CrossEntropyLoss", {"ignore_index": 1}, ("batch", N_CLASSES)),
    ("CrossEntropyLoss", {"weight": W, "ignore_index": -100}, ("batch", N_CLASSES)),
    ("CrossEntropyLoss", {"ignore_index": None}, ("batch", N_CLASSES)),
    ("CrossEntropyLoss", {"label_smoothing": 0.1}, ("batch", N_CLASSES)),
    ("CrossEntropyLoss", {"label_smoothing": 0.2, "weight": W}, ("batch", N_CLASSES)),
    ("CrossEntropyLoss", {"label_smoothing": 0.3, "weight": W, "ignore_index": 2}, ("batch", N_CLASSES)),
    ("CrossEntropyLoss", {"label_smoothing": 1.0, "ignore_index": -100}, ("batch", N_CLASSES)),
    ("CrossEntropyLoss", {"label_dtype": np.int64}, ("batch", N_CLASSES)),
    ("CrossEntropyLoss", {}, ("batch", N_CLASSES, "length")),
    ("CrossEntropyLoss", {"weight": W, "ignore_index": -100}, ("batch", N_CLASSES, "length")),
    ("CrossEntropyLoss", {"weight": W, "label_smoothing": 0.25, "ignore_index": 0}, ("batch", N_CLASSES, 2)),
    ("CrossEntropyLoss", {"label_smoothing": 0.1}, ("batch", "classes")),
    ("NLLLoss", {}, ("batch", N_CLASSES)),
    ("NLLLoss", {"weight": W}, ("batch", N_CLASSES)),
    ("NLLLoss", {"weight": W, "ignore_index": 1}, ("batch", N_CLASSES)),
    ("NLLLoss", {"ignore_index": -100, "label_dtype": np.int32}, ("batch", N_CLASSES)),
    ("NLLLoss", {"weight": W, "ignore_index": -100}, ("batch", N_CLASSES, "length")),
    ("BCEWithLogitsLoss", {}, ("batch", N_CLASSES)),
    ("BCEWithLogitsLoss", {"weight": W}, ("batch", N_CLASSES)),
    ("BCEWithLogitsLoss", {"pos_weight": POS_W}, ("batch", N_CLASSES)),
    ("BCEWithLogitsLoss", {"weight": [[2.0], [0.5]], "pos_weight": POS_W}, ("batch", 2, N_CLASSES)),
    ("BCELoss", {}, ("batch", N_CLASSES)),
    ("BCELoss", {"weight": W}, ("batch", N_CLASSES)),
]
FAMILY = {
    "MSELoss": "regression",
    "L1Loss": "regression",
    "HuberLoss": "regression",
    "SmoothL1Loss": "regression",
    "CrossEntropyLoss": "ce",
    "NLLLoss": "nll",
    "BCEWithLogitsLoss": "logits",
    "BCELoss": "probs",
    "KLDivLoss": "kl",
}

CASES: list[Case] = [
    *(Case(loss, "regression", kw) for loss, kw in REGRESSION),
    Case("MSELoss", "regression", {}, ("batch", 2, N_CLASSES)),
    Case("L1Loss", "regression", {}, ("batch",)),
    *(Case(loss, FAMILY[loss], kw, shape) for loss, kw, shape in CLASSIFICATION),
    Case("CrossEntropyLoss", "ce_probs", {"probabilities": True}),
    Case("CrossEntropyLoss", "ce_probs", {"probabilities": True, "weight": W, "label_smoothing": 0.2}),
    Case("CrossEntropyLoss", "ce_probs", {"probabilities": True, "weight": W}, ("batch", N_CLASSES, "length")),
    Case("CrossEntropyLoss", "ce_probs", {"probabilities": True, "label_smoothing": 0.1}, ("batch", "classes")),
    Case("KLDivLoss", "kl", {}),
    Case("KLDivLoss", "kl", {"log_target": True}),
    Case("KLDivLoss", "kl", {}, ("batch", 2, N_CLASSES)),
]
CASES_BY_ID = {case.id: case for case in CASES}
assert len(CASES_BY_ID) == len(CASES), "case ids must be unique"


def single_thread_session(model: onnx.ModelProto) -> ort.InferenceSession:
    """A CPU session with one intra-op thread: tiny models run faster without a spinning pool."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return inference_session(model.SerializeToString(), options)


@functools.cache
def case_session(case_id: str, reduction: str, dtype_name: str) -> ort.InferenceSession:
    """The built model of a case, in an onnxruntime session (built once per case, reduction and dtype)."""
    case = CASES_BY_ID[case_id]
    model = build_loss_model(case.block(reduction), case.shape, ELEM_TYPE[np.dtype(dtype_name).type])
    return single_thread_session(model)


# --------------------------------------------------------------------- data


def float_arrays(dtype: Any, shape: tuple[int, ...], low: float, high: float, special: Sequence[float] = ()) -> Any:
    """Arrays of finite floats in ``[low, high]`` representable in ``dtype``, sometimes exactly ``special``."""
    elements: Any = st.floats(low, high, width=32 if dtype == np.float32 else 64, allow_subnormal=False)
    if special:
        elements = st.one_of(elements, st.sampled_from(list(special)))
    return arrays(dtype, shape, elements=elements)


def draw_shape(data: st.DataObject, case: Case) -> tuple[int, ...]:
    """Concrete sizes for the case's dims: symbolic ones drawn, fixed ones kept."""
    sizes = []
    for axis, dim in enumerate(case.shape):
        if isinstance(dim, int):
            sizes.append(dim)
        elif axis == 1:
            sizes.append(data.draw(st.integers(2, 5), label=f"size of {dim}"))
        else:
            sizes.append(data.draw(st.integers(1, 4), label=f"size of {dim}"))
    return tuple(sizes)


#: The blocks' default ``ignore_index``: none for CrossEntropyLoss (ONNX Runtime's), -100 for NLLLoss (PyTorch's).
DEFAULT_IGNORE_INDEX: dict[str, int | None] = {"CrossEntropyLoss": None, "NLLLoss": -100}


def ignore_index_of(case: Case) -> int | None:
    """The ``ignore_index`` the case's block uses."""
    return case.kwargs.get("ignore_index", DEFAULT_IGNORE_INDEX[case.loss])


def draw_labels(data: st.DataObject, case: Case, shape: tuple[int, ...]) -> np.ndarray:
    """Class labels for ``(N, C, d...)`` inputs: shape ``(N, d...)``, some equal to ``ignore_index``."""
    n_classes = shape[1]
    choices = list(range(n_classes))
    ignore = ignore_index_of(case)
    if ignore is not None and ignore not in choices:
        choices.append(ignore)
    label_shape = shape[:1] + shape[2:]
    return data.draw(arrays(case.label_dtype, label_shape, elements=st.sampled_from(choices)), label="labels")


def draw_inputs(data: st.DataObject, case: Case, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(y, target)`` in the domain of the case's loss."""
    shape = draw_shape(data, case)
    family = case.family
    if family == "regression":
        y = data.draw(float_arrays(dtype, shape, -3.0, 3.0), label="input")
        target = data.draw(float_arrays(dtype, shape, -3.0, 3.0), label="target")
    elif family == "ce":
        y = data.draw(float_arrays(dtype, shape, -6.0, 6.0), label="scores")
        target = draw_labels(data, case, shape)
    elif family == "nll":
        y = data.draw(float_arrays(dtype, shape, -8.0, 0.0), label="log-probabilities")
        target = draw_labels(data, case, shape)
    elif family == "ce_probs":  # a distribution over the classes (axis 1) per sample, or any weights of them
        y = data.draw(float_arrays(dtype, shape, -6.0, 6.0), label="scores")
        target = data.draw(float_arrays(dtype, shape, 0.0, 1.0, special=[0.0]), label="probabilities")
        if data.draw(st.booleans(), label="normalized"):
            total = target.sum(axis=1, keepdims=True)
            target = np.where(total > 0, target / np.where(total > 0, total, 1), target).astype(dtype)
    elif family == "logits":
        y = data.draw(float_arrays(dtype, shape, -15.0, 15.0, special=[0.0]), label="logits")
        target = data.draw(float_arrays(dtype, shape, 0.0, 1.0, special=[0.0, 1.0]), label="target")
    elif family == "probs":
        y = data.draw(float_arrays(dtype, shape, 0.0, 1.0, special=[0.0, 1.0]), label="probabilities")
        target = data.draw(float_arrays(dtype, shape, 0.0, 1.0, special=[0.0, 1.0]), label="target")
    elif family == "kl":
        y = data.draw(float_arrays(dtype, shape, -6.0, 0.0), label="log-probabilities")
        if case.kwargs.get("log_target"):
            target = data.draw(float_arrays(dtype, shape, -6.0, 0.0), label="log-target")
        else:
            target = data.draw(float_arrays(dtype, shape, 0.0, 1.0, special=[0.0]), label="target")
    else:
        raise AssertionError(family)
    return y, target


def run_case(case: Case, reduction: str, dtype: Any, y: np.ndarray, target: np.ndarray) -> np.ndarray:
    feeds = {"x": y / 2, case.target_name: target}
    (loss,) = case_session(case.id, reduction, np.dtype(dtype).name).run(None, feeds)
    return loss


# ------------------------------------------------------------------ oracles


def _kwargs(case: Case, *names: str) -> dict[str, Any]:
    return {name: case.kwargs[name] for name in names if name in case.kwargs}


def oracle(case: Case, reduction: str, y: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The expected loss of a case, from :mod:`tests.losses.oracles`."""
    if case.loss == "MSELoss":
        return oracles.mse_loss(y, target, reduction)
    if case.loss == "L1Loss":
        return oracles.l1_loss(y, target, reduction)
    if case.loss == "HuberLoss":
        return oracles.huber_loss(y, target, reduction, **_kwargs(case, "delta"))
    if case.loss == "SmoothL1Loss":
        return oracles.smooth_l1_loss(y, target, reduction, **_kwargs(case, "beta"))
    if case.family == "ce_probs":
        return oracles.cross_entropy_with_probabilities(
            y, target, reduction=reduction, **_kwargs(case, "weight", "label_smoothing")
        )
    if case.loss == "CrossEntropyLoss":
        return oracles.cross_entropy(
            y,
            target,
            reduction=reduction,
            ignore_index=ignore_index_of(case),
            **_kwargs(case, "weight", "label_smoothing"),
        )
    if case.loss == "NLLLoss":
        return oracles.nll_loss(y, target, reduction=reduction, **_kwargs(case, "weight", "ignore_index"))
    if case.loss == "BCEWithLogitsLoss":
        return oracles.binary_cross_entropy_with_logits(
            y, target, reduction=reduction, **_kwargs(case, "weight", "pos_weight")
        )
    if case.loss == "BCELoss":
        return oracles.binary_cross_entropy(y, target, reduction=reduction, **_kwargs(case, "weight"))
    if case.loss == "KLDivLoss":
        return oracles.kl_div(y, target, reduction, **_kwargs(case, "log_target"))
    raise AssertionError(case.loss)


def magnitude(case: Case, reduction: str, y: np.ndarray, target: np.ndarray) -> np.ndarray | None:
    """The reduced absolute terms of losses that add terms of mixed signs (else ``None``)."""
    if case.loss == "KLDivLoss":
        return oracles.kl_div_magnitude(y, target, reduction, **_kwargs(case, "log_target"))
    if case.loss == "BCEWithLogitsLoss":
        return oracles.binary_cross_entropy_with_logits_magnitude(
            y, target, reduction=reduction, **_kwargs(case, "weight", "pos_weight")
        )
    return None


# -------------------------------------------------------------------- tests


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
@given(data=st.data())
def test_loss_matches_oracle(case: Case, dtype: Any, data: st.DataObject) -> None:
    """Each reduction of the case (one model each) on the same drawn data."""
    y, target = draw_inputs(data, case, dtype)
    for reduction in case.reductions:
        actual = run_case(case, reduction, dtype, y, target)
        expected = oracle(case, reduction, y, target)
        assert_loss_close(actual, expected, dtype, magnitude(case, reduction, y, target))


# ------------------------------------------------------------ against torch


@pytest.fixture(scope="module")
def torch() -> Iterator[Any]:
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: a thread pool only adds wake-up latency
    yield torch
    torch.set_num_threads(threads)


def torch_loss(torch: Any, case: Case, reduction: str, y: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The case's loss from ``torch.nn.functional``, on tensors of ``y``'s dtype."""
    return torch_loss_tensor(torch, case, reduction, torch.from_numpy(y), target).detach().numpy()


def torch_loss_tensor(torch: Any, case: Case, reduction: str, x: Any, target: np.ndarray) -> Any:
    """The case's loss from ``torch.nn.functional`` of tensor ``x`` (which may require grad)."""
    functional = torch.nn.functional

    def tensor(name: str) -> Any:
        value = case.kwargs.get(name)
        return None if value is None else torch.tensor(value, dtype=x.dtype)

    if case.family in ("ce", "nll"):
        labels = torch.from_numpy(target.astype(np.int64))
        ignore_index = ignore_index_of(case)
        common = {"weight": tensor("weight"), "reduction": reduction}
        common["ignore_index"] = -100 if ignore_index is None else ignore_index  # torch's "none": a label never used
        if case.loss == "NLLLoss":
            return functional.nll_loss(x, labels, **common)
        return functional.cross_entropy(x, labels, label_smoothing=case.kwargs.get("label_smoothing", 0.0), **common)
    t = torch.from_numpy(target)
    if case.family == "ce_probs":
        smoothing = case.kwargs.get("label_smoothing", 0.0)
        return functional.cross_entropy(x, t, weight=tensor("weight"), reduction=reduction, label_smoothing=smoothing)
    if case.loss == "MSELoss":
        result = functional.mse_loss(x, t, reduction=reduction)
    elif case.loss == "L1Loss":
        result = functional.l1_loss(x, t, reduction=reduction)
    elif case.loss == "HuberLoss":
        result = functional.huber_loss(x, t, reduction=reduction, **_kwargs(case, "delta"))
    elif case.loss == "SmoothL1Loss":
        result = functional.smooth_l1_loss(x, t, reduction=reduction, **_kwargs(case, "beta"))
    elif case.loss == "BCEWithLogitsLoss":
        result = functional.binary_cross_entropy_with_logits(
            x, t, weight=tensor("weight"), reduction=reduction, pos_weight=tensor("pos_weight")
        )
    elif case.loss == "BCELoss":
        result = functional.binary_cross_entropy(x, t, weight=tensor("weight"), reduction=reduction)
    elif case.loss == "KLDivLoss":
        with warnings.catch_warnings():  # torch warns that "mean" is not the KL divergence ("batchmean" is)
            warnings.simplefilter("ignore", UserWarning)
            result = functional.kl_div(x, t, reduction=reduction, log_target=case.kwargs.get("log_target", False))
    else:
        raise AssertionError(case.loss)
    return result


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
@given(data=st.data())
def test_loss_matches_torch(torch: Any, case: Case, data: st.DataObject) -> None:
    """onnxruntime in float32 against torch in float32; the oracle against torch in float64, same data.

    (onnxruntime in float64 is held to the oracle at rtol 1e-10 above, so it
    matches torch in float64 too.)
    """
    y, target = draw_inputs(data, case, np.float32)
    y64 = y.astype(np.float64)
    target64 = target if case.family in ("ce", "nll") else target.astype(np.float64)
    for reduction in case.reductions:
        expected = torch_loss(torch, case, reduction, y, target).astype(np.float64)
        actual = run_case(case, reduction, np.float32, y, target)
        assert_loss_close(actual, expected, np.float32, magnitude(case, reduction, y, target))
        np.testing.assert_allclose(
            oracle(case, reduction, y64, target64),
            torch_loss(torch, case, reduction, y64, target64),
            rtol=1e-12,
            atol=1e-13,
            err_msg=f"oracle against torch, reduction={reduction!r}",
        )


# ------------------------------------------------- the inputs a loss adds


SIGNATURES = [
    # (loss, base output shape, added input name, its element type (None: like the output), its shape)
    (lambda: onnxblock.loss.MSELoss(), ["batch", 3], "target", None, ["batch", 3]),
    (lambda: onnxblock.loss.L1Loss(), ["batch", "seq", 4], "target", None, ["batch", "seq", 4]),
    (lambda: onnxblock.loss.HuberLoss(delta=0.5), ["batch", 3], "target", None, ["batch", 3]),
    (lambda: onnxblock.loss.SmoothL1Loss(beta=2.0), ["batch", 3], "target", None, ["batch", 3]),
    (lambda: onnxblock.loss.BCEWithLogitsLoss(pos_weight=[1.0, 2.0, 3.0]), ["batch", 3], "target", None, ["batch", 3]),
    (lambda: onnxblock.loss.BCELoss(), ["batch", 3], "target", None, ["batch", 3]),
    (lambda: onnxblock.loss.KLDivLoss(reduction="batchmean"), ["batch", 3], "target", None, ["batch", 3]),
    (lambda: onnxblock.loss.CrossEntropyLoss(), ["batch", 3], "labels", INT64, ["batch"]),
    (lambda: onnxblock.loss.CrossEntropyLoss(), ["batch", 3, "length"], "labels", INT64, ["batch", "length"]),
    (lambda: onnxblock.loss.CrossEntropyLoss(), ["batch", "classes", 5, 6], "labels", INT64, ["batch", 5, 6]),
    (lambda: onnxblock.loss.CrossEntropyLoss(label_dtype=np.int32), ["batch", 3], "labels", INT32, ["batch"]),
    (lambda: onnxblock.loss.CrossEntropyLoss(label_dtype="int32"), ["batch", 3], "labels", INT32, ["batch"]),
    (lambda: onnxblock.loss.CrossEntropyLoss(label_dtype=INT32), ["batch", 3], "labels", INT32, ["batch"]),
    (lambda: onnxblock.loss.NLLLoss(), ["batch", 3], "target", INT64, ["batch"]),
    (lambda: onnxblock.loss.NLLLoss(), ["batch", 3, "length"], "target", INT64, ["batch", "length"]),
    (lambda: onnxblock.loss.NLLLoss(label_dtype=np.int32), ["batch", 3], "target", INT32, ["batch"]),
    (lambda: onnxblock.loss.CrossEntropyLoss(weight=W, label_smoothing=0.1), None, "labels", INT64, None),
]


@pytest.mark.parametrize("elem_type", [FLOAT, DOUBLE], ids=["float32", "float64"])
@pytest.mark.parametrize(("make_loss", "shape", "name", "target_type", "target_shape"), SIGNATURES)
def test_loss_adds_its_target_input(
    make_loss: Callable[[], onnxblock.Block],
    shape: Shape,
    name: str,
    target_type: int | None,
    target_shape: Shape,
    elem_type: int,
) -> None:
    """The target (labels) input: name, element type, shape with the symbolic dims kept."""
    model = build_loss_model(make_loss(), shape, elem_type)
    if shape is not None:  # onnx's strict check rejects unknown-rank inputs, the base model's too
        onnx.checker.check_model(model, full_check=True)
    inputs = inputs_of(model)
    assert list(inputs) == ["x", name]
    target = inputs[name]
    assert target.type.tensor_type.elem_type == (elem_type if target_type is None else target_type)
    assert dims_of(target) == target_shape
    (output,) = model.graph.output
    assert output.type.tensor_type.elem_type == elem_type


@pytest.mark.parametrize(
    ("make_loss", "shape", "output_shape"),
    [
        (lambda r: onnxblock.loss.MSELoss(reduction=r), ["batch", 3], ["batch", 3]),
        (lambda r: onnxblock.loss.KLDivLoss(reduction=r), ["batch", 3], ["batch", 3]),
        (
            lambda r: onnxblock.loss.BCEWithLogitsLoss(reduction=r, pos_weight=[1.0, 2.0, 3.0]),
            ["batch", 3],
            ["batch", 3],
        ),
        (lambda r: onnxblock.loss.CrossEntropyLoss(reduction=r), ["batch", 3, "length"], ["batch", "length"]),
        (lambda r: onnxblock.loss.NLLLoss(reduction=r, weight=W), ["batch", 3], ["batch"]),
    ],
)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_loss_output_shape(
    make_loss: Callable[[str], onnxblock.Block], shape: Shape, output_shape: Shape, reduction: str
) -> None:
    """A scalar for "mean" and "sum"; the element-wise shape (symbolic dims kept) for "none"."""
    model = build_loss_model(make_loss(reduction), shape, FLOAT)
    (output,) = model.graph.output
    assert dims_of(output) == ([] if reduction != "none" else output_shape)


def test_losses_are_reachable_from_both_modules() -> None:
    names = ["MSELoss", "L1Loss", "HuberLoss", "SmoothL1Loss", "CrossEntropyLoss", "NLLLoss",
             "BCEWithLogitsLoss", "BCELoss", "KLDivLoss"]  # fmt: skip
    for name in names:
        assert getattr(onnxtrain.losses, name) is getattr(onnxblock.loss, name)
        assert issubclass(getattr(onnxblock.loss, name), onnxblock.Block)


def test_building_a_loss_leaves_the_callers_model_unchanged() -> None:
    model = scaled_model(["batch", 3], FLOAT)
    before = model.SerializeToString()
    build_loss_model(onnxblock.loss.CrossEntropyLoss(weight=W, label_smoothing=0.1), None, FLOAT, model=model)
    assert model.SerializeToString() == before


# ---------------------------------------------------------- target names


def two_input_model(target_type: int, target_shape: Shape) -> onnx.ModelProto:
    """``y = 2 * x`` with a second graph input ``t`` the loss can take as its target."""
    return make_model(
        {"x": (FLOAT, ["batch", 3]), "t": (target_type, target_shape)},
        [helper.make_node("Mul", ["x", "two"], ["y"])],
        {"y": (FLOAT, ["batch", 3])},
        initializers=[("two", np.array(2, dtype=np.float32))],
    )


def test_existing_input_is_reused_as_target() -> None:
    model = build_loss_model(
        onnxblock.loss.MSELoss(reduction="sum"),
        None,
        FLOAT,
        target_name="t",
        model=two_input_model(FLOAT, ["batch", 3]),
    )
    assert list(inputs_of(model)) == ["x", "t"]
    rng = np.random.default_rng(0)
    x, t = rng.standard_normal((2, 4, 3)).astype(np.float32)
    (loss,) = single_thread_session(model).run(None, {"x": x, "t": t})
    assert_loss_close(loss, oracles.mse_loss(2 * x, t, "sum"), np.float32)


def test_existing_int_input_is_reused_as_labels() -> None:
    model = build_loss_model(
        onnxblock.loss.CrossEntropyLoss(ignore_index=-100, label_dtype=np.int32),
        None,
        FLOAT,
        target_name="t",
        model=two_input_model(INT32, ["batch"]),
    )
    assert list(inputs_of(model)) == ["x", "t"]
    x = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
    labels = np.array([0, 2, 1, -100], dtype=np.int32)
    (loss,) = single_thread_session(model).run(None, {"x": x, "t": labels})
    assert_loss_close(loss, oracles.cross_entropy(2 * x, labels), np.float32)


def test_a_loss_of_the_target_against_itself_is_zero() -> None:
    """The base model's own input as the target of a loss on that input: no new input, loss 0."""
    base_model = scaled_model(["batch", 3], FLOAT)
    head = LossHead(onnxblock.loss.L1Loss(), target_name="x")
    with onnxblock.base(base_model):
        head("x")
    model = head.to_model_proto()
    assert list(inputs_of(model)) == ["x"]
    (loss,) = single_thread_session(model).run(None, {"x": np.ones((2, 3), np.float32)})
    assert loss == 0.0


class TwoLosses(onnxblock.ForwardBlock):
    """MSE on one output against ``target1`` plus L1 on the other against ``target2``."""

    def __init__(self) -> None:
        super().__init__()
        self._mse = onnxblock.loss.MSELoss()
        self._l1 = onnxblock.loss.L1Loss(reduction="sum")
        self._add = onnxblock.blocks.Add()

    def build(self, output1: str, output2: str) -> str:
        return self._add(self._mse(output1, target_name="target1"), self._l1(output2, target_name="target2"))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_two_losses_with_distinct_target_names(dtype: Any) -> None:
    elem_type = ELEM_TYPE[dtype]
    base_model = make_model(
        {"x": (elem_type, ["batch", 3])},
        [helper.make_node("Mul", ["x", "two"], ["y1"]), helper.make_node("Neg", ["x"], ["y2"])],
        {"y1": (elem_type, ["batch", 3]), "y2": (elem_type, ["batch", 3])},
        initializers=[("two", np.array(2, dtype=dtype))],
    )
    head = TwoLosses()
    with onnxblock.base(base_model):
        head("y1", "y2")
    model = head.to_model_proto()
    inputs = inputs_of(model)
    assert list(inputs) == ["x", "target1", "target2"]
    for name in ("target1", "target2"):
        assert inputs[name].type.tensor_type.elem_type == elem_type
        assert dims_of(inputs[name]) == ["batch", 3]
    rng = np.random.default_rng(2)
    x, t1, t2 = rng.standard_normal((3, 5, 3)).astype(dtype)
    (loss,) = single_thread_session(model).run(None, {"x": x, "target1": t1, "target2": t2})
    assert_loss_close(loss, oracles.mse_loss(2 * x, t1) + oracles.l1_loss(-x, t2, "sum"), dtype)


# -------------------------------------------------------- opsets and shapes


OPSET_CASES = [
    Case("MSELoss", "regression"),
    Case("HuberLoss", "regression", {"delta": 0.5}),
    Case("CrossEntropyLoss", "ce", {"weight": W, "label_smoothing": 0.2}),
    Case("CrossEntropyLoss", "ce", {"label_smoothing": 0.2, "ignore_index": 1}, ("batch", "classes", "length")),
    Case("NLLLoss", "nll", {"weight": W}),
    Case("CrossEntropyLoss", "ce_probs", {"probabilities": True, "weight": W, "label_smoothing": 0.2}),
    Case("BCEWithLogitsLoss", "logits", {"pos_weight": POS_W}),
    Case("BCELoss", "probs"),
    Case("KLDivLoss", "kl"),
    Case("KLDivLoss", "kl", {"log_target": True}, ("batch", "k")),
]


@pytest.mark.parametrize("opset", [13, 15, 18, 21])
@pytest.mark.parametrize("case", OPSET_CASES, ids=lambda c: c.id)
def test_losses_build_and_run_on_every_supported_opset(case: Case, opset: int) -> None:
    """From opset 13 (the oldest supported) on: no operator form that a newer opset introduced."""
    rng = np.random.default_rng(opset)
    sizes = {"batch": 4, "classes": 3, "length": 2, "k": 5}
    shape = tuple(sizes[d] if isinstance(d, str) else d for d in case.shape)
    if case.family == "ce_probs":
        y = rng.uniform(-5, 0, shape)
        target = np.moveaxis(rng.dirichlet(np.ones(shape[1]), shape[:1] + shape[2:]), -1, 1)
    elif case.family in ("ce", "nll"):
        y = rng.uniform(-5, 0, shape)
        target = rng.integers(0, shape[1], shape[:1] + shape[2:]).astype(case.label_dtype)
        ignore = ignore_index_of(case)
        if ignore is not None:
            target.flat[0] = ignore
    else:
        y = rng.uniform(-3, 0, shape) if case.family == "kl" else rng.uniform(0, 1, shape)
        target = rng.uniform(-3, 0, shape) if case.kwargs.get("log_target") else rng.uniform(0, 1, shape)
    for reduction in case.reductions:
        model = build_loss_model(case.block(reduction), case.shape, DOUBLE, opset=opset)
        assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [opset]
        (loss,) = single_thread_session(model).run(None, {"x": y / 2, case.target_name: target})
        assert_loss_close(loss, oracle(case, reduction, y, target), np.float64)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("data_shape", [(4, 3), (2, 3, 5)], ids=["2d", "3d"])
def test_cross_entropy_with_weight_and_smoothing_on_scores_of_unknown_rank(
    reduction: str, data_shape: tuple[int, ...]
) -> None:
    """The class weights of the smoothing term go on axis 1 also when the rank is known only at run time."""
    loss = onnxblock.loss.CrossEntropyLoss(weight=W, reduction=reduction, ignore_index=0, label_smoothing=0.3)
    model = build_loss_model(loss, None, FLOAT)
    assert dims_of(inputs_of(model)["labels"]) is None
    rng = np.random.default_rng(3)
    y = rng.uniform(-4, 4, data_shape).astype(np.float32)
    labels = rng.integers(0, 3, data_shape[:1] + data_shape[2:]).astype(np.int64)
    labels.flat[0], labels.flat[-1] = 0, 1
    (actual,) = single_thread_session(model).run(None, {"x": y / 2, "labels": labels})
    expected = oracles.cross_entropy(y, labels, W, reduction, ignore_index=0, label_smoothing=0.3)
    assert_loss_close(actual, expected, np.float32)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("data_shape", [(4, 3), (2, 3, 5)], ids=["2d", "3d"])
def test_cross_entropy_with_probabilities_on_scores_of_unknown_rank(
    reduction: str, data_shape: tuple[int, ...]
) -> None:
    """The class weights go on axis 1 of the targets also when the rank is known only at run time."""
    loss = onnxblock.loss.CrossEntropyLoss(weight=W, reduction=reduction, label_smoothing=0.3, probabilities=True)
    model = build_loss_model(loss, None, FLOAT)
    rng = np.random.default_rng(4)
    y = rng.uniform(-4, 4, data_shape).astype(np.float32)
    targets = rng.dirichlet(np.ones(3), data_shape[:1] + data_shape[2:]).astype(np.float32)
    targets = np.moveaxis(targets, -1, 1)
    (actual,) = single_thread_session(model).run(None, {"x": y / 2, "labels": targets})
    expected = oracles.cross_entropy_with_probabilities(y, targets, W, reduction, label_smoothing=0.3)
    assert_loss_close(actual, expected, np.float32)


def test_cross_entropy_takes_an_existing_float_target_as_probabilities_as_torch_does() -> None:
    """A model input of the scores' float type given as the target is a distribution (mixup, distillation); the
    label's index to skip applies to labels only."""
    model = scaled_model(["batch", 3], FLOAT)
    model.graph.input.append(onnx.helper.make_tensor_value_info("soft", FLOAT, ["batch", 3]))
    with onnxblock.base(model) as builder:
        builder.set_outputs([onnxblock.loss.CrossEntropyLoss()("y", "soft")])
        built = builder.finalize()
    y = np.array([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0]], np.float32)
    soft = np.array([[0.7, 0.1, 0.2], [0.0, 0.5, 0.5]], np.float32)
    (actual,) = single_thread_session(built).run(None, {"x": y / 2, "soft": soft})
    assert_loss_close(actual, oracles.cross_entropy_with_probabilities(y, soft), np.float32)
    with pytest.raises(ValueError, match=r"ignore_index.* only with integer labels"):
        onnxblock.loss.CrossEntropyLoss(ignore_index=-100, probabilities=True)
    with pytest.raises(TypeError, match="probabilities must be None, True or False"):
        onnxblock.loss.CrossEntropyLoss(probabilities="yes")  # type: ignore[arg-type]


def test_a_target_that_is_another_output_of_the_model_is_said() -> None:
    """ONNX Runtime's default loss inputs, every output: ``MSELoss(a, b)`` of a model of two heads takes ``b``
    as the target of ``a``, and training pulls one toward the other with no labels."""
    model = make_model(
        {"x": (FLOAT, ["batch", 2])},
        [helper.make_node("Mul", ["x", "two"], ["a"]), helper.make_node("Neg", ["x"], ["b"])],
        {"a": (FLOAT, ["batch", 2]), "b": (FLOAT, ["batch", 2])},
        initializers=[("two", np.array(2, np.float32))],
    )
    with onnxblock.base(model), pytest.warns(onnxtrain.losses.ComputedTargetWarning, match=r"loss_input_names=\['a'\]"):
        onnxblock.loss.MSELoss()("a", "b")


# ------------------------------------------------------------ edge values


@pytest.mark.parametrize("smoothing", [0.0, 0.4])
@pytest.mark.parametrize("weight", [None, W], ids=["unweighted", "weighted"])
def test_mean_over_only_ignored_labels_is_nan_as_in_torch(weight: list[float] | None, smoothing: float) -> None:
    loss = onnxblock.loss.CrossEntropyLoss(weight=weight, label_smoothing=smoothing, ignore_index=-100)
    model = build_loss_model(loss, ["batch", 3], FLOAT)
    scores = np.zeros((2, 3), np.float32)
    (actual,) = single_thread_session(model).run(None, {"x": scores, "labels": np.full(2, -100, np.int64)})
    assert np.isnan(actual)
    assert np.isnan(oracles.cross_entropy(scores, np.full(2, -100), weight, label_smoothing=smoothing))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_bce_clamps_the_log_at_minus_100(dtype: Any) -> None:
    """Probabilities of exactly 0 and 1 give finite losses: ``-log`` is clamped at 100."""
    model = build_loss_model(onnxblock.loss.BCELoss(reduction="none"), ["batch", 2], ELEM_TYPE[dtype])
    p = np.array([[0.0, 1.0], [0.0, 1.0], [1.0, 0.0]], dtype)
    t = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]], dtype)
    (actual,) = single_thread_session(model).run(None, {"x": p / 2, "target": t})
    np.testing.assert_array_equal(actual, np.array([[100.0, 100.0], [0.0, 0.0], [50.0, 50.0]], dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_bce_with_logits_is_finite_for_large_logits(dtype: Any) -> None:
    model = build_loss_model(onnxblock.loss.BCEWithLogitsLoss(reduction="none"), ["batch", 2], ELEM_TYPE[dtype])
    x = np.array([[-200.0, 200.0], [-200.0, 200.0]], dtype)
    t = np.array([[1.0, 0.0], [0.0, 1.0]], dtype)
    (actual,) = single_thread_session(model).run(None, {"x": x / 2, "target": t})
    assert_loss_close(actual, oracles.binary_cross_entropy_with_logits(x, t, reduction="none"), dtype)
    np.testing.assert_array_equal(actual[0], [200.0, 200.0])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_kl_div_counts_zero_targets_as_zero(dtype: Any) -> None:
    """``0 * log 0 = 0``: a target of 0 adds nothing, even against a log-probability of -inf."""
    model = build_loss_model(onnxblock.loss.KLDivLoss(reduction="none"), ["batch", 3], ELEM_TYPE[dtype])
    log_q = np.log(np.array([[0.5, 0.5, 1e-3]], dtype))
    t = np.array([[0.5, 0.5, 0.0]], dtype)
    (actual,) = single_thread_session(model).run(None, {"x": log_q / 2, "target": t})
    np.testing.assert_array_equal(actual[0, 2], 0.0)
    assert_loss_close(actual, oracles.kl_div(log_q, t, "none"), dtype)
