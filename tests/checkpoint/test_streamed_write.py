"""Checkpoints written a tensor at a time: ``format.write`` gives ``encode``'s bytes, and a lazy state
(``lazy_from_tensors``: arrays read from initializers when written) gives ``from_tensors``' file."""

from __future__ import annotations

import io
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper
from onnx.external_data_helper import uses_external_data

from onnxtrain import checkpoint
from onnxtrain.checkpoint import encode, from_tensors, lazy_from_tensors, save, write_files
from onnxtrain.checkpoint import format as fmt
from onnxtrain.graph import external
from onnxtrain.graph.external import TensorData
from tests.checkpoint.strategies import states


@settings(max_examples=60, deadline=None)
@given(states(), st.booleans(), st.booleans())
def test_write_gives_the_bytes_of_encode(state, external_data, optimizer):
    expected_data, data = io.BytesIO(), io.BytesIO()
    expected = bytes(
        encode(state, include_optimizer_state=optimizer, external=expected_data if external_data else None)
    )
    out = io.BytesIO()
    fmt.write(state, out, include_optimizer_state=optimizer, external=data if external_data else None)
    assert out.getvalue() == expected
    assert data.getvalue() == expected_data.getvalue()


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "w": rng.standard_normal((40, 30)).astype(np.float32),
        "b": np.array([1.5, -2.0], np.float32),
        "ids": np.arange(2000, dtype=np.int64),
        "table": rng.standard_normal(1500),
        "half": np.linspace(0, 1, 1200).astype(np.float16),
        "bf": np.arange(1100).astype(ml_dtypes.bfloat16),
        "flag": np.array([True, False] * 600),
        "scalar": np.float64(2.5),
        "empty": np.zeros((0, 3), np.int32),
    }


def _initializers(folder: Path) -> list[onnx.TensorProto]:
    """The arrays of :func:`_arrays` as initializers: large ones in an external data file beside, in a shuffled
    order, one held as typed values (``float_data``), small ones inline."""
    tensors = []
    with open(folder / "weights.bin", "wb") as data:
        data.write(b"header")
        for name, array in reversed(list(_arrays().items())):
            tensor = numpy_helper.from_array(array, name)
            if array.size >= 1000:
                offset = data.tell()
                data.write(tensor.raw_data)
                tensor.ClearField("raw_data")
                tensor.data_location = onnx.TensorProto.EXTERNAL
                for key, value in (("location", "weights.bin"), ("offset", offset), ("length", data.tell() - offset)):
                    tensor.external_data.add(key=key, value=str(value))
            elif name == "b":
                tensor = helper.make_tensor(name, onnx.TensorProto.FLOAT, array.shape, array.tolist())
            tensors.append(tensor)
    return tensors


@pytest.mark.parametrize("threshold", [0, 10**9], ids=["external", "inline"])
def test_a_lazy_state_writes_the_file_from_tensors_writes(tmp_path, threshold):
    tensors = _initializers(tmp_path)
    trainable = [t for t in tensors if t.name in ("w", "b", "table")]
    frozen = [t for t in tensors if t.name not in ("w", "b", "table")]
    eager = from_tensors(trainable, frozen, base_dir=tmp_path)
    lazy = lazy_from_tensors(trainable, frozen, TensorData(base_dir=tmp_path))
    assert lazy == eager
    assert lazy.nominal() == eager.nominal()
    assert repr(lazy) == repr(eager)
    for name, state in (("eager", eager), ("lazy", lazy)):
        (tmp_path / name).mkdir()
        write_files(state, tmp_path / name, "ckpt", external_data_threshold=threshold)
        save(state, tmp_path / name / "saved", external_data_threshold=threshold)
    for file in ("ckpt", "ckpt.data", "saved", "saved.data") if threshold == 0 else ("ckpt", "saved"):
        assert (tmp_path / "lazy" / file).read_bytes() == (tmp_path / "eager" / file).read_bytes(), file
    assert checkpoint.load(tmp_path / "lazy" / "ckpt") == eager


def test_a_lazy_state_reads_each_tensor_once_and_one_at_a_time_when_written(tmp_path, monkeypatch):
    tensors = _initializers(tmp_path)
    lazy = lazy_from_tensors(tensors[:4], tensors[4:], TensorData(base_dir=tmp_path))
    reads: list[tuple[int, int, int]] = []
    real = external.read_bytes

    def counted(found, start, count, label):
        reads.append((found.offset, start, count))
        return real(found, start, count, label)

    monkeypatch.setattr(external, "read_bytes", counted)
    monkeypatch.setattr(external, "CHUNK_BYTES", 1000)
    assert not reads, "nothing is read before the state is written"
    write_files(lazy, tmp_path, "ckpt")
    stored = [t for t in tensors if uses_external_data(t)]
    by_tensor = [offset for offset, _, _ in reads]
    assert sorted(set(by_tensor)) == sorted(external.locate(t, tmp_path).offset for t in stored)
    runs = [offset for k, offset in enumerate(by_tensor) if k == 0 or by_tensor[k - 1] != offset]
    assert len(runs) == len(stored), "each tensor is read in one run of pieces, then never again"
    for offset in set(by_tensor):
        pieces = sorted((start, count) for o, start, count in reads if o == offset)
        assert all(count <= 1000 for _, count in pieces)
        assert [start for start, _ in pieces] == list(np.cumsum([0] + [c for _, c in pieces[:-1]]))


def test_a_lazy_state_checks_every_tensor_before_reading_any(tmp_path):
    tensors = _initializers(tmp_path)
    data = TensorData(base_dir=tmp_path)
    text = helper.make_tensor("text", onnx.TensorProto.STRING, [1], [b"a"])
    with pytest.raises(TypeError, match="holds strings"):
        lazy_from_tensors([*tensors, text], [], data)
    with pytest.raises(ValueError, match="appears twice"):
        lazy_from_tensors([tensors[0], tensors[0]], [], data)
    with pytest.raises(ValueError, match="no such file"):
        lazy_from_tensors(tensors, [], TensorData(base_dir=tmp_path / "elsewhere"))
    four = helper.make_tensor("four", onnx.TensorProto.INT4, [2], [1, 2])
    with pytest.raises(TypeError, match="trainable parameter 'four'"):
        lazy_from_tensors([four], [], data)
