"""Class labels out of range in a train or eval step: a ``ValueError`` naming them (docs/runtime.md, "Bad input").

Artifacts from ``generate_artifacts`` with ``LossType.CrossEntropyLoss``
(labels ``labels``, no ``ignore_index``) and ``LossType.NLLLoss`` (labels
``target``, ``ignore_index=-100``), over a model whose class count is fixed
(4) or symbolic (the run's ``x`` decides it), run through ``onnxtrain.api``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxtrain import losses
from onnxtrain.artifacts import LossType, OptimType
from onnxtrain.losses.label_check import strippable_label_checks
from onnxtrain.sessions import inference_session
from tests.training import models
from tests.training.helpers import open_module, snapshot

CLASSES = 4


LOSSES = {"CrossEntropyLoss": ("labels", None), "NLLLoss": ("target", -100)}


@pytest.fixture(scope="module", params=[(loss, c) for loss in LOSSES for c in (CLASSES, "classes")], ids=str)
def artifacts(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Path]]:
    loss, classes = request.param
    paths = models.generate(
        tmp_path_factory.mktemp("labels"),
        models.classes_model(classes, log_probs=loss == "NLLLoss"),
        loss=LossType[loss],
        optimizer=OptimType.AdamW,
    )
    return loss, paths


def batch(labels: list[int], classes: int = CLASSES) -> tuple[np.ndarray, np.ndarray]:
    x = np.linspace(-2, 2, len(labels) * classes, dtype=np.float32).reshape(len(labels), classes)
    return x, np.array(labels, np.int64)


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("bad", [-1, CLASSES])
def test_a_label_out_of_range_raises_value_error(artifacts, mode, bad):
    """A fixed class count: the module checks the labels before anything runs, so even the fused step (whose
    update a failed run would have applied) leaves the state as it was. A symbolic one: the loss's check in
    the graph fails during the run, and onnxruntime's error becomes the same message."""
    loss, paths = artifacts
    labels_name, ignore = LOSSES[loss]
    state, module, optimizer = open_module(paths)
    module(*batch([0, 1, 2, 3]))  # a step, so that the next train step is the fused one
    optimizer.step()
    module.lazy_reset_grad()
    module.train(mode == "train")
    on_host = bool(strippable_label_checks(onnx.load(paths["training_model"]), [labels_name]))  # a fixed count
    before = snapshot(state)
    with pytest.raises(ValueError) as caught:
        module(*batch([0, bad, 3, 1]))
    text = str(caught.value)
    step = "train step 2" if mode == "train" else "eval step"
    assert text.startswith(f"{step}: 1 label is out of range in {labels_name!r} for {loss} on 'y' (4 classes): ")
    assert f": {bad} at [1]. Labels must be in [0, 4)" in text
    if ignore is None:
        assert "(ignore_index is None: no label is skipped)" in text
    else:
        assert f"or equal ignore_index {ignore}" in text
    if on_host:
        assert text.endswith("(checked before running)")
        assert caught.value.__cause__ is None
        after = snapshot(state)
        for name, value in before.items():
            np.testing.assert_array_equal(after[name], value, err_msg=name)
        assert module.train_step_count == 1
    else:
        assert "labels_out_of_range" in text or "target_out_of_range" in text  # the check node
        assert isinstance(caught.value.__cause__, Exception)  # onnxruntime's error
        assert not isinstance(caught.value.__cause__, ValueError)


@pytest.mark.parametrize("path", ["reset", "fused", "accumulating", "eval", "epoch"])
def test_only_the_message_reaches_the_user(artifacts, capfd, path):
    """onnxruntime logs a failed kernel to standard error before raising; the runtime's runs log only fatal
    errors, so that the ValueError is all the user sees, on every path of a step."""
    _, paths = artifacts
    _, module, optimizer = open_module(paths)
    if path != "reset":
        module(*batch([0, 1, 2, 3]))
        if path != "accumulating":
            optimizer.step()
            module.lazy_reset_grad()
    module.train(path != "eval")
    capfd.readouterr()
    with pytest.raises(ValueError, match="out of range"):
        if path == "epoch":
            x, labels = batch([0, 1, 2, 3, 9, 1, 2, 0])
            module.train_epoch(optimizer, x, labels, 4)
        else:
            module(*batch([0, 9, 3, 1]))
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


