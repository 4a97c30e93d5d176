"""``add_loss_output``, ``penalty_loss_onnx`` and ``get_train_initializer``: values against NumPy oracles,
every parameter's gradient against central finite differences in float64, and the errors."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

from onnxtrain.artifacts import build_artifacts
from onnxtrain.sklearn import add_loss_output, get_train_initializer, penalty_loss_onnx
from onnxtrain.training import Module, TrainingState
from tests.helpers import DOUBLE, FLOAT, INT64, make_model, run_model
from tests.helpers import session as session_of
from tests.sklearn.models import N_FEATURES, forward, mlp, weights_of

PARAMETERS = ["W1", "b1", "W2", "b2"]


@dataclass(frozen=True)
class Case:
    """A score on an MLP head: ``add_loss_output(mlp(...), **kwargs)``."""

    id: str
    n_outputs: int
    head: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def classes(self) -> int | None:
        """Number of label values for the log score (``None``: a float label)."""
        if self.kwargs.get("score_name") != "log":
            return None
        return max(self.n_outputs, 2)


CASES = [
    Case("l2", 2, "none", {"score_name": "squared_error"}),
    Case("l2-alias-weighted", 2, "none", {"score_name": "l2", "weight_name": "weight"}),
    Case("l1", 1, "none", {"score_name": "absolute_error", "weight_name": "weight"}),
    Case("l1-alias", 2, "none", {"score_name": "l1"}),
    Case("elastic", 2, "none", {"score_name": "elastic", "l1_weight": 0.3, "l2_weight": 1.7}),
    Case("elastic-defaults-penalised", 1, "none", {"score_name": "elastic", "weight_name": "weight",
                                                   "penalty": {"W1": {"l1": 0.2, "l2": 0.05}, "b2": 0.5}}),
    Case("log-multiclass", 3, "softmax", {"score_name": "log", "weight_name": "weight"}),
    Case("log-binary-two-columns", 2, "softmax", {"score_name": "log", "penalty": {"W2": {"l1": 0.1}}}),
    Case("log-binary-one-column", 1, "sigmoid", {"score_name": "log", "eps": 1e-4}),
    Case("penalty-l2-float", 2, "none", {"penalty": {"W1": 0.25, "W2": {"l2": 0.5}}}),
]  # fmt: skip
CASES_BY_ID = {case.id: case for case in CASES}


def oracle(case: Case, weights: dict[str, np.ndarray], x: np.ndarray, label: np.ndarray, w: np.ndarray | None) -> float:
    """The loss of the module docstring of ``onnxtrain.sklearn.loss_output``, in NumPy."""
    kwargs = case.kwargs
    y = forward(weights, x, case.head)
    score = kwargs.get("score_name", "squared_error")
    if score == "log":
        eps = kwargs.get("eps", 1e-6)
        p = np.clip(y, eps, 1 - eps)
        if y.shape[1] == 1:
            p1 = p[:, 0]
            per_sample = -(label * np.log(p1) + (1 - label) * np.log(1 - p1))
        else:
            p = p / p.sum(axis=1, keepdims=True)
            per_sample = -np.log(p[np.arange(len(label)), label])
    else:
        d = y - label
        if score in ("squared_error", "l2"):
            per_sample = (d * d).sum(axis=1)
        elif score in ("absolute_error", "l1"):
            per_sample = np.abs(d).sum(axis=1)
        else:
            per_sample = (kwargs.get("l1_weight", 0.5) * np.abs(d) + kwargs.get("l2_weight", 0.5) * d * d).sum(axis=1)
    total = float(((w if w is not None else 1.0) * per_sample).sum())
    for name, spec in (kwargs.get("penalty") or {}).items():
        spec = spec if isinstance(spec, dict) else {"l2": spec}
        total += spec.get("l1", 0.0) * np.abs(weights[name]).sum() + spec.get("l2", 0.0) * (weights[name] ** 2).sum()
    return total


def loss_model(case: Case) -> onnx.ModelProto:
    return add_loss_output(mlp(case.n_outputs, case.head), **case.kwargs)


def draw_batch(data: st.DataObject, case: Case) -> dict[str, np.ndarray]:
    n = data.draw(st.integers(1, 6), label="batch")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    feeds = {"x": rng.normal(size=(n, N_FEATURES))}
    if case.classes is None:
        feeds["label"] = rng.normal(size=(n, case.n_outputs))
    else:
        shape = (n, 1) if case.n_outputs == 1 else (n,)
        feeds["label"] = rng.integers(0, case.classes, size=shape).astype(np.int64)
    if case.kwargs.get("weight_name"):
        feeds["weight"] = rng.uniform(0.0, 2.0, size=n)
    return feeds


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_loss_value_matches_oracle(case: Case) -> None:
    model = loss_model(case)
    assert [o.name for o in model.graph.output] == ["loss", "y"]
    session = session_of(model)
    weights = weights_of(mlp(case.n_outputs, case.head))

    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        feeds = draw_batch(data, case)
        loss, y = session.run(None, feeds)
        assert loss.shape == ()
        np.testing.assert_allclose(y, forward(weights, feeds["x"], case.head), rtol=1e-12)
        label = feeds["label"].reshape(-1) if case.classes is not None else feeds["label"]
        np.testing.assert_allclose(loss, oracle(case, weights, feeds["x"], label, feeds.get("weight")), rtol=1e-10)

    check()


@functools.cache
def _training(case_id: str) -> tuple[onnx.ModelProto, onnx.ModelProto, ort.InferenceSession]:
    case = CASES_BY_ID[case_id]
    built = build_artifacts(loss_model(case), PARAMETERS, loss=None, loss_input_names=["loss"])
    session = session_of(built.eval_model)
    return built.training_model, built.eval_model, session


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_every_parameter_gradient_matches_finite_differences(case: Case) -> None:
    """d loss / d W1, b1, W2, b2 from the training model against central differences of the eval model."""
    training, _, eval_session = _training(case.id)
    base_weights = weights_of(mlp(case.n_outputs, case.head))

    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        feeds = draw_batch(data, case)
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="direction"))
        weights = {name: value + rng.normal(size=value.shape) * 0.3 for name, value in base_weights.items()}
        state = TrainingState(
            build_artifacts(loss_model(case), PARAMETERS, loss=None, loss_input_names=["loss"]).checkpoint
        )
        for name, value in weights.items():
            state.parameters[name] = value
        module = Module(training, state)
        module(**feeds)
        for name in PARAMETERS:
            direction = rng.normal(size=weights[name].shape)
            h = 1e-5

            def loss_at(step: float, name: str = name, direction: np.ndarray = direction) -> float:
                return float(
                    eval_session.run(["loss"], {**feeds, **weights, name: weights[name] + step * direction})[0]
                )

            numeric = (loss_at(h) - loss_at(-h)) / (2 * h)
            analytic = float((state.parameters[name].grad * direction).sum())
            np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-7, err_msg=name)

    check()


def test_weights_broadcast_over_every_axis_but_the_first() -> None:
    """A weight scales all of its sample's outputs (onnxcustom multiplied [N, k] by [N], a mistake)."""
    case = CASES_BY_ID["l2-alias-weighted"]
    model = loss_model(case)
    x = np.arange(6, dtype=np.float64).reshape(2, 3) / 5
    label = np.zeros((2, 2))
    (loss, _), (loss_first, _) = (
        run_model(model, {"x": x, "label": label, "weight": w}) for w in (np.array([1.0, 1.0]), np.array([1.0, 0.0]))
    )
    y = forward(weights_of(mlp(2, "none")), x, "none")
    np.testing.assert_allclose(loss_first, (y[0] ** 2).sum(), rtol=1e-12)
    np.testing.assert_allclose(loss, (y**2).sum(), rtol=1e-12)


