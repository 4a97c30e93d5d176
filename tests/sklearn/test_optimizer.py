"""``OrtGradientOptimizer``: the fit loop's arithmetic against NumPy, validation, sample weights, warm start,
state, divergence, early stopping, scikit-learn's protocol and the errors."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnxtrain import optim
from onnxtrain.optim import reference
from onnxtrain.sklearn import (
    ConvergenceError,
    LearningRateSGD,
    LearningRateSGDNesterov,
    OrtGradientOptimizer,
    add_loss_output,
)
from tests.helpers import DOUBLE, FLOAT, make_model, run_model

N, D = 64, 3
TRUE_W = np.array([[1.5], [-2.0], [0.5]])
TRUE_B = 0.75


def linear(dtype: int = DOUBLE) -> onnx.ModelProto:
    """``y = x @ coef + intercept`` with zero weights (the names skl2onnx gives a linear regression)."""
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    return make_model(
        {"X": (dtype, ["batch", D])},
        [helper.make_node("MatMul", ["X", "coef"], ["xw"]), helper.make_node("Add", ["xw", "intercept"], ["variable"])],
        {"variable": (dtype, ["batch", 1])},
        [("coef", np.zeros((D, 1), np_dtype)), ("intercept", np.zeros(1, np_dtype))],
    )


def data(n: int = N, noise: float = 0.1, seed: int = 0, dtype: Any = np.float64) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, D))
    y = (x @ TRUE_W).ravel() + TRUE_B + noise * rng.normal(size=n)
    return x.astype(dtype), y.astype(dtype)


def least_squares(x: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
    """``[coef..., intercept]`` minimising ``sum w (x coef + b - y)^2``."""
    design = np.hstack([x, np.ones((len(x), 1))]).astype(np.float64)
    root = np.sqrt(np.ones(len(x)) if w is None else w)
    return np.linalg.lstsq(design * root[:, None], y * root, rcond=None)[0]


def numpy_fit(
    x: np.ndarray,
    y: np.ndarray,
    iterations: int,
    rates: list[float],
    update: Any,
    batch_size: int = N,
    random_state: int | None = None,
) -> tuple[dict[str, np.ndarray], list[float]]:
    """Training of :func:`linear` on the squared error's mean over each batch, with ``update(p, g, states, lr,
    step)``: one batch per iteration, or ``batch_size`` rows at a time in the order ``fit`` draws from
    ``random_state`` (a permutation per iteration), the last batch shorter. The parameters, and each
    iteration's squared error per row, each batch's before its step."""
    params = {"coef": np.zeros((D, 1)), "intercept": np.zeros(1)}
    states: dict[str, list[np.ndarray]] = {name: [] for name in params}
    rng = np.random.default_rng(random_state)
    step, losses = 0, []
    for iteration in range(iterations):
        order = rng.permutation(len(x))
        lr = float(np.float32(rates[iteration]))  # the optimizer model's learning rate is a float32 input
        losses.append(0.0)
        for start in range(0, len(x), batch_size):
            rows = order[start : start + batch_size]
            residual = x[rows] @ params["coef"] + params["intercept"] - y[rows, None]
            losses[-1] += float(np.sum(residual**2)) / len(x)
            grads = {"coef": 2 * x[rows].T @ residual / len(rows), "intercept": 2 * residual.mean(axis=0)}
            step += 1
            for name in params:
                params[name], states[name] = update(params[name], grads[name], states[name], lr, step)
    return params, losses


def sgd(momentum: float = 0.0, nesterov: bool = False) -> Any:
    def update(p: np.ndarray, g: np.ndarray, s: list[np.ndarray], lr: float, step: int) -> Any:
        return reference.sgd_step(p, g, s or ([np.zeros_like(p)] if momentum else []), lr=lr, step=step,
                                  momentum=momentum, nesterov=nesterov)  # fmt: skip

    return update


def adam(p: np.ndarray, g: np.ndarray, s: list[np.ndarray], lr: float, step: int) -> Any:
    return reference.adam_step(p, g, s or [np.zeros_like(p), np.zeros_like(p)], lr=lr, step=step)


OPTIMIZERS = pytest.mark.parametrize(
    ("optimizer_name", "learning_rate", "update"),
    [
        ("SGDOptimizer", LearningRateSGD(0.05, learning_rate="constant"), sgd()),
        ("SGDOptimizer", LearningRateSGD(0.05, learning_rate="invscaling", power_t=0.5), sgd()),
        ("SGDOptimizer", LearningRateSGD(0.05, learning_rate="optimal", alpha=0.01), sgd()),
        ("SGDOptimizer", LearningRateSGDNesterov(0.02, learning_rate="constant"), sgd(0.9, True)),
        ("SGDOptimizer", LearningRateSGDNesterov(0.02, nesterov=False, momentum=0.5), sgd(0.5)),
        ("Adam", LearningRateSGD(0.05, learning_rate="invscaling"), adam),
    ],
    ids=["sgd-constant", "sgd-invscaling", "sgd-optimal", "nesterov", "momentum", "adam"],
)


@OPTIMIZERS
def test_full_batch_trajectory_equals_numpy(optimizer_name: str, learning_rate: Any, update: Any) -> None:
    """With one batch per iteration, fit is full-batch descent on the mean loss: SGD steps with eta / n on the
    summed loss."""
    x, y = data()
    iterations = 12
    fit = OrtGradientOptimizer(
        add_loss_output(linear()), ["coef", "intercept"], max_iter=iterations, batch_size=N,
        training_optimizer_name=optimizer_name, learning_rate=learning_rate, warm_start=True,
    ).fit(x, y)  # fmt: skip
    expected, _ = numpy_fit(x, y, iterations, [learning_rate.rate_at(t) for t in range(iterations)], update)
    state = fit.get_state()
    for name, value in expected.items():
        np.testing.assert_allclose(state[name], value, rtol=1e-9, atol=1e-12, err_msg=name)
    assert fit.n_iter_ == iterations and len(fit.train_losses_) == iterations
    assert fit.learning_rate_ is learning_rate


@OPTIMIZERS
def test_mini_batches_with_a_short_last_one_step_on_each_batchs_mean_gradient(
    optimizer_name: str, learning_rate: Any, update: Any
) -> None:
    """27 rows in batches of 8: the last batch of 3 weighs its rows as the others do, so a momentum or Adam's
    moments average gradients of one scale (a summed gradient stepped with eta / 3 would not)."""
    x, y = data(27)
    iterations = 4
    fit = OrtGradientOptimizer(
        add_loss_output(linear()), ["coef", "intercept"], max_iter=iterations, batch_size=8,
        training_optimizer_name=optimizer_name, learning_rate=learning_rate, warm_start=True, random_state=5,
    ).fit(x, y)  # fmt: skip
    rates = [learning_rate.rate_at(t) for t in range(iterations)]
    expected, losses = numpy_fit(x, y, iterations, rates, update, batch_size=8, random_state=5)
    state = fit.get_state()
    for name, value in expected.items():
        np.testing.assert_allclose(state[name], value, rtol=1e-9, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(fit.train_losses_, losses, rtol=1e-9)


@pytest.mark.parametrize("hidden", [4, 5_000], ids=["small", "over-SMALL_TENSOR"])
def test_minibatches_of_data_whose_size_is_not_a_multiple_of_the_batch_equal_numpy(hidden: int) -> None:
    """100 rows in batches of 32 (32, 32, 32, 4), shuffled by ``random_state``: minibatch SGD at eta / rows of
    each batch on ``(X W1) W2 + b``, whose W1 is under or over the runtime's size threshold
    (training.options.SMALL_TENSOR: 8 x 5,000 elements)."""
    rows, features, size, eta, iterations = 100, 8, 32, 0.05, 2
    rng = np.random.default_rng(5)
    x = rng.normal(size=(rows, features))
    y = x @ rng.normal(size=(features, 1)) + 0.3
    start = {"W1": rng.normal(size=(features, hidden)) / np.sqrt(features), "W2": np.zeros((hidden, 1)),
             "b": np.zeros(1)}  # fmt: skip
    model = make_model(
        {"X": (DOUBLE, ["batch", features])},
        [
            helper.make_node("MatMul", ["X", "W1"], ["h"]),
            helper.make_node("MatMul", ["h", "W2"], ["hw"]),
            helper.make_node("Add", ["hw", "b"], ["variable"]),
        ],
        {"variable": (DOUBLE, ["batch", 1])},
        list(start.items()),
    )
    fit = OrtGradientOptimizer(add_loss_output(model), list(start), max_iter=iterations, batch_size=size,
                               learning_rate=LearningRateSGD(eta / hidden, learning_rate="constant"),
                               warm_start=True, random_state=0).fit(x, y.ravel())  # fmt: skip
    w1, w2, b = start["W1"], start["W2"], start["b"]
    order_rng = np.random.default_rng(0)
    for _ in range(iterations):
        order = order_rng.permutation(rows)
        for first in range(0, rows, size):
            chosen = order[first : first + size]
            h = x[chosen] @ w1
            residual = h @ w2 + b - y[chosen]
            rate = float(np.float32(eta / hidden / len(chosen)))
            grads = (2 * x[chosen].T @ (residual @ w2.T), 2 * h.T @ residual, 2 * residual.sum(axis=0))
            w1, w2, b = (value - rate * grad for value, grad in zip((w1, w2, b), grads, strict=True))
    state = fit.get_state()
    for name, expected in {"W1": w1, "W2": w2, "b": b}.items():
        np.testing.assert_allclose(state[name], expected, rtol=1e-9, atol=1e-12, err_msg=name)
    assert len(fit.train_losses_) == iterations


def test_train_losses_are_per_sample_means_and_decrease() -> None:
    x, y = data()
    fit = OrtGradientOptimizer(add_loss_output(linear()), ["coef", "intercept"], max_iter=20, batch_size=8,
                               learning_rate=0.05, random_state=0).fit(x, y)  # fmt: skip
    assert fit.train_losses_[-1] < 0.05 < fit.train_losses_[0]
    model = fit.get_trained_onnx()
    loss, prediction = run_model(model, {"X": x, "label": y[:, None]})
    np.testing.assert_allclose(loss / N, ((prediction.ravel() - y) ** 2).mean(), rtol=1e-12)


def test_seed_snippet_of_the_onnxcustom_docs_runs_with_only_the_import_changed() -> None:
    """seeds/000: add_loss_output(elastic, weights, L2 penalty) then OrtGradientOptimizer(..., learning_rate=1e-3)."""
    x, y = data(200, dtype=np.float32)
    w_train = (np.random.default_rng(1).random(200) + 1).astype(np.float32)
    onx = linear(FLOAT)
    onx_loss = add_loss_output(
        onx, weight_name="weight", score_name="elastic", l1_weight=0.1, l2_weight=0.9, penalty={"coef": {"l2": 0.01}}
    )
    train_session = OrtGradientOptimizer(onx_loss, ["intercept", "coef"], learning_rate=1e-3)
    train_session.fit(x, y, w_train)
    state_tensors = train_session.get_state()
    losses = train_session.train_losses_
    assert set(state_tensors) == {"intercept", "coef"} and state_tensors["coef"].dtype == np.float32
    assert len(losses) == 100 and losses[-1] < losses[0] / 10
    x_test, y_test = data(100, seed=9, dtype=np.float32)
    (prediction,) = run_model(train_session.get_trained_onnx(onx), {"X": x_test})
    r2 = 1 - ((prediction.ravel() - y_test) ** 2).sum() / ((y_test - y_test.mean()) ** 2).sum()
    assert r2 > 0.95  # 0.978 to 0.995 over 30 initial draws; the seed's settings stop short of convergence


def test_add_loss_output_example_of_seed_003_trains() -> None:
    """seeds/003's example: the elastic loss with weights and L1 + L2 penalties on both coef and intercept."""
    x, y = data(200, dtype=np.float32)
    w = (np.random.default_rng(2).random(200) + 1).astype(np.float32)
    onx_loss = add_loss_output(
        linear(FLOAT), weight_name="weight", score_name="elastic",
        penalty={"coef": {"l1": 0.5, "l2": 0.5}, "intercept": {"l1": 0.5, "l2": 0.5}},
    )  # fmt: skip
    loss, _ = run_model(onx_loss, {"X": x, "label": y[:, None], "weight": w})
    np.testing.assert_allclose(loss, (w * 0.5 * (np.abs(y) + y**2)).sum(), rtol=1e-5)  # zero weights: no penalty
    fit = OrtGradientOptimizer(onx_loss, ["intercept", "coef"], max_iter=30, learning_rate=0.01, random_state=0)
    fit.fit(x, y, w)
    assert fit.train_losses_[-1] < fit.train_losses_[0] / 5


