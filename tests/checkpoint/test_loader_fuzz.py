"""Hypothesis feeds the loader damaged files: CheckpointError (or a valid state), fast, small.

300 examples in all (``ONNXTRAIN_FUZZ_EXAMPLES`` sets the number per test). Each
load runs under tracemalloc: its peak allocation must stay within a small
multiple of the file size, so no length or offset in a file can make the loader
allocate what the file does not hold. Nominal checkpoints, whose declared dims
no data backs (terabytes in a few bytes, products past int64), go through the
three loaders: ``decode``, ``checkpoint.load`` and the runtime's
``api.CheckpointState.load_checkpoint`` (with its nominal snapshot), which must
agree.
"""

from __future__ import annotations

import os
import struct
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from onnxtrain import api
from onnxtrain.checkpoint import CheckpointError, CheckpointState, decode, encode, external_data_path, load
from tests.checkpoint.strategies import declared_dims, dims_entries, length_fields, nominal_files, states

Loaded = TypeVar("Loaded")

#: 50 examples per test (200 in all); ONNXTRAIN_FUZZ_EXAMPLES=5000 for a longer local run.
FUZZ = settings(
    max_examples=int(os.environ.get("ONNXTRAIN_FUZZ_EXAMPLES", "50")),
    deadline=1000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
ALLOCATION_FACTOR = 8
ALLOCATION_SLACK = 256 * 1024
#: A hang guard, not a speed check (speed is measured in benchmarks/): a decode under tracemalloc of a
#: 300 KB crafted file took 0.52 s on a loaded 2-core machine; a file that made the loader loop over its
#: declared sizes would take minutes. Memory (ALLOCATION_FACTOR) is the guard that matters.
SECONDS = 10.0


def checked(size: int, read: Callable[[], Loaded]) -> Loaded | None:
    """``read()`` of a ``size``-byte file, allowing only CheckpointError, within the time and allocation limits."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        return read()
    except CheckpointError as error:
        assert str(error)  # a message naming the problem
        return None
    finally:
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak <= ALLOCATION_FACTOR * size + ALLOCATION_SLACK, f"allocated {peak} bytes for a {size}-byte file"
        assert elapsed < SECONDS, f"took {elapsed:.2f} s"


def checked_decode(buf: bytes) -> CheckpointState | None:
    """decode, allowing only CheckpointError, within the time and allocation limits."""
    return checked(len(buf), lambda: decode(buf))


def checked_loads(buf: bytes, path: Path) -> CheckpointState | None:
    """``buf`` written to ``path`` (with a small ``.data`` file) and read by the three loaders, which agree.

    The runtime's state, when it loads, gives back the loaded state as its
    snapshot (``to_checkpoint``), also without allocating from declared dims.
    Returns the loaded state, or ``None`` for a CheckpointError.
    """
    path.write_bytes(buf)
    external_data_path(path).write_bytes(bytes(64))
    decoded = checked_decode(buf)
    loaded = checked(len(buf), lambda: load(path))
    runtime = checked(len(buf), lambda: api.CheckpointState.load_checkpoint(path))
    assert (loaded is None) == (runtime is None)
    if decoded is not None:  # without a data file: fails where the file has external data
        assert loaded == decoded
    if runtime is not None:
        snapshot = checked(len(buf), lambda: runtime.to_checkpoint(include_optimizer_state=True))
        if loaded.parameters:  # a nominal state without parameters snapshots as a plain one
            assert snapshot == loaded
    return loaded


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One checkpoint path for every example of a test."""
    return tmp_path_factory.mktemp("fuzz") / "checkpoint"


@FUZZ
@given(states(max_params=3), st.data())
def test_truncated_files(state, data):
    buf = bytes(encode(state))
    cut = data.draw(st.integers(0, len(buf) - 1))
    loaded = checked_decode(buf[:cut])
    # a cut can only succeed where it removes trailing alignment padding: then nothing changed
    assert loaded is None or loaded == state


@FUZZ
@given(states(max_params=3), st.data())
def test_flipped_bits(state, data):
    buf = bytearray(encode(state))
    for bit in data.draw(st.lists(st.integers(0, 8 * len(buf) - 1), min_size=1, max_size=8)):
        buf[bit // 8] ^= 1 << (bit % 8)
    checked_decode(bytes(buf))


@FUZZ
@given(st.binary(max_size=600), st.booleans())
def test_random_bytes(buf, with_identifier):
    if with_identifier and len(buf) >= 8:
        buf = buf[:4] + b"ODTC" + buf[8:]
    checked_decode(buf)


@FUZZ
@given(states(max_params=3), st.data())
def test_mutated_length_fields(state, data):
    buf = bytearray(encode(state))
    positions = length_fields(bytes(buf))
    position = data.draw(st.sampled_from(positions))
    (old,) = struct.unpack_from("<I", buf, position)
    new = data.draw(
        st.one_of(
            st.integers(0, 2**32 - 1),
            st.integers(max(0, old - 4), old + 4),
            st.sampled_from([2**31 - 1, 2**32 - 1, len(buf), len(buf) // 2 + 1]),
        ).filter(lambda value: value != old)
    )
    struct.pack_into("<I", buf, position, new)
    loaded = checked_decode(bytes(buf))
    if new > len(buf) - position - 4:  # more elements than bytes left: always an error
        assert loaded is None


@FUZZ
@given(nominal_files())
def test_crafted_nominal_files(scratch, buf):
    checked_loads(buf, scratch)


@FUZZ
@given(states(nominal=True, max_params=3), st.data())
def test_nominal_files_declaring_huge_dims(scratch, state, data):
    buf = bytearray(encode(state))
    positions = dims_entries(bytes(buf))
    assume(positions)
    for position in data.draw(st.lists(st.sampled_from(positions), min_size=1, max_size=3)):
        struct.pack_into("<q", buf, position, data.draw(declared_dims))
    loaded = checked_loads(bytes(buf), scratch)
    if loaded is not None:
        assert loaded.is_nominal
        assert all(a.strides == (0,) * a.ndim for a in loaded.parameters.values())  # placeholders, no memory


@pytest.mark.parametrize("size", [0, 3, 7, 8])
def test_tiny_files(size):
    with pytest.raises(CheckpointError):
        decode(b"\0" * 4 + b"ODTC"[: max(0, size - 4)] if size >= 4 else b"\0" * size)
