"""Checkpoints move between onnxtrain and ONNX Runtime's training runtime (1.19.2).

ORT's side runs in a subprocess with the interpreter of ``.venv-ort-training``
(``make ort-training``; ``ONNXTRAIN_ORT_TRAINING_PYTHON`` overrides it), see
``ort_side.py``. The tests skip, with the reason, where that environment could
not be created (no onnxruntime-training wheel for this platform or Python).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from onnx import numpy_helper

from onnxtrain.checkpoint import CheckpointState, OptimizerState, from_tensors, load, save
from tests.ort_training_env import ort_training_python, run_ort_side

ADAMW = {"beta1": 0.9, "beta2": 0.999, "eps": 1e-6, "weight_decay": 0.0}
LEARNING_RATE = 0.02


def test_missing_environment_skips_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.delenv("ONNXTRAIN_ORT_TRAINING_PYTHON", raising=False)
    with pytest.raises(pytest.skip.Exception, match="make ort-training"):
        ort_training_python(tmp_path)
    (tmp_path / "UNAVAILABLE").write_text("no wheel for this Python")
    with pytest.raises(pytest.skip.Exception, match="no wheel for this Python"):
        ort_training_python(tmp_path)


def our_state() -> CheckpointState:
    rng = np.random.default_rng(7)
    shapes = {"dense.weight": (3, 4), "dense.bias": (4,)}
    trainable = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    moments = {
        n: [rng.standard_normal(s).astype(np.float32), rng.random(s).astype(np.float32)] for n, s in shapes.items()
    }
    frozen = {
        "embedding": rng.standard_normal((5, 2)),  # float64
        "positions": np.arange(6, dtype=np.int64),
        "mask": np.array([True, False, True]),
        "counts": np.array([1, 2, 3], np.int32),
        "bytes": np.arange(7, dtype=np.uint8),
        "scale": np.float64(0.5),  # a scalar
        "nothing": np.zeros((0, 3), np.float32),  # an empty tensor
    }
    return CheckpointState(
        trainable,
        frozen,
        OptimizerState(moments, step=7, initial_learning_rate=LEARNING_RATE),
        {"epoch": 3, "best_loss": 0.125, "run": "interop", "big": -(2**63)},
    )


def adamw_step(param: np.ndarray, m: np.ndarray, v: np.ndarray, step: int) -> tuple[np.ndarray, ...]:
    """ORT's AdamWOptimizer (adam_mode=1, correct_bias=1) for a gradient of ones at step ``step``."""
    b1, b2, eps = ADAMW["beta1"], ADAMW["beta2"], ADAMW["eps"]
    g = np.ones_like(param, dtype=np.float64)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    lr = LEARNING_RATE * np.sqrt(1 - b2**step) / (1 - b1**step)
    return param - lr * m / (np.sqrt(v) + eps), m, v


@pytest.fixture(scope="module")
def ort_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CheckpointState, dict]:
    ort_training_python()
    work = tmp_path_factory.mktemp("ort_interop")
    state = our_state()
    save(state, work / "ours")
    save(state, work / "ours_external", external_data_threshold=0)
    save(state.nominal(), work / "ours_nominal")
    offline = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "ids": np.arange(4), "s": np.float64(3.0)}
    np.savez(work / "offline_params.npz", **offline)
    spec = {
        "load": ["ours", "ours_external", "ours_nominal"],
        "train": "ours",
        "trainable_shapes": {n: list(a.shape) for n, a in state.trainable.items()},
        "adamw": ADAMW,
        "learning_rate": LEARNING_RATE,
        "offline_trainable": ["w"],
    }
    (work / "spec.json").write_text(json.dumps(spec))
    run_ort_side(Path(__file__).with_name("ort_side.py"), work, timeout=120)
    return work, state, json.loads((work / "report.json").read_text())


@pytest.mark.parametrize("name", ["ours", "ours_external"])
def test_ort_loads_our_checkpoint(ort_run, name):
    work, state, report = ort_run
    loaded = np.load(work / f"loaded_{name}.npz", allow_pickle=False)
    assert sorted(loaded.files) == sorted(state.parameters)
    for param, array in state.parameters.items():
        assert loaded[param].dtype == array.dtype, param
        assert loaded[param].shape == array.shape, param
        assert loaded[param].tobytes() == array.tobytes(), param
        assert report[name]["params"][param]["requires_grad"] == (param in state.trainable), param
    assert report[name]["properties"] == dict(state.properties)


def test_ort_loads_our_nominal_checkpoint(ort_run):
    _, state, report = ort_run
    nominal = report["ours_nominal"]
    assert sorted(nominal["params"]) == sorted(state.parameters)
    assert all("nominal" in entry.get("error", "") for entry in nominal["params"].values())
    assert nominal["properties"] == dict(state.properties)


def test_ort_writes_back_our_optimizer_state_unchanged(ort_run):
    work, state, _ = ort_run
    assert load(work / "ort_resaved") == state


def test_ort_steps_with_our_moments(ort_run):
    """ORT's AdamW used momentum0 as the first and momentum1 as the second moment."""
    work, state, _ = ort_run
    stepped = load(work / "ort_stepped")
    assert stepped.optimizer is not None and state.optimizer is not None
    assert stepped.optimizer.step == state.optimizer.step + 1
    assert _same(stepped.frozen, state.frozen)
    for name, param in state.trainable.items():
        m, v = state.optimizer.moments[name]
        expected = adamw_step(param.astype(np.float64), m, v, state.optimizer.step + 1)
        got = (stepped.trainable[name], *stepped.optimizer.moments[name])
        for g, e in zip(got, expected, strict=True):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
    assert stepped.properties == state.properties


def test_we_load_ort_offline_checkpoints(ort_run):
    work, _, _ = ort_run
    offline = np.load(work / "offline_params.npz", allow_pickle=False)
    tensors = {n: numpy_helper.from_array(offline[n], n) for n in offline.files}
    expected = from_tensors([tensors["w"]], [tensors["ids"], tensors["s"]])
    assert load(work / "ort_offline") == expected
    nominal = load(work / "ort_nominal")
    assert nominal.is_nominal
    # ORT's nominal tensors keep name and element type but drop the shape.
    assert {n: a.dtype for n, a in nominal.parameters.items()} == {n: a.dtype for n, a in expected.parameters.items()}
    assert sorted(nominal.trainable) == ["w"]


def _same(a, b) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a)
