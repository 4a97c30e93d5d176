"""``pack_updates`` and ``pack_in_place``: the optimizer's identical per-parameter chains run once on packed tensors,
with the same bits."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from onnxtrain import optim
from onnxtrain.artifacts import LossType
from onnxtrain.artifacts.vectorize import MAX_PACKED_ROWS, Pack, pack_in_place, pack_updates, views_in_place
from onnxtrain.graph.naming import keep_or_tag, names_in
from onnxtrain.sessions import inference_session
from tests.training import models
from tests.training.helpers import open_module

#: The optimizers whose chains are packed, by name.
OPTIMIZERS: dict[str, Callable[[], optim.Optimizer]] = {
    "AdamW": optim.AdamW,
    "AdamW-amsgrad": lambda: optim.AdamW(amsgrad=True),
    "SGD-momentum": lambda: optim.SGD(momentum=0.9),
}


def _fused(paths: dict[str, Path]) -> Any:
    _, _, optimizer = open_module(paths)
    return optimizer.fused_step


def _feeds(model: onnx.ModelProto, rng: np.random.Generator) -> dict[str, np.ndarray]:
    feeds = {}
    for value in model.graph.input:
        tensor = value.type.tensor_type
        dims = [d.dim_value or 5 for d in tensor.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        if value.name == "step":
            feeds[value.name] = np.array([3], np.int64)
        elif dtype == np.int64:
            feeds[value.name] = rng.integers(0, 3, size=dims).astype(np.int64)
        else:
            feeds[value.name] = np.abs(rng.normal(size=dims)).astype(dtype) + 0.1  # moments must be >= 0
    return feeds


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = inference_session(model.SerializeToString())
    names = [o.name for o in session.get_outputs()]
    wanted = {i.name for i in session.get_inputs()}
    return dict(zip(names, session.run(None, {k: v for k, v in feeds.items() if k in wanted}), strict=True))


def _assert_packed_bits(
    model: onnx.ModelProto, packed: onnx.ModelProto, packs: list[Pack], rng: np.random.Generator
) -> None:
    """``packed`` (:func:`pack_updates` of ``model``) fed the packed inputs, the members' values one after the
    other, gives in each packed output the bits of ``model``'s outputs, and in every other output too."""
    feeds = _feeds(model, rng)
    for pack in packs:
        feeds[pack.carried[0]] = np.concatenate([feeds[name].ravel() for name, _ in pack.members])
    expected, got = _run(model, feeds), _run(packed, feeds)
    for pack in packs:
        offset = 0
        for (_, out), shape in zip(pack.members, pack.shapes, strict=True):
            size = math.prod(shape)
            np.testing.assert_array_equal(got[pack.carried[1]][offset : offset + size].reshape(shape), expected[out])
            offset += size
    for name, value in got.items():
        if name in expected:
            np.testing.assert_array_equal(value, expected[name], err_msg=name)


@pytest.mark.parametrize("slices", [False, True], ids=["split", "slices"])
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_packed_updates_give_the_same_bits_in_fewer_nodes(tmp_path: Path, optimizer: str, slices: bool) -> None:
    paths = models.generate(
        tmp_path, models.mlp((6, 8, 5, 3)), loss=LossType.MSELoss, optimizer=OPTIMIZERS[optimizer]()
    )
    fused = _fused(paths)
    model = fused.model.proto
    unique = keep_or_tag(names_in(model.graph), "test")
    packed, packs = pack_updates(model, fused.updates, unique, slices=slices)
    onnx.checker.check_model(packed, full_check=True)
    assert len(packs) == 2 + len(fused.updates[0].moments)  # parameters, gradients, each moment
    assert all(len(pack.members) == 6 for pack in packs)  # three layers' weights and biases
    # 6 chains of 4 (SGD) to 12 nodes: one, and the packing (5 more nodes with a Slice per parameter)
    assert len(packed.graph.node) <= len(model.graph.node) - 12 + (5 if slices else 0)
    unpacking = [n.op_type for n in packed.graph.node if n.op_type in ("Split", "Slice")]
    assert unpacking == (["Slice"] * 6 if slices else ["Split"])  # only the parameters are unpacked
    _assert_packed_bits(model, packed, packs, np.random.default_rng(0))


def test_clipped_gradients_are_not_packed(tmp_path: Path) -> None:
    """Clipping reads every gradient (their global norm): no chain is element-wise over its own tensors."""
    block = optim.AdamW(clip_grad=optim.ClipGradNorm(1.0))
    paths = models.generate(tmp_path, models.mlp((6, 8, 3)), loss=LossType.MSELoss, optimizer=block)
    fused = _fused(paths)
    model = fused.model.proto
    packed, packs = pack_updates(model, fused.updates, keep_or_tag(names_in(model.graph), "test"))
    assert packs == [] and len(packed.graph.node) == len(model.graph.node)


