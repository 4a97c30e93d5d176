"""Which parameters train changes between two runs: freezing a backbone after a warm-up, unfreezing it later.

The artifacts are regenerated with the new ``requires_grad``; the checkpoint of
the first run trains on with ``state.parameters[name].requires_grad`` set before
the ``Module`` is made. Before, loading it raised that the checkpoint did not
belong to the model, with no way out but rewriting the checkpoint by hand.
"""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest

from onnxtrain import api, artifacts, losses
from tests.helpers import export_for_training
from tests.training import models
from tests.training.helpers import open_module, regression_batch

STEPS = 3
RATE = 0.05


def _net(torch):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _batches(count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [
        (rng.standard_normal((5, 4)).astype(np.float32), rng.integers(0, 3, 5).astype(np.int64)) for _ in range(count)
    ]


def _generate(model, folder: Path, trained: list[str], optimizer) -> dict[str, Path]:  # type: ignore[no-untyped-def]
    frozen = [t.name for t in model.graph.initializer if t.name not in trained]
    return artifacts.generate_artifacts(
        model, requires_grad=trained, frozen_params=frozen, loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=optimizer, artifact_directory=folder,
    )  # fmt: skip


def _run(paths: dict[str, Path], state, batches) -> None:  # type: ignore[no-untyped-def]
    module = api.Module(paths["training_model"], state)
    optimizer = api.Optimizer(paths["optimizer_model"], module)
    optimizer.set_learning_rate(RATE)
    for x, y in batches:
        module(x, y)
        optimizer.step()
        module.lazy_reset_grad()


def _torch_run(torch, net, optimizer, batches) -> None:  # type: ignore[no-untyped-def]
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        optimizer.step()


@pytest.mark.parametrize(
    ("kind", "first", "then"),
    [
        ("adamw", ["0.weight", "0.bias", "2.weight", "2.bias"], ["2.weight", "2.bias"]),  # the backbone frozen
        ("sgd", ["2.weight", "2.bias"], ["0.weight", "0.bias", "2.weight", "2.bias"]),  # then unfrozen
    ],
)
def test_a_checkpoint_trains_on_with_other_parameters_as_torch(
    tmp_path: Path, kind: str, first: list[str], then: list[str]
) -> None:
    """torch: ``requires_grad_`` toggled between the runs, one optimizer over every parameter (a parameter
    without a gradient is skipped, weight decay included; SGD's momentum buffer starts at the first gradient)."""
    torch = pytest.importorskip("torch")
    net = _net(torch)
    model = export_for_training(net, (torch.zeros(5, 4),), ["x"], ["y"], opset=17, dynamic_axes={"x": {0: "N"}})
    if kind == "adamw":
        ours, theirs = artifacts.OptimType.AdamW, torch.optim.AdamW(net.parameters(), lr=RATE, eps=1e-6, weight_decay=0)
    else:
        from onnxtrain import optim

        ours, theirs = optim.SGD(momentum=0.9), torch.optim.SGD(net.parameters(), lr=RATE, momentum=0.9)
    batches = _batches(2 * STEPS)
    for name, parameter in net.named_parameters():
        parameter.requires_grad_(name in first)
    before = _generate(model, tmp_path / "first", first, ours)
    state = api.CheckpointState.load_checkpoint(before["checkpoint"])
    _run(before, state, batches[:STEPS])
    api.CheckpointState.save_checkpoint(state, tmp_path / "saved", include_optimizer_state=True)
    _torch_run(torch, net, theirs, batches[:STEPS])

    after = _generate(model, tmp_path / "then", then, ours)
    state = api.CheckpointState.load_checkpoint(tmp_path / "saved")
    with pytest.raises(ValueError, match=r"requires_grad = (True|False) for \["):
        api.Module(after["training_model"], state)  # the error says what to do
    state = api.CheckpointState.load_checkpoint(tmp_path / "saved")
    for name in set(first) ^ set(then):
        state.parameters[name].requires_grad = name in then
    _run(after, state, batches[STEPS:])
    for name, parameter in net.named_parameters():
        parameter.requires_grad_(name in then)
    _torch_run(torch, net, theirs, batches[STEPS:])

    for name, parameter in net.named_parameters():  # AdamW's steps of about the rate carry float32's noise
        np.testing.assert_allclose(
            state.parameters[name].data, parameter.detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=name
        )
    assert {name for name, parameter in state.parameters if parameter.requires_grad} == set(then)


def test_requires_grad_is_set_before_a_module_holds_the_state(regression) -> None:  # type: ignore[no-untyped-def]
    state = api.CheckpointState.load_checkpoint(regression["checkpoint"])
    name = next(name for name, parameter in state.parameters if parameter.requires_grad)
    with pytest.raises(TypeError, match="True or False"):
        state.parameters[name].requires_grad = 1
    module = api.Module(regression["training_model"], state)
    with pytest.raises(RuntimeError, match=r"while a Module holds the state.*regenerate the artifacts"):
        state.parameters[name].requires_grad = False
    assert module.state is state


def _frozen_first_layer(regression: dict[str, Path], state, rng, steps: int = 2) -> None:  # type: ignore[no-untyped-def]
    """Train ``state`` with ``regression``'s artifacts, the first layer frozen."""
    module = api.Module(regression["training_model"], state)
    optimizer = api.Optimizer(regression["optimizer_model"], module)
    optimizer.set_learning_rate(RATE)
    for _ in range(steps):
        module(*regression_batch(rng))
        optimizer.step()
        module.lazy_reset_grad()


def test_requires_grad_is_set_once_the_modules_over_the_state_are_gone(tmp_path: Path, regression, rng) -> None:  # type: ignore[no-untyped-def]
    """Before, a state any module had used refused it for good, ``del module, optimizer; gc.collect()`` or not.
    Now it gives what the documented route gives: save, load, set."""
    state, module, optimizer = open_module(regression)
    optimizer.set_learning_rate(RATE)
    module(*regression_batch(rng))
    optimizer.step()  # recorded, not applied: the state holds the optimizer (and through it the module) meanwhile
    names = ["fc0.weight", "fc0.bias"]
    with pytest.raises(RuntimeError, match=r"\(1 Module over it is still referenced.*del module, optimizer"):
        state.parameters[names[0]].requires_grad = False
    assert [name for name, parameter in state.parameters if parameter.grad is not None] == list(
        state.parameters.names()
    )
    api.CheckpointState.save_checkpoint(state, tmp_path / "saved", include_optimizer_state=True)
    del module, optimizer
    gc.collect()
    for name in names:
        state.parameters[name].requires_grad = False
    loaded = api.CheckpointState.load_checkpoint(tmp_path / "saved")
    for name in names:
        loaded.parameters[name].requires_grad = False
    assert state.parameters.names() == loaded.parameters.names()
    assert all(parameter.grad is None for _, parameter in state.parameters)  # restarted, as the loaded state's

    frozen = models.generate(
        tmp_path / "frozen", models.mlp((4, 8, 3)), requires_grad=["fc1.weight", "fc1.bias"], frozen_params=names,
        loss=losses.MSELoss(reduction="sum"), optimizer=artifacts.OptimType.SGD, additional_output_names=["y"],
    )  # fmt: skip
    for trained in (state, loaded):
        _frozen_first_layer(frozen, trained, np.random.default_rng(5))
    ours, theirs = state.to_checkpoint(), loaded.to_checkpoint()
    assert ours.optimizer is not None and theirs.optimizer is not None and ours.optimizer.step == 3
    for name in state.parameters.names():
        np.testing.assert_array_equal(ours.parameters[name], theirs.parameters[name], err_msg=name)


def test_requires_grad_is_refused_while_any_module_over_the_state_lives(regression) -> None:  # type: ignore[no-untyped-def]
    """Two modules over one state (a notebook's setup cell run again): refused until both are gone, without
    gc.collect() (the state collects modules that wait in reference cycles itself)."""
    state = api.CheckpointState.load_checkpoint(regression["checkpoint"])
    first = api.Module(regression["training_model"], state)
    second = api.Module(regression["training_model"], state, regression["eval_model"])
    with pytest.raises(RuntimeError, match=r"\(2 Modules over it are still referenced"):
        state.parameters["fc0.bias"].requires_grad = False
    del first
    with pytest.raises(RuntimeError, match=r"\(1 Module over it is still referenced"):
        state.parameters["fc0.bias"].requires_grad = False
    del second
    state.parameters["fc0.bias"].requires_grad = False
    assert not state.parameters["fc0.bias"].requires_grad
