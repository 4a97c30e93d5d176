"""``lr_scale``: parameters stepped at the learning rate times a factor of their own, as torch's parameter
groups of their own ``lr`` (a classifier head at 10x, layer-wise decay), every optimizer, any schedule."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from onnxtrain import api, artifacts, optim
from tests.helpers import export_for_training
from tests.optim.runner import onnx_trajectory, reference_trajectory

PARAMS = {"body.w": np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3), "head.b": np.ones(3, np.float32)}
GRADS = [
    {"body.w": np.full((2, 3), 0.1 * i, np.float32), "head.b": np.full(3, -0.2 * i, np.float32)} for i in (1, 2, 3)
]


@pytest.mark.parametrize(
    "block",
    [
        optim.SGD(momentum=0.9, lr_scale={"head.*": 10.0}),
        optim.Adam(weight_decay=0.01, lr_scale={"head.*": 10.0, "body.*": 0.5}),
        optim.AdamW(weight_decay=0.1, no_decay=["b"], lr_scale={"b": 3.0}),
        optim.Adagrad(lr_decay=0.1, lr_scale={"body.w": 0.25}),
        optim.RMSprop(momentum=0.5, centered=True, lr_scale={"head.b": 2.0}),
    ],
    ids=lambda block: type(block).__name__,
)
def test_each_parameter_steps_at_its_scaled_rate_as_the_reference(block: optim.Optimizer) -> None:
    """The model's steps against NumPy's at ``lr * factor``: each parameter as if it were alone at that rate."""
    got = onnx_trajectory(block, PARAMS, GRADS, [1e-2, 2e-2, 5e-3])
    expected = reference_trajectory(block, PARAMS, GRADS, [1e-2, 2e-2, 5e-3])
    for (params, states), (want, want_states) in zip(got, expected, strict=True):
        for name in PARAMS:
            np.testing.assert_allclose(params[name], want[name], rtol=1e-6, atol=1e-7, err_msg=name)
            for state, want_state in zip(states[name], want_states[name], strict=True):
                np.testing.assert_allclose(state, want_state, rtol=1e-6, atol=1e-7, err_msg=name)
    alone = onnx_trajectory(type(block)(**{**block.hyperparameters(), "lr_scale": None}), PARAMS, GRADS, [1e-2] * 3)
    assert not np.array_equal(got[-1][0]["head.b"], alone[-1][0]["head.b"]) or block.lr_scale_of("head.b") == 1.0


def test_a_head_at_ten_times_the_rate_trains_as_torchs_parameter_groups(tmp_path: Path) -> None:
    """torch: ``AdamW([{"params": body}, {"params": head, "lr": 10 * lr}])`` under one warm-up schedule (a
    scheduler scales every group's rate by its factor); every parameter after 8 steps of ``train_epoch``."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    model = export_for_training(net, (torch.zeros(5, 4),), ["x"], ["y"], opset=17, dynamic_axes={"x": {0: "N"}})
    block = optim.AdamW(eps=1e-8, weight_decay=0.01, lr_scale={"2.*": 10.0})
    names = [name for name, _ in net.named_parameters()]
    paths = artifacts.generate_artifacts(
        model, requires_grad=names, loss=artifacts.LossType.CrossEntropyLoss, optimizer=block,
        artifact_directory=tmp_path,
    )  # fmt: skip
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((37, 4)).astype(np.float32), rng.integers(0, 3, 37).astype(np.int64)
    rate, warmup, total = 1e-2, 3, 10
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state)
    optimizer = api.Optimizer(paths["optimizer_model"], module)
    api.LinearLRScheduler(optimizer, warmup, total, rate)
    module.train_epoch(optimizer, x, y, batch_size=5)  # 8 batches, the last of 2

    groups = [{"params": list(net[0].parameters())}, {"params": list(net[2].parameters()), "lr": 10 * rate}]
    theirs = torch.optim.AdamW(groups, lr=rate, eps=1e-8, weight_decay=0.01)
    factor = lambda t: t / warmup if t < warmup else max(0.0, (total - t) / (total - warmup))  # noqa: E731
    schedule = torch.optim.lr_scheduler.LambdaLR(theirs, factor)
    for start in range(0, 37, 5):
        theirs.zero_grad()
        logits = net(torch.from_numpy(x[start : start + 5]))
        torch.nn.functional.cross_entropy(logits, torch.from_numpy(y[start : start + 5])).backward()
        theirs.step()
        schedule.step()
    for name, parameter in net.named_parameters():
        np.testing.assert_allclose(
            state.parameters[name].data, parameter.detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=name
        )


def test_bad_factors_and_the_targets_that_cannot_take_them() -> None:
    with pytest.raises(ValueError, match=r"lr_scale\['head\.\*'\]=0 is out of range"):
        optim.SGD(lr_scale={"head.*": 0})
    with pytest.raises(TypeError, match=r"lr_scale\['head\.\*'\] must be a finite number > 0 \(a real number\), not"):
        optim.SGD(lr_scale={"head.*": "2"})
    with pytest.raises(TypeError, match="mapping of parameter-name patterns to factors"):
        optim.SGD(lr_scale=["head.*"])  # type: ignore[arg-type]
    from onnxtrain.optim.ort_nodes import ort_node

    with pytest.raises(ValueError, match=r"another learning rate \(lr_scale\).*target='onnxruntime'"):
        ort_node(optim.AdamW(lr_scale={"head.*": 2.0}))


def test_a_pattern_that_scales_no_parameter_warns() -> None:
    import onnxtrain.onnxblock as onnxblock
    from onnxtrain.optim import UnmatchedPatternWarning
    from tests.optim.runner import tensors

    warned = r"the lr_scale pattern 'classifier' matches none"
    with pytest.warns(UnmatchedPatternWarning, match=warned), onnxblock.empty_base():
        optim.AdamW(lr_scale={"classifier": 10.0})((tensors(PARAMS), []))
    with warnings.catch_warnings(), onnxblock.empty_base():
        warnings.simplefilter("error", UnmatchedPatternWarning)
        optim.AdamW(lr_scale={"head.*": 10.0})((tensors(PARAMS), []))
    # a glob gets no suggestion of globs made from it; a frozen parameter's factor applies to nothing either
    frozen = tensors({"frozen.w": np.ones(2, np.float32)})
    with pytest.warns(UnmatchedPatternWarning) as caught, onnxblock.empty_base():
        optim.AdamW(lr_scale={"frozen.*": 2.0})((tensors(PARAMS), frozen))
    message = str(caught[0].message)
    assert "matches none of the 2 trainable parameters" in message and ".*.*" not in message
