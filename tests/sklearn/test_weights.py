"""``trainable_weights``: the initializers a model reads as weights, and the error that names the others."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxtrain.sklearn import (
    ConvergenceError,
    OrtGradientOptimizer,
    add_loss_output,
    get_train_initializer,
    trainable_weights,
)
from tests.helpers import FLOAT, make_model, session
from tests.sklearn.models import mlp

skl2onnx = pytest.importorskip("skl2onnx")
datasets = pytest.importorskip("sklearn.datasets")
linear_model = pytest.importorskip("sklearn.linear_model")
neural_network = pytest.importorskip("sklearn.neural_network")
pipeline = pytest.importorskip("sklearn.pipeline")
preprocessing = pytest.importorskip("sklearn.preprocessing")


@pytest.fixture(autouse=True)
def quiet_scikit_learn() -> Iterator[None]:
    """scikit-learn warns that its few-epoch fits have not converged: only the converted graphs matter here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="sklearn")
        yield


def iris() -> tuple[np.ndarray, np.ndarray]:
    x, y = datasets.load_iris(return_X_y=True)
    return x.astype(np.float32), y


def scaled_sgd_classifier(x: np.ndarray, y: np.ndarray) -> tuple[Any, onnx.ModelProto]:
    """StandardScaler + SGDClassifier(log_loss), fitted and in standard operators: the converter's constants
    (multiclass: ``negate``, ``unity``, ``num_classes``) and the scaler's ``Su_Subcst``, ``Di_Divcst`` are float
    initializers like ``coef`` and ``intercept``."""
    fitted = pipeline.make_pipeline(
        preprocessing.StandardScaler(), linear_model.SGDClassifier(loss="log_loss", random_state=0)
    ).fit(x, y)
    onx = skl2onnx.to_onnx(fitted, x[:1], black_op={"LinearClassifier", "Scaler"}, options={"zipmap": False})
    return fitted, onx


def test_converted_classifier_weights_leave_out_the_converters_constants() -> None:
    x, y = iris()
    _, onx = scaled_sgd_classifier(x, y)
    assert {"negate", "unity", "num_classes", "Su_Subcst", "Di_Divcst"} <= set(get_train_initializer(onx))
    assert trainable_weights(onx) == ["coef", "intercept"]
    assert trainable_weights(add_loss_output(onx, score_name="log", output_index=1)) == ["coef", "intercept"]


def test_mlp_weights_are_every_layer() -> None:
    x, y = iris()
    fitted = neural_network.MLPClassifier((5,), max_iter=5, random_state=0).fit(x, y)
    onx = skl2onnx.to_onnx(fitted, x[:1], options={"zipmap": False})
    assert trainable_weights(onx) == ["coefficient", "intercepts", "coefficient1", "intercepts1"]
    assert trainable_weights(mlp(2, "softmax")) == ["W1", "b1", "W2", "b2"]


def test_weights_of_gemm_conv_and_normalization() -> None:
    """Gemm's operands, a Conv kernel and bias, a normalization's scale and bias (not its running mean and
    variance), an embedding table; not a divisor, not an integer table."""
    rng = np.random.default_rng(0)
    f = np.float32
    initializers = [
        ("kernel", rng.normal(size=(2, 1, 3, 3)).astype(f)),
        ("kernel_bias", np.zeros(2, f)),
        ("bn_scale", np.ones(2, f)),
        ("bn_bias", np.zeros(2, f)),
        ("bn_mean", np.zeros(2, f)),
        ("bn_var", np.ones(2, f)),
        ("divisor", np.full((), 2, f)),
        ("gemm_b", rng.normal(size=(8, 3)).astype(f)),
        ("gemm_c", np.zeros(3, f)),
        ("table", rng.normal(size=(5, 3)).astype(f)),
        ("ids", np.array([0, 4], np.int64)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "kernel", "kernel_bias"], ["c"]),
        helper.make_node("BatchNormalization", ["c", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["n"]),
        helper.make_node("Div", ["n", "divisor"], ["d"]),
        helper.make_node("Flatten", ["d"], ["flat"]),
        helper.make_node("Gemm", ["flat", "gemm_b", "gemm_c"], ["g"]),
        helper.make_node("Gather", ["table", "ids"], ["e"]),
        helper.make_node("Add", ["g", "e"], ["y"]),
    ]
    model = make_model({"x": (FLOAT, [2, 1, 4, 4])}, nodes, ["y"], initializers)
    assert trainable_weights(model) == ["kernel", "kernel_bias", "bn_scale", "bn_bias", "gemm_b", "gemm_c", "table"]


def test_training_the_converters_constants_fails_with_an_error_that_names_them() -> None:
    """warm_start=False draws them anew (zeros for vectors and scalars): the scaler divides by zero. The error
    says which trained names are constants, not the learning rate."""
    x, y = iris()
    _, onx = scaled_sgd_classifier(x, y)
    loss = add_loss_output(onx, score_name="log", output_index=1)
    trainer = OrtGradientOptimizer(loss, list(get_train_initializer(onx)), max_iter=5, random_state=0)
    with pytest.raises(ConvergenceError) as raised:
        trainer.fit(x, y)
    message = str(raised.value)
    for name in ("negate", "unity", "num_classes", "Su_Subcst", "Di_Divcst"):
        assert repr(name) in message
    assert "'coef'" not in message and "'intercept'" not in message
    assert "leave them out of weights_to_train" in message
    assert "trainable_weights(model)" in message
    assert "lower the learning rate" not in message


def test_the_trainable_weights_of_a_converted_classifier_train() -> None:
    """From new weights, 10 iterations reach scikit-learn's accuracy within 0.02 (on the training data)."""
    x, y = datasets.load_breast_cancer(return_X_y=True)
    x = x.astype(np.float32)
    fitted, onx = scaled_sgd_classifier(x, y)
    loss = add_loss_output(onx, score_name="log", output_index=1)
    trainer = OrtGradientOptimizer(loss, trainable_weights(onx), max_iter=10, learning_rate=0.1, random_state=0)
    trainer.fit(x, y)
    labels = session(trainer.get_trained_onnx(onx)).run(None, {"X": x})[0]
    assert abs(np.mean(labels == y) - fitted.score(x, y)) <= 0.02
