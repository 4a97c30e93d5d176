"""Gradients of the loss graphs (``onnxtrain.autodiff``) against ``torch.autograd``.

Each case of the forward tests, each reduction (``"none"`` summed), in
float64: ``d loss / d y`` from the gradient graph against torch's, on data
drawn by Hypothesis. Two points the loss graphs are built for are checked
explicitly: ``BCEWithLogitsLoss`` at logits of exactly 0 (where a ``Relu``
in the graph would give a wrong gradient) and ``BCELoss`` at probabilities
of exactly 0 and 1 (where ``Log``'s derivative would give ``nan``).

Losses whose operators have no gradient rule yet are expected failures with
``MissingGradientError`` (not strict): they turn into real tests as soon as
the rules exist, and fail if the gradient is then wrong.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given
from hypothesis import strategies as st

import onnxtrain.onnxblock as onnxblock
from tests.helpers import DOUBLE
from tests.losses.test_losses_forward import (
    CASES,
    CASES_BY_ID,
    Case,
    draw_inputs,
    scaled_model,
    single_thread_session,
    torch_loss_tensor,
)

autodiff = pytest.importorskip("onnxtrain.autodiff")


@pytest.fixture(scope="module")
def torch() -> Iterator[Any]:
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield torch
    torch.set_num_threads(threads)


def gradient_model(loss: onnxblock.Block, shape: Any, reduction: str) -> onnx.ModelProto:
    """Outputs: the loss (summed for ``"none"``) and its gradient with respect to ``y``."""
    with onnxblock.base(scaled_model(shape, DOUBLE)) as builder:
        value = loss("y")
        if reduction == "none":
            value = onnxblock.blocks.ReduceSum(keepdims=False)(value)
        gradients = autodiff.build_gradients(builder, value, ["y"])
        builder.set_outputs([value, gradients["y"]])
        return builder.finalize()


@functools.cache
def gradient_session(case_id: str, reduction: str) -> ort.InferenceSession:
    case = CASES_BY_ID[case_id]
    return single_thread_session(gradient_model(case.block(reduction), case.shape, reduction))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_loss_gradient_matches_torch(torch: Any, case: Case) -> None:
    # Built before drawing data: a missing rule fails once, not once per example.
    sessions = {reduction: gradient_session(case.id, reduction) for reduction in case.reductions}

    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        y, target = draw_inputs(data, case, np.float64)
        for reduction, session in sessions.items():
            loss, gradient = session.run(None, {"x": y / 2, case.target_name: target})
            x = torch.tensor(y, requires_grad=True)
            expected_loss = torch_loss_tensor(torch, case, reduction, x, target).sum()
            expected_loss.backward()
            expected = x.grad.numpy()
            if case.family == "probs":
                # torch divides by max(p (1 - p), 1e-12): its gradient there is not the derivative.
                assert np.all(np.isfinite(gradient)), f"BCELoss gradient not finite: {gradient}"
                expected = np.where(y * (1 - y) < 1e-12, gradient, expected)
            np.testing.assert_allclose(loss, expected_loss.detach().numpy(), rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(gradient, expected, rtol=1e-9, atol=1e-12, err_msg=f"reduction={reduction!r}")

    check()


def test_bce_with_logits_gradient_at_zero_logits_is_sigmoid_minus_target() -> None:
    """``d/dx = sigmoid(x) - t``: at ``x = 0`` that is ``0.5 - t``, where every ``|x|`` and ``max(-x, 0)`` kinks."""
    session = single_thread_session(
        gradient_model(onnxblock.loss.BCEWithLogitsLoss(reduction="sum"), ["batch", 3], "sum")
    )
    target = np.array([[0.0, 0.25, 1.0]])
    _, gradient = session.run(None, {"x": np.zeros((1, 3)), "target": target})
    np.testing.assert_allclose(gradient, 0.5 - target, rtol=1e-12)


def test_bce_gradient_is_finite_at_probabilities_0_and_1() -> None:
    """Where ``p`` is 0 or 1 the clamped log passes no gradient; the other term's derivative is left."""
    session = single_thread_session(gradient_model(onnxblock.loss.BCELoss(reduction="sum"), ["batch", 2], "sum"))
    p = np.array([[0.0, 1.0], [0.0, 1.0]])
    t = np.array([[0.0, 1.0], [0.5, 0.5]])
    loss, gradient = session.run(None, {"x": p / 2, "target": t})
    np.testing.assert_allclose(loss, 100.0)
    # d/dp of -(1 - t) log(1 - p) at p = 0 is (1 - t); of -t log p at p = 1 it is -t.
    np.testing.assert_allclose(gradient, [[1.0, -1.0], [0.5, -0.5]], rtol=1e-12)
