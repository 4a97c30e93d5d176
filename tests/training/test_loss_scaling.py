"""Dynamic loss scaling (``torch.amp.GradScaler``'s semantics) inside the training and optimizer models.

Scaling by a power of two is exact in float32, so artifacts that scale the
loss train bit for bit as those that do not, on the batches whose gradients
are finite; a batch with an infinite gradient leaves every parameter and
moment as it was and backs the scale off.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onnxtrain import api, optim
from onnxtrain.artifacts import LossType, build_artifacts
from onnxtrain.artifacts.fuse import fuse_update_and_train
from onnxtrain.optim.base import updated_name
from onnxtrain.optim.loss_scaling import GROWTH_TRACKER, LOSS_SCALE, SCALER_STATE
from onnxtrain.training.inplace import unsafe_in_place
from onnxtrain.training.optimizer import Optimizer
from tests.training import models

MODEL = models.mlp((4, 8, 3))
PARAMETERS = [t.name for t in MODEL.graph.initializer]
Batch = tuple[np.ndarray, np.ndarray]


def _batches(count: int, seed: int = 0) -> list[Batch]:
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(5, 4)).astype(np.float32), rng.integers(0, 3, 5)) for _ in range(count)]


def _bad(like: Batch) -> Batch:
    """A batch whose gradients are infinite or NaN."""
    return np.full_like(like[0], np.inf), like[1]


def _setup(
    scaling: bool | optim.LossScaling,
    optimizer: optim.Optimizer | None = None,
    fuse: bool = True,
    *,
    as_on_a_gpu: bool = False,
):
    """Artifacts of the MLP, and their state, module and optimizer; ``as_on_a_gpu``: the fused step as on a GPU
    (a session for every step shape, the update's chains packed)."""
    built = build_artifacts(
        MODEL, requires_grad=PARAMETERS, loss=LossType.CrossEntropyLoss,
        optimizer=optimizer or optim.AdamW(), loss_scaling=scaling,
    )  # fmt: skip
    state = api.CheckpointState(built.checkpoint)
    module = api.Module(built.training_model, state, built.eval_model)
    optimizer_of = Optimizer(built.optimizer_model, module, fuse=fuse)
    if as_on_a_gpu and optimizer_of.fused_step is not None:
        optimizer_of.fused_step.fold_every_shape = optimizer_of.fused_step.pack_updates = True
    return built, state, module, optimizer_of


def _train(module: api.Module, optimizer: Optimizer, batches: Sequence[Batch]) -> list[tuple]:
    seen = []
    for x, y in batches:
        module(x, y)
        optimizer.step()
        module.lazy_reset_grad()
        seen.append((optimizer.loss_scale, optimizer.last_step_skipped, optimizer.skipped_steps))
    return seen


def _parameters(state: api.CheckpointState) -> dict[str, np.ndarray]:
    return {name: state.parameters[name].data for name in PARAMETERS}


def _reference(bad: Sequence[bool], scaling: optim.LossScaling) -> list[tuple[float, bool, int]]:
    """GradScaler's scale, skip flag and skipped count after each step, in plain Python."""
    scale, tracker, skipped, seen = scaling.init_scale, 0, 0, []
    for inf in bad:
        if inf:
            scale, tracker, skipped = scale * scaling.backoff_factor, 0, skipped + 1
        else:
            tracker += 1
            if tracker == scaling.growth_interval:
                scale, tracker = scale * scaling.growth_factor, 0
        seen.append((scale, inf, skipped))
    return seen


@settings(max_examples=12, deadline=None)
@given(
    bad=st.lists(st.booleans(), min_size=1, max_size=7),
    interval=st.integers(1, 3),
    mode=st.sampled_from(["apart", "fused", "fused as on a GPU"]),
)
def test_the_scaler_follows_grad_scaler_and_skipped_steps_change_nothing(bad: list[bool], interval: int, mode: str):
    """Also with the fused step as on a GPU, whose packed update reads the scaler's flag."""
    scaling = optim.LossScaling(init_scale=2.0**10, growth_interval=interval)
    good = _batches(len(bad))
    batches = [_bad(batch) if inf else batch for batch, inf in zip(good, bad, strict=True)]
    fuse = mode != "apart"
    _, state, module, optimizer = _setup(scaling, fuse=fuse, as_on_a_gpu=mode == "fused as on a GPU")
    assert _train(module, optimizer, batches) == _reference(bad, scaling)
    if mode == "fused as on a GPU" and len(bad) > 1:  # the fused step ran: its update packed
        assert optimizer.fused_step.step_model is not optimizer.fused_step.model
    # the same artifacts' parameters as those of artifacts without scaling trained on the good batches alone
    _, unscaled_state, unscaled_module, unscaled = _setup(False, fuse=fuse)
    _train(unscaled_module, unscaled, [batch for batch, inf in zip(good, bad, strict=True) if not inf])
    want = _parameters(unscaled_state)
    for name, value in _parameters(state).items():
        np.testing.assert_array_equal(value, want[name], err_msg=name)


def test_an_epoch_with_an_infinite_batch_skips_it_as_single_steps_do():
    scaling = optim.LossScaling(growth_interval=2)
    batches = _batches(4)
    batches[1] = _bad(batches[1])
    x, y = np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches])
    _, epoch_state, epoch_module, epoch_optimizer = _setup(scaling)
    epoch_module.train_epoch(epoch_optimizer, x, y, batch_size=5)
    _, state, module, optimizer = _setup(scaling)
    _train(module, optimizer, batches)
    assert (epoch_optimizer.loss_scale, epoch_optimizer.skipped_steps) == (optimizer.loss_scale, 1)
    for name, value in _parameters(epoch_state).items():
        np.testing.assert_array_equal(value, _parameters(state)[name], err_msg=name)


