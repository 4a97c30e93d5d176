"""``generate_artifacts`` on a large base holds one piece of one tensor at a time (docs/artifacts.md, "Large models").

On a small GPT-2 built as the benchmark builds GPT-2 medium (weights in an
external data file; ``benchmarks/large_artifacts.py``): by path and from a
loaded ``ModelProto`` the files are those the in-memory build writes
(``build_artifacts`` + ``write_artifacts``, which load everything), bit for
bit; every weight is read once, in one run of pieces; the memory Python
allocates stays under the size of the largest weight; and constants of
models over protobuf's limit stream into the data files, which hold the
bytes onnx writes for the models with their data loaded.
"""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import onnx
import pytest
from onnx.external_data_helper import uses_external_data

from benchmarks.large_artifacts import MODEL_FILE, Gpt2, weight_names, write_model
from onnxtrain import artifacts
from onnxtrain.graph import external

CONFIG = Gpt2(layers=2, width=64, heads=4, vocab=300, positions=32)
LARGE = Gpt2(layers=2, width=256, heads=4, vocab=6000, positions=64)  # the token embedding: 6 MiB of 11 in all
ARGUMENTS = {"loss": artifacts.LossType.CrossEntropyLoss, "optimizer": artifacts.OptimType.AdamW}
FILES = ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx", "checkpoint")


def _model(folder: Path, config: Gpt2 = CONFIG) -> Path:
    folder.mkdir()
    return write_model(config, folder)


def _in_memory(model: onnx.ModelProto | Path, requires_grad: list[str], folder: Path) -> dict[str, Path]:
    """The files as the in-memory build writes them (every tensor loaded), for comparison."""
    built = artifacts.build_artifacts(model, requires_grad, [], **ARGUMENTS)
    return artifacts.write_artifacts(built, folder)


def _same_files(a: dict[str, Path], b: dict[str, Path], names: tuple[str, ...] = FILES) -> None:
    for name in names:
        assert Path(a[name.removesuffix(".onnx")]).read_bytes() == Path(b[name.removesuffix(".onnx")]).read_bytes(), (
            name
        )


def test_by_path_and_from_a_proto_the_files_are_the_in_memory_builds(tmp_path: Path):
    path = _model(tmp_path / "base")
    weights = weight_names(CONFIG)
    expected = _in_memory(path, weights, tmp_path / "expected")
    by_path = artifacts.generate_artifacts(path, weights, [], artifact_directory=tmp_path / "by-path", **ARGUMENTS)
    _same_files(by_path, expected)
    proto = onnx.load(os.fspath(path))
    before = proto.SerializeToString()
    from_proto = artifacts.generate_artifacts(proto, weights, [], artifact_directory=tmp_path / "proto", **ARGUMENTS)
    assert proto.SerializeToString() == before, "the caller's model is never changed"
    _same_files(from_proto, expected)
    _same_files(from_proto, _in_memory(proto, weights, tmp_path / "expected-proto"))


def _counting_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int, int]]:
    """Every read of external data from now on: (file, offset of the tensor, start in it, bytes)."""
    reads: list[tuple[str, int, int, int]] = []
    real = external.read_bytes

    def counted(found: external.ExternalData, start: int, count: int, label: str) -> bytes:
        reads.append((found.path.name, found.offset, start, count))
        return real(found, start, count, label)

    monkeypatch.setattr(external, "read_bytes", counted)
    monkeypatch.setattr(external, "CHUNK_BYTES", 4096)
    return reads


def _runs(reads: list[tuple[str, int, int, int]]) -> list[tuple[str, int]]:
    """The tensors read, one entry per run of consecutive pieces of one tensor."""
    tensors = [(file, offset) for file, offset, _, _ in reads]
    return [tensor for k, tensor in enumerate(tensors) if k == 0 or tensors[k - 1] != tensor]


def test_generation_by_path_reads_each_weight_once_in_one_run_of_pieces(tmp_path: Path, monkeypatch):
    path = _model(tmp_path / "base")
    reads = _counting_reads(monkeypatch)
    artifacts.generate_artifacts(path, weight_names(CONFIG), [], artifact_directory=tmp_path / "out", **ARGUMENTS)
    stored = [t for t in onnx.load(path, load_external_data=False).graph.initializer if uses_external_data(t)]
    runs = _runs(reads)
    assert sorted(runs) == sorted((MODEL_FILE + ".data", external.locate(t, path.parent).offset) for t in stored)
    assert all(count <= 4096 for *_, count in reads)


def _traced_peak(generate: object) -> int:
    tracemalloc.start()
    try:
        generate()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


#: What the tests train: every weight (the checkpoint holds them), or the last LayerNorm only (the models keep
#: the other weights as constants, as with LoRA adapters).
TRAINED = {"weights": None, "constants": ["transformer.ln_f.weight", "transformer.ln_f.bias"]}


@pytest.mark.parametrize("trained", sorted(TRAINED))
@pytest.mark.parametrize("source", ["path", "proto"])
def test_generation_holds_one_weight_at_most(tmp_path: Path, monkeypatch, source, trained):
    """The memory Python allocates while generating stays under the largest weight (by path: pieces of it are
    read) or a little over it (from a proto: protobuf hands out a copy of a tensor's bytes), whatever the total."""
    path = _model(tmp_path / "base", LARGE)
    monkeypatch.setattr(external, "CHUNK_BYTES", 2**18)
    largest = 4 * LARGE.vocab * LARGE.width
    model = path if source == "path" else onnx.load(os.fspath(path))
    requires_grad = TRAINED[trained] or weight_names(LARGE)
    peak = _traced_peak(
        lambda: artifacts.generate_artifacts(model, requires_grad, [], artifact_directory=tmp_path / "out", **ARGUMENTS)
    )
    limit = largest if source == "path" else largest + largest // 4
    assert peak < limit, f"{peak} bytes allocated at once, the largest weight has {largest}"