def test_float32_model_keeps_float32_and_the_input_model_is_unchanged() -> None:
    model = mlp(2, "softmax", dtype=FLOAT)
    before = model.SerializeToString()
    loss = add_loss_output(model, score_name="log", weight_name="w", penalty={"W1": 0.1})
    assert model.SerializeToString() == before
    types = {value.name: value.type.tensor_type.elem_type for value in loss.graph.input}
    assert types == {"x": FLOAT, "label": INT64, "w": FLOAT}
    assert loss.graph.output[0].type.tensor_type.elem_type == FLOAT


def test_output_chosen_by_index_or_name_and_unused_branches_removed() -> None:
    """A classifier-like model with a label output named ``label`` (as skl2onnx writes them): the model's
    own ``label`` is renamed out of the way, its branch is dropped, and the scored output is kept."""
    base = mlp(3, "softmax")
    base.graph.node.append(helper.make_node("ArgMax", ["y"], ["label"], axis=1, keepdims=0))
    base.graph.output.insert(0, helper.make_tensor_value_info("label", INT64, ["batch"]))
    for output_index in (1, "y", -1):
        model = add_loss_output(base, score_name="log", output_index=output_index)
        assert [o.name for o in model.graph.output] == ["loss", "y"]
        assert "ArgMax" not in {node.op_type for node in model.graph.node}
        label_input = next(value for value in model.graph.input if value.name == "label")
        assert label_input.type.tensor_type.elem_type == INT64
    x = np.ones((2, N_FEATURES))
    loss, y = run_model(model, {"x": x, "label": np.array([0, 2])})
    np.testing.assert_allclose(loss, -np.log(y[0, 0]) - np.log(y[1, 2]), rtol=1e-9)


