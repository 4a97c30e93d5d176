"""``Module.train_epoch``: the per-step loop's losses and state, from one onnxruntime call per epoch.

Every test runs the same data through ``train_epoch`` and through the loop
its docstring spells out (``module(batch); optimizer.step(); scheduler.step();
module.lazy_reset_grad()``), on two modules opened from the same artifacts,
and compares every loss and everything the state holds (parameters, running
statistics, gradients, moments, the step count).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from onnxtrain import api, optim
from onnxtrain.artifacts import LossType, OptimType
from onnxtrain.graph.passes.functions import written_out_from
from onnxtrain.losses.label_check import label_checks
from onnxtrain.training import epoch as training_epoch
from onnxtrain.training import train_epoch as train_epoch_module
from onnxtrain.training.binding import BoundSession
from tests.helpers import DOUBLE
from tests.training import models
from tests.training.helpers import classifier_batch, open_module, snapshot

Scheduler = Callable[[Any], Any]

ROWS, BATCH = 45, 8  # five full batches and a last one of five rows


def _per_step(
    module: Any,
    optimizer: Any,
    data: Sequence[np.ndarray],
    batch_size: int,
    *,
    shuffle: bool = False,
    seed: int | None = None,
    scheduler: Any = None,
    rates: Sequence[float] | None = None,
) -> np.ndarray:
    """The loop ``train_epoch`` stands for; the loss of every batch (a per-sample loss by its mean)."""
    rows = len(data[0])
    order = np.random.default_rng(seed).permutation(rows) if shuffle else np.arange(rows)
    out = []
    for b in range(-(-rows // batch_size)):
        picked = order[b * batch_size : (b + 1) * batch_size]
        loss = module(*[array[picked] for array in data])
        out.append(float(np.mean(loss[0] if isinstance(loss, tuple) else loss)))
        if rates is not None:
            optimizer.set_learning_rate(rates[b])
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        module.lazy_reset_grad()
    return np.array(out)


def _assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray], rtol: float) -> None:
    assert sorted(a) == sorted(b)
    for name, value in a.items():
        np.testing.assert_allclose(b[name], value, rtol=rtol, atol=0, err_msg=name)


def _compare(
    paths: dict[str, Path],
    data: Sequence[np.ndarray],
    *,
    epochs: int = 2,
    batch_size: int = BATCH,
    rtol: float = 1e-6,
    scheduler: Scheduler | None = None,
    rates: Sequence[float] | None = None,
    **module_options: Any,
) -> tuple[Any, Any]:
    """``train_epoch`` against the per-step loop over ``epochs`` shuffled epochs; the two states."""
    runs = []
    for by_epoch in (False, True):
        state, module, optimizer = open_module(paths, **module_options)
        optimizer.set_learning_rate(0.05)
        sched = scheduler(optimizer) if scheduler is not None else None
        seen = []
        for epoch in range(epochs):
            if by_epoch:
                inputs, labels = list(data[:-1]), data[-1]
                seen.append(
                    module.train_epoch(
                        optimizer, inputs, labels, batch_size, shuffle=True, seed=epoch, learning_rates=rates
                    )
                )
            else:
                seen.append(
                    _per_step(
                        module, optimizer, data, batch_size, shuffle=True, seed=epoch, scheduler=sched, rates=rates
                    )
                )
        runs.append((np.concatenate(seen), snapshot(state), state, module, optimizer))
    (losses_a, state_a, *_), (losses_b, state_b, *_) = runs
    np.testing.assert_allclose(losses_b, losses_a, rtol=rtol, atol=0)
    _assert_same(state_a, state_b, rtol)
    assert runs[0][3].train_step_count == runs[1][3].train_step_count
    assert runs[0][4].get_learning_rate() == runs[1][4].get_learning_rate()
    return runs[0][2], runs[1][2]


def _mlp_for(loss: LossType, elem_type: int = onnx.TensorProto.FLOAT) -> onnx.ModelProto:
    """The 4-8-3 MLP, ending in a sigmoid for the losses that take probabilities."""
    model = models.mlp((4, 8, 3), elem_type=elem_type)
    if loss is LossType.BCELoss:
        model.graph.node[-1].output[0] = "logits"
        model.graph.node.append(helper.make_node("Sigmoid", ["logits"], ["y"]))
    return model


def _data(loss: LossType, rng: np.random.Generator, dtype: type = np.float32) -> list[np.ndarray]:
    """``[x, labels or target]`` of ``ROWS`` rows that ``loss`` takes."""
    x = rng.normal(size=(ROWS, 4)).astype(dtype)
    if loss in (LossType.CrossEntropyLoss, LossType.NLLLoss):
        return [x, rng.integers(0, 3, size=ROWS).astype(np.int64)]
    if loss is LossType.KLDivLoss:
        t = rng.uniform(0.1, 1.0, size=(ROWS, 3))
        return [x, (t / t.sum(axis=1, keepdims=True)).astype(dtype)]
    low = 0.0 if loss in (LossType.BCELoss, LossType.BCEWithLogitsLoss) else -1.0
    return [x, rng.uniform(low, 1.0, size=(ROWS, 3)).astype(dtype)]


@pytest.mark.parametrize("loss", list(LossType), ids=lambda loss: loss.name)
def test_every_loss(tmp_path: Path, loss: LossType) -> None:
    paths = models.generate(tmp_path, _mlp_for(loss), loss=loss, optimizer=OptimType.AdamW)
    _compare(paths, _data(loss, np.random.default_rng(3)))


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precision_artifacts_on_a_provider_without_their_kernels(tmp_path: Path, precision: str) -> None:
    """The CPU has no bfloat16 Gemm: the step's session runs it in float32 (HalfPrecisionFallbackWarning), and
    the epoch model, whose Scan body the session's fallback does not reach, failed to load; now widened alike, it
    gives the per-step loop's losses and state."""
    from onnxtrain.training.half_kernels import HalfPrecisionFallbackWarning

    paths = models.generate(tmp_path, _mlp_for(LossType.MSELoss), loss=LossType.MSELoss, optimizer=OptimType.AdamW,
                            precision=precision)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HalfPrecisionFallbackWarning)
        _compare(paths, _data(LossType.MSELoss, np.random.default_rng(5)))


