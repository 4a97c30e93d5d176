"""``pack_updates``: the optimizer's identical per-parameter chains run once on packed tensors, with the same bits."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from onnxtrain import optim
from onnxtrain.artifacts import LossType
from onnxtrain.artifacts.vectorize import pack_updates
from onnxtrain.graph.naming import keep_or_tag, names_in
from onnxtrain.sessions import inference_session
from tests.training import models
from tests.training.helpers import open_module


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


@pytest.mark.parametrize("slices", [False, True], ids=["split", "slices"])
@pytest.mark.parametrize("optimizer", ["AdamW", "AdamW-amsgrad", "SGD-momentum"])
def test_packed_updates_give_the_same_bits_in_fewer_nodes(tmp_path: Path, optimizer: str, slices: bool) -> None:
    block = {
        "AdamW": optim.AdamW(),
        "AdamW-amsgrad": optim.AdamW(amsgrad=True),
        "SGD-momentum": optim.SGD(momentum=0.9),
    }
    paths = models.generate(tmp_path, models.mlp((6, 8, 5, 3)), loss=LossType.MSELoss, optimizer=block[optimizer])
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
    feeds = _feeds(model, np.random.default_rng(0))
    for pack in packs:  # the packed inputs: the members' values one after the other
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