def test_penalty_on_a_graph_input_and_on_an_intermediate_value() -> None:
    model = add_loss_output(mlp(1, "none"), penalty={"x": {"l1": 1.0}, "h": {"l2": 2.0}})
    x = np.array([[1.0, -2.0, 0.5]])
    loss, y = run_model(model, {"x": x, "label": np.zeros((1, 1))})
    weights = weights_of(mlp(1, "none"))
    h = np.tanh(x @ weights["W1"] + weights["b1"])
    np.testing.assert_allclose(loss, (y**2).sum() + np.abs(x).sum() + 2.0 * (h**2).sum(), rtol=1e-12)


def test_penalty_loss_onnx_returns_initializers_and_nodes_computing_the_penalty() -> None:
    for l1, l2, expected in ((0.5, None, 0.5 * 7.0), (None, 0.25, 0.25 * 21.0), (0.5, 0.25, 0.5 * 7 + 0.25 * 21)):
        initializers, nodes = penalty_loss_onnx("coef", np.float32, l1=l1, l2=l2, existing_names={"l1", "l2"})
        produced = {name for node in nodes for name in node.output}
        assert not produced & {"coef", "l1", "l2"}
        assert not {t.name for t in initializers} & {"l1", "l2"}
        graph = helper.make_graph(
            nodes, "penalty", [helper.make_tensor_value_info("coef", FLOAT, [2, 2])],
            [helper.make_tensor_value_info(nodes[-1].output[0], FLOAT, [])], initializers,
        )  # fmt: skip
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        (value,) = run_model(model, {"coef": np.array([[1.0, -2.0], [4.0, 0.0]], np.float32)})
        np.testing.assert_allclose(value, expected, rtol=1e-6)
    with pytest.raises(ValueError, match="l1 or l2 above 0"):
        penalty_loss_onnx("coef", np.float32)