OPTIMIZERS: dict[str, Callable[[], Any]] = {
    **{kind.name: (lambda kind=kind: kind) for kind in OptimType},
    "SGD-momentum-nesterov": lambda: optim.SGD(momentum=0.9, nesterov=True),
    "AdamW-amsgrad-clip": lambda: optim.AdamW(amsgrad=True, clip_grad=optim.ClipGradNorm(0.5)),
    "SGD-clip": lambda: optim.SGD(clip_grad=optim.ClipGradNorm(0.1)),
    "Adam-clip-inf-norm": lambda: optim.Adam(clip_grad=optim.ClipGradNorm(0.05, norm_type=float("inf"))),
    "SGD-momentum-clip-value": lambda: optim.SGD(momentum=0.9, clip_grad=optim.ClipGradValue(0.02)),
}


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_every_optimizer(tmp_path: Path, optimizer: str, dtype: type) -> None:
    elem_type = DOUBLE if dtype is np.float64 else onnx.TensorProto.FLOAT
    model = _mlp_for(LossType.MSELoss, elem_type)
    paths = models.generate(tmp_path, model, loss=LossType.MSELoss, optimizer=OPTIMIZERS[optimizer]())
    rtol = 1e-12 if dtype is np.float64 else 1e-6
    _compare(paths, _data(LossType.MSELoss, np.random.default_rng(5), dtype), rtol=rtol)


SCHEDULERS: dict[str, Scheduler] = {
    "linear": lambda opt: api.LinearLRScheduler(opt, 3, 10, 0.05),
    "cosine": lambda opt: api.CosineLRScheduler(opt, 2, 9, 0.05, min_lr=0.001),
    "step": lambda opt: api.StepLRScheduler(opt, 4, 0.05, gamma=0.5),
    "exponential": lambda opt: api.ExponentialLRScheduler(opt, 0.05, 0.8),
}


@pytest.mark.parametrize("scheduler", list(SCHEDULERS))
def test_schedulers_set_each_step_rate(classifier: dict[str, Path], scheduler: str) -> None:
    x, labels = classifier_batch(np.random.default_rng(8), ROWS)
    _compare(classifier, [x, labels], epochs=3, scheduler=SCHEDULERS[scheduler])