def test_packing_that_saves_nothing_is_not_done(tmp_path: Path) -> None:
    """Plain SGD: two nodes per parameter, fewer than the splitting and reshaping would add."""
    paths = models.generate(tmp_path, models.mlp((6, 1)), loss=LossType.MSELoss, optimizer=optim.SGD())
    fused = _fused(paths)
    model = fused.model.proto
    _, packs = pack_updates(model, fused.updates, keep_or_tag(names_in(model.graph), "test"))
    assert packs == []


def _as_rows(packs: list[Pack], feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``feeds`` as the runtime binds them to a model packed in place: the packed tensors as rows."""
    shapes, _ = views_in_place(packs)
    return {name: value.reshape(shapes[name]) if name in shapes else value for name, value in feeds.items()}


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_updates_packed_in_place_give_the_same_bits_in_fewer_nodes(tmp_path: Path, optimizer: str) -> None:
    """The fused step's inputs and outputs stay one per tensor, bound as rows of one width."""
    paths = models.generate(
        tmp_path, models.mlp((8, 16, 24, 8)), loss=LossType.MSELoss, optimizer=OPTIMIZERS[optimizer]()
    )
    fused = _fused(paths)
    model = fused.model.proto
    packed, packs = pack_in_place(model, fused.updates, keep_or_tag(names_in(model.graph), "test"))
    onnx.checker.check_model(packed, full_check=True)
    moments = len(fused.updates[0].moments)
    assert [pack.role for pack in packs] == ["parameters", "gradients", *(f"moment{k}" for k in range(moments))]
    assert {pack.width for pack in packs} == {8} and all(len(pack.members) == 6 for pack in packs)
    inputs, outputs = views_in_place(packs)
    assert inputs["fc1.weight"] == (48, 8) and outputs["fc1.weight.updated"] == (48, 8)
    assert [value.name for value in packed.graph.input] == [value.name for value in model.graph.input]
    assert [value.name for value in packed.graph.output] == [value.name for value in model.graph.output]
    ops = [node.op_type for node in packed.graph.node]
    before = [node.op_type for node in model.graph.node]
    # 6 chains of 4 (SGD) to 12 nodes: one; a Concat per role, a Slice per parameter and moment, a Reshape per
    # parameter not already of the shape of its rows of 8 (all but the last weight, 24 x 8)
    added = {op: ops.count(op) - before.count(op) for op in ("Concat", "Slice", "Reshape")}
    assert added == {"Concat": len(packs), "Slice": 6 * (1 + moments), "Reshape": 5}
    assert len(ops) < len(before) - 5 * (4 if optimizer == "SGD-momentum" else 12) + sum(added.values()) + 1
    feeds = _feeds(model, np.random.default_rng(0))
    expected, got = _run(model, feeds), _run(packed, _as_rows(packs, feeds))
    assert sorted(got) == sorted(expected)
    for name, value in got.items():
        np.testing.assert_array_equal(value.reshape(expected[name].shape), expected[name], err_msg=name)
    # the update runs before the training step: every node it depends on is listed before the first Slice
    first_slice = ops.index("Slice")
    assert "MatMul" not in ops[:first_slice]


@pytest.mark.parametrize("max_rows", [MAX_PACKED_ROWS, 30])
def test_a_group_packs_the_tensors_that_keep_its_rows_under_the_limit(tmp_path: Path, max_rows: int) -> None:
    """Sizes 48, 8, 40, 5, 15, 3: all, in rows of 1 (119 rows); or under 30 rows, largest first: 48, 40 and 8 in
    rows of 8 (12 rows), the others with their own chains. The same bits either way."""
    paths = models.generate(tmp_path, models.mlp((6, 8, 5, 3)), loss=LossType.MSELoss, optimizer=optim.AdamW())
    fused = _fused(paths)
    model = fused.model.proto
    unique = keep_or_tag(names_in(model.graph), "test")
    packed, packs = pack_in_place(model, fused.updates, unique, max_rows=max_rows)
    params = next(pack for pack in packs if pack.role == "parameters")
    if max_rows == MAX_PACKED_ROWS:
        assert params.width == 1 and len(params.members) == 6
    else:
        assert params.width == 8 and [p for p, _ in params.members] == ["fc0.weight", "fc0.bias", "fc1.weight"]
    feeds = _feeds(model, np.random.default_rng(1))
    expected, got = _run(model, feeds), _run(packed, _as_rows(packs, feeds))
    for name, value in got.items():
        np.testing.assert_array_equal(value.reshape(expected[name].shape), expected[name], err_msg=name)


@pytest.mark.parametrize("case", ["clipped", "loss-scaled", "loss-scaled, a gradient infinite"])
def test_updates_that_read_a_scalar_of_every_gradient_pack_in_place_with_the_same_bits(tmp_path: Path, case: str):
    """Clipping's norm and the loss scaler's finiteness flag reduce every gradient to one element that every
    chain reads: the chains are the same, and the reductions read the tensors in their shapes (through a
    ``Reshape`` of the rows). Not packed into an epoch's carried state, where the tensors are inputs no more."""
    clipped = case == "clipped"
    block = optim.AdamW(clip_grad=optim.ClipGradNorm(0.5)) if clipped else optim.AdamW()
    paths = models.generate(
        tmp_path, models.mlp((8, 16, 24, 8)), loss=LossType.MSELoss, optimizer=block, loss_scaling=not clipped
    )
    fused = _fused(paths)
    model = fused.model.proto
    unique = keep_or_tag(names_in(model.graph), "test")
    assert pack_updates(model, fused.updates, unique)[1] == []
    packed, packs = pack_in_place(model, fused.updates, unique)
    onnx.checker.check_model(packed, full_check=True)
    assert len(packs) == 4 and all(len(pack.members) == 6 for pack in packs)
    assert len(packed.graph.node) < len(model.graph.node)
    feeds = _feeds(model, np.random.default_rng(2))
    if case.endswith("infinite"):
        gradient = fused.updates[2].gradient[0]
        feeds[gradient] = feeds[gradient].copy()
        feeds[gradient].flat[3] = np.inf  # the scaler skips the update: every tensor as it was
    expected, got = _run(model, feeds), _run(packed, _as_rows(packs, feeds))
    for name, value in got.items():
        np.testing.assert_array_equal(value.reshape(expected[name].shape), expected[name], err_msg=name)


def test_parameters_left_out_of_weight_decay_pack_apart_with_the_same_bits(tmp_path: Path) -> None:
    """AdamW with ``no_decay``: the weights' chains (with the decay) and the biases' (without) are two groups,
    each packed in place, giving the bits of the unpacked update."""
    block = optim.AdamW(weight_decay=0.1, no_decay=["bias"])
    paths = models.generate(tmp_path, models.mlp((8, 16, 24, 8)), loss=LossType.MSELoss, optimizer=block)
    fused = _fused(paths)
    model = fused.model.proto
    packed, packs = pack_in_place(model, fused.updates, keep_or_tag(names_in(model.graph), "test"))
    groups = {tuple(name for name, _ in pack.members) for pack in packs if pack.role == "parameters"}
    assert groups == {("fc0.weight", "fc1.weight", "fc2.weight"), ("fc0.bias", "fc1.bias", "fc2.bias")}
    feeds = _feeds(model, np.random.default_rng(1))
    expected, got = _run(model, feeds), _run(packed, _as_rows(packs, feeds))
    for name, value in got.items():
        np.testing.assert_array_equal(value.reshape(expected[name].shape), expected[name], err_msg=name)
    decay = [node for node in model.graph.node if node.output[0].startswith("fc0.bias") and "decayed" in node.output[0]]
    assert not decay  # the biases' chains have no decay


def test_two_groups_pack_with_the_same_bits(tmp_path: Path) -> None:
    """``pack_updates`` with AdamW's decaying and non-decaying chains: two groups, each with its packed tensors,
    the outputs those of the unpacked update."""
    block = optim.AdamW(weight_decay=0.1, no_decay=["bias"])
    paths = models.generate(tmp_path, models.mlp((6, 8, 5, 3)), loss=LossType.MSELoss, optimizer=block)
    fused = _fused(paths)
    model = fused.model.proto
    packed, packs = pack_updates(model, fused.updates, keep_or_tag(names_in(model.graph), "test"))
    onnx.checker.check_model(packed, full_check=True)
    assert sorted(len(pack.members) for pack in packs) == [3] * 8  # two groups of 3, 4 roles each
    _assert_packed_bits(model, packed, packs, np.random.default_rng(2))


def test_parameters_at_another_learning_rate_pack_apart_with_the_same_bits(tmp_path: Path) -> None:
    """AdamW with ``lr_scale``: the chains stepping at ``lr * 10`` read another rate and form their own group,
    packed in place or into flat tensors with the bits of the unpacked update."""
    block = optim.AdamW(weight_decay=0.1, lr_scale={"fc2.*": 10.0})
    paths = models.generate(tmp_path, models.mlp((8, 16, 24, 8)), loss=LossType.MSELoss, optimizer=block)
    fused = _fused(paths)
    model = fused.model.proto
    packed, packs = pack_in_place(model, fused.updates, keep_or_tag(names_in(model.graph), "test"))
    groups = {tuple(name for name, _ in pack.members) for pack in packs if pack.role == "parameters"}
    assert ("fc2.weight",) in groups or any("fc2.weight" in group and "fc0.weight" not in group for group in groups)
    assert not any("fc2.weight" in group and "fc0.weight" in group for group in groups)
    feeds = _feeds(model, np.random.default_rng(1))
    expected, got = _run(model, feeds), _run(packed, _as_rows(packs, feeds))
    for name, value in got.items():
        np.testing.assert_array_equal(value.reshape(expected[name].shape), expected[name], err_msg=name)
    flat, flat_packs = pack_updates(model, fused.updates, keep_or_tag(names_in(model.graph), "test"))
    _assert_packed_bits(model, flat, flat_packs, np.random.default_rng(2))
