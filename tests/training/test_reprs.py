"""What a notebook shows for a Module, an Optimizer and a Parameter: concise, and with no tensor read.

Before, a Module and an Optimizer showed as ``<onnxtrain.training.module.Module object at 0x...>`` and a
Parameter as its name and ``requires_grad`` only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from onnxtrain import api
from onnxtrain.training import values
from tests.training.helpers import open_module, regression_batch


def _shown(value: object, monkeypatch: pytest.MonkeyPatch) -> str:
    """``repr(value)``, checking that it copies no tensor (``values.to_numpy``: from the device to the host)."""
    copies = []
    to_numpy = values.to_numpy

    def counted(*args: Any, **kwargs: Any) -> np.ndarray:
        copies.append(args)
        return to_numpy(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(values, "to_numpy", counted)
        shown = repr(value)
    assert copies == [], f"repr copied {len(copies)} tensor(s)"
    return shown


def test_a_modules_repr(regression, momentum, rng, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _state, module, _ = open_module(regression, optimizer=False)
    module(*regression_batch(rng))
    assert _shown(module, monkeypatch) == (
        "Module(device='cpu', mode='train', trainable=4 parameters (67 values), frozen=0 parameters (0 values), "
        f"inputs=[x: float32[batch, 4], target: float32[batch, 3]], outputs={module.output_names()}, "
        "eval_model=True, train_steps=1)"
    )
    shown = _shown(module.eval(), monkeypatch)
    assert "mode='eval'" in shown and "inputs=[x: float32[batch, 4], target: float32[batch, 3]]" in shown
    _state, frozen, _ = open_module(momentum, optimizer=False)
    assert "trainable=2 parameters (27 values), frozen=2 parameters (40 values)" in _shown(frozen, monkeypatch)


def test_an_optimizers_repr(regression, classifier, rng, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _state, module, optimizer = open_module(regression)
    assert _shown(optimizer, monkeypatch) == "Optimizer(SGD, learning_rate=0.001, step=0, fused=True)"
    module(*regression_batch(rng))
    optimizer.step()
    api.LinearLRScheduler(optimizer, 0, 10, 0.5)
    assert _shown(optimizer, monkeypatch) == (
        "Optimizer(SGD, learning_rate=0.45, step=1, fused=True, scheduler=LinearLRScheduler)"
    )
    _state, _, adamw = open_module(classifier, fuse=False)
    assert _shown(adamw, monkeypatch) == "Optimizer(AdamW, learning_rate=0.001, step=0, fused=False)"


def test_a_parameters_repr_keeps_onnx_runtimes_and_adds_shape_and_dtype(regression, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    state, _module, _ = open_module(regression, optimizer=False)
    assert _shown(state.parameters["fc1.weight"], monkeypatch) == (
        "Parameter(name=fc1.weight, requires_grad=True, shape=(8, 3), dtype=float32)"
    )
    host = api.CheckpointState.load_checkpoint(regression["checkpoint"])  # before any module: on the host
    assert _shown(host.parameters["fc0.bias"], monkeypatch).endswith("shape=(8,), dtype=float32)")