def test_given_learning_rates(classifier: dict[str, Path]) -> None:
    x, labels = classifier_batch(np.random.default_rng(9), ROWS)
    rates = [0.1, 0.05, 0.02, 0.3, 0.01, 0.07]
    _compare(classifier, [x, labels], rates=rates)


def test_batchnorm_running_statistics(batchnorm: dict[str, Path]) -> None:
    rng = np.random.default_rng(10)
    state, _ = _compare(
        batchnorm, [rng.normal(size=(ROWS, 4)).astype(np.float32), rng.normal(size=(ROWS, 3)).astype(np.float32)]
    )
    assert not np.array_equal(state.parameters["bn.mean"].data, np.zeros(3, np.float32))  # they moved


def test_frozen_parameters_and_mixed_dtypes(momentum: dict[str, Path], mixed: dict[str, Path]) -> None:
    rng = np.random.default_rng(11)
    _compare(momentum, [rng.normal(size=(ROWS, 4)).astype(np.float32), rng.normal(size=(ROWS, 3)).astype(np.float32)])
    _compare(mixed, [rng.normal(size=(ROWS, 3)).astype(np.float32), rng.normal(size=(ROWS, 2))])


def test_additional_outputs_and_sum_reduction(regression: dict[str, Path]) -> None:
    rng = np.random.default_rng(12)
    _compare(regression, [rng.normal(size=(ROWS, 4)).astype(np.float32), rng.normal(size=(ROWS, 3)).astype(np.float32)])


def test_without_the_fused_step_every_batch_is_a_step(classifier: dict[str, Path]) -> None:
    x, labels = classifier_batch(np.random.default_rng(13), ROWS)
    _compare(classifier, [x, labels], fuse=False)


@pytest.mark.parametrize(("rows", "batch_size"), [(1, 8), (8, 8), (9, 8), (40, 1), (45, 45), (45, 100)])
def test_batch_counts(classifier: dict[str, Path], rows: int, batch_size: int) -> None:
    x, labels = classifier_batch(np.random.default_rng(14), rows)
    _compare(classifier, [x, labels], batch_size=batch_size)


def test_after_accumulated_train_steps(classifier: dict[str, Path]) -> None:
    """Train steps that accumulated before the call: its first batch adds to them, as a step would."""
    x, labels = classifier_batch(np.random.default_rng(15), ROWS)
    states = []
    for by_epoch in (False, True):
        state, module, optimizer = open_module(classifier)
        module(x[:3], labels[:3])
        module(x[3:7], labels[3:7])
        got = (
            module.train_epoch(optimizer, x, labels, BATCH)
            if by_epoch
            else _per_step(module, optimizer, [x, labels], BATCH)
        )
        states.append((got, snapshot(state)))
    np.testing.assert_allclose(states[1][0], states[0][0], rtol=1e-6)
    _assert_same(states[0][1], states[1][1], 1e-6)