def test_symbolic_classes_are_counted_at_run_time(tmp_path):
    paths = models.generate(tmp_path, models.classes_model("classes", False), loss=LossType.CrossEntropyLoss)
    _, module, _ = open_module(paths, optimizer=False)
    module(*batch([0, 6, 2], classes=7))  # 7 classes in this batch: 6 is a label
    with pytest.raises(ValueError, match=r"\(7 classes\): 7 at \[1\]\. Labels must be in \[0, 7\)"):
        module(*batch([0, 7, 2], classes=7))
    with pytest.raises(ValueError, match=r"\(3 classes\): 3 at \[0\], -2 at \[2\]\. Labels must be in \[0, 3\)"):
        module(*batch([3, 0, -2], classes=3))


def test_the_ignored_label_is_allowed(artifacts):
    loss, paths = artifacts
    _, module, optimizer = open_module(paths)
    if LOSSES[loss][1] is None:  # CrossEntropyLoss as ONNX Runtime's: no ignore_index, so -100 is out of range
        with pytest.raises(ValueError, match=r"-100 at \[1\]"):
            module(*batch([0, -100, 1, 2]))
        return
    for mode in (True, False):
        module.train(mode)
        loss_value = module(*batch([0, -100, 1, 2]))
        assert np.isfinite(loss_value)
    module.train()
    optimizer.step()


def test_a_cross_entropy_ignore_index_is_allowed(tmp_path):
    paths = models.generate(
        tmp_path, models.classes_model(CLASSES, False), loss=losses.CrossEntropyLoss(ignore_index=-100), optimizer="SGD"
    )
    _, module, _ = open_module(paths)
    assert np.isfinite(module(*batch([-100, 3, -100, 0])))
    expected = r"2 labels are out of range .*: -1 at \[0\], 4 at \[2\]\. .*ignore_index -100"
    with pytest.raises(ValueError, match=expected):
        module(*batch([-1, 3, 4, -100]))


@pytest.mark.parametrize("fuse", [True, False])
def test_a_failed_accumulating_step_leaves_the_state_as_it_was(artifacts, fuse):
    _, paths = artifacts
    state, module, optimizer = open_module(paths, fuse=fuse)
    module(*batch([0, 1, 2, 3]))
    optimizer.step()
    module.lazy_reset_grad()
    module(*batch([3, 2, 1, 0]))  # accumulating from here on: the training model itself, with spares
    before = snapshot(state)
    with pytest.raises(ValueError, match="out of range"):
        module(*batch([0, 1, 9, 3]))
    after = snapshot(state)
    assert before.keys() == after.keys()
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)
    assert module.train_step_count == 2
    module(*batch([0, 1, 2, 3]))  # and training goes on
    optimizer.step()


def test_ort_value_inputs_are_explained_too(artifacts):
    _, paths = artifacts
    _, module, _ = open_module(paths, optimizer=False)
    x, labels = batch([0, 1, -5, 3])
    values = [ort.OrtValue.ortvalue_from_numpy(array) for array in (x, labels)]
    with pytest.raises(ValueError, match=r": -5 at \[2\]\."):
        module(*values)


def test_raw_onnxruntime_names_the_check_node(artifacts):
    loss, paths = artifacts
    labels_name, _ = LOSSES[loss]
    session = inference_session(str(paths["eval_model"]))
    x, labels = batch([0, 1, 4, 3])
    with pytest.raises(Exception, match=rf"Reshape node\. Name:'{labels_name}_out_of_range_\d+'"):
        session.run(None, {"x": x, labels_name: labels, "w": np.array([1.5], np.float32)})
