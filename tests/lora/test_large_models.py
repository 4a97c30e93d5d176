"""``add_adapters`` and ``merge_adapters`` on a base with external data hold one weight at a time (docs/lora.md).

On a small GPT-2 built as the benchmark builds GPT-2 medium (weights in an
external data file; ``benchmarks/large_artifacts.py``): from a loaded
``ModelProto`` the results are those from the path, with the caller's model
unchanged; ``merge_adapters(..., data_location=...)`` writes each merged
weight into a data file as it is computed (each weight read once), the
returned model holding none, and gives the values of the merge in memory; a
failing merge leaves the data file as it was.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx.external_data_helper import uses_external_data

from benchmarks.large_artifacts import MODEL_FILE, Gpt2, write_model
from onnxtrain.checkpoint import CheckpointState
from onnxtrain.graph import external
from onnxtrain.lora import add_adapters, merge_adapters
from onnxtrain.lora import merge as merge_module

CONFIG = Gpt2(layers=3, width=64, heads=4, vocab=300, positions=32)
TARGETS = ["c_attn", "c_fc"]


@pytest.fixture
def base(tmp_path: Path) -> Path:
    folder = tmp_path / "base"
    folder.mkdir()
    return write_model(CONFIG, folder)


def _trained(adapted: onnx.ModelProto, names: list[str]) -> CheckpointState:
    """Adapters with values (``B`` is zero as added: the merge would change nothing)."""
    rng = np.random.default_rng(0)
    shapes = {t.name: list(t.dims) for t in adapted.graph.initializer}
    return CheckpointState(trainable={name: rng.normal(0, 0.1, shapes[name]).astype(np.float32) for name in names})


def _values(model: onnx.ModelProto, folder: Path) -> dict[str, np.ndarray]:
    data = external.TensorData(base_dir=folder)
    return {tensor.name: data.array(tensor) for tensor in model.graph.initializer}


def test_from_a_proto_the_adapted_and_merged_models_are_those_from_the_path(base: Path):
    adapted_by_path, names = add_adapters(base, TARGETS, rank=4, alpha=8)
    proto = onnx.load(os.fspath(base))
    before = proto.SerializeToString()
    adapted, same_names = add_adapters(proto, TARGETS, rank=4, alpha=8)
    assert proto.SerializeToString() == before
    assert same_names == names
    assert not external.has_external_data(adapted)
    loaded = onnx.ModelProto()
    loaded.CopyFrom(adapted_by_path)
    external.TensorData(base_dir=base.parent).load_model(loaded)
    assert loaded.SerializeToString() == adapted.SerializeToString()
    state = _trained(adapted, names)
    onnx.save(adapted_by_path, base.parent / "adapted.onnx")
    by_path = merge_adapters(base.parent / "adapted.onnx", state)
    in_memory = merge_adapters(adapted, state)
    assert not external.has_external_data(in_memory)
    external.TensorData(base_dir=base.parent).load_model(by_path)
    assert by_path.SerializeToString() == in_memory.SerializeToString()


def _counting_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    reads: list[tuple[int, int]] = []
    real = external.read_bytes

    def counted(found: external.ExternalData, start: int, count: int, label: str) -> bytes:
        reads.append((found.offset, count))
        return real(found, start, count, label)

    monkeypatch.setattr(external, "read_bytes", counted)
    return reads


def test_merge_writes_each_weight_into_the_data_file_as_it_is_computed(base: Path, monkeypatch):
    adapted, names = add_adapters(base, TARGETS, rank=4, alpha=8)
    onnx.save(adapted, base.parent / "adapted.onnx")
    state = _trained(adapted, names)
    expected = merge_adapters(base.parent / "adapted.onnx", state)
    reads = _counting_reads(monkeypatch)
    merged = merge_adapters(base.parent / "adapted.onnx", state, data_location="merged.onnx.data")
    weights = {n.removesuffix(".lora_A") for n in names if n.endswith(".lora_A")}
    assert len(reads) == len(weights) == len(set(reads)), "each adapted weight is read once, and nothing else"
    locations = {t.name: external.location_of(t) for t in merged.graph.initializer if uses_external_data(t)}
    assert {name for name, location in locations.items() if location == "merged.onnx.data"} == weights
    assert merged.ByteSize() < adapted.ByteSize(), "the merged weights are in the data file, not in the model"
    values = _values(merged, base.parent)
    assert values.keys() == _values(expected, base.parent).keys()
    for name, value in _values(expected, base.parent).items():
        np.testing.assert_array_equal(values[name], value, err_msg=name)
    onnx.save(merged, base.parent / "merged.onnx")  # beside the base: it refers to both data files
    ids = np.arange(10).reshape(2, 5)
    (got,) = ort.InferenceSession(os.fspath(base.parent / "merged.onnx")).run(None, {"input_ids": ids})
    onnx.save(expected, base.parent / "expected.onnx")
    (want,) = ort.InferenceSession(os.fspath(base.parent / "expected.onnx")).run(None, {"input_ids": ids})
    np.testing.assert_array_equal(got, want)


def test_a_failing_merge_leaves_the_data_file_as_it_was(base: Path, monkeypatch):
    adapted, names = add_adapters(base, TARGETS, rank=4, alpha=8)
    onnx.save(adapted, base.parent / "adapted.onnx")
    (base.parent / "merged.onnx.data").write_bytes(b"an earlier merge")
    calls = []
    real = merge_module._updated

    def failing(weight: np.ndarray, update: np.ndarray, adapter: object) -> np.ndarray:
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("interrupted")
        return real(weight, update, adapter)

    monkeypatch.setattr(merge_module, "_updated", failing)
    with pytest.raises(RuntimeError, match="interrupted"):
        merge_adapters(base.parent / "adapted.onnx", _trained(adapted, names), data_location="merged.onnx.data")
    assert sorted(p.name for p in base.parent.iterdir()) == sorted(
        ["adapted.onnx", MODEL_FILE, MODEL_FILE + ".data", "merged.onnx.data"]
    )
    assert (base.parent / "merged.onnx.data").read_bytes() == b"an earlier merge"


def test_data_location_errors(base: Path):
    adapted, names = add_adapters(base, TARGETS, rank=4, alpha=8)
    onnx.save(adapted, base.parent / "adapted.onnx")
    state = _trained(adapted, names)
    for location, message in (
        ("sub/merged.data", "must be a file name"),
        ("..", "must be a file name"),
        (MODEL_FILE + ".data", "where the model keeps its own weights"),
    ):
        with pytest.raises(ValueError, match=message):
            merge_adapters(base.parent / "adapted.onnx", state, data_location=location)
    proto = onnx.load(os.fspath(base))
    in_memory, _ = add_adapters(proto, TARGETS, rank=4, alpha=8)
    with pytest.raises(ValueError, match="a ModelProto has none"):
        merge_adapters(in_memory, state, data_location="merged.onnx.data")
    assert sorted(p.name for p in base.parent.iterdir()) == ["adapted.onnx", MODEL_FILE, MODEL_FILE + ".data"]


def test_a_merge_whose_weights_all_stay_inline_writes_no_data_file(base: Path, monkeypatch):
    """``data_location`` takes the merged weights of 1 KiB or more; where none is that large, no empty file."""
    monkeypatch.setattr(merge_module, "EXTERNAL_THRESHOLD", 2**40)  # no weight reaches it
    adapted, names = add_adapters(base, TARGETS, rank=4, alpha=8)
    onnx.save(adapted, base.parent / "adapted.onnx")
    merged = merge_adapters(base.parent / "adapted.onnx", _trained(adapted, names), data_location="merged.onnx.data")
    assert not (base.parent / "merged.onnx.data").exists()
    assert all(external.location_of(t) != "merged.onnx.data" for t in merged.graph.initializer if uses_external_data(t))
