"""Labels of a fixed class count checked on the host before a step (onnxtrain.training.labels).

The module runs its models without the loss's label check where the class
count is fixed: the steps must compute the bits the models with the check
compute, the check on the host must pass and fail exactly where the graph's
does, and a label out of range must leave the state as it was on every path.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from onnxtrain.artifacts import LossType
from onnxtrain.losses.label_check import LabelCheck, label_checks, labels_out_of_range
from tests.training import models
from tests.training.helpers import classifier_batch, open_module, parameters, run_onnx, snapshot

TRAINABLE = ["fc0.weight", "fc0.bias", "fc1.weight", "fc1.bias"]


def test_the_module_runs_its_models_without_the_check_of_a_fixed_class_count(classifier: dict[str, Path]) -> None:
    _, module, _ = open_module(classifier)
    assert label_checks([onnx.load(classifier["training_model"])])  # the artifact keeps its check
    assert not label_checks([module.train_model.proto])


def test_a_symbolic_class_count_keeps_the_graph_check(tmp_path: Path) -> None:
    paths = models.generate(tmp_path, models.classes_model("classes", False), loss=LossType.CrossEntropyLoss)
    _, module, _ = open_module(paths, optimizer=False)
    assert [check.classes for check in label_checks([module.train_model.proto]).values()] == [None]


def test_steps_without_the_graph_check_compute_the_same_bits(classifier: dict[str, Path]) -> None:
    """A train step from reset gradients and an eval step against the artifacts (with their checks) run
    directly in onnxruntime: the loss and every gradient, bit for bit."""
    state, module, _ = open_module(classifier, optimizer=False)
    x, labels = classifier_batch(np.random.default_rng(5), 24)
    before = parameters(state)
    loss = module(x, labels)
    feeds = {"x": x, "labels": labels, **before, "lazy_reset_grad": np.array([True])}
    feeds.update({f"{name}_grad.accumulation.buffer": np.zeros_like(before[name]) for name in TRAINABLE})
    expected = run_onnx(classifier["training_model"], feeds)
    loss_name = module.output_names()[0]
    np.testing.assert_array_equal(loss, expected[loss_name])
    for name in TRAINABLE:
        np.testing.assert_array_equal(state.parameters[name].grad, expected[f"{name}_grad.accumulation.out"], name)
    module.eval()
    eval_expected = run_onnx(classifier["eval_model"], {"x": x, "labels": labels, **before})
    np.testing.assert_array_equal(module(x, labels), eval_expected[loss_name])


@pytest.mark.parametrize("fuse", [True, False])
def test_a_label_out_of_range_changes_nothing_on_any_path(classifier: dict[str, Path], fuse: bool) -> None:
    """The reset, fused and accumulating steps, the eval step and train_epoch (by steps without a fused step,
    where a bad last batch used to fail after the others had trained) raise before anything runs: the same
    training with the failed calls interleaved ends with the same bits, and a recorded update stays recorded."""
    x, labels = classifier_batch(np.random.default_rng(7), 40)
    bad = labels.copy()
    bad[37] = 4

    def train(failing: bool) -> tuple[dict[str, np.ndarray], int, int]:
        state, module, optimizer = open_module(classifier, fuse=fuse)

        def attempt(call: Callable[[], object]) -> None:
            if not failing:
                return
            recorded = state.store.recorded_update
            with pytest.raises(ValueError, match=r"4 at \[(7|37)\]\. Labels must be in \[0, 4\)") as caught:
                call()
            assert caught.value.__cause__ is None
            assert state.store.recorded_update is recorded

        attempt(lambda: module(x[:8], bad[30:38]))  # from reset gradients
        module(x[:8], labels[:8])
        optimizer.step()
        module.lazy_reset_grad()
        attempt(lambda: module(x[:8], bad[30:38]))  # the fused step
        attempt(lambda: module.eval_step(x[:8], bad[30:38]))
        attempt(lambda: module.train_epoch(optimizer, x, bad, 8))
        module(x[8:16], labels[8:16])
        attempt(lambda: module(x[:8], bad[30:38]))  # accumulating
        optimizer.step()
        module.lazy_reset_grad()
        module.train_epoch(optimizer, x, labels, 8)
        return snapshot(state), module.train_step_count, optimizer.step_count

    (clean, clean_steps, clean_updates), (failed, steps, updates) = train(False), train(True)
    assert (steps, updates) == (clean_steps, clean_updates) == (7, 7)
    for key, value in clean.items():
        np.testing.assert_array_equal(failed[key], value, err_msg=key)


def test_labels_on_a_device_value_are_checked(classifier: dict[str, Path]) -> None:
    _, module, _ = open_module(classifier, optimizer=False)
    x, labels = classifier_batch(np.random.default_rng(2), 6)
    labels[4] = -3
    values = [ort.OrtValue.ortvalue_from_numpy(array) for array in (x, labels)]
    with pytest.raises(ValueError, match=r"-3 at \[4\]\. .*\(checked before running\)"):
        module(*values)


LABEL_TYPES = st.sampled_from([np.int64, np.int32])


@given(
    labels=LABEL_TYPES.flatmap(
        lambda dtype: hnp.arrays(dtype, hnp.array_shapes(min_dims=1, max_dims=2, min_side=0, max_side=6),
                                 elements=st.integers(-4, 8))
    ),
    classes=st.integers(1, 6),
    ignore_index=st.sampled_from([None, -100, -1, 2, 7]),
)  # fmt: skip
def test_the_host_check_fails_exactly_where_the_graph_check_does(
    labels: np.ndarray, classes: int, ignore_index: int | None
) -> None:
    """Against the graph check's condition (label_check's docstring): ``0 <= label < C or label ==
    ignore_index`` for every label; the count of the others in the message."""
    check = LabelCheck("CrossEntropyLoss", "labels", "scores", classes, ignore_index)
    valid = ((labels >= 0) & (labels < classes)) | (labels == ignore_index if ignore_index is not None else False)
    error = labels_out_of_range(check, labels, "step")
    if valid.all():
        assert error is None
    else:
        count = int((~valid).sum())
        assert error is not None
        assert ("1 label is" if count == 1 else f"{count} labels are") in str(error)