def test_validation_losses_every_period() -> None:
    x, y = data()
    x_val, y_val = data(16, seed=5)
    fit = OrtGradientOptimizer(add_loss_output(linear()), ["coef", "intercept"], max_iter=20, batch_size=16,
                               learning_rate=0.05, validation_every=0.25, random_state=0)  # fmt: skip
    fit.fit(x, y, X_val=x_val, y_val=y_val)
    assert len(fit.validation_losses_) == 4  # after iterations 5, 10, 15, 20
    loss, _ = run_model(fit.get_trained_onnx(), {"X": x_val, "label": y_val[:, None]})
    np.testing.assert_allclose(fit.validation_losses_[-1], loss / 16, rtol=1e-12)
    fit.set_params(validation_every=3).fit(x, y, X_val=x_val, y_val=y_val)
    assert len(fit.validation_losses_) == 6
    assert OrtGradientOptimizer(add_loss_output(linear()), ["coef"], max_iter=2).fit(x, y).validation_losses_ is None


def test_sample_weights_land_on_weighted_least_squares() -> None:
    x, y = data(noise=1.0)
    w = np.where(np.arange(N) % 2 == 0, 3.0, 0.2)
    fit = OrtGradientOptimizer(add_loss_output(linear(), weight_name="weight"), ["coef", "intercept"], max_iter=300,
                               batch_size=N, learning_rate=LearningRateSGD(0.1, learning_rate="constant"))  # fmt: skip
    state = fit.fit(x, y, sample_weight=w).get_state()
    fitted = np.concatenate([state["coef"].ravel(), state["intercept"]])
    np.testing.assert_allclose(fitted, least_squares(x, y, w), rtol=1e-8)
    assert np.abs(fitted - least_squares(x, y)).max() > 1e-3  # the weights made a difference
    unweighted = fit.fit(x, y).get_state()  # no sample_weight: ones
    np.testing.assert_allclose(unweighted["coef"].ravel(), least_squares(x, y)[:D], rtol=1e-8)


