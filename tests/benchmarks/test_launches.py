"""The bytes each launching operation moves (:mod:`benchmarks.real_size.launches`), on hand-made nodes."""

from __future__ import annotations

import pytest
from onnx import helper

from benchmarks.real_size.launches import aten_bytes, node_bytes, onnx_launches
from tests.helpers import FLOAT, INT64, make_model

SIZES = {"a": 400, "b": 400, "c": 400, "big": 40_000, "row": 40, "starts": 8, "ends": 8, "idx": 16, "picked": 80}


def test_an_element_wise_node_reads_its_inputs_and_writes_its_output():
    assert node_bytes(helper.make_node("Add", ["a", "b"], ["c"]), SIZES) == 1_200


def test_a_selection_reads_of_its_data_only_what_it_writes():
    """A ``Slice`` of one row of ``big`` reads 40 bytes of it, not 40,000; a ``Gather`` reads its indices too."""
    assert node_bytes(helper.make_node("Slice", ["big", "starts", "ends"], ["row"]), SIZES) == 40 + 16 + 40
    assert node_bytes(helper.make_node("Gather", ["big", "idx"], ["picked"]), SIZES) == 80 + 16 + 80
    assert node_bytes(helper.make_node("Concat", ["a", "b"], ["big"], axis=0), SIZES) == 40_800


def test_a_size_not_known_leaves_the_node_out_and_is_counted():
    assert node_bytes(helper.make_node("Add", ["a", "unknown"], ["c"]), SIZES) is None
    nodes = [
        helper.make_node("Add", ["a", "b"], ["c"]),
        helper.make_node("Reshape", ["c", "shape"], ["d"]),  # an alias: no launch, no bytes
        helper.make_node("Mul", ["d", "e"], ["f"]),
    ]
    model = make_model({"a": (FLOAT, [10, 10]), "b": (FLOAT, [10, 10]), "shape": (INT64, [1])}, nodes, ["c"])
    counted = onnx_launches(model, {**SIZES, "d": 400, "e": None, "f": 400, "shape": 8})
    assert (counted["launches"], counted["aliases"], counted["bytes"], counted["unsized"]) == (2, 1, 1_200, 1)
    assert "bytes" not in onnx_launches(model)


def test_aten_operations_count_their_tensors_lists_of_them_and_in_place_writes():
    torch = pytest.importorskip("torch")
    a, b = torch.ones(10, 10), torch.ones(10, 10)
    assert aten_bytes("add", (a, b), {}, a + b) == 1_200
    # a multi-tensor in-place operation returns nothing: it writes its first list
    assert aten_bytes("_foreach_add_", ([a, a], [b, b]), {"alpha": 0.5}, None) == 4 * 400 + 2 * 400
    weight, ids = torch.ones(1_000, 10), torch.zeros(4, dtype=torch.int64)
    assert aten_bytes("embedding", (weight, ids), {}, weight[ids]) == 160 + 32 + 160
