"""``cuda_aware``: what the MPI library's ``MPIX_Query_cuda_support()`` says, ``False`` where it has none."""

from __future__ import annotations

import ctypes

import pytest

pytest.importorskip("mpi4py", reason="the MPI extra is not installed: pip install -e '.[mpi]'")

from onnxtrain.distributed import communicator
from onnxtrain.distributed.communicator import cuda_aware


class Library:
    """A stand-in for the MPI library as ``ctypes.CDLL`` opens it."""

    def __init__(self, answer: int | None) -> None:
        if answer is not None:
            self.MPIX_Query_cuda_support = lambda: answer


@pytest.mark.parametrize(("answer", "expected"), [(1, True), (0, False), (-1, False), (None, False)])
def test_the_answer_of_the_library(monkeypatch: pytest.MonkeyPatch, answer: int | None, expected: bool) -> None:
    """1: built CUDA-aware with CUDA found at run time; 0: not; -1 (mpi4py's "unknown"), no query: not known
    to be, so the gradients go through host memory."""
    monkeypatch.setattr(communicator, "mpi_library", lambda: Library(answer))
    assert cuda_aware() is expected


def test_an_unloadable_library_is_not_cuda_aware(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> ctypes.CDLL:
        raise OSError("MPI.so: cannot open shared object file")

    monkeypatch.setattr(communicator, "mpi_library", refuse)
    assert cuda_aware() is False


def test_the_library_opened_is_the_one_mpi4py_loaded() -> None:
    """mpi4py's own module: a lookup in it finds the MPI library's symbols (MPI_Init here)."""
    assert hasattr(communicator.mpi_library(), "MPI_Init")


def test_mpich_s_wheel_is_not_cuda_aware() -> None:
    """The MPI this suite installs (MPICH's wheel, built without CUDA) answers through the real query."""
    from mpi4py import MPI

    version = MPI.Get_library_version().rstrip("\x00").splitlines()[0]  # Open MPI's ends in a NUL
    if not version.startswith("MPICH"):
        pytest.skip(f"another MPI library: {version}")
    assert cuda_aware() is False
