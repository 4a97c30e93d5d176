"""The MPI communicator: ``init``, ``rank``, ``size``, ``local_rank``, ``local_size``; and ``cuda_aware``.

Every function takes ``comm`` (an ``mpi4py.MPI.Comm``); ``None`` means
``MPI.COMM_WORLD``. mpi4py initialises MPI when it is imported; :func:`init`
also makes an exception that ends one rank abort the whole job (else the
other ranks would wait for it forever in their next collective call).
"""

from __future__ import annotations

import ctypes
import sys
import time
import traceback
from types import TracebackType
from typing import Any

#: How long a failing rank waits, its message written, before it aborts the job: ``mpiexec`` forwards each
#: rank's output through a proxy process, which the abort ends, and a message still in the pipe is lost.
FORWARDING_GRACE_SECONDS = 1.0


def mpi() -> Any:
    """The ``mpi4py.MPI`` module; ``ImportError`` saying how to install it."""
    try:
        from mpi4py import MPI
    except ImportError as error:
        raise ImportError(
            "onnxtrain.distributed needs mpi4py and an MPI library: pip install 'onnxtrain[mpi]' "
            f"(mpi4py with MPICH's wheel), or mpi4py built against your cluster's MPI ({error})"
        ) from error
    return MPI


def communicator(comm: Any = None) -> Any:
    """``comm``, or ``MPI.COMM_WORLD``."""
    return mpi().COMM_WORLD if comm is None else comm


def init(comm: Any = None) -> Any:
    """Start MPI and return the communicator; an uncaught exception on any rank then aborts every rank.

    The abort prints ``onnxtrain.distributed: rank R of N failed:`` and the
    traceback to standard error, waits :data:`FORWARDING_GRACE_SECONDS` for
    the launcher to pass it on, then calls ``comm.Abort(1)``: ``mpiexec``
    ends all ranks and exits with an error instead of leaving the others
    blocked in their next all-reduce.
    """
    comm = communicator(comm)
    previous = sys.excepthook
    if getattr(previous, "aborts", None) is comm:  # init() again (fit does at every call): one hook is enough
        return comm

    def abort(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
        message = "".join(traceback.format_exception(kind, error, trace))
        sys.stderr.write(f"onnxtrain.distributed: rank {comm.Get_rank()} of {comm.Get_size()} failed:\n{message}")
        sys.stderr.flush()
        if comm.Get_size() > 1:
            time.sleep(FORWARDING_GRACE_SECONDS)  # the launcher forwards the message before it ends the ranks
            comm.Abort(1)
        previous(kind, error, trace)

    abort.aborts = comm  # type: ignore[attr-defined]
    sys.excepthook = abort
    return comm


def rank(comm: Any = None) -> int:
    """This process's rank in ``comm``."""
    return int(communicator(comm).Get_rank())


def size(comm: Any = None) -> int:
    """The number of processes in ``comm``."""
    return int(communicator(comm).Get_size())


def local_rank(comm: Any = None) -> int:
    """This process's rank among the processes of ``comm`` on the same machine (to choose a GPU: ``cuda:<i>``)."""
    return _on_this_machine(comm)[0]


def local_size(comm: Any = None) -> int:
    """The number of processes of ``comm`` on this machine."""
    return _on_this_machine(comm)[1]


def _on_this_machine(comm: Any) -> tuple[int, int]:
    """This process's rank and the process count of ``comm``'s processes that share this machine's memory."""
    node = communicator(comm).Split_type(mpi().COMM_TYPE_SHARED)
    try:
        return int(node.Get_rank()), int(node.Get_size())
    finally:
        node.Free()


def cuda_aware() -> bool:
    """Whether the MPI library takes GPU memory in its calls (built CUDA-aware, with CUDA found at run time).

    Asks the library's ``MPIX_Query_cuda_support()`` (Open MPI, MPICH and
    MVAPICH have it) through :func:`mpi_library`; ``False`` where there is no
    such query, or it answers anything but 1.
    """
    try:
        query = mpi_library().MPIX_Query_cuda_support
    except (OSError, AttributeError):
        return False
    query.restype, query.argtypes = ctypes.c_int, []
    return query() == 1


def mpi_library() -> ctypes.CDLL:
    """mpi4py's own module opened by ``ctypes``: a symbol lookup in it searches the MPI library it loaded too."""
    return ctypes.CDLL(mpi().__file__)


__all__ = ["communicator", "cuda_aware", "init", "local_rank", "local_size", "mpi", "mpi_library", "rank", "size"]