def _count_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count every onnxruntime run of every session of the runtime."""
    runs = [0]
    original = BoundSession.run

    def counted(self: BoundSession) -> None:
        runs[0] += 1
        original(self)

    monkeypatch.setattr(BoundSession, "run", counted)
    return runs


def test_one_onnxruntime_call_per_epoch(classifier: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    x, labels = classifier_batch(np.random.default_rng(16), 48)
    _, module, optimizer = open_module(classifier)
    runs = _count_runs(monkeypatch)
    module.train_epoch(optimizer, x, labels, BATCH)
    assert runs[0] == 2  # the first batch records the first update, then the other five in one run
    for expected in (3, 4, 5):
        module.train_epoch(optimizer, x, labels, BATCH, shuffle=True, seed=expected)
        assert runs[0] == expected
    module.train_epoch(optimizer, x[:45], labels[:45], BATCH)  # and a shorter last batch: one step more
    assert runs[0] == 7


def test_one_onnxruntime_call_per_steady_step(classifier: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    x, labels = classifier_batch(np.random.default_rng(17), BATCH)
    _, module, optimizer = open_module(classifier)
    module(x, labels)
    optimizer.step()
    module.lazy_reset_grad()
    runs = _count_runs(monkeypatch)
    for step in range(1, 6):
        module(x, labels)
        optimizer.step()
        module.lazy_reset_grad()
        assert runs[0] == step  # the fused step: the recorded update and the train step in one run


def test_check_finite_stops_where_the_per_step_loop_raises(tmp_path: Path) -> None:
    paths = models.generate(tmp_path, _mlp_for(LossType.MSELoss), loss=LossType.MSELoss, optimizer=OptimType.AdamW)
    x, target = _data(LossType.MSELoss, np.random.default_rng(18))
    x[3 * BATCH + 2, 1] = np.inf  # batch 4 of each epoch gives an infinite loss
    results = []
    for by_epoch in (False, True):
        state, module, optimizer = open_module(paths, check_finite=True)
        module.train_epoch(optimizer, x[: 3 * BATCH], target[: 3 * BATCH], BATCH)  # a first, clean epoch
        with pytest.raises(FloatingPointError, match="train step 7"):
            if by_epoch:
                module.train_epoch(optimizer, x, target, BATCH)
            else:
                _per_step(module, optimizer, [x, target], BATCH)
        results.append((snapshot(state), module.train_step_count))
    _assert_same(results[0][0], results[1][0], 1e-6)
    assert results[0][1] == results[1][1] == 6


def test_labels_out_of_range_raise_before_any_batch_runs(classifier: dict[str, Path]) -> None:
    """The module leaves out the loss's label check of its fixed class count, and so does the epoch model made
    from it; the labels are checked on the host first."""
    x, labels = classifier_batch(np.random.default_rng(19), 48)
    bad = labels.copy()
    bad[4 * BATCH + 1] = 7  # the classifier has 4 classes
    expected = []
    for fails in (False, True):
        state, module, optimizer = open_module(classifier)
        module.train_epoch(optimizer, x, labels, BATCH)
        if fails:
            with pytest.raises(ValueError, match=r"train_epoch: 1 label is out of range in 'labels'.*7 at \[33\]"):
                module.train_epoch(optimizer, x, bad, BATCH)
        expected.append((snapshot(state), module.train_step_count, optimizer.step_count))
    _assert_same(expected[0][0], expected[1][0], 0)
    assert expected[0][1:] == expected[1][1:]
    epoch = next(iter(module._epochs.values())).epoch
    assert not label_checks([module.train_model.proto])
    assert epoch.label_checks == ()  # none left for the epoch model to take out


def test_an_error_in_the_run_leaves_the_state_as_before_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """onnxruntime fails in the epoch's last batch (an id out of its table, which the module's host check would
    refuse before the run: bypassed, so that the run's own failure is what is tested)."""
    from onnxtrain.training.lookups import HostLookupChecks

    monkeypatch.setattr(HostLookupChecks, "raise_if_out_of_range", lambda self, feeds, what: None)
    paths = models.generate(tmp_path, models.embedding_model(), loss=LossType.MSELoss, optimizer=OptimType.AdamW)
    rng = np.random.default_rng(23)
    ids, x, target = rng.integers(0, 5, 48), rng.normal(size=(48, 3)).astype(np.float32), np.zeros((48, 2), np.float32)
    bad = ids.copy()
    bad[5 * BATCH - 1] = 99  # the last batch's
    expected = []
    for fails in (False, True):
        state, module, optimizer = open_module(paths)
        module.train_epoch(optimizer, [ids, x], target, BATCH)
        if fails:
            with pytest.raises(Exception, match=r"(?i)out of|invalid|range|bound"):
                module.train_epoch(optimizer, [bad, x], target, BATCH)
        expected.append((snapshot(state), module.train_step_count, optimizer.step_count))
    _assert_same(expected[0][0], expected[1][0], 0)
    assert expected[0][1:] == expected[1][1:]


