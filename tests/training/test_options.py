"""Default session options: the sessions of a module share one arena on its device; options of the user's own, and
CUDA arena settings of the user's own, are theirs."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from onnxtrain.training.device import CUDA_PROVIDER, Device, shares_arena
from onnxtrain.training.options import default_session_options, register_shared_arena
from tests.training.helpers import classifier_batch, open_module, parameters

SHARED = "session.use_env_allocators"


def _config(options: ort.SessionOptions, key: str) -> str | None:
    try:
        return options.get_session_config_entry(key)
    except RuntimeError:  # onnxruntime's way of saying the key is not set
        return None


def _sessions(module: Any, optimizer: Any) -> dict[str, Any]:
    sessions = {"training": module._train_session, "reset": module._reset.session, "eval": module._eval_session}
    sessions.update({"optimizer": optimizer._session, "fused": optimizer.fused_step.session})
    return sessions


def _train(module: Any, optimizer: Any, rng: np.random.Generator, steps: int) -> list[Any]:
    """The losses of ``steps`` steps of the usual loop on the classifier's batches."""
    losses = []
    for _ in range(steps):
        losses.append(module(*classifier_batch(rng)))
        optimizer.step()
        module.lazy_reset_grad()
    return losses


HAS_CUDA = CUDA_PROVIDER in ort.get_available_providers()


def test_default_options_use_the_shared_arena_only_when_asked():
    assert _config(default_session_options(shared_arena=Device("cpu")), SHARED) == "1"
    assert _config(default_session_options(), SHARED) is None
    fused = default_session_options(spinning=True, update_first=True, shared_arena=Device("cpu"))
    assert _config(fused, "session.intra_op.allow_spinning") == "1"
    assert fused.execution_order == ort.ExecutionOrder.PRIORITY_BASED


def test_every_session_of_a_cpu_module_shares_the_arena_unless_the_user_gives_options(classifier):
    _, module, optimizer = open_module(classifier)
    for what, session in _sessions(module, optimizer).items():
        assert _config(session.session.get_session_options(), SHARED) == "1", what
    mine = ort.SessionOptions()
    mine.intra_op_num_threads = 1
    _, module, optimizer = open_module(classifier, session_options=mine)
    for what, session in _sessions(module, optimizer).items():
        options = session.session.get_session_options()
        assert _config(options, SHARED) is None and options.intra_op_num_threads == 1, what


def test_the_training_and_optimizer_sessions_run_in_node_order_and_the_eval_session_in_onnxruntimes(classifier):
    """Priority-based order for every session of the training and optimizer models: the loss runs where the
    forward computes it, not where onnxruntime's default order would put it (docs/runtime.md)."""
    _, module, optimizer = open_module(classifier)
    orders = {what: s.session.get_session_options().execution_order for what, s in _sessions(module, optimizer).items()}
    priority, default = ort.ExecutionOrder.PRIORITY_BASED, ort.ExecutionOrder.DEFAULT
    assert orders == {
        "training": priority,
        "reset": priority,
        "eval": default,
        "optimizer": priority,
        "fused": priority,
    }


def test_training_gives_the_same_results_with_a_shared_arena_or_with_arenas_of_their_own(classifier):
    results = []
    for options in (None, ort.SessionOptions()):
        state, module, optimizer = open_module(classifier, session_options=options)
        rng = np.random.default_rng(4)
        losses = _train(module, optimizer, rng, 5)
        module.eval()
        losses.append(module(*classifier_batch(rng)))
        results.append((losses, parameters(state)))
    (losses_a, params_a), (losses_b, params_b) = results
    for a, b in zip(losses_a, losses_b, strict=True):
        np.testing.assert_array_equal(a, b)
    for name, value in params_a.items():
        np.testing.assert_array_equal(value, params_b[name], err_msg=name)


def _planning(session: Any) -> tuple[bool, bool]:
    """The session's memory pattern and planned buffer reuse, on or off."""
    options = session.session.get_session_options()
    return options.enable_mem_pattern, options.enable_mem_reuse


