"""Steps whose batch shapes change from step to step: every path gives what plain steps give.

A user's last batch is shorter than the others, and a sequence model's
length changes from batch to batch. The runtime chooses between paths by
size (``SMALL_TENSOR`` elements: the fused step's session for fixed shapes;
``STAGED_BYTES``: inputs copied into kept buffers; ``graph.fold.MAX_ELEMENTS``:
constants folded into that session), so the models and batches below are
drawn on both sides of each threshold, and every step is compared with a
reference that runs the training model and the optimizer model one after
the other in plain onnxruntime sessions, with no binding, fusion or staging.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

from onnxtrain import api, checkpoint, optim
from onnxtrain.artifacts import LossType
from onnxtrain.graph.fold import MAX_ELEMENTS
from onnxtrain.optim.base import grad_name, updated_name
from onnxtrain.sessions import inference_session
from onnxtrain.training.fused import STAGED_BYTES
from onnxtrain.training.options import SMALL_TENSOR
from tests.helpers import FLOAT, make_model
from tests.training import models

FEATURES = 64  # of the flat model's rows: x = [rows, 64] float32
TOKEN_FEATURES = 8  # of the sequence model's tokens: x = [rows, length, 8]
CLASSES = 3

#: Rows of a batch of the flat model, across the thresholds: 248 rows (x and labels) are under STAGED_BYTES and
#: 250 over; 500 rows are under SMALL_TENSOR elements and 520 over.
FLAT_ROWS = (1, 3, 100, 248, 250, 500, 520)
#: Hidden sizes of the flat model: its first weight under SMALL_TENSOR (16, 200: 12,800 elements, whose
#: activations at 400-500 rows pass MAX_ELEMENTS) and over it (600: 38,400).
FLAT_HIDDEN = (16, 200, 600)
#: Hidden sizes of the sequence model (its first weight: 8 x 4,200 = 33,600 elements, over SMALL_TENSOR).
SEQUENCE_HIDDEN = (16, 4200)

OPTIMIZERS: dict[str, Callable[[], optim.Optimizer]] = {
    "sgd": optim.SGD,
    "momentum": lambda: optim.SGD(momentum=0.9),
    "adamw": optim.AdamW,
}


def test_the_drawn_sizes_straddle_every_threshold():
    """The constants above are where the runtime's thresholds are (a test of this test)."""
    row_bytes = FEATURES * 4 + 8  # x's row and a label
    assert 248 * row_bytes <= STAGED_BYTES < 250 * row_bytes
    assert 500 * FEATURES < SMALL_TENSOR < 520 * FEATURES
    assert FEATURES * 200 < SMALL_TENSOR < FEATURES * 600 and TOKEN_FEATURES * 4200 > SMALL_TENSOR
    assert 300 * 200 < MAX_ELEMENTS < 400 * 200


def flat_model(hidden: int) -> onnx.ModelProto:
    """``x[rows, 64] -> MatMul, Add, Relu -> MatMul, Add -> y[rows, 3]``."""
    return models.mlp((FEATURES, hidden, CLASSES), seed=hidden)


def sequence_model(hidden: int) -> onnx.ModelProto:
    """``x[rows, length, 8] -> MatMul, Add, Relu -> mean over length -> MatMul, Add -> y[rows, 3]``: two
    symbolic dimensions."""
    rng = np.random.default_rng(hidden)
    initializers = [
        ("w0", (rng.normal(size=(TOKEN_FEATURES, hidden)) / np.sqrt(TOKEN_FEATURES)).astype(np.float32)),
        ("b0", (0.1 * rng.normal(size=hidden)).astype(np.float32)),
        ("w1", (rng.normal(size=(hidden, CLASSES)) / np.sqrt(hidden)).astype(np.float32)),
        ("b1", np.zeros(CLASSES, np.float32)),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["h0"]),
        helper.make_node("Add", ["h0", "b0"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("ReduceMean", ["h2"], ["pooled"], axes=[1], keepdims=0),
        helper.make_node("MatMul", ["pooled", "w1"], ["h3"]),
        helper.make_node("Add", ["h3", "b1"], ["y"]),
    ]
    return make_model(
        {"x": (FLOAT, ["rows", "length", TOKEN_FEATURES])}, nodes, {"y": (FLOAT, ["rows", CLASSES])}, initializers
    )


@pytest.fixture(scope="module")
def artifacts_of(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, int, str], dict[str, Path]]:
    """``(kind, hidden, optimizer) -> artifact paths``, generated once each (cross-entropy)."""

    @functools.cache
    def make(kind: str, hidden: int, optimizer: str) -> dict[str, Path]:
        model = flat_model(hidden) if kind == "flat" else sequence_model(hidden)
        folder = tmp_path_factory.mktemp(f"{kind}-{hidden}-{optimizer}")
        return models.generate(folder, model, loss=LossType.CrossEntropyLoss, optimizer=OPTIMIZERS[optimizer]())

    return make


