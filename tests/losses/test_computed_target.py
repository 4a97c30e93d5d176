"""``ComputedTargetWarning``: said where a loss pairs two outputs of the model by accident, not for a
deliberate pair (distillation from a frozen teacher), and its advice names model outputs only.

ONNX Runtime's default ``loss_input_names`` gives a loss every output of the
model: ``MSELoss`` of a model of two heads takes the second as the target of
the first, and training pulls one toward the other. A user's distillation
block computes the student's log-probabilities and takes the frozen teacher's
probabilities, another output, as ``KLDivLoss``'s target on purpose: the
warning called that a mistake and advised ``loss_input_names=['logsoftmax_0']``,
an intermediate value that ``generate_artifacts`` then refused.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxtrain import artifacts, onnxblock
from onnxtrain.losses import ComputedTargetWarning
from tests.helpers import FLOAT, make_model

STUDENT = ["s.weight", "s.bias"]
TEACHER = ["t.weight", "t.bias"]


def _pair(*, log_probs: bool = False) -> onnx.ModelProto:
    """``x: float[batch, 4]`` -> ``student`` (logits, or log-probabilities with ``log_probs``) and
    ``teacher_probs`` (a softmax), each a linear layer of its own."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Gemm", ["x", "s.weight", "s.bias"], ["s_logits" if log_probs else "student"], transB=1),
        helper.make_node("Gemm", ["x", "t.weight", "t.bias"], ["t_logits"], transB=1),
        helper.make_node("Softmax", ["t_logits"], ["teacher_probs"], axis=1),
    ]
    if log_probs:
        nodes.append(helper.make_node("LogSoftmax", ["s_logits"], ["student"], axis=1))
    initializers = [
        (name, rng.normal(size=(3, 4) if name.endswith("weight") else 3).astype(np.float32))
        for name in (*STUDENT, *TEACHER)
    ]
    outputs = {"student": (FLOAT, ["batch", 3]), "teacher_probs": (FLOAT, ["batch", 3])}
    return make_model({"x": (FLOAT, ["batch", 4])}, nodes, outputs, initializers)


class Distill(onnxblock.Block):
    """KL(teacher || student): the student's log-probabilities computed here."""

    def build(self, student: str, teacher: str) -> str:
        log_probs = onnxblock.blocks.LogSoftmax(axis=1)(student)
        return onnxblock.loss.KLDivLoss(reduction="batchmean")(log_probs, target_name=teacher)


class DistillLogProbs(onnxblock.Block):
    """KL(teacher || student) on a model that outputs the student's log-probabilities itself."""

    def build(self, student: str, teacher: str) -> str:
        return onnxblock.loss.KLDivLoss(reduction="batchmean")(student, target_name=teacher)


def _said(model: onnx.ModelProto, loss: object, directory: Path, requires_grad: list[str], frozen: list[str]) -> list:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        artifacts.generate_artifacts(
            model, requires_grad=requires_grad, frozen_params=frozen, loss=loss, optimizer="AdamW",
            artifact_directory=directory,
        )  # fmt: skip
    return [w for w in caught if w.category is ComputedTargetWarning]


def test_distillation_from_a_frozen_teacher_is_not_said(tmp_path: Path) -> None:
    """The user's block: its loss input is a value it computed, and the teacher trains no parameter."""
    assert _said(_pair(), Distill(), tmp_path, STUDENT, TEACHER) == []


def test_a_loss_input_the_block_computed_is_its_own_choice(tmp_path: Path) -> None:
    """A teacher that trains too (mutual learning): still the block's pair, its input no model output."""
    assert _said(_pair(), Distill(), tmp_path, [*STUDENT, *TEACHER], []) == []


def test_a_target_no_trained_parameter_feeds_is_data(tmp_path: Path) -> None:
    """The loss on the model's own log-probabilities output, the frozen teacher's output its target."""
    assert _said(_pair(log_probs=True), DistillLogProbs(), tmp_path, STUDENT, TEACHER) == []


def test_a_target_that_trains_is_said_with_advice_naming_a_model_output(tmp_path: Path) -> None:
    model = _pair(log_probs=True)
    said = _said(model, DistillLogProbs(), tmp_path, [*STUDENT, *TEACHER], [])
    assert len(said) == 1
    message = str(said[0].message)
    assert "'teacher_probs' as the target of its output 'student'" in message
    advised = re.findall(r"loss_input_names=\[([^\]]*)\]", message)
    assert advised == ["'student'"]
    assert "student" in {output.name for output in model.graph.output}
    artifacts.generate_artifacts(  # the advice is accepted
        model, requires_grad=STUDENT, loss=artifacts.LossType.MSELoss, loss_input_names=["student"],
        artifact_directory=tmp_path / "advised",
    )  # fmt: skip


def test_the_default_loss_inputs_of_two_trained_heads_are_still_said(tmp_path: Path) -> None:
    """generate_artifacts' default: MSELoss(student, teacher_probs) of a model whose heads both train."""
    said = _said(_pair(), artifacts.LossType.MSELoss, tmp_path, [*STUDENT, *TEACHER], [])
    assert len(said) == 1
    assert "loss_input_names=['student']" in str(said[0].message)


def test_the_default_loss_inputs_over_a_frozen_output_are_said(tmp_path: Path) -> None:
    """generate_artifacts' default pairs a built-in loss with every output: MSELoss(student, teacher_probs) with
    the teacher frozen (a head fine-tuned over a frozen backbone's features, both outputs) takes no labels, and
    was no longer said once a frozen target counted as data. The pairing is the default's, not the user's."""
    said = _said(_pair(), artifacts.LossType.MSELoss, tmp_path, STUDENT, TEACHER)
    assert len(said) == 1
    assert "loss_input_names=['student']" in str(said[0].message)


def test_a_bare_base_cannot_tell_what_trains_and_says_it() -> None:
    """Outside a training block nothing says which values train: the warning stays (as it was)."""
    with onnxblock.base(_pair()), pytest.warns(ComputedTargetWarning, match=r"loss_input_names=\['student'\]"):
        onnxblock.loss.MSELoss()("student", "teacher_probs")
