"""scikit-learn models converted with skl2onnx, trained with onnxtrain, land where scikit-learn's own fit lands.

Each model is fitted by scikit-learn, converted, re-initialised (``warm_start=False``) and trained again by
``OrtGradientOptimizer`` with the same architecture, optimizer and epochs; the comparison is on held-out
data. Converted models whose operators have no gradient get an error naming the converter option to use.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from onnxtrain.sklearn import LearningRateSGD, OrtGradientOptimizer, add_loss_output, get_train_initializer
from tests.helpers import session

skl2onnx = pytest.importorskip("skl2onnx")
datasets = pytest.importorskip("sklearn.datasets")
linear_model = pytest.importorskip("sklearn.linear_model")
metrics = pytest.importorskip("sklearn.metrics")
model_selection = pytest.importorskip("sklearn.model_selection")
neural_network = pytest.importorskip("sklearn.neural_network")
pipeline = pytest.importorskip("sklearn.pipeline")
preprocessing = pytest.importorskip("sklearn.preprocessing")


@pytest.fixture(autouse=True)
def quiet_scikit_learn() -> Iterator[None]:
    """scikit-learn warns that its few-epoch MLPs have not converged: the comparison is at equal epochs."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="sklearn")
        yield


def predict(model: Any, x: np.ndarray, output: int = 0) -> np.ndarray:
    return session(model).run(None, {"X": x})[output]


