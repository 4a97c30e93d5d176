"""The recompute pass: element-wise forward values the backward reads are computed again there, not kept.

The promise: the gradients do not change (bit for bit when onnxruntime runs
the graph as written; within float tolerance once its fusions apply), values
of fewer than ``MIN_KNOWN_ELEMENTS`` known elements are kept, the copies
survive the runtime's sessions, and the models the runtime derives from the
training model say that they recompute.
"""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import numpy as np
import onnx
import onnxruntime as ort
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

from benchmarks.real_size.static import in_index_order, ort_optimized
from onnxtrain import api
from onnxtrain.artifacts import LossType, OptimType
from onnxtrain.artifacts.fuse import fuse_update_and_train
from onnxtrain.artifacts.step_memory import execution_order, live_memory
from onnxtrain.artifacts.training_model import build_training_models
from onnxtrain.graph.passes import recompute
from onnxtrain.graph.passes.recompute import MIN_KNOWN_ELEMENTS, recompute_elementwise, recomputes
from onnxtrain.sessions import inference_session
from tests.graph.recomputed import NO_CSE, assert_same_outputs
from tests.helpers import DOUBLE, FLOAT, make_model
from tests.training import models

#: Element-wise links of an activation, each ``(op, reads the link before it twice)``; none of them is fused by
#: onnxruntime into a contrib kernel, so every copy shows in the optimized graph.
LINKS = [("Tanh", False), ("Sin", False), ("Mul", True), ("Exp", False), ("Add", True), ("Sigmoid", False)]


def _mlp(width: int, links: list[tuple[str, bool]]) -> onnx.ModelProto:
    """``loss = ReduceSum((chain(x @ w1)) @ w2)`` with ``x: [n, width]`` (``width`` known elements per sample)."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h0"])]
    for index, (op, twice) in enumerate(links):
        before = f"h{index}"
        nodes.append(helper.make_node(op, [before, before] if twice else [before], [f"h{index + 1}"]))
    nodes += [
        helper.make_node("MatMul", [f"h{len(links)}", "w2"], ["y"]),
        helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
    ]
    rng = np.random.default_rng(width)
    initializers = [
        ("w1", rng.normal(scale=0.3 / np.sqrt(width), size=(width, width))),
        ("w2", rng.normal(scale=1.0 / np.sqrt(width), size=(width, 2))),
    ]
    return make_model({"x": (DOUBLE, ["n", width])}, nodes, {"loss": (DOUBLE, [])}, initializers)


def _training(model: onnx.ModelProto, *, recomputing: bool) -> onnx.ModelProto:
    threshold = MIN_KNOWN_ELEMENTS if recomputing else np.iinfo(np.int64).max
    with mock.patch.object(recompute, "MIN_KNOWN_ELEMENTS", threshold):
        return build_training_models(model, ["loss"], ["w1", "w2"]).training


def _feeds(model: onnx.ModelProto, width: int, rows: int) -> dict[str, np.ndarray]:
    feeds = {"x": np.random.default_rng(rows).normal(size=(rows, width))}
    feeds.update({t.name: onnx.numpy_helper.to_array(t) for t in _parameters(model)})
    return feeds


def _parameters(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    return list(model.graph.initializer)


def _copies(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [node for node in model.graph.node if ".recomputed" in node.name]


@settings(max_examples=12, deadline=None)
@given(
    links=st.lists(st.sampled_from(LINKS), min_size=1, max_size=5),
    width=st.sampled_from([MIN_KNOWN_ELEMENTS // 64, MIN_KNOWN_ELEMENTS - 1, MIN_KNOWN_ELEMENTS]),
    rows=st.integers(1, 3),
)
def test_recomputed_gradients_equal_kept_ones_bit_for_bit(links: list[tuple[str, bool]], width: int, rows: int):
    model = _mlp(width, links)
    recomputed, kept = _training(model, recomputing=True), _training(model, recomputing=False)
    assert not _copies(kept) and not recomputes(kept)
    if width < MIN_KNOWN_ELEMENTS:  # below the threshold the pass leaves the graph as it was
        assert recomputed.SerializeToString() == kept.SerializeToString()
        return
    assert recomputes(recomputed) == bool(_copies(recomputed))
    if len(links) > 1 and links[0][0] in ("Tanh", "Exp", "Sigmoid"):
        # the first link's gradient reads its output h1, so the backward keeps it; the last link's value feeds a
        # MatMul, whose gradient reads it, and it is derivable from h1: recomputed
        assert _copies(recomputed)
    onnx.checker.check_model(recomputed, full_check=True)
    feeds = _feeds(model, width, rows)
    assert_same_outputs(recomputed, kept, feeds)


def test_the_backward_reads_copies_placed_before_it_and_the_forward_values_die_in_the_forward():
    width = MIN_KNOWN_ELEMENTS
    training = _training(_mlp(width, [("Tanh", False), ("Mul", True), ("Sin", False)]), recomputing=True)
    nodes = list(training.graph.node)
    copies = _copies(training)
    # h0 = x @ w1 is not kept (the weight's gradient reads x), so h1 = Tanh(h0) is kept (its gradient reads it);
    # h2 = h1 * h1 and h3 = Sin(h2) are made again from h1
    assert sorted(node.op_type for node in copies) == ["Mul", "Sin"]
    first_backward = min(nodes.index(node) for node in copies)
    forward_links = {"h2", "h3"}
    readers = [k for k, node in enumerate(nodes) if forward_links & set(node.input)]
    assert max(readers) < first_backward  # the forward's links are read by the forward alone
    assert {p.key: p.value for p in training.metadata_props}[recompute.RECOMPUTED_KEY] == "2"


def test_copies_start_from_values_the_backward_keeps_anyway():
    """Softmax's gradient reads its output ``s``: ``Tanh(s)`` and ``Tanh(s) * s`` are made again from ``s``."""
    model = _mlp(MIN_KNOWN_ELEMENTS, [("Tanh", False)])
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m"]),
        helper.make_node("Softmax", ["m"], ["s"], axis=-1),
        helper.make_node("Tanh", ["s"], ["t"]),
        helper.make_node("Mul", ["t", "s"], ["u"]),
        helper.make_node("MatMul", ["u", "w2"], ["y"]),
        helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
    ]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    training = _training(model, recomputing=True)
    copies = {node.op_type: node for node in _copies(training)}
    assert sorted(copies) == ["Mul", "Tanh"]
    # they read s through a hold, which waits for a gradient and changes no value: Mul(s, one), one made from it
    held = {node.output[0]: node for node in training.graph.node if node.op_type == "Mul"}
    (source,) = copies["Tanh"].input
    assert source.endswith(".held") and held[source].input[0] == "s"
    assert list(copies["Mul"].input) == [copies["Tanh"].output[0], "s"]  # waits for the held copy already