def test_get_train_initializer_lists_float_initializers_in_order() -> None:
    model = make_model(
        {"x": (FLOAT, [2])},
        [helper.make_node("Add", ["x", "a"], ["y"])],
        ["y"],
        [("a", np.ones(2, np.float32)), ("shape", np.array([2], np.int64)), ("d", np.zeros(3)),
         ("h", np.ones(1, np.float16))],
    )  # fmt: skip
    found = get_train_initializer(model)
    assert list(found) == ["a", "d", "h"]
    value, tensor = found["d"]
    np.testing.assert_array_equal(value, np.zeros(3))
    assert tensor.name == "d"


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"score_name": "hinge"}, ValueError, r"score_name='hinge'.*squared_error"),
        ({"score_name": "l2", "l1_weight": 0.5}, TypeError, r"unexpected arguments \['l1_weight'\]"),
        ({"score_name": "log", "eps": 0.7}, ValueError, "eps must be in"),
        ({"score_name": "elastic", "l1_weight": float("nan")}, ValueError, "l1_weight must be a finite number"),
        ({"penalty": {"W9": 0.1}}, ValueError, "penalty names 'W9'"),
        ({"penalty": {"W1": {"l3": 0.1}}}, ValueError, r"keys \['l3'\]"),
        ({"penalty": {"W1": -1.0}}, ValueError, "l2 must be a number >= 0"),
        ({"penalty": [0.1]}, TypeError, "penalty must be a dict"),
        ({"output_index": 3}, ValueError, "out of range"),
        ({"output_index": "z"}, ValueError, r"not an output of the model; its outputs are \['y'\]"),
        ({"label_name": "y"}, ValueError, "label_name='y' is already the scored output"),
        ({"loss_name": "W1"}, ValueError, "loss_name='W1' is already an input or initializer"),
        ({"weight_name": "label"}, ValueError, "new names must differ"),
    ],
)
def test_bad_arguments_are_refused_with_a_clear_message(kwargs: dict[str, Any], error: type, match: str) -> None:
    model = mlp(2, "none")
    before = model.SerializeToString()
    with pytest.raises(error, match=match):
        add_loss_output(model, **kwargs)
    assert model.SerializeToString() == before


def test_several_outputs_need_output_index() -> None:
    model = mlp(2, "none")
    model.graph.output.append(helper.make_tensor_value_info("h", DOUBLE, ["batch", 4]))
    with pytest.raises(ValueError, match=r"2 outputs \['y', 'h'\]; pass output_index"):
        add_loss_output(model)


def test_non_tensor_and_integer_outputs_are_refused_naming_the_cure() -> None:
    """ZipMap's sequence of maps: the error names skl2onnx's zipmap option; integer labels: the probabilities."""
    model = make_model(
        {"x": (FLOAT, ["batch", 2])},
        [helper.make_node("ArgMax", ["x"], ["label"], axis=1, keepdims=0),
         helper.make_node("ZipMap", ["x"], ["probabilities"], domain="ai.onnx.ml", classlabels_int64s=[0, 1])],
        {"label": (INT64, ["batch"]),
         "probabilities": (FLOAT, None)},
        extra_opsets={"ai.onnx.ml": 1},
    )  # fmt: skip
    model.graph.output[1].type.CopyFrom(
        helper.make_sequence_type_proto(helper.make_map_type_proto(INT64, helper.make_tensor_type_proto(FLOAT, [])))
    )
    with pytest.raises(ValueError, match=r"ZipMap.*options=\{'zipmap': False\}"):
        add_loss_output(model, score_name="log", output_index="probabilities")
    with pytest.raises(ValueError, match="score the probabilities"):
        add_loss_output(model, score_name="log", output_index="label")
    with pytest.raises(ValueError, match=r"'output_probability' is not an output.*options=\{'zipmap': False\}"):
        add_loss_output(model, score_name="log", output_index="output_probability")


def test_log_score_needs_probabilities_of_rank_one_or_two() -> None:
    model = make_model(
        {"x": (FLOAT, [2, 2, 2])}, [helper.make_node("Sigmoid", ["x"], ["y"])], {"y": (FLOAT, [2, 2, 2])}
    )
    with pytest.raises(ValueError, match=r"shape \[N, C\] or \[N\]"):
        add_loss_output(model, score_name="log")