def regression(n: int = 500, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    x, y = datasets.make_regression(n, n_features=5, noise=1.0, random_state=seed)
    return x.astype(np.float32), y.astype(np.float32)


@pytest.mark.parametrize("estimator", ["LinearRegression", "SGDRegressor"])
def test_linear_models_reach_the_closed_form(estimator: str) -> None:
    """Full-batch SGD on the squared error: coefficients within 1e-3 relative of the least-squares solution."""
    x, y = regression()
    closed_form = linear_model.LinearRegression().fit(x, y)
    fitted = getattr(linear_model, estimator)().fit(x, y)
    onx = skl2onnx.to_onnx(fitted, x[:1], black_op={"LinearRegressor"})
    trainer = OrtGradientOptimizer(
        add_loss_output(onx), ["coef", "intercept"], max_iter=200, batch_size=len(x),
        learning_rate=LearningRateSGD(0.1, learning_rate="constant"), random_state=0,
    ).fit(x, y)  # fmt: skip
    state = trainer.get_state()
    np.testing.assert_allclose(state["coef"].ravel(), closed_form.coef_, rtol=1e-3)
    np.testing.assert_allclose(state["intercept"], closed_form.intercept_, atol=1e-3 * np.abs(closed_form.coef_).max())
    np.testing.assert_allclose(
        predict(trainer.get_trained_onnx(onx), x).ravel(), closed_form.predict(x), rtol=1e-3, atol=0.05
    )


def test_mlp_regressor_scores_as_scikit_learn() -> None:
    x, y = datasets.make_regression(600, n_features=8, noise=5, random_state=0)
    x, y = x.astype(np.float32), (y / y.std()).astype(np.float32)
    x_train, x_test, y_train, y_test = model_selection.train_test_split(x, y, random_state=0)
    reference = neural_network.MLPRegressor(
        hidden_layer_sizes=(32,), max_iter=60, batch_size=32, learning_rate_init=1e-2, random_state=0
    ).fit(x_train, y_train)
    onx = skl2onnx.to_onnx(reference, x_train[:1])
    trainer = OrtGradientOptimizer(
        add_loss_output(onx), list(get_train_initializer(onx)), max_iter=60, batch_size=32,
        training_optimizer_name="Adam", learning_rate=LearningRateSGD(1e-2, learning_rate="constant"), random_state=0,
    ).fit(x_train, y_train)  # fmt: skip
    ours = metrics.r2_score(y_test, predict(trainer.get_trained_onnx(onx), x_test).ravel())
    theirs = metrics.r2_score(y_test, reference.predict(x_test))
    assert abs(ours - theirs) <= 0.02, (ours, theirs)
    assert trainer.train_losses_[-1] < trainer.train_losses_[0] / 20


def test_mlp_classifier_scores_as_scikit_learn() -> None:
    digits = datasets.load_digits()
    x, y = (digits.data / 16).astype(np.float32), digits.target
    x_train, x_test, y_train, y_test = model_selection.train_test_split(x, y, random_state=0)
    reference = neural_network.MLPClassifier(
        hidden_layer_sizes=(32,), max_iter=40, batch_size=32, learning_rate_init=1e-3, random_state=0
    ).fit(x_train, y_train)
    onx = skl2onnx.to_onnx(reference, x_train[:1], options={"zipmap": False})
    loss = add_loss_output(onx, score_name="log", output_index="probabilities")
    trainer = OrtGradientOptimizer(
        loss, list(get_train_initializer(onx)), max_iter=40, batch_size=32, training_optimizer_name="Adam",
        learning_rate=LearningRateSGD(1e-3, learning_rate="constant"), random_state=0,
    ).fit(x_train, y_train)  # fmt: skip
    labels, probabilities = (predict(trainer.get_trained_onnx(onx), x_test, i) for i in (0, 1))
    ours = metrics.accuracy_score(y_test, labels)
    theirs = reference.score(x_test, y_test)
    assert abs(ours - theirs) <= 0.02, (ours, theirs)
    np.testing.assert_array_equal(labels, probabilities.argmax(axis=1))
    assert metrics.log_loss(y_test, probabilities) < 0.2


def test_logistic_regression_with_the_log_loss() -> None:
    """skl2onnx writes a binary LogisticRegression as Sigmoid over two columns of 'coef', normalised; trained
    with the log loss and an L2 penalty it predicts as scikit-learn's (accuracy and log loss within 0.02)."""
    x, y = datasets.load_breast_cancer(return_X_y=True)
    x = ((x - x.mean(axis=0)) / x.std(axis=0)).astype(np.float32)
    x_train, x_test, y_train, y_test = model_selection.train_test_split(x, y, random_state=0)
    reference = linear_model.LogisticRegression(C=1.0).fit(x_train, y_train)
    onx = skl2onnx.to_onnx(reference, x_train[:1], black_op={"LinearClassifier"}, options={"zipmap": False})
    loss = add_loss_output(onx, score_name="log", output_index="probabilities", penalty={"coef": 0.25})
    trainer = OrtGradientOptimizer(
        loss, ["coef", "intercept"], max_iter=100, batch_size=32,
        learning_rate=LearningRateSGD(0.1, learning_rate="constant"), random_state=0,
    ).fit(x_train, y_train)  # fmt: skip
    labels, probabilities = (predict(trainer.get_trained_onnx(onx), x_test, i) for i in (0, 1))
    assert abs(metrics.accuracy_score(y_test, labels) - reference.score(x_test, y_test)) <= 0.02
    assert (
        abs(metrics.log_loss(y_test, probabilities) - metrics.log_loss(y_test, reference.predict_proba(x_test))) <= 0.02
    )


# ------------------------------------------------------------------ untrainable conversions


def test_default_linear_regression_conversion_names_black_op() -> None:
    x, y = regression(50)
    onx = skl2onnx.to_onnx(linear_model.LinearRegression().fit(x, y), x[:1])
    trainer = OrtGradientOptimizer(add_loss_output(onx), ["coef", "intercept"], max_iter=1)
    with pytest.raises(
        ValueError, match=r"'coef'.*LinearRegressor \(ai.onnx.ml\): to_onnx\(model, X, black_op=\{'LinearRegressor'\}\)"
    ):
        trainer.fit(x, y)


def test_default_logistic_regression_conversion_names_the_options() -> None:
    x, y = datasets.make_classification(60, n_features=4, random_state=0)
    x = x.astype(np.float32)
    fitted = linear_model.LogisticRegression().fit(x, y)
    with pytest.raises(ValueError, match=r"ZipMap.*options=\{'zipmap': False\}"):
        add_loss_output(skl2onnx.to_onnx(fitted, x[:1]), score_name="log", output_index=1)
    onx = skl2onnx.to_onnx(fitted, x[:1], options={"zipmap": False})
    loss = add_loss_output(onx, score_name="log", output_index="probabilities")
    with pytest.raises(ValueError, match=r"LinearClassifier \(ai.onnx.ml\): .*black_op=\{'LinearClassifier'\}"):
        OrtGradientOptimizer(loss, ["coef"], max_iter=1).fit(x, y)


def test_tree_models_are_reported_as_not_differentiable() -> None:
    tree = pytest.importorskip("sklearn.tree")
    x, y = regression(50)
    onx = skl2onnx.to_onnx(tree.DecisionTreeRegressor(max_depth=2).fit(x, y), x[:1])
    with pytest.raises(TypeError, match=r"TreeEnsemble\w* \(ai.onnx.ml\) is piecewise constant.*no gradient"):
        OrtGradientOptimizer(add_loss_output(onx), [], max_iter=1).fit(x, y)


def test_a_scaler_kept_as_fitted_names_black_op_to_train_its_values() -> None:
    """A pipeline's ai.onnx.ml Scaler trains the layers after it; naming a value it would have with
    black_op={'Scaler'} says so and names the option."""
    x, y = datasets.make_classification(60, n_features=4, random_state=0)
    x = x.astype(np.float32)
    fitted = pipeline.make_pipeline(preprocessing.StandardScaler(), linear_model.LogisticRegression()).fit(x, y)
    onx = skl2onnx.to_onnx(fitted, x[:1], black_op={"LinearClassifier"}, options={"zipmap": False})
    loss = add_loss_output(onx, score_name="log", output_index=1)
    with pytest.raises(
        ValueError, match=r"Scaler \(ai.onnx.ml\): its offset and scale stay as fitted.*black_op=\{'Scaler'\}"
    ):
        OrtGradientOptimizer(loss, ["coef", "Su_Subcst"], max_iter=1).fit(x, y)
