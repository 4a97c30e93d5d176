"""Element-wise rules beyond the spec table: refusals, and values at points finite differences cannot check."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxtrain.autodiff import build_gradients
from onnxtrain.graph import GraphBuilder
from tests.helpers import DOUBLE, FLOAT, make_model, run_model


def _gradients(model: onnx.ModelProto, wrt: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    builder = GraphBuilder(model)
    grads = build_gradients(builder, "loss", wrt)
    builder.set_outputs([grads[name] for name in wrt])
    return run_model(builder.finalize(), feeds)


def test_mod_with_fmod_0_on_floats_is_refused() -> None:
    """fmod=0 is the integer remainder; ONNX forbids it on floats, and the rule says so."""
    nodes = [helper.make_node("Mod", ["a", "b"], ["y"]), helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0)]
    model = make_model({"a": (DOUBLE, [3]), "b": (DOUBLE, [3])}, nodes, {"loss": (DOUBLE, [])})
    with pytest.raises(ValueError, match=r"fmod=0.*set fmod=1"):
        build_gradients(GraphBuilder(model), "loss", ["a"])


def _cofactors(x: np.ndarray) -> np.ndarray:
    n = x.shape[-1]
    result = np.empty_like(x)
    for i, j in itertools.product(range(n), repeat=2):
        minor = np.delete(np.delete(x, i, axis=-2), j, axis=-1)
        result[..., i, j] = (-1) ** (i + j) * np.linalg.det(minor.astype(np.float64))
    return result


@pytest.mark.parametrize("dims", [[2, 6, 6], ["b", "n", "n"]])
def test_det_gradient_is_the_cofactor_matrix_even_for_singular_matrices(dims: list[int | str]) -> None:
    """d det(X) / dX = det(X) inverse(X)^T where X is invertible, and the cofactors where it is not."""
    nodes = [helper.make_node("Det", ["x"], ["d"]), helper.make_node("ReduceSum", ["d"], ["loss"], keepdims=0)]
    model = make_model({"x": (FLOAT, dims)}, nodes, {"loss": (FLOAT, [])})
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 6, 6)).astype(np.float32)
    x[1, 5] = x[1, 0] + x[1, 2]  # rank 5: det 0, inverse undefined, gradient not 0
    (dx,) = _gradients(model, ["x"], {"x": x})
    expected = _cofactors(x)
    np.testing.assert_allclose(dx, expected, rtol=1e-3, atol=1e-3)
    x64 = x[0].astype(np.float64)
    np.testing.assert_allclose(dx[0], np.linalg.det(x64) * np.linalg.inv(x64).T, rtol=1e-3, atol=1e-3)
    assert np.abs(dx[1]).max() > 0.1
