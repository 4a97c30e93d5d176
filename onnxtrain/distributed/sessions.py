"""``session_options``: onnxruntime's threads for a rank, the machine's cores shared among the ranks on it."""

from __future__ import annotations

import os
from typing import Any

import onnxruntime as ort

from onnxtrain.distributed.communicator import local_size
from onnxtrain.training.options import default_session_options


def session_options(comm: Any = None) -> ort.SessionOptions:
    """onnxruntime session options for this rank's ``Module``: its share of the machine's cores, no spinning.

    Intra-op threads: the cores this process may run on, divided by the
    ranks of ``comm`` on this machine (at least 1); where the launcher bound
    the process to fewer cores than the machine has, those cores, undivided.
    The threads do not spin: a spinning thread holds its core while it waits,
    and the other ranks on the machine need it. With the runtime's default
    options (a thread per core in every rank, the fused step's spinning), two
    ranks on 2 cores took 10.2 ms per MLP step instead of 4.2 ms. All graph optimizations, as the runtime's
    defaults. Pass it as ``Module(..., session_options=...)``;
    ``fit(distributed=True)`` and ``onnxtrain train --distributed`` do.
    """
    return default_session_options(threads=rank_threads(local_size(comm)))


def rank_threads(ranks_here: int, allowed: int | None = None, cores: int | None = None) -> int:
    """The intra-op threads of one of ``ranks_here`` ranks on a machine of ``cores`` cores, of which the process
    may run on ``allowed`` (defaults: this process's affinity and this machine's count)."""
    if allowed is None:
        allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    cores = cores or os.cpu_count() or allowed
    if allowed < cores:  # bound by the launcher (or the user) already: its share
        return max(1, allowed)
    return max(1, allowed // max(1, ranks_here))


__all__ = ["rank_threads", "session_options"]