def test_recompute_is_idempotent_in_count_and_a_model_without_copies_is_unmarked():
    model = _mlp(8, [("Tanh", False)])
    training = _training(model, recomputing=True)
    assert not recomputes(training)
    assert recompute_elementwise(training, backward_from=len(training.graph.node), shapes={}) is training
    assert not recomputes(training)


def test_the_copies_survive_a_runtime_session(tmp_path: Path):
    width = MIN_KNOWN_ELEMENTS
    training = _training(_mlp(width, [("Tanh", False), ("Sin", False), ("Exp", False)]), recomputing=True)
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    inference_session(training.SerializeToString(), options, disabled_optimizers=NO_CSE)
    optimized = onnx.load(options.optimized_model_filepath)
    assert sorted(node.op_type for node in _copies(optimized)) == ["Exp", "Sin"]


def _forward(width: int) -> onnx.ModelProto:
    """:func:`_mlp` without its loss: ``y = chain(x @ w1) @ w2`` for an MSE loss."""
    model = _mlp(width, [("Tanh", False), ("Mul", True)])
    del model.graph.node[-1]
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("y", DOUBLE, ["n", 2]))
    return model


def _train(directory: Path, model: onnx.ModelProto, *, recomputing: bool) -> tuple[list[float], dict[str, np.ndarray]]:
    threshold = MIN_KNOWN_ELEMENTS if recomputing else np.iinfo(np.int64).max
    with mock.patch.object(recompute, "MIN_KNOWN_ELEMENTS", threshold):
        paths = models.generate(directory, model, loss=LossType.MSELoss, optimizer=OptimType.AdamW)
    assert recomputes(onnx.load(paths["training_model"])) == recomputing
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state, paths["eval_model"])
    optimizer = api.Optimizer(paths["optimizer_model"], module)
    rng = np.random.default_rng(3)
    losses = []
    for rows in (4, 4, 3, 4):  # the fused step's fixed and general sessions, and a short batch
        x, target = (
            rng.normal(size=(rows, model.graph.input[0].type.tensor_type.shape.dim[1].dim_value)),
            rng.normal(size=(rows, 2)),
        )
        losses.append(float(module(x, target)))
        optimizer.step()
        module.lazy_reset_grad()
    parameters = {name: np.array(state.parameters[name].data) for name in ("w1", "w2")}
    return losses, parameters