class PlainSteps:
    """The reference: the training model and the optimizer model, each run by ``InferenceSession.run`` on NumPy
    arrays, the gradients accumulated through the model's own ``lazy_reset_grad`` input."""

    def __init__(self, paths: dict[str, Path], learning_rate: float) -> None:
        self.train = inference_session(str(paths["training_model"]))
        self.eval = inference_session(str(paths["eval_model"]))
        self.update = inference_session(str(paths["optimizer_model"]))
        self.params = {n: np.array(v) for n, v in checkpoint.load(paths["checkpoint"]).parameters.items()}
        self.trainable = [i.name for i in self.update.get_inputs() if i.name in self.params]
        moments = [i.name for i in self.update.get_inputs() if ".momentum" in i.name]
        self.moments = {name: np.zeros_like(self.params[name.split(".momentum")[0]]) for name in moments}
        self.grads = {p: np.zeros_like(self.params[p]) for p in self.trainable}
        self.reset = True
        self.steps = 0
        self.rate = np.array([learning_rate], np.float32)

    def train_step(self, feeds: Sequence[np.ndarray]) -> float:
        names = [i.name for i in self.train.get_inputs()]
        inputs = dict(zip(names, feeds, strict=False))
        inputs.update((n, v) for n, v in self.params.items() if n in names)
        inputs.update((f"{grad_name(p)}.accumulation.buffer", g) for p, g in self.grads.items())
        inputs["lazy_reset_grad"] = np.array([self.reset])
        outputs = [o.name for o in self.train.get_outputs()]
        results = dict(zip(outputs, self.train.run(None, inputs), strict=True))
        self.grads = {p: results[f"{grad_name(p)}.accumulation.out"] for p in self.trainable}
        self.reset = False
        return float(results[outputs[0]])

    def optimizer_step(self) -> None:
        self.steps += 1
        inputs = {"learning_rate": self.rate, "step": np.array([self.steps], np.int64)}
        for p in self.trainable:
            inputs[p], inputs[grad_name(p)] = self.params[p], self.grads[p]
        inputs.update(self.moments)
        outputs = [o.name for o in self.update.get_outputs()]
        results = dict(zip(outputs, self.update.run(None, inputs), strict=True))
        for p in self.trainable:
            self.params[p] = results[updated_name(p)]
        for name in self.moments:
            self.moments[name] = results[updated_name(name)]

    def eval_step(self, feeds: Sequence[np.ndarray]) -> float:
        names = [i.name for i in self.eval.get_inputs()]
        inputs = dict(zip(names, feeds, strict=False))
        inputs.update((n, v) for n, v in self.params.items() if n in names)
        return float(self.eval.run(None, inputs)[0])


@dataclass(frozen=True)
class Step:
    """One step of a drawn loop: a train step on ``rows`` (and ``length``), then an optimizer step unless it
    ``accumulates`` into the next; with ``eval_rows``, an eval step before it."""

    rows: int
    length: int
    accumulates: bool
    eval_rows: int | None


