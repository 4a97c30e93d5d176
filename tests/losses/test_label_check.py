"""The label check of ``CrossEntropyLoss`` and ``NLLLoss`` (``onnxtrain.losses.label_check``), in bare onnxruntime.

Labels out of range (negative, or ``>= C``, other than ``ignore_index``) make
the check's ``Reshape`` fail, named in onnxruntime's error, with the class
count known or symbolic. The check survives onnxruntime's graph
optimisations, takes the nodes its docstring says, and changes nothing bit
for bit, loss or gradient, when every label is valid.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import onnxtrain.onnxblock as onnxblock
from onnxtrain import autodiff
from onnxtrain.graph.io import copy_model
from onnxtrain.losses.label_check import (
    is_label_check,
    label_checks,
    label_error,
    strip_label_checks,
    strippable_label_checks,
)
from onnxtrain.sklearn import add_loss_output
from tests.helpers import DOUBLE, FLOAT, make_model
from tests.losses.test_losses_forward import scaled_model

N_CLASSES = 4


def loss_block(loss: str, **kwargs: Any) -> onnxblock.Block:
    return getattr(onnxblock.loss, loss)(**kwargs)


def checked_model(
    loss: str, classes: int | str | None, *, elem_type: int = FLOAT, gradients: bool = False, **kwargs: Any
) -> onnx.ModelProto:
    """``loss`` on ``y = 2 x`` with ``x: [batch, classes]`` (``None``: unknown rank); outputs the loss, and
    with ``gradients`` its gradient with respect to ``y``."""
    shape = None if classes is None else ["batch", classes]
    with onnxblock.base(scaled_model(shape, elem_type)) as builder:
        value = loss_block(loss, **kwargs)("y", "labels")
        if gradients and kwargs.get("reduction") == "none":
            value = onnxblock.blocks.ReduceSum(keepdims=False)(value)
        outputs = [value]
        if gradients:
            outputs.append(autodiff.build_gradients(builder, value, ["y"])["y"])
        builder.set_outputs(outputs)
        return builder.finalize()


def session(model: onnx.ModelProto, optimized: str | None = None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = 1
    options.log_severity_level = 4  # the failing runs are expected
    if optimized is not None:
        options.optimized_model_filepath = optimized
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def check_names(model: onnx.ModelProto) -> list[str]:
    return list(label_checks([model]))


def feeds(labels: list[int], dtype: Any = np.int64, classes: int = N_CLASSES) -> dict[str, np.ndarray]:
    x = np.linspace(-1, 1, len(labels) * classes, dtype=np.float32).reshape(len(labels), classes)
    return {"x": x, "labels": np.array(labels, dtype)}


LOSSES = [
    ("CrossEntropyLoss", {}),
    ("CrossEntropyLoss", {"ignore_index": -100}),
    ("CrossEntropyLoss", {"ignore_index": 2, "label_smoothing": 0.2, "weight": [1.0, 2.0, 0.5, 1.5]}),
    ("NLLLoss", {}),
    ("NLLLoss", {"ignore_index": None, "reduction": "none"}),
]


@pytest.mark.parametrize("classes", [N_CLASSES, "classes", None], ids=["static", "symbolic", "unknown-rank"])
@pytest.mark.parametrize("label_dtype", [np.int64, np.int32])
@pytest.mark.parametrize(("loss", "kwargs"), LOSSES, ids=lambda v: str(v))
def test_labels_out_of_range_fail_the_check_after_all_optimisations(tmp_path, loss, kwargs, classes, label_dtype):
    model = checked_model(loss, classes, label_dtype=label_dtype, **kwargs)
    (name,) = check_names(model)
    optimized = tmp_path / "optimized.onnx"
    run = session(model, str(optimized))
    kept = [node for node in onnx.load(optimized).graph.node if node.name == name]
    assert [node.op_type for node in kept] == ["Reshape"], "onnxruntime optimised the check away"
    ignore = kwargs.get("ignore_index", -100 if loss == "NLLLoss" else None)
    run.run(None, feeds([0, 3, 1, 2], label_dtype))
    if ignore is not None:
        run.run(None, feeds([0, ignore, ignore, 3], label_dtype))  # ignored labels are allowed
    for bad in ([0, -1, 2, 1], [N_CLASSES, 0, 1, 2], [-3, 7, N_CLASSES, 1]):
        with pytest.raises(Exception, match=rf"Reshape node\. Name:'{name}'") as caught:
            run.run(None, feeds(bad, label_dtype))
        count = sum(1 for label in bad if not 0 <= label < N_CLASSES)
        assert f"requested shape:{{{count},{N_CLASSES},2}}" in str(caught.value)


def test_the_ignored_label_is_out_of_range_without_ignore_index():
    run = session(checked_model("CrossEntropyLoss", N_CLASSES))  # ONNX Runtime's default: no ignore_index
    with pytest.raises(Exception, match="out_of_range"):
        run.run(None, feeds([0, -100, 1, 2]))


@pytest.mark.parametrize(
    ("classes", "kwargs", "label_dtype", "expected"),
    [
        (N_CLASSES, {}, np.int64, 9),
        (N_CLASSES, {"ignore_index": 2}, np.int64, 9),  # in range: nothing more to compare
        (N_CLASSES, {"ignore_index": -100}, np.int64, 11),
        ("classes", {}, np.int64, 13),
        ("classes", {"ignore_index": -100}, np.int64, 15),
        ("classes", {"ignore_index": -100}, np.int32, 16),
    ],
)
def test_node_count(classes, kwargs, label_dtype, expected):
    model = checked_model("CrossEntropyLoss", classes, label_dtype=label_dtype, **kwargs)
    assert sum(1 for node in model.graph.node if is_label_check(node)) == expected


def without_check(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its label check removed: the loss reads the labels themselves.

    Check nodes the gradient shares (``Shape`` of the scores, merged with the
    gradient's own) stay.
    """
    (checked,) = [node.output[0] for node in model.graph.node if is_label_check(node) and node.op_type == "Where"]
    stripped = onnx.ModelProto()
    stripped.CopyFrom(model)
    for node in stripped.graph.node:
        node.input[:] = ["labels" if name == checked else name for name in node.input]
    needed = {name for node in stripped.graph.node if not is_label_check(node) for name in node.input}
    needed.update(value.name for value in stripped.graph.output)
    shared = [node for node in stripped.graph.node if is_label_check(node) and set(node.output) & needed]
    while True:
        needed.update(name for node in shared for name in node.input)
        more = [node for node in stripped.graph.node if is_label_check(node) and set(node.output) & needed]
        if len(more) == len(shared):
            break
        shared = more
    kept = [node for node in stripped.graph.node if not is_label_check(node) or node in shared]
    assert len(kept) < len(stripped.graph.node)
    del stripped.graph.node[:]
    stripped.graph.node.extend(kept)
    del stripped.graph.value_info[:]
    return stripped