def test_warm_start_continues_and_cold_start_redraws() -> None:
    x, y = data()
    model = add_loss_output(linear())
    ten = OrtGradientOptimizer(model, ["coef", "intercept"], max_iter=10, batch_size=N, learning_rate=0.05,
                               warm_start=True).fit(x, y)  # fmt: skip
    five = OrtGradientOptimizer(model, ["coef", "intercept"], max_iter=5, batch_size=N, learning_rate=0.05,
                                warm_start=True).fit(x, y)  # fmt: skip
    five.set_params(learning_rate=LearningRateSGD(0.05 / 6**0.25, power_t=0.25)).fit(x, y)
    assert five.train_losses_[0] < ten.train_losses_[0]  # started where the first five iterations ended
    cold = OrtGradientOptimizer(model, ["coef", "intercept"], max_iter=1, random_state=3).fit(x, y)
    again = OrtGradientOptimizer(model, ["coef", "intercept"], max_iter=1, random_state=3).fit(x, y)
    other = OrtGradientOptimizer(model, ["coef", "intercept"], max_iter=1, random_state=4).fit(x, y)
    np.testing.assert_array_equal(cold.get_state()["coef"], again.get_state()["coef"])
    assert not np.array_equal(cold.get_state()["coef"], other.get_state()["coef"])