def batch(kind: str, rows: int, length: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    shape = (rows, FEATURES) if kind == "flat" else (rows, length, TOKEN_FEATURES)
    return rng.normal(size=shape).astype(np.float32), rng.integers(0, CLASSES, rows).astype(np.int64)


def steps(rows: Sequence[int]) -> st.SearchStrategy[list[Step]]:
    step = st.builds(
        Step,
        rows=st.sampled_from(rows),
        length=st.sampled_from((1, 5, 40)),
        accumulates=st.booleans(),
        eval_rows=st.none() | st.sampled_from(rows),
    )
    return st.lists(step, min_size=2, max_size=7)


def _compare(
    paths: dict[str, Path],
    kind: str,
    loop: list[Step],
    *,
    tolerance: float = 2e-5,
    fuse: bool = True,
    fold_every_shape: bool = False,
) -> api.Module:
    """``loop`` trained by the runtime and by plain sessions, compared step by step; ``fold_every_shape``: the fused
    step as on a GPU (a step of any size gets the session for its shapes, the optimizer's chains packed)."""
    rate = 0.05
    plain = PlainSteps(paths, rate)
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state, paths["eval_model"])
    optimizer = api.Optimizer(paths["optimizer_model"], module, fuse=fuse)
    if module._fused is not None:
        assert not module._fused.fold_every_shape and not module._fused.pack_updates  # on the CPU
        module._fused.fold_every_shape = module._fused.pack_updates = fold_every_shape
    optimizer.set_learning_rate(rate)
    rng = np.random.default_rng(len(loop))
    for i, step in enumerate(loop):
        if step.eval_rows is not None:
            feeds = batch(kind, step.eval_rows, step.length, rng)
            module.eval()
            np.testing.assert_allclose(module(*feeds), plain.eval_step(feeds), rtol=tolerance, err_msg=f"eval {i}")
            module.train()
        feeds = batch(kind, step.rows, step.length, rng)
        loss = module(*feeds)
        np.testing.assert_allclose(loss, plain.train_step(feeds), rtol=tolerance, err_msg=f"loss of step {i}")
        if not step.accumulates or i == len(loop) - 1:
            optimizer.step()
            module.lazy_reset_grad()
            plain.optimizer_step()
            plain.reset = True
    trained = {name: parameter.data for name, parameter in state.parameters}
    for name, value in plain.params.items():
        np.testing.assert_allclose(trained[name], value, rtol=tolerance, atol=1e-6, err_msg=name)
    assert optimizer.step_count == plain.steps
    return module


@pytest.mark.parametrize("fold_every_shape", [False, True], ids=["as-on-the-cpu", "as-on-a-gpu"])
@settings(max_examples=20)
@given(
    hidden=st.sampled_from(FLAT_HIDDEN),
    optimizer=st.sampled_from(sorted(OPTIMIZERS)),
    loop=steps(FLAT_ROWS),
)
def test_any_sequence_of_batch_sizes_trains_as_plain_steps(artifacts_of, fold_every_shape, hidden, optimizer, loop):
    """On the CPU, and as on a GPU (where a step of any size gets the session for its shapes)."""
    _compare(artifacts_of("flat", hidden, optimizer), "flat", loop, fold_every_shape=fold_every_shape)


@settings(max_examples=10)
@given(hidden=st.sampled_from(SEQUENCE_HIDDEN), optimizer=st.sampled_from(sorted(OPTIMIZERS)), loop=steps((1, 4, 9)))
def test_any_sequence_of_batch_and_sequence_lengths_trains_as_plain_steps(artifacts_of, hidden, optimizer, loop):
    _compare(artifacts_of("sequence", hidden, optimizer), "sequence", loop)


def _no_accumulation(rows: Sequence[int]) -> list[Step]:
    return [Step(n, 5, False, None) for n in rows]


@pytest.mark.parametrize("hidden", FLAT_HIDDEN)
def test_a_short_last_batch_after_full_ones_trains_as_plain_steps(artifacts_of, hidden):
    """The issue's loop (32, 32, 4) and an epoch's pattern repeated, on a small and a large model."""
    _compare(artifacts_of("flat", hidden, "adamw"), "flat", _no_accumulation([32, 32, 4, 32, 32, 4, 32]))