@pytest.mark.parametrize("as_on_a_gpu", [False, True], ids=["as-on-the-cpu", "as-on-a-gpu"])
def test_clipping_sees_the_unscaled_gradients(as_on_a_gpu: bool):
    """Scaled and clipped, or clipped alone, the same bits; as on a GPU both fused steps pack their chains, which
    read the clipping coefficient and the scaler's flag."""
    clipped = optim.AdamW(clip_grad=optim.ClipGradNorm(0.05))
    batches = _batches(3)
    _, state, module, optimizer = _setup(True, optim.AdamW(clip_grad=optim.ClipGradNorm(0.05)), as_on_a_gpu=as_on_a_gpu)
    _train(module, optimizer, batches)
    _, unscaled_state, unscaled_module, unscaled = _setup(False, clipped, as_on_a_gpu=as_on_a_gpu)
    _train(unscaled_module, unscaled, batches)
    for fused in (optimizer.fused_step, unscaled.fused_step):
        assert (fused.step_model is not fused.model) == as_on_a_gpu
    for name, value in _parameters(state).items():
        np.testing.assert_array_equal(value, _parameters(unscaled_state)[name], err_msg=name)


def test_the_scaler_resumes_bit_for_bit(tmp_path: Path):
    scaling = optim.LossScaling(growth_interval=2)
    batches = _batches(6)
    batches[2] = _bad(batches[2])
    _, whole_state, whole_module, whole = _setup(scaling)
    _train(whole_module, whole, batches)
    built, state, module, optimizer = _setup(scaling)
    _train(module, optimizer, batches[:3])
    api.CheckpointState.save_checkpoint(state, tmp_path / "ckpt", include_optimizer_state=True)
    resumed = api.CheckpointState.load_checkpoint(tmp_path / "ckpt")
    assert resumed.parameters[LOSS_SCALE].data.tolist() == [2.0**16]  # grown at step 2, backed off at step 3
    module = api.Module(built.training_model, resumed, built.eval_model)
    optimizer = Optimizer(built.optimizer_model, module)
    _train(module, optimizer, batches[3:])
    for name in [*PARAMETERS, *SCALER_STATE]:
        np.testing.assert_array_equal(resumed.parameters[name].data, whole_state.parameters[name].data, err_msg=name)
    assert resumed.parameters[GROWTH_TRACKER].data.tolist() == [1]  # 3 good steps after the backoff: grown at 2


def test_fp16_scales_by_default_and_the_other_precisions_do_not():
    def scaled(**options: object) -> bool:
        built = build_artifacts(MODEL, requires_grad=PARAMETERS, loss=LossType.MSELoss, optimizer="AdamW", **options)
        inputs = {value.name for value in built.training_model.graph.input}
        assert (LOSS_SCALE in inputs) == (LOSS_SCALE in built.checkpoint.frozen)
        return LOSS_SCALE in inputs

    assert scaled(precision="fp16")
    assert not scaled(precision="fp16", loss_scaling=False)
    assert not scaled(precision="bf16") and not scaled()
    assert scaled(precision="bf16", loss_scaling=True)


def test_without_loss_scaling_the_api_says_so():
    _, _, _, optimizer = _setup(False)
    assert (optimizer.loss_scale, optimizer.last_step_skipped, optimizer.skipped_steps) == (None, None, None)


def test_bad_scaling_settings_and_a_clashing_name_are_refused():
    with pytest.raises(ValueError, match="growth_factor > 1"):
        optim.LossScaling(growth_factor=0.5)
    with pytest.raises(ValueError, match="growth_interval must be an integer >= 1"):
        optim.LossScaling(growth_interval=0)
    with pytest.raises(TypeError, match=r"loss_scaling must be None, True, False or an onnxtrain\.optim\.LossScaling"):
        build_artifacts(MODEL, requires_grad=PARAMETERS, loss=LossType.MSELoss, loss_scaling="yes")
    clash = onnx.ModelProto()
    clash.CopyFrom(MODEL)
    clash.graph.initializer.append(onnx.numpy_helper.from_array(np.ones(1, np.float32), LOSS_SCALE))
    with pytest.raises(ValueError, match="already has a value named 'loss_scale'"):
        build_artifacts(clash, requires_grad=PARAMETERS, loss=LossType.MSELoss, loss_scaling=True)


@pytest.mark.parametrize(
    "optimizer", [optim.AdamW(), optim.SGD(momentum=0.9), optim.AdamW(clip_grad=optim.ClipGradNorm(1.0))]
)
def test_the_scaled_optimizer_and_fused_step_update_everything_in_place(optimizer: optim.Optimizer):
    """No second buffer for the parameters, moments or the scaler: each new value is computed from every node that
    reads its input (an update that is not in place doubles the state's memory)."""
    built = build_artifacts(
        MODEL, requires_grad=PARAMETERS, loss=LossType.CrossEntropyLoss, optimizer=optimizer, loss_scaling=True
    )
    updated = {value.name: updated_name(value.name) for value in built.optimizer_model.graph.input}
    updated = {
        name: out for name, out in updated.items() if out in {o.name for o in built.optimizer_model.graph.output}
    }
    assert set(SCALER_STATE) <= updated.keys()
    assert unsafe_in_place(built.optimizer_model.graph, updated) == {}
    fused = fuse_update_and_train(built.training_model, built.optimizer_model, PARAMETERS)
    in_fused = {fused.name_of(name): fused.name_of(out) for name, out in updated.items()}
    assert unsafe_in_place(fused.model.graph, in_fused) == {}
