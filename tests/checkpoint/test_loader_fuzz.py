"""Hypothesis feeds the loader damaged files: CheckpointError (or a valid state), fast, small.

200 examples in all (``ONNXTRAIN_FUZZ_EXAMPLES`` sets the number per test). Each
load runs under tracemalloc: its peak allocation must stay within a small
multiple of the file size, so no length or offset in a file can make the loader
allocate what the file does not hold.
"""

from __future__ import annotations

import os
import struct
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onnxtrain.checkpoint import CheckpointError, CheckpointState, decode, encode
from tests.checkpoint.strategies import length_fields, states

#: 50 examples per test (200 in all); ONNXTRAIN_FUZZ_EXAMPLES=5000 for a longer local run.
FUZZ = settings(
    max_examples=int(os.environ.get("ONNXTRAIN_FUZZ_EXAMPLES", "50")),
    deadline=1000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
ALLOCATION_FACTOR = 8
ALLOCATION_SLACK = 256 * 1024
SECONDS = 0.5


def checked_decode(buf: bytes) -> CheckpointState | None:
    """decode, allowing only CheckpointError, within the time and allocation limits."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        return decode(buf)
    except CheckpointError as error:
        assert str(error)  # a message naming the problem
        return None
    finally:
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak <= ALLOCATION_FACTOR * len(buf) + ALLOCATION_SLACK, (
            f"allocated {peak} bytes for a {len(buf)}-byte file"
        )
        assert elapsed < SECONDS, f"took {elapsed:.2f} s"


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


@pytest.mark.parametrize("size", [0, 3, 7, 8])
def test_tiny_files(size):
    with pytest.raises(CheckpointError):
        decode(b"\0" * 4 + b"ODTC"[: max(0, size - 4)] if size >= 4 else b"\0" * size)
