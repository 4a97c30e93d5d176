"""Activation checkpointing: ``activation_checkpoints`` keeps chosen forward values and recomputes the rest.

The promise: the gradients do not change (bit for bit when onnxruntime runs
the graph as written; within float tolerance once its fusions apply); the
backward reads no forward value but the checkpoints (and values it cannot
make again: random ones, small ones); ``"auto"`` chooses the layer
boundaries and the values every layer reads; random nodes are never copied;
values of fewer than ``MIN_KNOWN_ELEMENTS`` known elements are kept; bad
names are refused before anything is built; and the runtime trains a
checkpointed model as one that keeps everything, through accumulation,
clipping, schedules and half precision.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from unittest import mock

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

from onnxtrain import api, optim
from onnxtrain.artifacts import LossType, training_model
from onnxtrain.artifacts.step_memory import execution_order
from onnxtrain.artifacts.training_model import build_training_models
from onnxtrain.graph.passes.checkpoint_choice import choose_checkpoints
from onnxtrain.graph.passes.recompute import MIN_KNOWN_ELEMENTS, NOT_RECOMPUTED, recomputes
from onnxtrain.sessions import inference_session
from tests.graph.recomputed import NO_CSE, assert_bit_equal, assert_same_outputs
from tests.helpers import DOUBLE, FLOAT, make_model
from tests.training import models


def _stack(
    depth: int,
    width: int,
    *,
    rows: int | str = "n",
    shared: bool = False,
    dropout: bool = False,
    elem_type: int = DOUBLE,
    loss: bool = True,
) -> onnx.ModelProto:
    """``depth`` residual layers ``h{l+1} = h{l} + Tanh(h{l} @ a{l}) @ b{l}`` on ``h0 = x @ w_in``, then
    ``y = h{depth} @ w_out`` and ``loss = ReduceSum(y * y)`` (or ``y`` alone with ``loss=False``).

    ``shared``: every layer also multiplies its product by ``g = Sigmoid(x @ w_in)``, a value all layers read;
    ``dropout``: a training-mode ``Dropout`` (ratio 0.25) on each ``Tanh``.
    """
    nodes = [helper.make_node("MatMul", ["x", "w_in"], ["h0"])]
    if shared:
        nodes.append(helper.make_node("Sigmoid", ["h0"], ["g"]))
    for layer in range(depth):
        h, t = f"h{layer}", f"t{layer}"
        nodes += [
            helper.make_node("MatMul", [h, f"a{layer}"], [f"p{layer}"]),
            helper.make_node("Tanh", [f"p{layer}"], [t]),
        ]
        if dropout:
            nodes.append(helper.make_node("Dropout", [t, "ratio", "training"], [f"d{layer}", f"mask{layer}"]))
            t = f"d{layer}"
        nodes.append(helper.make_node("MatMul", [t, f"b{layer}"], [f"m{layer}"]))
        if shared:
            nodes.append(helper.make_node("Mul", [f"m{layer}", "g"], [f"s{layer}"]))
        nodes.append(helper.make_node("Add", [h, f"s{layer}" if shared else f"m{layer}"], [f"h{layer + 1}"]))
    nodes.append(helper.make_node("MatMul", [f"h{depth}", "w_out"], ["y"]))
    if loss:
        nodes += [
            helper.make_node("Mul", ["y", "y"], ["squares"]),
            helper.make_node("ReduceSum", ["squares"], ["loss"], keepdims=0),
        ]
    rng = np.random.default_rng(depth * 100 + width)
    dtype = np.float64 if elem_type == DOUBLE else np.float32
    initializers: list[tuple[str, np.ndarray]] = [
        ("w_in", rng.normal(scale=width**-0.5, size=(width, width)).astype(dtype)),
        ("w_out", rng.normal(scale=width**-0.5, size=(width, 2)).astype(dtype)),
    ]
    for layer in range(depth):
        initializers.append((f"a{layer}", rng.normal(scale=width**-0.5, size=(width, width)).astype(dtype)))
        initializers.append((f"b{layer}", rng.normal(scale=width**-0.5, size=(width, width)).astype(dtype)))
    if dropout:
        initializers += [("ratio", np.array(0.25, dtype)), ("training", np.array(True))]
    outputs = {"loss": (elem_type, [])} if loss else {"y": (elem_type, [rows, 2])}
    return make_model({"x": (elem_type, [rows, width])}, nodes, outputs, initializers)


def _trainable(model: onnx.ModelProto) -> list[str]:
    return [t.name for t in model.graph.initializer if t.name not in ("ratio", "training")]


def _training(model: onnx.ModelProto, checkpoints: str | Sequence[str] | None) -> onnx.ModelProto:
    return build_training_models(model, ["loss"], _trainable(model), activation_checkpoints=checkpoints).training


def _checkpointed(model: onnx.ModelProto, checkpoints: str | Sequence[str]) -> tuple[onnx.ModelProto, list[str]]:
    """The training model with ``checkpoints``, and the checkpoints (those ``"auto"`` chose)."""
    chosen: list[list[str]] = []

    def choose(*args: object, **kwargs: object) -> list[str]:
        chosen.append(choose_checkpoints(*args, **kwargs))  # type: ignore[arg-type]
        return chosen[-1]

    with mock.patch.object(training_model, "choose_checkpoints", choose):
        training = _training(model, checkpoints)
    return training, chosen[0] if chosen else list(checkpoints)


def _feeds(model: onnx.ModelProto, rows: int) -> dict[str, np.ndarray]:
    width = model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    feeds = {"x": np.random.default_rng(rows).normal(size=(rows, width))}
    feeds.update(
        {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer if t.name in _trainable(model)}
    )
    return feeds


def _layer(value: str) -> int:
    """The layer of ``h<layer>``."""
    return int(value[1:])


def _made_after(model: onnx.ModelProto, value: str) -> set[str]:
    """The forward's values made after ``value``."""
    outputs = [name for node in model.graph.node for name in node.output]
    return set(outputs[outputs.index(value) + 1 :])