def test_warm_start_without_a_fit_starts_from_the_model_weights() -> None:
    x, y = data()
    solution = least_squares(x, y)
    model = linear()
    model.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(solution[:D, None], "coef"))
    model.graph.initializer[1].CopyFrom(onnx.numpy_helper.from_array(solution[D:], "intercept"))
    fit = OrtGradientOptimizer(add_loss_output(model), ["coef", "intercept"], max_iter=1, batch_size=N,
                               warm_start=True, learning_rate=1e-6).fit(x, y)  # fmt: skip
    residual = x @ solution[:D] + solution[D] - y
    np.testing.assert_allclose(fit.train_losses_[0], (residual**2).mean(), rtol=1e-9)


def test_get_state_set_state_and_get_trained_onnx() -> None:
    x, y = data()
    base = linear()
    fit = OrtGradientOptimizer(add_loss_output(base), ["coef", "intercept"], max_iter=3, warm_start=True)
    with pytest.raises(AttributeError, match=r"call fit\(\) or set_state\(\) first"):
        fit.get_state()
    fit.set_state({"coef": TRUE_W, "intercept": [TRUE_B]})
    state = fit.get_state()
    np.testing.assert_array_equal(state["coef"], TRUE_W)
    state["coef"][0] = 99.0  # a copy
    assert fit.get_state()["coef"][0, 0] == TRUE_W[0, 0]
    predictor = fit.get_trained_onnx(base)
    (prediction,) = run_model(predictor, {"X": x})
    np.testing.assert_allclose(prediction.ravel(), (x @ TRUE_W).ravel() + TRUE_B)
    fit.set_params(learning_rate=1e-9).fit(x, y)  # warm start from set_state
    np.testing.assert_allclose(fit.get_state()["coef"], TRUE_W, atol=1e-6)
    with pytest.raises(ValueError, match="'slope' is not a trained weight"):
        fit.set_state({"slope": TRUE_W})
    with pytest.raises(ValueError, match=r"'coef' has shape \[3\], but the weight is \[3, 1\]"):
        fit.set_state({"coef": TRUE_W.ravel()})
    with pytest.raises(TypeError, match=r"takes an onnx\.ModelProto"):
        fit.get_trained_onnx("model.onnx")  # type: ignore[arg-type]


def test_nan_loss_raises_convergence_error_and_keeps_the_last_good_iteration() -> None:
    x, y = data()
    x[0] *= 1e3  # one far sample: a large learning rate diverges in a few iterations

    def fit(max_iter: int) -> OrtGradientOptimizer:
        return OrtGradientOptimizer(add_loss_output(linear()), ["coef", "intercept"], max_iter=max_iter,
                                    batch_size=8, learning_rate=LearningRateSGD(0.5, learning_rate="constant"),
                                    warm_start=True, random_state=0)  # fmt: skip

    diverging = fit(100)
    with pytest.raises(ConvergenceError, match=r"NaN or infinite (\(\w+\) )?at iteration (\d+) of 100") as raised:
        diverging.fit(x, y)
    failed_at = int(raised.value.args[0].split("iteration ")[1].split(" ")[0])
    assert f"the weights are those after iteration {failed_at - 1}" in str(raised.value)
    kept = diverging.get_state()
    assert all(np.isfinite(value).all() for value in kept.values())
    if failed_at > 1:
        reference_fit = fit(failed_at - 1).fit(x, y)
        for name, value in reference_fit.get_state().items():
            np.testing.assert_array_equal(kept[name], value)
    else:
        np.testing.assert_array_equal(kept["coef"], np.zeros((D, 1)))


