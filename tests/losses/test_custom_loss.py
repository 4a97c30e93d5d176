"""ONNX Runtime's custom-loss example (``WeightedAverageLoss``) runs on onnxtrain unchanged.

The class is the example from ONNX Runtime's onnxblock documentation
(:func:`tests.ort_samples.weighted_average_loss`, the one copy of it), with
only its import changed (so it keeps the documentation's style: no type
hints, no ``super().__init__()``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

import onnxtrain.onnxblock as onnxblock
from tests.helpers import FLOAT, make_model, run_model, tolerance
from tests.losses import oracles
from tests.ort_samples import weighted_average_loss

REPO_ROOT = Path(__file__).resolve().parents[2]


#: ONNX Runtime's example class (tests/ort_samples.py), with only its import changed.
WeightedAverageLoss = weighted_average_loss()


class ForwardWithCustomLoss(onnxblock.ForwardBlock):
    """The forward model: the base model's two outputs, reduced by the custom loss."""

    def __init__(self) -> None:
        super().__init__()
        self.loss = WeightedAverageLoss()

    def build(self, output1: str, output2: str) -> str:
        return self.loss(output1, output2)


W1 = np.random.default_rng(0).uniform(-1, 1, (4, 3)).astype(np.float32)
W2 = np.random.default_rng(1).uniform(-1, 1, (4, 2)).astype(np.float32)


def two_output_model() -> onnx.ModelProto:
    """``output1 = relu(x @ W1)`` (batch, 3) and ``output2 = x @ W2`` (batch, 2)."""
    return make_model(
        {"x": (FLOAT, ["batch", 4])},
        [
            helper.make_node("MatMul", ["x", "weight1"], ["hidden1"]),
            helper.make_node("Relu", ["hidden1"], ["output1"]),
            helper.make_node("MatMul", ["x", "weight2"], ["output2"]),
        ],
        {"output1": (FLOAT, ["batch", 3]), "output2": (FLOAT, ["batch", 2])},
        initializers=[("weight1", W1), ("weight2", W2)],
    )


def build_custom_loss_model() -> onnx.ModelProto:
    block = ForwardWithCustomLoss()
    with onnxblock.base(two_output_model()):
        block("output1", "output2")
    return block.to_model_proto()


def test_custom_loss_adds_both_targets() -> None:
    model = build_custom_loss_model()
    inputs = {value.name: value.type.tensor_type for value in model.graph.input}
    assert list(inputs) == ["x", "target1", "target2"]
    assert [d.dim_param or d.dim_value for d in inputs["target1"].shape.dim] == ["batch", 3]
    assert [d.dim_param or d.dim_value for d in inputs["target2"].shape.dim] == ["batch", 2]
    assert all(t.elem_type == FLOAT for t in inputs.values())
    (output,) = model.graph.output
    assert output.type.tensor_type.elem_type == FLOAT
    assert len(output.type.tensor_type.shape.dim) == 0


def test_custom_loss_is_the_weighted_average_of_the_two_mse() -> None:
    model = build_custom_loss_model()
    rng = np.random.default_rng(2)
    for batch in (1, 5):
        x = rng.standard_normal((batch, 4)).astype(np.float32)
        target1 = rng.standard_normal((batch, 3)).astype(np.float32)
        target2 = rng.standard_normal((batch, 2)).astype(np.float32)
        (loss,) = run_model(model, {"x": x, "target1": target1, "target2": target2})
        x64 = x.astype(np.float64)
        mse1 = oracles.mse_loss(np.maximum(x64 @ W1, 0.0), target1)
        mse2 = oracles.mse_loss(x64 @ W2, target2)
        expected = 0.4 * mse1 + 0.6 * mse2
        assert loss.dtype == np.float32 and loss.shape == ()
        np.testing.assert_allclose(loss, expected, **tolerance(np.float32))


_BUILD_IN_SUBPROCESS = (
    "import sys\n"
    "from tests.losses.test_custom_loss import build_custom_loss_model\n"
    "sys.stdout.buffer.write(build_custom_loss_model().SerializeToString())\n"
)


def build_in_subprocess(hash_seed: str) -> bytes:
    """The serialized model, built by a fresh interpreter with string hashing seeded by ``hash_seed``."""
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", _BUILD_IN_SUBPROCESS],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return result.stdout


def test_custom_loss_builds_byte_identically_in_separate_processes() -> None:
    """Names come from a per-build counter: the same build gives the same bytes in every process."""
    first = build_in_subprocess("1")
    second = build_in_subprocess("2")
    assert first, "the subprocess wrote no model"
    assert first == second
    assert build_custom_loss_model().SerializeToString() == first


class TokenCrossEntropy(onnxblock.Block):
    """docs/artifacts.md's loss for ``[batch, seq, classes]`` scores: flattened to one row per token."""

    def __init__(self) -> None:
        super().__init__()
        self.flatten = onnxblock.blocks.Flatten(axis=2)
        self.loss = onnxblock.loss.CrossEntropyLoss(ignore_index=-100)

    def build(self, logits: str) -> str:
        return self.loss(self.flatten(logits))


class ForwardTokenLoss(onnxblock.ForwardBlock):
    """The forward model: the scores, reduced by :class:`TokenCrossEntropy`."""

    def __init__(self) -> None:
        super().__init__()
        self.loss = TokenCrossEntropy()

    def build(self, logits: str) -> str:
        return self.loss(logits)


def test_scores_per_token_flattened_in_the_loss_are_torchs_cross_entropy_over_the_tokens() -> None:
    """``[batch, seq, classes]`` scores flattened in the loss, one label per token (-100 not counted): the mean
    of ``-log softmax`` at the counted labels, as ``torch.nn.functional.cross_entropy(logits.flatten(0, 1),
    labels.flatten())``."""
    model = make_model(
        {"x": (FLOAT, ["batch", "seq", 5])}, [helper.make_node("Identity", ["x"], ["logits"])],
        {"logits": (FLOAT, ["batch", "seq", 5])},
    )  # fmt: skip
    forward = ForwardTokenLoss()
    with onnxblock.base(model):
        forward("logits")
    built = forward.to_model_proto()
    labels_input = built.graph.input[-1]
    assert len(labels_input.type.tensor_type.shape.dim) == 1  # one label per token
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3, 5)).astype(np.float32)
    labels = np.array([[0, 4, 2], [1, 3, -100]])
    (loss,) = run_model(built, {"x": x, labels_input.name: labels.reshape(-1)})
    rows, flat = x.reshape(6, 5), labels.reshape(-1)
    log_p = rows - np.log(np.exp(rows).sum(axis=1, keepdims=True))
    counted = flat != -100
    want = -log_p[np.arange(6)[counted], flat[counted]].mean()
    np.testing.assert_allclose(loss, want, **tolerance(np.float32))