def test_the_runtime_trains_a_recomputing_model_as_one_that_keeps_its_values(tmp_path: Path):
    model = _forward(MIN_KNOWN_ELEMENTS)
    losses, parameters = _train(tmp_path / "recomputed", model, recomputing=True)
    want_losses, want_parameters = _train(tmp_path / "kept", model, recomputing=False)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
    for name, value in parameters.items():
        np.testing.assert_allclose(value, want_parameters[name], rtol=1e-12, atol=1e-14)


def test_the_fused_step_says_that_it_recomputes(tmp_path: Path):
    paths = models.generate(tmp_path, _forward(MIN_KNOWN_ELEMENTS), loss=LossType.MSELoss, optimizer=OptimType.AdamW)
    training, optimizer = onnx.load(paths["training_model"]), onnx.load(paths["optimizer_model"])
    fused = fuse_update_and_train(training, optimizer, ["w1", "w2"])
    assert recomputes(fused.model)


def _quick_gelu_mlp(width: int) -> onnx.ModelProto:
    """``loss = ReduceSum(quick_gelu(x @ w1) @ w2)``, float32, CLIP's QuickGELU written out as
    ``h * Sigmoid(1.702 h)``, which onnxruntime fuses into ``QuickGelu``. Its derivative reads ``h`` and the
    output, which the recompute pass copies into the backward from ``h``. (GPT-2's tanh GELU chain was the example
    until its derivative read ``h`` alone.)"""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Mul", ["h", "alpha"], ["ah"]),
        helper.make_node("Sigmoid", ["ah"], ["s"]),
        helper.make_node("Mul", ["h", "s"], ["g"]),
        helper.make_node("MatMul", ["g", "w2"], ["y"]),
        helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
    ]
    rng = np.random.default_rng(0)
    initializers = [
        ("alpha", np.array(1.702, np.float32)),
        ("w1", rng.normal(scale=0.03, size=(width, width)).astype(np.float32)),
        ("w2", rng.normal(scale=0.03, size=(width, 2)).astype(np.float32)),
    ]
    return make_model({"x": (FLOAT, ["n", width])}, nodes, {"loss": (FLOAT, [])}, initializers)


def test_copies_wait_for_the_backward_where_onnxruntime_fuses_the_forward():
    """onnxruntime numbers the ``QuickGelu`` it makes after every node of the model, and runs the lowest ready
    index first: unheld, the QuickGELU's copies ran in the forward (ready as soon as ``x @ w1`` was) and their outputs
    lived until the backward, kept for it after all. Held, the step keeps what the model as written keeps."""
    model = _quick_gelu_mlp(MIN_KNOWN_ELEMENTS)
    training = build_training_models(model, ["loss"], ["w1", "w2"]).training
    assert _copies(training)
    optimized = in_index_order(training, ort_optimized(training))  # as the runtime's session optimizes it
    assert any(node.op_type == "QuickGelu" for node in optimized.graph.node)
    nodes = list(optimized.graph.node)
    position = {index: place for place, index in enumerate(execution_order(nodes, "priority"))}
    forward_end = next(k for k, node in enumerate(nodes) if "y" in node.output)  # the forward's last product
    copies = [k for k, node in enumerate(nodes) if ".recomputed" in node.name]
    assert copies and all(position[k] > position[forward_end] for k in copies)  # none in the forward
    shapes = {"x": (4, MIN_KNOWN_ELEMENTS)}
    as_written = live_memory(training, shapes, order="priority", loss="loss")
    assert live_memory(optimized, shapes, order="priority", loss="loss").peak <= as_written.peak
