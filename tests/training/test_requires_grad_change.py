"""Which parameters train changes between two runs: freezing a backbone after a warm-up, unfreezing it later.

The artifacts are regenerated with the new ``requires_grad``; the checkpoint of
the first run trains on with ``state.parameters[name].requires_grad`` set before
the ``Module`` is made. Before, loading it raised that the checkpoint did not
belong to the model, with no way out but rewriting the checkpoint by hand.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from onnxtrain import api, artifacts
from tests.helpers import export_for_training

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
    api.Module(regression["training_model"], state)
    with pytest.raises(RuntimeError, match=r"while a Module holds the state.*regenerate the artifacts"):
        state.parameters[name].requires_grad = False