def test_bad_arguments(classifier: dict[str, Path], regression: dict[str, Path]) -> None:
    x, labels = classifier_batch(np.random.default_rng(20), 16)
    _, module, optimizer = open_module(classifier)
    _, _, other = open_module(classifier)
    with pytest.raises(TypeError, match="Optimizer made over this module"):
        module.train_epoch(other, x, labels, 4)
    with pytest.raises(ValueError, match="same number of rows"):
        module.train_epoch(optimizer, x, labels[:-1], 4)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        module.train_epoch(optimizer, x, labels, 0)
    with pytest.raises(TypeError, match="batch_size must be an int"):
        module.train_epoch(optimizer, x, labels, 4.0)
    with pytest.raises(TypeError, match="cast it"):
        module.train_epoch(optimizer, x.astype(np.float64), labels, 4)
    with pytest.raises(TypeError, match=r"takes 2 user input.*got 3 array\(s\) \(inputs, then labels\)$"):
        module.train_epoch(optimizer, [x, x], labels, 4)
    with pytest.raises(TypeError, match=r"got 17 array\(s\).*inputs holds rows, not arrays.*np.asarray\(x\)"):
        module.train_epoch(optimizer, x.tolist(), labels, 4)
    with pytest.raises(ValueError, match="learning_rates has 3 values; the pass takes 4 optimizer steps"):
        module.train_epoch(optimizer, x, labels, 4, learning_rates=[0.1, 0.1, 0.1])
    assert module.train_step_count == 0


def test_unpacking_with_slices_gives_the_same_bits(classifier: dict[str, Path], monkeypatch) -> None:
    """The epoch model CUDA runs (its packed parameters unpacked by ``Slice``s, not a ``Split``), here on the CPU."""
    monkeypatch.setattr(training_epoch, "unpacks_with_slices", lambda device: True)
    x, labels = classifier_batch(np.random.default_rng(23), ROWS)
    _compare(classifier, [x, labels])
    _, module, optimizer = open_module(classifier)
    module.train_epoch(optimizer, x, labels, BATCH)
    graph = next(iter(module._epochs.values())).epoch.model.graph
    (scan,) = [node for node in graph.node if node.op_type == "Scan"]
    body_nodes = onnx.helper.get_node_attr_value(scan, "body").node
    body = [node.op_type for node in body_nodes if written_out_from(node) is None]  # not the loss's own Slice
    outside = [node.op_type for node in graph.node]
    assert body.count("Slice") == 4 and "Split" not in body + outside  # the MLP's 2 weights and 2 biases


@pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(), reason="no CUDA here")
def test_on_cuda_the_epoch_keeps_the_state_on_the_device(classifier: dict[str, Path]) -> None:
    x, labels = classifier_batch(np.random.default_rng(22), ROWS)
    state_gpu, _ = _compare(classifier, [x, labels], rtol=1e-5, device="cuda")
    assert all(t.value.device_name().lower() == "cuda" for t in state_gpu.store.tensors.values())
    state_cpu, _ = _compare(classifier, [x, labels])
    for name, parameter in state_cpu.parameters:
        np.testing.assert_allclose(state_gpu.parameters[name].data, parameter.data, rtol=1e-4, atol=1e-6)


def test_small_models_run_alone_on_one_thread(classifier: dict[str, Path]) -> None:
    """The fused and epoch sessions of a model whose every input of a step is small: one intra-op thread."""
    x, labels = classifier_batch(np.random.default_rng(24), 48)
    _, module, optimizer = open_module(classifier)
    module.train_epoch(optimizer, x, labels, BATCH)
    module(x[:BATCH], labels[:BATCH])  # a fused step: its session for these shapes
    epoch = next(iter(module._epochs.values()))
    fixed = optimizer.fused_step.sessions()[-1]
    for session in (epoch.session, fixed):
        assert session.session.get_session_options().intra_op_num_threads == 1
    assert optimizer.fused_step.session.session.get_session_options().intra_op_num_threads == 0  # any shape
    options = ort.SessionOptions()
    _, module, optimizer = open_module(classifier, session_options=options)  # the user's options: as they are
    module.train_epoch(optimizer, x, labels, BATCH)
    assert next(iter(module._epochs.values())).session.session.get_session_options().intra_op_num_threads == 0


