"""ONNX Runtime's custom-loss example (seeds/004) runs through onnxtrain's generate_artifacts.

The example (:data:`tests.ort_samples.CUSTOM_LOSS_EXAMPLE`) runs as a script in
a working directory that holds ``model.onnx``, and writes the four artifacts
there, as the page says.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from onnxtrain import checkpoint
from tests.folders import visible_names
from tests.helpers import FLOAT, make_model
from tests.ort_samples import CUSTOM_LOSS_EXAMPLE

RNG = np.random.default_rng(0)
VALUES = {
    "weight1": RNG.normal(size=(3, 5)).astype(np.float32),
    "bias1": RNG.normal(size=5).astype(np.float32),
    "weight2": RNG.normal(size=(5, 2)).astype(np.float32),
    "bias2": RNG.normal(size=2).astype(np.float32),
    "weight3": RNG.normal(size=(5, 4)).astype(np.float32),
    "bias3": RNG.normal(size=4).astype(np.float32),
}


def two_output_model() -> onnx.ModelProto:
    """``r = relu(x @ weight1 + bias1)``; ``output1 = r @ weight2 + bias2``, ``output2 = r @ weight3 + bias3``."""
    nodes = [
        helper.make_node("MatMul", ["x", "weight1"], ["a"]),
        helper.make_node("Add", ["a", "bias1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "weight2"], ["b"]),
        helper.make_node("Add", ["b", "bias2"], ["output1"]),
        helper.make_node("MatMul", ["r", "weight3"], ["c"]),
        helper.make_node("Add", ["c", "bias3"], ["output2"]),
    ]
    outputs = {"output1": (FLOAT, ["batch", 2]), "output2": (FLOAT, ["batch", 4])}
    return make_model({"x": (FLOAT, ["batch", 3])}, nodes, outputs, list(VALUES.items()))


@pytest.fixture
def example_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The example run as a script in a fresh working directory holding model.onnx."""
    onnx.save_model(two_output_model(), tmp_path / "model.onnx")
    monkeypatch.chdir(tmp_path)
    exec(compile(CUSTOM_LOSS_EXAMPLE, "ort_custom_loss_example.py", "exec"), {"__name__": "__main__"})
    return tmp_path


def test_the_example_writes_the_four_artifacts_in_the_working_directory(example_run: Path):
    assert visible_names(example_run) == [
        "checkpoint", "eval_model.onnx", "model.onnx", "optimizer_model.onnx", "training_model.onnx",
    ]  # fmt: skip
    for name in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx"):
        ort.InferenceSession(str(example_run / name), providers=["CPUExecutionProvider"])
    state = checkpoint.load(example_run / "checkpoint")
    assert sorted(state.trainable) == ["bias1", "bias2", "weight1", "weight2"]
    assert sorted(state.frozen) == ["bias3", "weight3"]
    for name, array in state.parameters.items():
        np.testing.assert_array_equal(array, VALUES[name])


def test_the_example_artifacts_compute_the_weighted_loss_and_train(example_run: Path):
    training = onnx.load(example_run / "training_model.onnx")
    trainable = ["weight1", "bias1", "weight2", "bias2"]
    assert [i.name for i in training.graph.input] == [
        "x", "target1", "target2", *VALUES, *(f"{p}_grad.accumulation.buffer" for p in trainable), "lazy_reset_grad",
    ]  # fmt: skip
    sess = ort.InferenceSession(str(example_run / "training_model.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    x = rng.normal(size=(6, 3)).astype(np.float32)
    t1, t2 = rng.normal(size=(6, 2)).astype(np.float32), rng.normal(size=(6, 4)).astype(np.float32)
    feeds = {"x": x, "target1": t1, "target2": t2, **VALUES, "lazy_reset_grad": np.array([True])}
    feeds |= {f"{p}_grad.accumulation.buffer": np.zeros_like(VALUES[p]) for p in trainable}
    out = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
    r = np.maximum(x @ VALUES["weight1"] + VALUES["bias1"], 0)
    o1, o2 = r @ VALUES["weight2"] + VALUES["bias2"], r @ VALUES["weight3"] + VALUES["bias3"]
    expected = 0.4 * np.mean((o1 - t1) ** 2) + 0.6 * np.mean((o2 - t2) ** 2)
    loss = out[training.graph.output[0].name]
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    # weight2 feeds output1 only: its gradient comes from the first term alone
    grad_w2 = r.T @ (0.4 * 2 * (o1 - t1) / o1.size)
    np.testing.assert_allclose(out["weight2_grad.accumulation.out"], grad_w2, rtol=1e-4, atol=1e-6)