def test_the_session_for_fixed_shapes_is_chosen_per_step(artifacts_of):
    """A first batch over SMALL_TENSOR elements fixes nothing: the later small batches get the folded session;
    batches of other shapes run the general one, and no staged buffer is fed a batch of another shape."""
    module = _compare(artifacts_of("flat", 16, "sgd"), "flat", _no_accumulation([520, 520, 32, 32, 4, 520, 32]))
    fused = module._fused
    assert fused is not None
    general, fixed = fused.sessions()
    assert fixed is not general and fixed.session.get_inputs()[0].shape == [32, FEATURES]


def test_a_large_models_steps_all_run_the_general_session(artifacts_of):
    module = _compare(artifacts_of("flat", 600, "sgd"), "flat", _no_accumulation([32, 32, 4, 32]))
    fused = module._fused
    assert fused is not None and len(fused.sessions()) == 1


@pytest.mark.parametrize("hidden", FLAT_HIDDEN)
def test_on_a_gpu_the_first_shape_of_any_size_gets_its_own_session(artifacts_of, hidden):
    """As on a GPU, where a node costs a launch: the large model's batches of the first shape run the session for
    their shapes too, a short last batch the general one, and every step equals plain steps."""
    loop = _no_accumulation([520, 520, 4, 520, 32])
    module = _compare(artifacts_of("flat", hidden, "adamw"), "flat", loop, fold_every_shape=True)
    fused = module._fused
    assert fused is not None
    general, fixed = fused.sessions()
    assert fixed.session.get_inputs()[0].shape == [520, FEATURES]
    assert general.session.get_inputs()[0].shape != [520, FEATURES]
    assert len(fixed.session.get_inputs()) == len(general.session.get_inputs())
    # AdamW's chains run once, on the parameters packed inside the step
    ops = [node.op_type for node in fused.step_model.proto.graph.node]
    unpacked = [node.op_type for node in fused.model.proto.graph.node]
    assert ops.count("Concat") - unpacked.count("Concat") == 4  # the parameters, gradients and two moments
    assert ops.count("Slice") - unpacked.count("Slice") == 3 * len(fused.updates)  # new parameters and moments
    shapes = {value.name: value.shape for value in fixed.session.get_inputs()}
    seen = [shapes[update.parameter[0]] for update in fused.updates]  # as rows of one width: the same buffers
    assert len({width for _, width in seen}) == 1
    assert [math.prod(shape) for shape in seen] == [math.prod(update.shape) for update in fused.updates]


@pytest.mark.parametrize("hidden", [16, 600])
@pytest.mark.parametrize("rows", [100, 97])
def test_train_epoch_over_data_of_any_size_trains_as_plain_steps(artifacts_of, hidden, rows):
    """Two epochs of ``train_epoch`` (its full batches scanned, the last shorter one by step) against plain steps."""
    paths, size, rate = artifacts_of("flat", hidden, "adamw"), 32, 0.05
    rng = np.random.default_rng(rows)
    x, labels = batch("flat", rows, 0, rng)
    plain = PlainSteps(paths, rate)
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state, paths["eval_model"])
    optimizer = api.Optimizer(paths["optimizer_model"], module)
    optimizer.set_learning_rate(rate)
    for epoch in range(2):
        losses = module.train_epoch(optimizer, x, labels, size, shuffle=True, seed=epoch)
        order = np.random.default_rng(epoch).permutation(rows)
        expected = []
        for first in range(0, rows, size):
            chosen = order[first : first + size]
            expected.append(plain.train_step([x[chosen], labels[chosen]]))
            plain.optimizer_step()
            plain.reset = True
        np.testing.assert_allclose(losses, expected, rtol=2e-5, err_msg=f"epoch {epoch}")
    trained = {name: parameter.data for name, parameter in state.parameters}
    for name, value in plain.params.items():
        np.testing.assert_allclose(trained[name], value, rtol=2e-5, atol=1e-6, err_msg=name)
