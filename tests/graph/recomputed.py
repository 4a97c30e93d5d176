"""Running a training model that recomputes values beside one that keeps them, and comparing their outputs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

from onnxtrain.sessions import inference_session

#: Sessions of recomputing models run without it, as the runtime's do: it would merge each copy back.
NO_CSE = ["CommonSubexpressionElimination"]

AS_WRITTEN = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
OPTIMIZED = ort.GraphOptimizationLevel.ORT_ENABLE_ALL


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], level: ort.GraphOptimizationLevel) -> list[np.ndarray]:
    """``model``'s outputs for ``feeds``, onnxruntime's graph optimizations at ``level`` (without CSE)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    return inference_session(model.SerializeToString(), options, disabled_optimizers=NO_CSE).run(None, feeds)


def assert_bit_equal(model: onnx.ModelProto, reference: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    """Every output of ``model`` bit for bit ``reference``'s, both run as written."""
    for got, want in zip(run(model, feeds, AS_WRITTEN), run(reference, feeds, AS_WRITTEN), strict=True):
        np.testing.assert_array_equal(got, want)


def assert_same_outputs(model: onnx.ModelProto, reference: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    """Bit for bit ``reference``'s outputs as written, and within 1e-12 once onnxruntime optimizes both."""
    assert_bit_equal(model, reference, feeds)
    for got, want in zip(run(model, feeds, OPTIMIZED), run(reference, feeds, OPTIMIZED), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
