"""The accuracy: found from the artifacts' metadata and outputs, counted from scores and targets."""

from __future__ import annotations

import numpy as np
import pytest

from onnxtrain import artifacts
from onnxtrain.loop import Accuracy, accuracy_of
from onnxtrain.training.tensor_spec import TensorSpec
from tests.cli.helpers import tiny_mlp

LABELS = TensorSpec("labels", np.dtype(np.int64), ("batch",))
X = TensorSpec("x", np.dtype(np.float32), ("batch", 4))


def test_class_accuracy_from_the_class_axis():
    scores = np.array([[[0.1, 0.9], [0.8, 0.2]], [[0.3, 0.3], [0.1, 0.0]]], np.float32)  # [N=2, C=2, d=2]
    labels = np.array([[0, 1], [0, 0]])  # argmax over axis 1: [[1, 0], [0, 0]]
    assert Accuracy("classes", 1, 1).count((np.float32(0.5), scores), [np.zeros(2), labels]) == (2, 4)


def test_class_accuracy_counts_only_the_labels_that_are_classes():
    """An ignored label (-100, a padded position's) is neither right nor wrong."""
    scores = np.array([[[0.1, 0.9], [0.8, 0.2]], [[0.3, 0.3], [0.1, 0.0]]], np.float32)  # argmax [[1, 0], [0, 0]]
    labels = np.array([[0, -100], [0, -100]])
    assert Accuracy("classes", 1, 1).count((np.float32(0.5), scores), [np.zeros(2), labels]) == (1, 2)


def test_binary_accuracy_of_logits_and_probabilities():
    target = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    logits = np.array([[2.0, -1.0], [0.5, -0.5]], np.float32)
    assert Accuracy("logits", 1, 1).count((0.0, logits), [None, target]) == (2, 4)
    assert Accuracy("probabilities", 1, 1).count((0.0, 1 / (1 + np.exp(-logits))), [None, target]) == (2, 4)


def test_scores_that_do_not_line_up_count_nothing():
    assert Accuracy("classes", 1, 1).count((0.0, np.zeros((3, 2))), [None, np.zeros((3, 1), np.int64)]) == (0, 0)


@pytest.mark.parametrize(
    ("loss", "scores", "inputs", "expected"),
    [
        ("CrossEntropyLoss", True, [X, LABELS], Accuracy("classes", 1, 1)),
        ("CrossEntropyLoss", False, [X, LABELS], None),  # the scores are not an output
        ("CrossEntropyLoss", True, [X, TensorSpec("p", np.dtype(np.float32), ("batch", 3))], None),  # soft targets
        ("MSELoss", True, [X, TensorSpec("t", np.dtype(np.float32), ("batch", 3))], None),
    ],
)
def test_accuracy_of_the_artifacts(loss: str, scores: bool, inputs: list[TensorSpec], expected: Accuracy | None):
    model = tiny_mlp()
    output = model.graph.output[0].name
    built = artifacts.build_artifacts(
        model, requires_grad=[t.name for t in model.graph.initializer], loss=loss,
        additional_output_names=[output] if scores else None,
    )  # fmt: skip
    outputs = [o.name for o in built.eval_model.graph.output]
    assert accuracy_of(built.eval_model, outputs, inputs) == expected
