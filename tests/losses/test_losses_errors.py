"""Misuse of the loss blocks: the error says what is wrong, and the base model is left as it was.

Every check builds inside ``with onnxblock.base(model) as builder`` and
compares ``builder.model.SerializeToString()`` before and after the failing
call (constructor errors included: the block is made inside the context).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper

import onnxtrain.onnxblock as onnxblock
from tests.helpers import DOUBLE, FLOAT, INT32, INT64, make_model

LOSSES = ["MSELoss", "L1Loss", "HuberLoss", "SmoothL1Loss", "CrossEntropyLoss", "NLLLoss",
          "BCEWithLogitsLoss", "BCELoss", "KLDivLoss"]  # fmt: skip


def base_model(elem_type: int = FLOAT, shape: list[Any] | None = None) -> onnx.ModelProto:
    """``y = Identity(x)`` of ``elem_type`` plus an int64 input ``lab`` (batch,) and a float input ``t``."""
    shape = ["batch", 3] if shape is None else shape
    return make_model(
        {"x": (elem_type, shape), "lab": (INT64, ["batch"]), "t": (DOUBLE, ["batch", 3])},
        [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Cast", ["lab"], ["lab_float"], to=FLOAT)],
        {"y": (elem_type, shape), "lab_float": (FLOAT, ["batch"])},
    )


def assert_fails_cleanly(
    call: Callable[[], Any], error: type[Exception], match: str, model: onnx.ModelProto | None = None
) -> pytest.ExceptionInfo[Exception]:
    """``call()`` raises ``error`` matching ``match`` inside a base context, and changes nothing."""
    model = base_model() if model is None else model
    caller_bytes = model.SerializeToString()
    with onnxblock.base(model) as builder:
        before = builder.model.SerializeToString()
        with pytest.raises(error, match=match) as info:
            call()
        assert builder.model.SerializeToString() == before, "the failed block left nodes or inputs behind"
    assert model.SerializeToString() == caller_bytes
    return info


# ------------------------------------------------------------------ reductions


@pytest.mark.parametrize(
    ("loss", "reduction"),
    [(loss, reduction) for loss in LOSSES for reduction in ("average", "Mean", "", None)]
    + [(loss, "batchmean") for loss in LOSSES if loss != "KLDivLoss"],
)
def test_unknown_reduction_lists_the_valid_ones(loss: str, reduction: Any) -> None:
    valid = ["mean", "sum", "none", "batchmean"] if loss == "KLDivLoss" else ["mean", "sum", "none"]
    info = assert_fails_cleanly(lambda: getattr(onnxblock.loss, loss)(reduction=reduction)("y"), ValueError, loss)
    message = str(info.value)
    assert repr(reduction) in message
    for name in valid:
        assert repr(name) in message


# ---------------------------------------------------------------- input types


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("elem_type", [INT32, INT64, onnx.TensorProto.BOOL], ids=["int32", "int64", "bool"])
def test_non_float_loss_input_asks_for_a_cast(loss: str, elem_type: int) -> None:
    info = assert_fails_cleanly(
        lambda: getattr(onnxblock.loss, loss)()("y"), TypeError, "Cast", model=base_model(elem_type)
    )
    assert "'y'" in str(info.value)
    assert loss in str(info.value)


@pytest.mark.parametrize("loss", LOSSES)
def test_unknown_loss_input_name_lists_the_models_values(loss: str) -> None:
    info = assert_fails_cleanly(lambda: getattr(onnxblock.loss, loss)()("z"), ValueError, "'z'")
    assert "'y'" in str(info.value)


@pytest.mark.parametrize("loss", ["CrossEntropyLoss", "NLLLoss"])
@pytest.mark.parametrize(
    "label_dtype", [np.float32, np.int16, np.uint8, "float", onnx.TensorProto.DOUBLE, "no such type"]
)
def test_label_dtype_must_be_int32_or_int64(loss: str, label_dtype: Any) -> None:
    info = assert_fails_cleanly(
        lambda: getattr(onnxblock.loss, loss)(label_dtype=label_dtype)("y"), TypeError, "int32 or int64"
    )
    assert loss in str(info.value)


@pytest.mark.parametrize("loss", ["CrossEntropyLoss", "NLLLoss"])
@pytest.mark.parametrize("shape", [["batch"], []], ids=["rank1", "rank0"])
def test_class_losses_need_a_class_axis(loss: str, shape: list[Any]) -> None:
    model = base_model(FLOAT, shape)
    info = assert_fails_cleanly(lambda: getattr(onnxblock.loss, loss)()("y"), ValueError, "rank", model=model)
    assert loss in str(info.value) and "(batch, classes" in str(info.value)


@pytest.mark.parametrize("loss", ["CrossEntropyLoss", "NLLLoss"])
@pytest.mark.parametrize(
    ("shape", "warned"),
    [
        (["batch", "seq", 50], True),  # a language model's [batch, seq, vocab]: the classes would be the sequence
        (["batch", None, 7, 50], True),
        (["batch", 5], False),
        (["batch", 5, "seq"], False),  # [N, C, d]: a fixed class count on axis 1
        (["batch", "classes"], False),  # rank 2: nothing else the classes could be
        (["batch", "seq", 1], False),
    ],
)
def test_scores_shaped_batch_seq_classes_are_said_to_read_their_classes_on_axis_1(
    loss: str, shape: list[Any], warned: bool
) -> None:
    from onnxtrain.losses import ClassAxisWarning

    with onnxblock.base(base_model(FLOAT, shape)), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        getattr(onnxblock.loss, loss)()("y")
    said = [w for w in caught if issubclass(w.category, ClassAxisWarning)]
    assert bool(said) is warned
    if warned:
        message = str(said[0].message)
        assert loss in message and "logits.flatten(0, 1)" in message and "blocks.Flatten(axis=2)" in message
        assert said[0].filename == __file__  # attributed to the caller, not to onnxtrain


# --------------------------------------------------------------- target names


@pytest.mark.parametrize(
    ("make_loss", "target_name", "wanted"),
    [
        (lambda: onnxblock.loss.MSELoss(), "lab", "float"),  # an int64 graph input
        (lambda: onnxblock.loss.BCEWithLogitsLoss(), "t", "float"),  # a double graph input
        (lambda: onnxblock.loss.KLDivLoss(), "lab", "float"),
        (lambda: onnxblock.loss.CrossEntropyLoss(label_dtype=np.int32), "lab", "int32"),  # int64 labels
        (lambda: onnxblock.loss.CrossEntropyLoss(), "t", "int64"),
        (lambda: onnxblock.loss.NLLLoss(), "lab_float", "int64"),  # a node output, not an input
        (lambda: onnxblock.loss.NLLLoss(label_dtype=np.int32), "lab", "int32"),
    ],
)
def test_target_name_of_another_element_type(make_loss: Callable[[], Any], target_name: str, wanted: str) -> None:
    info = assert_fails_cleanly(lambda: make_loss()("y", target_name), TypeError, re.escape(repr(target_name)))
    message = str(info.value)
    assert wanted in message and "another target name" in message


@pytest.mark.parametrize("target_name", ["", 3, None])
def test_target_name_must_be_a_non_empty_string(target_name: Any) -> None:
    assert_fails_cleanly(lambda: onnxblock.loss.MSELoss()("y", target_name), TypeError, "target name")


# ----------------------------------------------------------- class weights


@pytest.mark.parametrize("loss", ["CrossEntropyLoss", "NLLLoss"])
@pytest.mark.parametrize("weight", [[[1.0, 2.0, 3.0]], 2.0, [], ["a", "b", "c"]], ids=["2d", "0d", "empty", "str"])
def test_class_weight_must_be_1d_numbers(loss: str, weight: Any) -> None:
    assert_fails_cleanly(lambda: getattr(onnxblock.loss, loss)(weight=weight)("y"), ValueError, "1-D")


@pytest.mark.parametrize("loss", ["CrossEntropyLoss", "NLLLoss"])
def test_class_weight_needs_one_weight_per_class(loss: str) -> None:
    info = assert_fails_cleanly(lambda: getattr(onnxblock.loss, loss)(weight=[1.0, 2.0])("y"), ValueError, "3 classes")
    assert "2 weights" in str(info.value)


# ------------------------------------------------------ numeric arguments


@pytest.mark.parametrize("smoothing", [-0.1, 1.5, float("nan")])
def test_label_smoothing_must_be_within_0_and_1(smoothing: float) -> None:
    assert_fails_cleanly(
        lambda: onnxblock.loss.CrossEntropyLoss(label_smoothing=smoothing)("y"), ValueError, "label_smoothing"
    )


@pytest.mark.parametrize("delta", [0.0, -1.0, float("nan")])
def test_huber_delta_must_be_positive(delta: float) -> None:
    assert_fails_cleanly(lambda: onnxblock.loss.HuberLoss(delta=delta)("y"), ValueError, "delta > 0")


@pytest.mark.parametrize("beta", [-0.5, float("nan")])
def test_smooth_l1_beta_must_not_be_negative(beta: float) -> None:
    assert_fails_cleanly(lambda: onnxblock.loss.SmoothL1Loss(beta=beta)("y"), ValueError, "beta >= 0")


# ------------------------------------------------- recovery after an error


class MeanSquaredError(onnxblock.ForwardBlock):
    def __init__(self) -> None:
        super().__init__()
        self.loss = onnxblock.loss.MSELoss()

    def build(self, output_name: str) -> str:
        return self.loss(output_name)


def test_a_failed_loss_leaves_no_trace_in_the_built_model() -> None:
    """After a failed block, the same build gives the same bytes (names included) as without it."""
    clean = MeanSquaredError()
    with onnxblock.base(base_model()):
        clean("y")
    after_failure = MeanSquaredError()
    with onnxblock.base(base_model()):
        with pytest.raises(TypeError):
            onnxblock.loss.CrossEntropyLoss(label_smoothing=0.1, weight=[1.0, 2.0, 3.0])("y", "t")
        with pytest.raises(TypeError):
            onnxblock.loss.NLLLoss()("y", "lab_float")
        after_failure("y")
    assert after_failure.to_model_proto().SerializeToString() == clean.to_model_proto().SerializeToString()