def test_early_stopping_stops_and_keeps_the_best_weights() -> None:
    x, y = data(noise=2.0)
    x_val, y_val = data(32, noise=2.0, seed=7)
    fit = OrtGradientOptimizer(add_loss_output(linear()), ["coef", "intercept"], max_iter=500, batch_size=4,
                               learning_rate=LearningRateSGD(0.05, learning_rate="constant"), early_stopping=True,
                               n_iter_no_change=3, tol=1e-3, random_state=0)  # fmt: skip
    fit.fit(x, y, X_val=x_val, y_val=y_val)
    assert fit.n_iter_ < 500
    assert len(fit.validation_losses_) == fit.n_iter_  # validated after every iteration
    assert fit.best_validation_loss_ == min(fit.validation_losses_)
    loss, _ = run_model(fit.get_trained_onnx(), {"X": x_val, "label": y_val[:, None]})
    np.testing.assert_allclose(loss / 32, fit.best_validation_loss_, rtol=1e-12)
    held_out = OrtGradientOptimizer(add_loss_output(linear()), ["coef", "intercept"], max_iter=500, batch_size=4,
                                    learning_rate=0.05, early_stopping=True, n_iter_no_change=2,
                                    validation_fraction=0.25, random_state=0).fit(x, y)  # fmt: skip
    assert held_out.n_iter_ < 500 and len(held_out.validation_losses_) == held_out.n_iter_


def test_other_optimizers_by_name_and_instance() -> None:
    x, y = data()
    solution = least_squares(x, y)
    for optimizer in ("AdamOptimizer", "AdamWOptimizer", "SGD", optim.RMSprop(), optim.SGD(momentum=0.9)):
        eta = 0.05 if isinstance(optimizer, str) and "SGD" in optimizer else 0.01
        fit = OrtGradientOptimizer(
            add_loss_output(linear()), ["coef", "intercept"], max_iter=300, batch_size=16,
            training_optimizer_name=optimizer, learning_rate=LearningRateSGD(eta, learning_rate="constant"),
            random_state=0,
        )  # fmt: skip
        coef = fit.fit(x, y).get_state()["coef"].ravel()
        np.testing.assert_allclose(coef, solution[:D], atol=0.05, err_msg=repr(optimizer))


def test_scikit_learn_protocol_clone_repr_and_pickle() -> None:
    sklearn_base = pytest.importorskip("sklearn.base")
    model = add_loss_output(linear())
    fit = OrtGradientOptimizer(model, ["coef", "intercept"], max_iter=3, batch_size=5, early_stopping=False)
    params = fit.get_params()
    assert params["max_iter"] == 3 and params["batch_size"] == 5 and params["model_onnx"] is model
    assert set(params) >= {"learning_rate", "training_optimizer_name", "sample_weight_name", "random_state"}
    clone = sklearn_base.clone(fit)
    assert clone.get_params()["max_iter"] == 3 and clone is not fit
    assert fit.set_params(max_iter=4, tol=0.1) is fit and fit.max_iter == 4
    with pytest.raises(ValueError, match="has no parameter 'epochs'"):
        fit.set_params(epochs=3)
    text = repr(fit)
    assert text.startswith("OrtGradientOptimizer(model_onnx=<ModelProto") and "max_iter=4" in text
    assert "verbose" not in text  # defaults are not shown
    x, y = data()
    fit.fit(x, y)
    restored = pickle.loads(pickle.dumps(fit))
    np.testing.assert_array_equal(restored.get_state()["coef"], fit.get_state()["coef"])
    assert restored.train_losses_ == fit.train_losses_


def test_verbose_draws_a_progress_bar_and_prints_iterations(capsys: pytest.CaptureFixture[str]) -> None:
    x, y = data()
    OrtGradientOptimizer(add_loss_output(linear()), ["coef"], max_iter=3, verbose=1).fit(x, y)
    captured = capsys.readouterr()
    assert "fit" in captured.out and "3/3" in captured.out and "iteration 1/3" not in captured.out
    OrtGradientOptimizer(add_loss_output(linear()), ["coef"], max_iter=3, verbose=2).fit(x, y)
    assert "iteration 3/3: loss" in capsys.readouterr().out
    OrtGradientOptimizer(add_loss_output(linear()), ["coef"], max_iter=3).fit(x, y)
    assert capsys.readouterr().out == ""


def test_saved_gradient_writes_the_training_model(tmp_path: Any) -> None:
    x, y = data()
    path = tmp_path / "gradient.onnx"
    OrtGradientOptimizer(add_loss_output(linear()), ["coef"], max_iter=1, saved_gradient=path).fit(x, y)
    saved = onnx.load(path)
    assert "coef_grad.accumulation.out" in [o.name for o in saved.graph.output]


