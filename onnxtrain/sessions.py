"""Creating onnxruntime sessions the same way everywhere, around what some onnxruntime releases lack.

onnxruntime 1.23 (the last release for Python 3.10) has graph transformers
that break models every release loads once they are off:

- it fuses ``MatMul`` with a ``Transpose`` into ``com.microsoft::FusedMatMul``,
  and ``x * Sigmoid(x)`` into ``com.microsoft::QuickGelu``, whose CPU kernels
  take float only: a float64 graph with a weight gradient
  (``MatMul(Transpose(x), g)``) or a SiLU then fails to load;
- ``ReshapeFusion`` merges ``Reshape(Reshape(x, computed shape), constant)``
  into one ``Reshape`` and loses the computed shape's edge ("Attempting to get
  index by a name which does not exist ... _new_reshape");
- ``NoopElimination`` takes ``Mul`` by an empty constant for ``Mul`` by 1 and
  fails to remove it ("CanRemoveNodeAndMergeEdges").

Newer releases (1.32 checked) do none of these. :func:`inference_session` makes the
session again without the transformer at fault when, and only when,
onnxruntime reports one of these errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnx
import onnxruntime as ort
from onnx.external_data_helper import uses_external_data
from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

#: onnxruntime's graph transformers that write operators some releases have no double kernel for.
FLOAT_ONLY_FUSIONS: dict[str, str] = {"FusedMatMul": "MatmulTransposeFusion", "QuickGelu": "QuickGeluFusion"}

#: onnxruntime's graph transformers that fail on some valid graphs in some releases, by what their error says.
FAILING_TRANSFORMERS: dict[str, str] = {
    "_new_reshape": "ReshapeFusion",
    "CanRemoveNodeAndMergeEdges": "NoopElimination",
}


def _at_fault(error: Exception) -> list[str]:
    """The transformers ``error`` blames (none when it is no error of theirs)."""
    message = str(error)
    if isinstance(error, ort_errors.NotImplemented):
        return [fusion for op, fusion in FLOAT_ONLY_FUSIONS.items() if f".{op}(" in message]
    if isinstance(error, ort_errors.RuntimeException):
        return [name for clue, name in FAILING_TRANSFORMERS.items() if clue in message]
    return []


def inference_session(
    source: str | bytes,
    options: ort.SessionOptions | None = None,
    providers: Sequence[Any] | None = None,
    *,
    disabled_optimizers: Sequence[str] = (),
) -> ort.InferenceSession:
    """``onnxruntime.InferenceSession(source, options, providers)``, without a transformer this release fails in
    nor those in ``disabled_optimizers``."""
    chosen = ["CPUExecutionProvider"] if providers is None else list(providers)
    disabled: list[str] = list(disabled_optimizers)
    while True:
        try:
            if not disabled:
                return ort.InferenceSession(source, sess_options=options, providers=chosen)
            return ort.InferenceSession(source, sess_options=options, providers=chosen, disabled_optimizers=disabled)
        except (ort_errors.NotImplemented, ort_errors.RuntimeException) as error:
            more = [name for name in _at_fault(error) if name not in disabled]
            if not more:
                raise
            disabled += more


__all__ = ["FAILING_TRANSFORMERS", "FLOAT_ONLY_FUSIONS", "inference_session"]


def _external_as_inputs(graph: onnx.GraphProto) -> None:
    """Make ``graph``'s initializers whose data is marked external typed inputs, in place: a copy loaded from
    bytes has no folder to find their files in (and the training runtime's shared constants have none), and a
    session that is never run needs no values."""
    stubs = [t for t in graph.initializer if uses_external_data(t)]
    if not stubs:
        return
    kept = [t for t in graph.initializer if not uses_external_data(t)]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in stubs)


def inferred_shapes(model: onnx.ModelProto, names: Sequence[str]) -> dict[str, list[int] | None]:
    """The dimensions onnxruntime infers for the values ``names`` of ``model`` (``None`` where some is unknown).

    The values are made outputs of a copy that onnxruntime loads without
    optimizing it and never runs: its shape inference is onnxruntime's own,
    with the operator schemas it has loaded already (``onnx.shape_inference``
    would load ONNX's copy of them, 7.5 MiB, the first time). ``None`` for
    all where the copy does not load. onnxruntime reports a scalar as it
    reports a value of unknown rank (``[]``): ``None`` for both.
    """
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    present = {value.name for value in graph.output}
    made = {name for node in graph.node for name in node.output} | {value.name for value in graph.input}
    graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names if n in made and n not in present)
    _external_as_inputs(graph)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3  # errors only: warnings about this copy (an unread initializer) are not the user's
    try:
        session = ort.InferenceSession(
            copy.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"]
        )
    except Exception:  # onnxruntime's own error types: nothing known
        return dict.fromkeys(names)
    found = {value.name: value.shape for value in session.get_outputs()}
    shapes: dict[str, list[int] | None] = {}
    for name in names:
        dims = found.get(name)
        # onnxruntime reports [] both for a scalar and for a value whose rank it does not know: unknown
        shapes[name] = list(dims) if dims and all(isinstance(d, int) for d in dims) else None
    return shapes