def test_only_small_sessions_of_fixed_sizes_keep_the_memory_pattern_and_planned_reuse(classifier, tmp_path):
    """Sessions whose step sizes are symbolic, or fixed and over SMALL_TENSOR elements, run without onnxruntime's
    memory pattern and without its planned reuse of buffers; the fused step's session for the small model's fixed
    shapes keeps both, and a user's options are used as they are. The results are the same either way
    (test_training_gives_the_same_results_with_a_shared_arena_or_with_arenas_of_their_own: a user's
    ``SessionOptions()`` keeps both on)."""
    from onnxtrain import artifacts
    from onnxtrain.training.options import SMALL_TENSOR
    from tests.training import models

    _, module, optimizer = open_module(classifier)
    rng = np.random.default_rng(5)
    _train(module, optimizer, rng, 2)
    fixed = optimizer.fused_step.sessions()[-1]  # made for the batches of 16 rows
    assert _planning(fixed) == (True, True)
    planning = {what: _planning(s) for what, s in _sessions(module, optimizer).items()}
    # symbolic batch sizes, but the optimizer model's parameters, all fixed and small
    off, on = (False, False), (True, True)
    assert planning == {"training": off, "reset": off, "eval": off, "fused": off, "optimizer": on}
    # fixed shapes over the threshold: a weight of SMALL_TENSOR elements
    wide = models.generate(
        tmp_path / "wide",
        models.mlp((6, SMALL_TENSOR // 6 + 1, 4)),
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.AdamW,
    )
    _, module, optimizer = open_module(wide)
    _train(module, optimizer, rng, 2)
    assert [_planning(s) for s in optimizer.fused_step.sessions()] == [off]
    mine = ort.SessionOptions()
    _, module, optimizer = open_module(classifier, session_options=mine)
    assert all(_planning(s) == on for s in _sessions(module, optimizer).values())


def test_cuda_sessions_share_an_arena_only_where_the_providers_leave_its_settings_as_device_cuda_has_them():
    cuda = Device.parse("cuda:1").providers()
    assert cuda[0] == (CUDA_PROVIDER, {"device_id": "1", "use_tf32": "0", "arena_extend_strategy": "kSameAsRequested"})
    assert shares_arena(cuda) and shares_arena(Device("cpu").providers())
    assert shares_arena([CUDA_PROVIDER, "CPUExecutionProvider"])  # no arena settings at all
    assert shares_arena([(CUDA_PROVIDER, {"device_id": "0", "arena_extend_strategy": "kSameAsRequested"})])
    assert shares_arena([("CPUExecutionProvider", {"arena_extend_strategy": "kNextPowerOfTwo"})])  # the CPU's: ours
    for own in (
        {"arena_extend_strategy": "kNextPowerOfTwo"},
        {"gpu_mem_limit": "2147483648"},
        {"gpu_mem_limit": 2147483648, "arena_extend_strategy": "kSameAsRequested"},
        {"gpu_external_alloc": "1234", "gpu_external_free": "5678"},
    ):
        assert not shares_arena([(CUDA_PROVIDER, own), "CPUExecutionProvider"]), own
    assert not shares_arena(["TensorrtExecutionProvider", CUDA_PROVIDER])


@pytest.mark.skipif(HAS_CUDA, reason="CUDA is available here")
def test_a_build_without_cuda_leaves_each_session_its_own_arena_for_a_cuda_device():
    assert not register_shared_arena(Device("cuda"))
    assert _config(default_session_options(shared_arena=Device("cuda")), SHARED) is None
    assert register_shared_arena(Device("cpu"))  # the CPU's is unaffected


def test_an_arena_onnxruntime_fails_to_make_leaves_each_session_its_own(monkeypatch: pytest.MonkeyPatch):
    """A failure inside the provider (onnxruntime's own error types, which are not RuntimeErrors) leaves the
    sessions arenas of their own instead of raising."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

    def fail(*args: Any) -> None:
        raise ort_errors.Fail("CUDA failure 2: out of memory")

    monkeypatch.setattr(ort, "create_and_register_allocator_v2", fail)
    device = Device("cuda", 7)  # an id no other test registers (the registration is remembered per device)
    assert not register_shared_arena(device)
    assert _config(default_session_options(shared_arena=device), SHARED) is None


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA here")
def test_every_session_of_a_cuda_module_shares_the_arena_unless_the_providers_configure_it(classifier):
    assert register_shared_arena(Device("cuda"))
    results = []
    own = [(CUDA_PROVIDER, {"device_id": "0", "use_tf32": "0", "gpu_mem_limit": str(1 << 30)}), "CPUExecutionProvider"]
    for kwargs, shared in (({"device": "cuda"}, "1"), ({"providers": own}, None)):
        state, module, optimizer = open_module(classifier, **kwargs)
        losses = _train(module, optimizer, np.random.default_rng(4), 4)
        for what, session in _sessions(module, optimizer).items():
            assert _config(session.session.get_session_options(), SHARED) == shared, what
        results.append((losses, parameters(state)))
    (losses_a, params_a), (losses_b, params_b) = results  # the same arithmetic; CUDA's sums may take other orders
    for a, b in zip(losses_a, losses_b, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    for name, value in params_a.items():
        np.testing.assert_allclose(value, params_b[name], rtol=1e-6, atol=1e-7, err_msg=name)