@pytest.mark.parametrize("classes", [N_CLASSES, "classes"])
@pytest.mark.parametrize(("loss", "kwargs"), LOSSES, ids=lambda v: str(v))
def test_the_check_changes_neither_loss_nor_gradient(loss, kwargs, classes):
    model = checked_model(loss, classes, elem_type=DOUBLE, gradients=True, **kwargs)
    with_check, reference = session(model), session(without_check(model))
    ignore = kwargs.get("ignore_index", -100 if loss == "NLLLoss" else None)
    valid = list(range(N_CLASSES)) + ([] if ignore is None else [ignore])

    @settings(max_examples=25, deadline=None)
    @given(
        labels=st.lists(st.sampled_from(valid), min_size=1, max_size=6),
        scale=st.floats(-30, 30, allow_nan=False),
    )
    def check(labels: list[int], scale: float) -> None:
        x = np.linspace(-1, 1, len(labels) * N_CLASSES).reshape(len(labels), N_CLASSES) * scale
        inputs = {"x": x, "labels": np.array(labels, np.int64)}
        for got, expected in zip(with_check.run(None, inputs), reference.run(None, inputs), strict=True):
            np.testing.assert_array_equal(got, expected, strict=True)

    check()


@pytest.mark.parametrize(("loss", "kwargs"), LOSSES, ids=lambda v: str(v))
def test_stripping_the_check_keeps_the_loss_and_leaves_nothing_unread(loss, kwargs):
    """``strip_label_checks``: the check's nodes and the constants only they read go; the loss stays."""
    model = checked_model(loss, N_CLASSES, elem_type=DOUBLE, **kwargs)
    checks = strippable_label_checks(model, ["labels"])
    stripped = strip_label_checks(copy_model(model), inputs=["labels"])
    assert [check.labels for check in checks] == ["labels"] and check_names(stripped) == []
    read = {name for node in stripped.graph.node for name in node.input}
    assert [t.name for t in stripped.graph.initializer if t.name not in read] == []
    inputs = {"x": np.linspace(-1, 1, 4 * N_CLASSES).reshape(4, N_CLASSES), "labels": np.array([0, 3, 1, 2])}
    for got, expected in zip(session(stripped).run(None, inputs), session(model).run(None, inputs), strict=True):
        np.testing.assert_array_equal(got, expected, strict=True)


def test_label_error_ignores_other_failures():
    model = checked_model("CrossEntropyLoss", N_CLASSES)
    message = "Non-zero status code returned while running Gather node. Name:'Gather_3' Status Message: idx"
    assert label_error(RuntimeError(message), [model], lambda name: None, "train step 1") is None
    assert label_error(RuntimeError("out of memory"), [model], lambda name: None, "train step 1") is None


def test_label_error_names_labels_classes_and_values():
    model = checked_model("NLLLoss", "classes")
    (name,) = check_names(model)
    with pytest.raises(Exception) as caught:
        session(model).run(None, feeds([0, -1, 6, 2, -100, 9, 9, 9, 9, 9], classes=6))
    error = label_error(caught.value, [model], lambda name: feeds([0, -1, 6, 2, -100, 9, 9, 9, 9, 9])[name], "eval")
    assert isinstance(error, ValueError)
    text = str(error)
    for part in (
        "eval: 7 labels are out of range in 'labels' for NLLLoss on 'y' (6 classes)",
        "-1 at [1], 6 at [2], 9 at [5], 9 at [6], 9 at [7] and 2 more",
        "Labels must be in [0, 6) or equal ignore_index -100",
        f"node {name!r}",
    ):
        assert part in text
    # without the labels' values (not a user input), the counts come from onnxruntime's message
    error = label_error(caught.value, [model], lambda name: None, "eval")
    assert "7 labels are out of range in 'labels' for NLLLoss on 'y' (6 classes). Labels must be" in str(error)


def test_add_loss_output_log_score_checks_its_labels():
    softmax = onnx.helper.make_node("Softmax", ["x"], ["y"], axis=1)
    base = make_model({"x": (FLOAT, ["batch", 3])}, [softmax], {"y": (FLOAT, ["batch", 3])})
    model = add_loss_output(base, score_name="log")
    run = session(model)
    x = np.zeros((2, 3), np.float32)
    run.run(None, {"x": x, "label": np.array([0, 2])})
    with pytest.raises(Exception, match=r"Name:'label_out_of_range_\d+'.*requested shape:\{1,3,2\}"):
        run.run(None, {"x": x, "label": np.array([0, 3])})
