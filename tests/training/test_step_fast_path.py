"""The per-step fast paths: bindings kept per buffer parity, and the input check skipped for a known signature."""

from __future__ import annotations

import numpy as np
import pytest

from tests.training.helpers import open_module, parameters, regression_batch


def _count_state_binds(session, counts):
    """Wrap every binding's ortvalue binds (the state tensors, flags, learning rate and step) to count them."""
    for layout in session._layouts.values():
        io = layout.io
        for method in ("bind_ortvalue_input", "bind_ortvalue_output"):
            original = getattr(io, method)

            def counted(name, value, _original=original):
                counts.append(name)
                _original(name, value)

            setattr(io, method, counted)


@pytest.mark.parametrize("fuse", [False, True])
def test_a_steady_loop_rebinds_no_state(regression, rng, fuse):
    _state, module, optimizer = open_module(regression, fuse=fuse)
    batches = [regression_batch(rng) for _ in range(4)]
    for x, t in batches:  # warm up both parities
        module(x, t)
        optimizer.step()
        optimizer.set_learning_rate(0.05)  # as a scheduler does: after the step, before the next train step
        module.lazy_reset_grad()
    sessions = [module._train_session, module._reset.session, optimizer._session]
    sessions += [optimizer.fused_step.sessions()[-1]] if fuse else []  # the one for the batches' fixed shapes
    kept = [len(session._layouts) for session in sessions]
    # the layout made with each session, and one per parity of the sessions that run; every step starts from
    # reset gradients and writes everything in place, so one parity: apart, the reset step and the optimizer
    # step run every time and the training model (which accumulates) never; fused, the reset step runs the
    # first step and the fused step the others
    assert kept == ([1, 2, 1, 2] if fuse else [1, 2, 2])
    counts: list[str] = []
    for session in sessions:
        _count_state_binds(session, counts)
    for x, t in batches:
        module(x, t)
        optimizer.step()
        optimizer.set_learning_rate(0.05)  # written in place, not rebound
        module.lazy_reset_grad()
    assert counts == []
    assert [len(session._layouts) for session in sessions] == kept
    assert optimizer.step_count == 8


def test_the_fast_paths_give_the_same_trajectory_with_accumulation(regression, rng):
    """Accumulating steps break the parity pattern: the result must not depend on which binding runs."""
    batches = [regression_batch(rng) for _ in range(6)]
    results = []
    for fresh_bindings in (False, True):
        state, module, optimizer = open_module(regression)
        optimizer.set_learning_rate(0.01)
        losses = []
        for i, (x, t) in enumerate(batches):
            if fresh_bindings:  # forget every kept binding: all is bound again from scratch
                module._train_session._layouts.clear()
                module._train_session.select(None)
                optimizer._session._layouts.clear()
            losses.append(float(module(x, t)[0].sum()))
            if i % 3 != 0:  # steps 1 and 2 of every 3 accumulate into the next
                optimizer.step()
                module.lazy_reset_grad()
        results.append((losses, parameters(state)))
    (losses_a, params_a), (losses_b, params_b) = results
    assert losses_a == losses_b
    for name, value in params_a.items():
        np.testing.assert_array_equal(value, params_b[name])


def test_a_bad_input_after_a_known_signature_still_raises_before_running(regression, rng):
    state, module, _optimizer = open_module(regression)
    x, t = regression_batch(rng)
    module(x, t)
    module(x, t)  # the signature is known now
    grad = state.parameters["fc0.weight"].grad
    before = parameters(state)
    for bad, error in (
        ((x.astype(np.float64), t), TypeError),
        ((x, t[:3]), ValueError),
        ((np.asfortranarray(np.zeros((8, 5), np.float32)), t), ValueError),
        ((x[:, :3], t), ValueError),
    ):
        with pytest.raises(error, match=r"input '(x|target)' of the training model"):
            module(*bad)
    np.testing.assert_array_equal(state.parameters["fc0.weight"].grad, grad)
    for name, value in parameters(state).items():
        np.testing.assert_array_equal(value, before[name])
    assert module.train_step_count == 2
    # a non-contiguous view with the known dtype and shape goes through the full check, and works
    wide = np.zeros((8, 8), np.float32)
    wide[:, ::2] = x
    np.testing.assert_allclose(module(wide[:, ::2], t)[0], module(x, t)[0], rtol=1e-6)
