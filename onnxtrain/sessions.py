"""Creating onnxruntime sessions the same way everywhere, around what some onnxruntime releases lack.

onnxruntime 1.23 (the last release for Python 3.10) fuses ``MatMul`` with a
``Transpose`` into ``com.microsoft::FusedMatMul``, whose CPU kernel takes
float only: every float64 gradient graph with a weight gradient
(``MatMul(Transpose(x), g)``) then fails to load. Releases from 1.24 on do not
fuse it for double. :func:`inference_session` makes the session again
without that fusion when, and only when, onnxruntime reports that kernel
missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

#: onnxruntime's graph transformers that write operators some releases have no double kernel for.
FLOAT_ONLY_FUSIONS: dict[str, str] = {"FusedMatMul": "MatmulTransposeFusion"}


def inference_session(
    source: str | bytes, options: ort.SessionOptions | None = None, providers: Sequence[Any] | None = None
) -> ort.InferenceSession:
    """``onnxruntime.InferenceSession(source, options, providers)``, without a fusion this release cannot run."""
    chosen = ["CPUExecutionProvider"] if providers is None else list(providers)
    try:
        return ort.InferenceSession(source, sess_options=options, providers=chosen)
    except ort_errors.NotImplemented as error:
        disabled = [fusion for op, fusion in FLOAT_ONLY_FUSIONS.items() if f".{op}(" in str(error)]
        if not disabled:
            raise
        return ort.InferenceSession(source, sess_options=options, providers=chosen, disabled_optimizers=disabled)


__all__ = ["FLOAT_ONLY_FUSIONS", "inference_session"]