def test_inputs_are_cast_and_reshaped_to_the_model() -> None:
    """float64 data for a float32 model, y as [N] for a [N, 1] label, lists, int labels for the log score."""
    x, y = data()
    fit = OrtGradientOptimizer(add_loss_output(linear(FLOAT)), ["coef", "intercept"], max_iter=2).fit(x.tolist(), y)
    assert fit.get_state()["coef"].dtype == np.float32
    fit.fit(x, y[:, None])


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("params", "error", "match"),
    [
        ({"max_iter": 0}, ValueError, "max_iter must be an int >= 1"),
        ({"batch_size": 2.5}, ValueError, "batch_size must be an int >= 1"),
        ({"validation_every": 0}, ValueError, "validation_every must be > 0"),
        ({"validation_fraction": 1.0}, ValueError, r"validation_fraction must be in \(0, 1\)"),
        ({"verbose": -1}, ValueError, "verbose must be an int >= 0"),
        ({"loss_output_name": "score"}, ValueError, r"'score' is not an output.*\['loss', 'variable'\]"),
        ({"training_optimizer_name": "LBFGS"}, ValueError, r"training_optimizer_name='LBFGS' is not an optimizer"),
        ({"learning_rate": "cyclic"}, ValueError, "learning_rate='cyclic' is not a learning rate"),
        ({"learning_rate": LearningRateSGDNesterov(), "training_optimizer_name": "Adam"}, ValueError,
         "sets SGD's momentum, but the optimizer is Adam"),
        ({"weights_to_train": "coef"}, TypeError, "weights_to_train must be a non-empty list"),
        ({"weights_to_train": ["slope"]}, ValueError,
         r"weights_to_train names 'slope', which is not a float initializer .* lists its weights: the 2 known"),
        ({"weights_to_train": ["coeff"]}, ValueError, r"did you mean 'coef'\?"),
        ({"random_state": -1}, ValueError, "random_state must be >= 0"),
        ({"random_state": 1.5}, TypeError, "random_state must be None, an int >= 0, a numpy.random.RandomState"),
    ],
)  # fmt: skip
def test_bad_parameters_raise_at_fit(params: dict[str, Any], error: type, match: str) -> None:
    x, y = data()
    arguments = {"model_onnx": add_loss_output(linear()), "weights_to_train": ["coef"]} | params
    fit = OrtGradientOptimizer(**arguments)  # no validation in __init__: scikit-learn's convention
    with pytest.raises(error, match=match):
        fit.fit(x, y)


def test_bad_data_is_refused_naming_the_array() -> None:
    x, y = data()
    fit = OrtGradientOptimizer(add_loss_output(linear()), ["coef"], max_iter=1)
    with pytest.raises(ValueError, match="different numbers of samples"):
        fit.fit(x, y[:-1])
    with pytest.raises(ValueError, match=r"fit got sample_weight, but the model has no input 'weight'"):
        fit.fit(x, y, sample_weight=np.ones(N))
    with pytest.raises(ValueError, match="pass both X_val and y_val"):
        fit.fit(x, y, X_val=x)
    with pytest.raises(ValueError, match=r"X has shape \[64\], but input 'X' is \['\?', 3\]"):
        fit.fit(x[:, 0], y)
    with pytest.raises(TypeError, match="must hold numbers"):
        fit.fit(x.astype(str), y)
    two_inputs = add_loss_output(linear())
    two_inputs.graph.input.append(helper.make_tensor_value_info("extra", DOUBLE, [1]))
    with pytest.raises(ValueError, match=r"two inputs.*\['X', 'label', 'extra'\]"):
        OrtGradientOptimizer(two_inputs, ["coef"]).fit(x, y)


def softmax_classifier(rng: np.random.Generator, classes: int) -> onnx.ModelProto:
    """``softmax(X @ coef)``: class probabilities, as a converted classifier outputs them."""
    return make_model(
        {"X": (FLOAT, ["batch", D])},
        [helper.make_node("MatMul", ["X", "coef"], ["scores"]), helper.make_node("Softmax", ["scores"], ["p"])],
        {"p": (FLOAT, ["batch", classes])},
        [("coef", rng.normal(size=(D, classes)).astype(np.float32))],
    )


def test_a_label_out_of_range_is_named_by_the_callers_row() -> None:
    """Every label is checked before the first (shuffled) batch: the error names the row of ``y`` or ``y_val``."""
    rng = np.random.default_rng(0)
    classes = 3
    model = softmax_classifier(rng, classes)
    fit = OrtGradientOptimizer(add_loss_output(model, score_name="log"), ["coef"], max_iter=1, batch_size=8,
                               random_state=0)  # fmt: skip
    x = rng.normal(size=(40, D)).astype(np.float32)
    y = rng.integers(0, classes, size=40)
    bad = y.copy()
    bad[7] = classes
    with pytest.raises(ValueError, match=r"^fit: 1 label is out of range .*: 3 at \[7\]"):
        fit.fit(x, bad)
    with pytest.raises(ValueError, match=r"^fit's validation data: 1 label is out of range .*: 3 at \[7\]"):
        fit.fit(x, y, X_val=x, y_val=bad)
    assert fit.fit(x, y).n_iter_ == 1


def test_a_model_with_dropout_fits_alike_from_the_same_random_state() -> None:
    """random_state seeds the Dropout masks too (Module's ``seed``): two fits from it give the same weights."""
    model = linear()
    model.graph.node[0].output[0] = "xw_kept"
    model.graph.node.insert(1, helper.make_node("Dropout", ["xw_kept", "ratio", "training"], ["xw"]))
    model.graph.initializer.extend(
        [numpy_helper.from_array(np.array(0.5), "ratio"), numpy_helper.from_array(np.array(True), "training")]
    )
    x, y = data()
    fits = [
        OrtGradientOptimizer(add_loss_output(model), ["coef", "intercept"], max_iter=3, batch_size=16,
                             learning_rate=LearningRateSGD(0.01, learning_rate="constant"), random_state=seed).fit(x, y)
        for seed in (4, 4, 5)
    ]  # fmt: skip
    same, other = (
        all(np.array_equal(a.trained_coef_[k], b.trained_coef_[k]) for k in a.trained_coef_)
        for a, b in ((fits[0], fits[1]), (fits[0], fits[2]))
    )
    assert same and not other