def _is_copy(node: onnx.NodeProto) -> bool:
    """Whether ``node`` is a copy the checkpointing made (named ``<node>.recomputed[_N]``)."""
    return re.search(r"\.recomputed(_\d+)?$", node.name) is not None


def _copies(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [node for node in model.graph.node if _is_copy(node)]


def _forward_values_the_backward_reads(training: onnx.ModelProto, forward: onnx.ModelProto) -> set[str]:
    """The forward's node outputs that a node after the forward reads (a copy made in the backward included)."""
    made = {name for node in forward.graph.node for name in node.output}
    backward = list(training.graph.node)[len(forward.graph.node) :]
    return {name for node in backward for name in node.input if name in made and node.op_type != "Shape"}


@settings(max_examples=15, deadline=None)
@given(
    depth=st.integers(2, 4),
    width=st.sampled_from([4, 8]),
    rows=st.integers(1, 3),
    chosen=st.one_of(st.just("auto"), st.sets(st.integers(1, 3), min_size=1)),
)
def test_checkpointed_gradients_equal_kept_ones_bit_for_bit(depth: int, width: int, rows: int, chosen: object):
    model = _stack(depth, width)
    checkpoints = chosen if chosen == "auto" else [f"h{k}" for k in sorted(chosen) if k <= depth] or ["h1"]  # type: ignore
    checkpointed, checkpoints = _checkpointed(model, checkpoints)
    kept = _training(model, None)
    assert recomputes(checkpointed) and not recomputes(kept)
    onnx.checker.check_model(checkpointed, full_check=True)
    assert set(checkpoints) <= {f"h{k}" for k in range(depth + 1)}  # for "auto", layer boundaries
    # the backward reads the checkpoints and, from the last one on, what the forward made after it (its gradients
    # run first): nothing else the forward made
    read = _forward_values_the_backward_reads(checkpointed, model)
    assert read <= set(checkpoints) | _made_after(model, max(checkpoints, key=_layer))
    feeds = _feeds(model, rows)
    assert_same_outputs(checkpointed, kept, feeds)


def test_auto_keeps_boundaries_and_the_value_every_layer_reads_and_recomputes_layers_last_first():
    model = _stack(4, 8, shared=True)
    training, chosen = _checkpointed(model, "auto")
    read = _forward_values_the_backward_reads(training, model)
    last = max(set(chosen) - {"g"}, key=_layer)
    assert "g" in chosen and set(chosen) - {"g"} <= {"h0", "h1", "h2", "h3", "h4"}
    assert read - _made_after(model, last) <= set(chosen)
    # each segment between checkpoints is recomputed right before its own gradients, the last segment's first
    position = {node.output[0]: k for k, node in enumerate(training.graph.node)}
    layers = [layer for layer in range(4) if f"t{layer}.recomputed" in position]
    segment = {layer: sum(_layer(value) <= layer for value in set(chosen) - {"g"}) for layer in layers}
    assert len(set(segment.values())) >= 2, chosen
    for early in layers:
        for late in layers:
            if segment[early] < segment[late]:
                assert position[f"t{early}.recomputed"] > position[f"t{late}.recomputed"], (early, late, chosen)


def _chain(depth: int, width: int = 8) -> onnx.ModelProto:
    """``depth`` layers ``h{l+1} = Tanh(h{l} @ w{l})`` on ``h0 = x``, and ``loss = ReduceSum(h{depth})``."""
    nodes = []
    for layer in range(depth):
        nodes.append(helper.make_node("MatMul", [f"h{layer}" if layer else "x", f"w{layer}"], [f"p{layer}"]))
        nodes.append(helper.make_node("Tanh", [f"p{layer}"], [f"h{layer + 1}"]))
    nodes.append(helper.make_node("ReduceSum", [f"h{depth}"], ["loss"], keepdims=0))
    rng = np.random.default_rng(depth)
    weights = [(f"w{layer}", rng.normal(scale=width**-0.5, size=(width, width))) for layer in range(depth)]
    return make_model({"x": (DOUBLE, ["n", width])}, nodes, {"loss": (DOUBLE, [])}, weights)


@pytest.mark.parametrize("depth", [4, 16, 64])
def test_a_chain_of_n_layers_keeps_about_sqrt_n_of_its_activations(depth: int):
    """Every activation of a chain is a narrowing; Chen et al.'s rule keeps about sqrt(n) of them."""
    model = _chain(depth)
    types = {name: (DOUBLE, ["n", 8]) for node in model.graph.node for name in node.output}
    types["loss"] = (DOUBLE, [])
    training = build_training_models(model, ["loss"], _trainable(model)).training
    chosen = choose_checkpoints(training, backward_from=len(model.graph.node), batch_inputs=["x"], types=types)
    assert set(chosen) <= {f"{kind}{k}" for kind in "hp" for k in range(depth + 1)}
    assert np.sqrt(depth) / 2 <= len(chosen) <= 2 * np.sqrt(depth) + 1, chosen
    checkpointed = _training(model, "auto")
    feeds = _feeds(model, 3)
    assert_bit_equal(checkpointed, _training(model, None), feeds)


def test_choose_checkpoints_keeps_the_shared_value_and_boundaries_in_forward_order():
    model = _stack(3, 8, shared=True)
    types = {name: (DOUBLE, ["n", 8]) for node in model.graph.node for name in node.output}
    types.update(y=(DOUBLE, ["n", 2]), squares=(DOUBLE, ["n", 2]), loss=(DOUBLE, []))
    training = build_training_models(model, ["loss"], _trainable(model)).training
    chosen = choose_checkpoints(training, backward_from=len(model.graph.node), batch_inputs=["x"], types=types)
    order = [name for node in model.graph.node for name in node.output]
    assert "g" in chosen and set(chosen) - {"g"} <= {"h0", "h1", "h2", "h3"} and len(chosen) >= 2
    assert chosen == sorted(chosen, key=order.index)


def test_a_forward_that_never_narrows_to_one_value_is_refused():
    model = make_model(
        {"x": (DOUBLE, ["n", 3])},
        [helper.make_node("Einsum", ["x", "w"], ["loss"], equation="ij,j->")],
        {"loss": (DOUBLE, [])},
        [("w", np.ones(3))],
    )
    with pytest.raises(ValueError, match=r"narrows to one activation.*activation_checkpoints=\[") as raised:
        _training(model, "auto")
    assert "name the values to keep" in str(raised.value)


@pytest.mark.parametrize(
    ("checkpoints", "error", "match"),
    [
        ("all", ValueError, "activation_checkpoints='all': pass 'auto'"),
        (["h1", "nowhere"], ValueError, r"names \['nowhere'\], which the forward's nodes do not compute;"),
        ([1], TypeError, "must be 'auto', a list of forward value names or None"),
        (True, TypeError, r"not True \(on the command line, --activation-checkpoints alone means 'auto'\)"),
        ([], ValueError, r"names no value to keep, so nothing would be recomputed.*pass None"),
        (["x"], ValueError, r"names \['x'\].*\(\['x'\] are inputs or parameters, which are there anyway\)"),
    ],
)
def test_bad_checkpoints_are_refused_by_name(checkpoints: object, error: type[Exception], match: str):
    with pytest.raises(error, match=match):
        _training(_stack(2, 8), checkpoints)  # type: ignore[arg-type]


def test_random_nodes_are_never_copied_and_their_outputs_are_kept():
    model = _stack(3, 8, dropout=True)
    training = _training(model, "auto")
    copied = {node.op_type for node in _copies(training)}
    assert copied and not copied & NOT_RECOMPUTED
    read = _forward_values_the_backward_reads(training, model)
    assert {"d0", "d1", "d2"} <= read  # the dropped activations (their masks too) are kept, not drawn again
    assert {"p0", "p1", "p2", "m0", "m1", "m2"}.isdisjoint(read)


@pytest.mark.parametrize("rows", [MIN_KNOWN_ELEMENTS // 8 - 1, MIN_KNOWN_ELEMENTS // 8])
def test_values_of_fewer_known_elements_than_the_threshold_are_kept(rows: int):
    model = _stack(2, 8, rows=rows)  # every value [rows, 8]: known, below or at the threshold
    training = _training(model, "auto")
    small = rows * 8 < MIN_KNOWN_ELEMENTS
    assert bool(_copies(training)) != small
    read = _forward_values_the_backward_reads(training, model)
    assert ("t0" in read) == small  # read by the gradients of Tanh and of the MatMul after it, unless recomputed
    feeds = _feeds(model, rows)
    assert_bit_equal(training, _training(model, None), feeds)


def test_the_small_values_copies_are_made_from_are_kept_not_copied():
    """A shape computed in a segment (``Shape`` of ``[n, 8]``: two elements) is read by the copies, not copied."""
    nodes = [
        helper.make_node("MatMul", ["x", "w_in"], ["h0"]),
        helper.make_node("MatMul", ["h0", "a0"], ["p0"]),
        helper.make_node("Tanh", ["p0"], ["t0"]),
        helper.make_node("Shape", ["p0"], ["shape"]),
        helper.make_node("Reshape", ["t0", "shape"], ["r0"]),
        helper.make_node("MatMul", ["r0", "b0"], ["m0"]),
        helper.make_node("Add", ["h0", "m0"], ["h1"]),
        helper.make_node("MatMul", ["h1", "w_out"], ["y"]),
        helper.make_node("Mul", ["y", "y"], ["squares"]),
        helper.make_node("ReduceSum", ["squares"], ["loss"], keepdims=0),
    ]
    rng = np.random.default_rng(0)
    weights = [(name, rng.normal(size=(8, 8))) for name in ("w_in", "a0", "b0")]
    model = make_model(
        {"x": (DOUBLE, ["n", 8])}, nodes, {"loss": (DOUBLE, [])}, [*weights, ("w_out", rng.normal(size=(8, 2)))]
    )
    training = _training(model, ["h0", "h1"])
    copied = [node.op_type for node in _copies(training)]
    assert "Tanh" in copied and "Reshape" in copied and "Shape" not in copied
    assert any("shape" in node.input for node in _copies(training))
    feeds = {"x": rng.normal(size=(3, 8)), **{name: value for name, value in weights}}
    feeds["w_out"] = onnx.numpy_helper.to_array(model.graph.initializer[-1])
    assert_bit_equal(training, _training(model, None), feeds)


def _train(
    directory: Path, model: onnx.ModelProto, checkpoints: str | None, **kwargs: object
) -> tuple[list[float], dict[str, np.ndarray]]:
    """Three optimizer steps, each over two accumulated batches (of 5 and 3 rows), under a linear schedule."""
    paths = models.generate(directory, model, loss=LossType.MSELoss, activation_checkpoints=checkpoints, **kwargs)
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state, paths["eval_model"])
    optimizer = api.Optimizer(paths["optimizer_model"], module)
    scheduler = api.LinearLRScheduler(optimizer, warmup_step_count=1, total_step_count=4, initial_lr=0.05)
    rng = np.random.default_rng(11)
    dtype = np.float64 if model.graph.input[0].type.tensor_type.elem_type == DOUBLE else np.float32
    losses = []
    for _ in range(3):
        for rows in (5, 3):
            x, target = rng.normal(size=(rows, 8)).astype(dtype), rng.normal(size=(rows, 2)).astype(dtype)
            losses.append(float(module(x, target)))
        optimizer.step()
        scheduler.step()
        module.lazy_reset_grad()
    return losses, {name: np.array(state.parameters[name].data) for name in _trainable(model)}


def test_the_runtime_trains_a_checkpointed_model_as_one_that_keeps_everything(tmp_path: Path):
    model = _stack(3, 8, loss=False)
    adamw = optim.AdamW(weight_decay=0.01, clip_grad=optim.ClipGradNorm(0.5))
    losses, parameters = _train(tmp_path / "checkpointed", model, "auto", optimizer=adamw)
    want_losses, want_parameters = _train(tmp_path / "kept", model, None, optimizer=adamw)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
    for name, value in parameters.items():
        np.testing.assert_allclose(value, want_parameters[name], rtol=1e-12, atol=1e-14, err_msg=name)


@pytest.mark.filterwarnings("ignore::onnxtrain.training.half_kernels.HalfPrecisionFallbackWarning")
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_checkpointing_in_half_precision_trains_as_keeping_everything(tmp_path: Path, precision: str):
    model = _stack(3, 8, loss=False, elem_type=FLOAT)
    losses, parameters = _train(tmp_path / "checkpointed", model, "auto", optimizer="AdamW", precision=precision)
    want_losses, want_parameters = _train(tmp_path / "kept", model, None, optimizer="AdamW", precision=precision)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-6)
    for name, value in parameters.items():
        np.testing.assert_allclose(value, want_parameters[name], rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("depth", [3, 6])
def test_copies_wait_for_the_backward_whatever_onnxruntime_renumbers(depth: int):
    """onnxruntime runs the ready node of lowest index and numbers the nodes its fusions make after every other
    one: a copy ready once its checkpoint is made would run in the forward. Renumbered as if every forward
    node were fused, the copies still run after ``y``, the value the gradients start from."""
    model = _stack(depth, 8)
    training, _ = _checkpointed(model, "auto")
    forward = len(model.graph.node)
    nodes = list(training.graph.node)
    renumbered = nodes[forward:] + nodes[:forward]
    order = [renumbered[i] for i in execution_order(renumbered, "priority")]
    made_at = {name: k for k, node in enumerate(order) for name in node.output}
    copies = [k for k, node in enumerate(order) if _is_copy(node)]
    assert copies
    assert min(copies) > made_at["y"]


def test_copies_wait_for_the_backward_in_the_graph_onnxruntime_optimizes(tmp_path: Path):
    """The same in onnxruntime's optimized graph, in its numbering: the nodes of the model loaded keep their
    index, the ones its fusions make come after them all. Its optimizations must not drop the holds."""
    model = _stack(4, 8, elem_type=FLOAT)
    training, _ = _checkpointed(model, "auto")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    inference_session(training.SerializeToString(), options, disabled_optimizers=NO_CSE)
    optimized = list(onnx.load(options.optimized_model_filepath).graph.node)
    index = {node.name: k for k, node in enumerate(training.graph.node)}
    numbered = sorted(range(len(optimized)), key=lambda k: index.get(optimized[k].name, len(index) + k))
    nodes = [optimized[k] for k in numbered]
    order = [nodes[k] for k in execution_order(nodes, "priority")]
    made_at = {name: k for k, node in enumerate(order) for name in node.output}
    copies = [k for k, node in enumerate(order) if _is_copy(node)]
    assert copies
    assert min(copies) > made_at["y"]


@pytest.mark.filterwarnings("ignore::onnxtrain.training.half_kernels.HalfPrecisionFallbackWarning")
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_copies_wait_for_the_backward_in_mixed_precision(tmp_path: Path, precision: str):
    """The same in the artifacts of mixed precision, whose checkpoints are of the half type (bfloat16 has no
    ``Where`` on the CPU: its values are held by appending nothing)."""
    model = _stack(4, 8, loss=False, elem_type=FLOAT)
    paths = models.generate(tmp_path, model, loss=LossType.MSELoss, activation_checkpoints="auto", precision=precision)
    training = onnx.load(paths["training_model"])
    nodes = list(training.graph.node)
    made_by = {name: k for k, node in enumerate(nodes) for name in node.output}
    forward: set[int] = set()
    stack = [made_by[training.graph.output[0].name]]
    while stack:
        k = stack.pop()
        if k not in forward:
            forward.add(k)
            stack.extend(made_by[name] for name in nodes[k].input if name in made_by)
    renumbered = [node for k, node in enumerate(nodes) if k not in forward] + [nodes[k] for k in sorted(forward)]
    order = [renumbered[i] for i in execution_order(renumbered, "priority")]
    made_at = {name: k for k, node in enumerate(order) for name in node.output}
    copies = [k for k, node in enumerate(order) if _is_copy(node)]
    assert copies
    assert min(copies) > made_at["y"]


def test_values_made_from_parameters_alone_are_recomputed_and_held_on_their_parameter():
    """``Transpose(a0)`` (as torch exports ``Linear``) is made again in the backward, held on ``a0``: keeping it
    would keep a copy of the weight through the step."""
    nodes = [
        helper.make_node("MatMul", ["x", "w_in"], ["h0"]),
        helper.make_node("Transpose", ["a0"], ["a0t"], perm=[1, 0]),
        helper.make_node("MatMul", ["h0", "a0t"], ["p0"]),
        helper.make_node("Tanh", ["p0"], ["t0"]),
        helper.make_node("Add", ["h0", "t0"], ["h1"]),
        helper.make_node("MatMul", ["h1", "w_out"], ["y"]),
        helper.make_node("Mul", ["y", "y"], ["squares"]),
        helper.make_node("ReduceSum", ["squares"], ["loss"], keepdims=0),
    ]
    rng = np.random.default_rng(0)
    weights = {"w_in": rng.normal(size=(40, 40)), "a0": rng.normal(size=(40, 40)), "w_out": rng.normal(size=(40, 2))}
    model = make_model({"x": (DOUBLE, ["n", 40])}, nodes, {"loss": (DOUBLE, [])}, list(weights.items()))
    training = _training(model, ["h0", "h1"])
    assert sorted(node.op_type for node in _copies(training)) == ["MatMul", "Tanh", "Transpose"]
    held = sorted(node.input[0] for node in training.graph.node if node.name.endswith(".held"))
    assert held == ["a0"]  # held by Mul(a0, one); the product reads the held transpose: it waits too
    assert "a0t" not in _forward_values_the_backward_reads(training, model)
    assert_bit_equal(training, _training(model, None), {"x": rng.normal(size=(3, 40)), **weights})
