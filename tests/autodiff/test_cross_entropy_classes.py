"""Cross-entropy's gradient on both sides of SCATTERED_TARGET_CLASSES: with a one-hot below it, and the target's
``-1`` written into the softmax from it on (no ``[N, classes]`` one-hot), the same values either way."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from onnxtrain import artifacts
from onnxtrain.autodiff.rules.losses import SCATTERED_TARGET_CLASSES
from onnxtrain.sessions import inference_session
from tests.helpers import FLOAT, make_model

FEATURES = 3


def _training_model(classes: int) -> tuple:
    rng = np.random.default_rng(0)
    weight = (rng.normal(size=(FEATURES, classes)) * 0.5).astype(np.float32)
    model = make_model(
        {"x": (FLOAT, ["n", FEATURES])},
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        {"y": (FLOAT, ["n", classes])},
        [("w", weight)],
    )
    built = artifacts.build_artifacts(model, ["w"], [], artifacts.LossType.CrossEntropyLoss)
    training = artifacts.remove_gradient_accumulation(built.training_model, ["w"]).model
    return training, weight


@pytest.mark.parametrize(
    ("classes", "form"),
    [
        (SCATTERED_TARGET_CLASSES - 1, "OneHot"),
        (SCATTERED_TARGET_CLASSES, "ScatterElements"),
        (3 * SCATTERED_TARGET_CLASSES, "ScatterElements"),
    ],
)
def test_the_gradient_is_softmax_minus_the_one_hot_over_n(classes: int, form: str) -> None:
    training, weight = _training_model(classes)
    ops = {node.op_type for node in training.graph.node}
    assert form in ops and ({"OneHot", "ScatterElements"} - {form}).isdisjoint(ops)
    width = weight.shape[1]
    rng = np.random.default_rng(1)
    for rows in (1, 7):
        x = rng.normal(size=(rows, FEATURES)).astype(np.float32)
        labels = rng.integers(0, width, rows)
        labels[0] = width - 1  # the last class too
        session = inference_session(training.SerializeToString())
        names = [value.name for value in session.get_inputs()]
        feeds = dict(zip(names, [x, labels, weight], strict=True))
        loss, grad = session.run(None, feeds)
        scores = x.astype(np.float64) @ weight.astype(np.float64)
        probs = np.exp(scores - scores.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        expected_loss = -np.log(probs[np.arange(rows), labels]).mean()
        onehot = np.eye(width)[labels]
        expected = x.astype(np.float64).T @ ((probs - onehot) / rows)
        np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
        np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-7)


def test_a_class_count_known_only_at_run_time_takes_the_one_hot() -> None:
    """``y = x * w`` with ``x: [n, classes]``: the class count is symbolic, so the size threshold cannot apply."""
    model = make_model(
        {"x": (FLOAT, ["n", "classes"])},
        [helper.make_node("Mul", ["x", "w"], ["y"])],
        {"y": (FLOAT, ["n", "classes"])},
        [("w", np.array([0.7], np.float32))],
    )
    built = artifacts.build_artifacts(model, ["w"], [], artifacts.LossType.CrossEntropyLoss)
    training = artifacts.remove_gradient_accumulation(built.training_model, ["w"]).model
    assert "ScatterElements" not in {node.op_type for node in training.graph.node}
    rng = np.random.default_rng(2)
    for classes in (5, SCATTERED_TARGET_CLASSES + 1):
        x = rng.normal(size=(4, classes)).astype(np.float32)
        labels = rng.integers(0, classes, 4)
        session = inference_session(training.SerializeToString())
        names = [value.name for value in session.get_inputs()]
        _, grad = session.run(None, dict(zip(names, [x, labels, np.array([0.7], np.float32)], strict=True)))
        scores = x.astype(np.float64) * 0.7
        probs = np.exp(scores - scores.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        expected = (((probs - np.eye(classes)[labels]) / 4) * x).sum()
        np.testing.assert_allclose(grad, [expected], rtol=1e-4)