def test_scikit_learns_model_selection_scores_by_minus_the_loss_per_sample() -> None:
    """``score`` is minus the loss per sample at the trained weights: ``cross_val_score`` and ``GridSearchCV``
    work with their default scoring, and ``check_is_fitted`` knows a fitted estimator."""
    model_selection = pytest.importorskip("sklearn.model_selection")
    validation = pytest.importorskip("sklearn.utils.validation")
    exceptions = pytest.importorskip("sklearn.exceptions")
    x, y = data(101)
    rate = LearningRateSGD(0.05, learning_rate="constant")
    fit = OrtGradientOptimizer(add_loss_output(linear()), ["coef", "intercept"], max_iter=5, batch_size=16,
                               learning_rate=rate, random_state=0)  # fmt: skip
    with pytest.raises(exceptions.NotFittedError):
        validation.check_is_fitted(fit)
    with pytest.raises(AttributeError, match=r"call fit\(\) before score\(\)"):
        fit.score(x, y)
    fit.fit(x, y)
    validation.check_is_fitted(fit)
    state = fit.get_state()
    residual = x @ state["coef"] + state["intercept"] - y[:, None]
    np.testing.assert_allclose(fit.score(x, y), -np.mean(residual**2), rtol=1e-12)
    scores = model_selection.cross_val_score(fit, x, y, cv=3)
    assert scores.shape == (3,) and np.all(scores < 0)
    search = model_selection.GridSearchCV(fit, {"learning_rate": [1e-4, 0.05]}, cv=3).fit(x, y)
    assert search.best_params_ == {"learning_rate": 0.05}  # 5 passes at 1e-4 leave the weights near zero
    assert search.best_estimator_.n_iter_ == 5


def test_sample_weights_weight_the_score() -> None:
    x, y = data()
    fit = OrtGradientOptimizer(add_loss_output(linear(), weight_name="weight"), ["coef", "intercept"], max_iter=2)
    fit.fit(x, y)
    weights = np.linspace(0.0, 2.0, N)
    state = fit.get_state()
    residual = (x @ state["coef"] + state["intercept"]).ravel() - y
    np.testing.assert_allclose(fit.score(x, y, sample_weight=weights), -np.mean(weights * residual**2), rtol=1e-12)
    np.testing.assert_allclose(fit.score(x, y), -np.mean(residual**2), rtol=1e-12)


@pytest.mark.parametrize("bad", ["X", "y", "X_val"])
def test_nan_or_infinity_in_the_data_is_refused_before_training_naming_the_rows(bad: str) -> None:
    x, y = data()
    arrays = {"X": x.copy(), "y": y.copy(), "X_val": x.copy()}
    arrays[bad][[3, 40]] = [np.nan, np.inf] if bad == "y" else np.nan
    fit = OrtGradientOptimizer(add_loss_output(linear()), ["coef"], max_iter=1)
    what = "fit's validation data" if bad == "X_val" else "fit"
    name = "label" if bad == "y" else "X"
    consequence = "its loss would be NaN" if bad == "X_val" else "every parameter would become NaN"
    said = rf"^{what}: input '{name}' has NaN or infinite values in 2 row\(s\) \(3, 40;.*{consequence}"
    with pytest.raises(ValueError, match=said):
        fit.fit(arrays["X"], arrays["y"], X_val=arrays["X_val"], y_val=y)
    assert not hasattr(fit, "trained_coef_")


def test_numpy_scalars_and_random_states_are_taken_as_scikit_learn_takes_them() -> None:
    x, y = data()
    model = add_loss_output(linear())
    rate = LearningRateSGD(np.float32(0.05), learning_rate="constant")

    def fitted(**params: Any) -> dict[str, np.ndarray]:
        return OrtGradientOptimizer(model, np.array(["coef", "intercept"]), max_iter=2, learning_rate=rate,
                                    **params).fit(x, y).get_state()  # fmt: skip

    plain = fitted(random_state=3)
    for same in (
        fitted(random_state=np.int64(3), verbose=np.int64(0), validation_every=np.int64(1)),
        fitted(random_state=np.uint8(3)),
    ):
        assert all(np.array_equal(plain[k], same[k]) for k in plain)
    # a RandomState or Generator draws each fit's seed, as scikit-learn's estimators use them: fits differ
    for state in (np.random.RandomState(0), np.random.default_rng(0)):
        first, second = fitted(random_state=state), fitted(random_state=state)
        assert not np.array_equal(first["coef"], second["coef"])
    assert OrtGradientOptimizer(model, ["coef"], max_iter=1, learning_rate=np.float32(0.01)).fit(x, y).n_iter_ == 1