@pytest.mark.parametrize("source", ["path", "proto"])
def test_models_keeping_constants_are_the_in_memory_builds(tmp_path: Path, monkeypatch, source):
    path = _model(tmp_path / "base")
    model = path if source == "path" else onnx.load(os.fspath(path))
    expected = _in_memory(model, TRAINED["constants"], tmp_path / "expected")
    reads = _counting_reads(monkeypatch)
    written = artifacts.generate_artifacts(
        model, TRAINED["constants"], [], artifact_directory=tmp_path / "out", **ARGUMENTS
    )
    _same_files(written, expected)
    if source == "path":
        _read_once_per_file(_runs(reads))


def _read_once_per_file(runs: list[tuple[str, int]]) -> None:
    """Each trained weight was read once (into the checkpoint), each constant once for each model, in one run of
    pieces each time."""
    once = {run for run in runs if runs.count(run) == 1}
    assert len(once) == len(TRAINED["constants"])
    assert all(runs.count(run) == 2 for run in set(runs) - once)


def _data_files_stream(tmp_path: Path, monkeypatch, source: str) -> None:
    monkeypatch.setattr("onnxtrain.artifacts.generate.PROTOBUF_LIMIT", 100_000)  # the models keep the weights
    path = _model(tmp_path / "base")
    model = path if source == "path" else onnx.load(os.fspath(path))
    trained = TRAINED["constants"]  # the rest stay constants of the graphs
    expected = _in_memory(model, trained, tmp_path / "expected")
    reads = _counting_reads(monkeypatch)
    streamed = artifacts.generate_artifacts(model, trained, [], artifact_directory=tmp_path / "out", **ARGUMENTS)
    for name in ("training_model", "eval_model"):
        assert f"{name}_data" in streamed and f"{name}_data" in expected
        assert streamed[f"{name}_data"].read_bytes() == expected[f"{name}_data"].read_bytes()
        assert _relocated(streamed[name], streamed[f"{name}_data"]) == _relocated(
            expected[name], expected[f"{name}_data"]
        )
    _same_files(streamed, expected, ("optimizer_model.onnx", "checkpoint"))
    if source == "path":
        _read_once_per_file(_runs(reads))


def _relocated(model_path: Path, data_path: Path) -> bytes:
    """The model file with its data file's location (which names the set's version folder) left out."""
    proto = onnx.load(os.fspath(model_path), load_external_data=False)
    location = os.path.relpath(data_path, model_path.parent)
    for tensor, _ in external.model_tensors(proto):
        for entry in tensor.external_data:
            if entry.key == "location":
                assert entry.value == location
                entry.value = "<data>"
    return proto.SerializeToString()


@pytest.mark.parametrize("source", ["path", "proto"])
def test_constants_over_the_protobuf_limit_stream_into_the_data_files(tmp_path: Path, monkeypatch, source):
    _data_files_stream(tmp_path, monkeypatch, source)


def test_the_runtime_trains_artifacts_whose_models_keep_their_data_in_files(tmp_path: Path, monkeypatch):
    """The models' data files lie in the set's version folder, at locations relative to the artifact directory,
    which the runtime resolves from there (not from the folder the names' links lead to)."""
    import numpy as np

    from onnxtrain.api import CheckpointState, Module, Optimizer

    monkeypatch.setattr("onnxtrain.artifacts.generate.PROTOBUF_LIMIT", 100_000)
    path = _model(tmp_path / "base")
    paths = artifacts.generate_artifacts(
        path, TRAINED["constants"], [], artifact_directory=tmp_path / "out", **ARGUMENTS
    )
    assert "training_model_data" in paths
    state = CheckpointState.load_checkpoint(os.fspath(paths["checkpoint"]))
    module = Module(os.fspath(paths["training_model"]), state, os.fspath(paths["eval_model"]))
    optimizer = Optimizer(os.fspath(paths["optimizer_model"]), module)
    ids = np.arange(12).reshape(2, 6) % CONFIG.vocab
    losses = []
    for _ in range(3):
        losses.append(float(module(ids, ids.reshape(-1))))
        optimizer.step()
        module.lazy_reset_grad()
    assert losses[-1] < losses[0]


def test_the_generate_command_holds_one_weight_at_most_and_writes_what_the_api_writes(tmp_path: Path, monkeypatch):
    """``onnxtrain generate`` (with ``--lr``, which it stores in the one checkpoint it writes) streams as
    ``generate_artifacts`` does."""
    from onnxtrain.cli import main

    path = _model(tmp_path / "base", LARGE)
    monkeypatch.setattr(external, "CHUNK_BYTES", 2**18)
    largest = 4 * LARGE.vocab * LARGE.width
    argv = [str(path), "--requires-grad", *weight_names(LARGE), "--loss", "ce", "--optimizer", "adamw", "--no-scores"]
    peak = _traced_peak(lambda: main(["generate", *argv, "-o", str(tmp_path / "cli")]))
    assert peak < largest, f"{peak} bytes allocated at once, the largest weight has {largest}"
    expected = artifacts.generate_artifacts(
        path, weight_names(LARGE), [], artifact_directory=tmp_path / "api", **ARGUMENTS
    )
    written = {name: tmp_path / "cli" / Path(p).name for name, p in expected.items()}
    _same_files(written, expected)