def test_labels_of_flattened_tokens_are_told_why_they_cannot_be_cut_into_batches(tmp_path: Path) -> None:
    """Scores flattened to ``[batch * seq, classes]``, labels ``[batch*seq]``: train_epoch cuts every input by
    rows, so neither flat labels nor ``[batch, seq]`` ones fit, and its errors said only the counts or shapes."""
    from tests.helpers import FLOAT, INT64, make_model

    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["h"]),
        helper.make_node("Reshape", ["h", "flat"], ["scores"]),
    ]
    model = make_model(
        {"ids": (INT64, ["batch", "seq"])}, nodes, {"scores": (FLOAT, ["batch*seq", 5])},
        [("table", rng.normal(size=(7, 5)).astype(np.float32)), ("flat", np.array([-1, 5], np.int64))],
    )  # fmt: skip
    paths = models.generate(tmp_path, model, requires_grad=["table"], loss=LossType.CrossEntropyLoss, optimizer="SGD")
    _, module, optimizer = open_module(paths)
    ids = rng.integers(0, 7, (4, 8))
    hint = r"do not share their first axis \(ids: batch, labels: batch\*seq\).*labels\.reshape\(-1\)"
    with pytest.raises(ValueError, match=r"same number of rows.*" + hint):
        module.train_epoch(optimizer, ids, ids.reshape(-1), 2)
    with pytest.raises(ValueError, match=r"is int64\[batch\*seq\]; got int64\[2, 8\]. The model's inputs " + hint):
        module.train_epoch(optimizer, ids, ids, 2)


@pytest.mark.parametrize("shuffle", [False, True], ids=["in_order", "shuffled"])
def test_a_label_the_scan_refuses_is_named_at_its_row_of_the_data(tmp_path: Path, shuffle: bool) -> None:
    """A symbolic class count keeps the loss's label check in the scanned body: its error names the bad label
    at its row of the array given to train_epoch (the user's row, shuffled or not), not at ``[batch, row]`` of
    the scanned ``[M, B]`` labels; the first batch, a step of its own before the scan, is kept."""
    paths = models.generate(tmp_path, models.classes_model("classes", False), loss=LossType.CrossEntropyLoss,
                            optimizer=OptimType.SGD)  # fmt: skip
    rows, size, seed = 13, 4, 3  # batch 1 by step (no update recorded yet), 2-3 in one run, a last one of 1 row
    x = np.linspace(-2, 2, rows * 4, dtype=np.float32).reshape(rows, 4)
    labels = np.arange(rows, dtype=np.int64) % 4
    order = np.random.default_rng(seed).permutation(rows) if shuffle else np.arange(rows)
    bad_row = int(order[2 * size + 1])  # the second row of batch 3, scanned
    labels[bad_row] = 9
    _, module, optimizer = open_module(paths)
    assert not module._label_checks  # checked in the graph, not on the host
    message = rf"train_epoch, batches 2-3: 1 label is out of range in 'labels' .* \(4 classes\): 9 at \[{bad_row}\]\."
    with pytest.raises(ValueError, match=message):
        module.train_epoch(optimizer, x, labels, size, shuffle=shuffle, seed=seed)
    assert module.train_step_count == optimizer.step_count == 1  # the first batch's step, as the loop keeps it


@pytest.mark.parametrize("over", [False, True])
def test_a_model_over_the_scans_size_trains_step_by_step_with_the_same_results(
    classifier: dict[str, Path], monkeypatch: pytest.MonkeyPatch, over: bool
) -> None:
    """A ``Scan`` carries the parameters, gradients and moments through its iterations: past
    ``EPOCH_SCAN_MAX_ELEMENTS`` trainable elements each epoch runs as per-step calls (a 1,000,000 x 32
    embedding held 3.6 GiB more and stepped 1.3x slower in the ``Scan``). Both sides of the threshold give the
    loop's results."""
    x, labels = classifier_batch(np.random.default_rng(21), 48)
    state, module, optimizer = open_module(classifier)
    trainable = sum(parameter.data.size for _, parameter in state.parameters if parameter.requires_grad)
    monkeypatch.setattr(train_epoch_module, "EPOCH_SCAN_MAX_ELEMENTS", trainable - 1 if over else trainable)
    runs = _count_runs(monkeypatch)
    losses = module.train_epoch(optimizer, x, labels, BATCH)
    batches = len(x) // BATCH
    assert runs[0] == (batches if over else 2)  # each batch a fused step, or the first and then one Scan
    loop_state, loop_module, loop_optimizer = open_module(classifier)
    for b in range(batches):
        expected = loop_module(x[b * BATCH : (b + 1) * BATCH], labels[b * BATCH : (b + 1) * BATCH])
        loop_optimizer.step()
        loop_module.lazy_reset_grad()
        assert losses[b] == np.float32(expected)
    for name, parameter in loop_state.parameters:
        np.testing.assert_array_equal(state.parameters[name].data, parameter.data, err_msg=name)