def test_bad_data_says_what_to_pass() -> None:
    sparse = pytest.importorskip("scipy.sparse")
    x, y = data()
    fit = OrtGradientOptimizer(add_loss_output(linear()), ["coef"], max_iter=1)
    with pytest.raises(TypeError, match=r"X is a sparse csr_matrix: pass X.toarray\(\)"):
        fit.fit(sparse.csr_matrix(x), y)
    with pytest.raises(ValueError, match=r"^fit: X has no rows"):
        fit.fit(x[:0], y[:0])


def test_class_labels_are_told_to_be_positions_in_the_classes() -> None:
    """Labels 1..C (not 0..C-1), or strings: the messages say how to encode y for a converted classifier."""
    rng = np.random.default_rng(0)
    classes = 3
    model = softmax_classifier(rng, classes)
    fit = OrtGradientOptimizer(add_loss_output(model, score_name="log"), ["coef"], max_iter=1)
    x = rng.normal(size=(30, D)).astype(np.float32)
    y = rng.integers(1, classes + 1, size=30)
    with pytest.raises(ValueError, match=r"out of range.*numpy.searchsorted\(classifier.classes_, y\)") as error:
        fit.fit(x, y)
    assert "give the loss ignore_index" not in str(error.value)  # add_loss_output has none
    with pytest.raises(TypeError, match=r"y must hold numbers .*, not <U6; .*numpy.searchsorted"):
        fit.fit(x, np.array(["setosa", "other"] * 15))


def test_pandas_nullable_dtypes_are_taken_as_scikit_learn_takes_them() -> None:
    """DataFrames of Int64 and Float64 columns (convert_dtypes(), read_csv(dtype_backend="numpy_nullable")) were
    refused as object arrays; scikit-learn's check_array takes them, pd.NA as NaN."""
    pd = pytest.importorskip("pandas")
    x, y = data()
    x[:, 0] = np.round(3 * x[:, 0])  # a column of whole numbers: Int64
    frame = pd.DataFrame(x, columns=["shop", "qty", "price"]).convert_dtypes()
    target = pd.Series(y, name="sales").convert_dtypes()
    assert [str(dtype) for dtype in frame.dtypes] == ["Int64", "Float64", "Float64"] and str(target.dtype) == "Float64"
    model = add_loss_output(linear())

    def fitted(features: Any, labels: Any) -> dict[str, np.ndarray]:
        return OrtGradientOptimizer(model, ["coef", "intercept"], max_iter=3, random_state=0).fit(
            features, labels
        ).get_state()  # fmt: skip

    plain, nullable = fitted(x, y), fitted(frame, target)
    assert all(np.array_equal(plain[name], nullable[name]) for name in plain)
    missing = frame.copy()
    missing.loc[5, "qty"] = pd.NA
    with pytest.raises(ValueError, match=r"^fit: input 'X' has NaN or infinite values in 1 row\(s\) \(5;"):
        fitted(missing, target)
    named = frame.assign(city=pd.Series(["a", "b"] * (N // 2), dtype="string"))[["shop", "city", "price"]]
    with pytest.raises(TypeError, match=r"X must hold numbers, but its column\(s\) 'city' \(string\) do not"):
        fitted(named, target)
    rng = np.random.default_rng(0)
    classifier = OrtGradientOptimizer(add_loss_output(softmax_classifier(rng, 3), score_name="log"), ["coef"],
                                      max_iter=1)  # fmt: skip
    labels = pd.Series(rng.integers(0, 3, size=N), dtype="Int64")
    assert classifier.fit(frame, labels).n_iter_ == 1
    labels[7] = pd.NA
    with pytest.raises(ValueError, match=r"y feeds the integer input 'label' but holds NaN: drop or impute"):
        classifier.fit(frame, labels)


def test_a_category_code_outside_the_table_is_named_at_its_row_of_x() -> None:
    """A code carried in X's first column and cast to an embedding's ids: fit shuffles a copy of the data each
    iteration, and the id check named the code's row in that copy, under train_epoch's name."""
    nodes = [
        helper.make_node("Gather", ["X", "first"], ["code"], axis=1),
        helper.make_node("Cast", ["code"], ["ids"], to=onnx.TensorProto.INT64),
        helper.make_node("Gather", ["table", "ids"], ["vectors"]),
        helper.make_node("ReduceSum", ["vectors", "last"], ["y"], keepdims=1),
    ]
    model = make_model(
        {"X": (FLOAT, ["N", 2])},
        nodes,
        {"y": (FLOAT, ["N", 1])},
        [
            ("first", np.array(0, np.int64)),
            ("last", np.array([1], np.int64)),
            ("table", np.ones((4, 2), np.float32)),
        ],
        opset=13,
    )
    x = np.array([[0, 1.0], [1, 2.0], [2, 0.5], [-1, 1.5], [1, 0.0], [0, 1.0], [2, 2.0], [3, 0.5]], np.float32)
    y = np.arange(8, dtype=np.float32)
    estimator = OrtGradientOptimizer(
        add_loss_output(model, score_name="squared_error"), ["table"], max_iter=2, batch_size=4
    )
    with pytest.raises(ValueError, match=r"^fit: input 'X' holds 1 id\(s\) outside the 4 rows .*-1 at \[3, 0\]"):
        estimator.fit(x, y)
