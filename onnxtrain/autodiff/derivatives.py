"""Higher derivatives of a whole model as ONNX models: Hessian-vector products and Jacobians.

Both differentiate the gradient graph that :func:`build_gradients` emits,
which is made of standard operators (docs/gradient-coverage.md lists the
rules closed under differentiation), and return a new model; the input model
is not changed.

- :func:`hessian_vector_product`: ``H v`` without forming ``H``, by
  differentiating ``<v, grad loss>`` (Pearlmutter's trick, reverse over
  reverse). Cost: one forward pass and two reverse passes, about 4 to 5 times
  the forward pass, and the memory of both passes' intermediate values; the
  same for any number of parameters.
- :func:`jacobian`: ``d output / d wrt`` as a dense tensor
  ``[*output.shape, *wrt.shape]``, one reverse pass per element of
  ``output`` (unrolled: the graph holds that many copies of the gradient
  graph). For outputs of a few hundred elements; a point-wise network's
  per-row derivatives are one ``blocks.Gradient`` instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from onnxtrain.autodiff.gradients import build_gradients, build_vjp
from onnxtrain.autodiff.registry import GradientRegistry
from onnxtrain.graph import GraphBuilder, dtypes, ops

#: The most output elements :func:`jacobian` unrolls a reverse pass for.
MAX_JACOBIAN_ROWS = 1024


def hessian_vector_product(
    model: onnx.ModelProto,
    loss: str,
    wrt: Sequence[str],
    vector_names: Sequence[str] | None = None,
    registry: GradientRegistry | None = None,
) -> onnx.ModelProto:
    """A model computing ``H v``: ``sum_j d^2 loss / (d x_i d x_j) v_j`` for each ``x_i`` of ``wrt``.

    The returned model has the inputs of ``model`` plus one vector per ``wrt``
    value (named ``vector_names``, default ``"<x>_vector"``, of ``x``'s type),
    and the outputs ``loss``, ``"<x>_grad"`` for each ``x`` (the gradient)
    and ``"<x>_hvp"`` for each ``x`` (the product). ``loss`` is a float
    scalar; ``wrt`` are float graph inputs, initializers or intermediate
    values. Emitted as ``g = d loss / d x`` (one reverse pass), then
    ``d <v, g> / d x`` (a reverse pass over both).
    """
    wrt = _names(wrt, "wrt")
    vectors = [f"{name}_vector" for name in wrt] if vector_names is None else _names(vector_names, "vector_names")
    if len(vectors) != len(wrt):
        raise ValueError(f"vector_names has {len(vectors)} names for {len(wrt)} wrt values; give one per value")
    builder = GraphBuilder(_copy(model))
    gradients = build_gradients(builder, loss, wrt, registry)
    terms = []
    for name, vector in zip(wrt, vectors, strict=True):
        builder.add_input(vector, builder.tensor_type_of(name))
        terms.append(builder.add_node1("ReduceSum", [builder.add_node1("Mul", [gradients[name], vector])], keepdims=0))
    dot = terms[0] if len(terms) == 1 else builder.add_node1("Sum", terms, hint="vector_dot_grad")
    one = builder.add_initializer(np.ones((), dtypes.to_numpy_dtype(builder.elem_type(dot))), "one")
    products = build_vjp(builder, {dot: one}, wrt, registry)
    outputs = [loss, *(gradients[name] for name in wrt)]
    for name in wrt:
        product = products[name] if products[name] is not None else ops.filled_like(builder, name, 0.0, "zeros")
        outputs.append(builder.add_node("Identity", [product], [f"{name}_hvp"])[0])
    builder.set_outputs(outputs)
    return builder.finalize()


def jacobian(
    model: onnx.ModelProto,
    output: str,
    wrt: str,
    registry: GradientRegistry | None = None,
) -> onnx.ModelProto:
    """A model computing ``J[i..., j...] = d output[i...] / d wrt[j...]``, shape ``[*output.shape, *wrt.shape]``.

    The returned model has the inputs of ``model`` and the outputs ``output``
    and ``"<output>_jacobian"``. ``output`` needs a static shape of at most
    :data:`MAX_JACOBIAN_ROWS` elements: row ``k`` of the Jacobian is the
    vector-Jacobian product with the ``k``-th unit vector, one reverse pass
    each.
    """
    builder = GraphBuilder(_copy(model))
    builder.require(output, role="output to differentiate")
    dims = builder.shape(output)
    if dims is None or not all(isinstance(d, int) for d in dims):
        raise ValueError(
            f"jacobian needs a static shape for {output!r}, which has {dims}: one reverse pass runs per element; "
            "give the model's inputs fixed sizes, or use blocks.Gradient for per-row derivatives"
        )
    count = int(np.prod(dims, dtype=np.int64))
    if count > MAX_JACOBIAN_ROWS:
        raise ValueError(
            f"{output!r} has {count} elements, more than {MAX_JACOBIAN_ROWS} reverse passes; use "
            "hessian_vector_product or blocks.Gradient(grad_output=...) for products with vectors instead"
        )
    dtype = dtypes.to_numpy_dtype(builder.elem_type(output))
    flat_wrt = builder.add_initializer(np.array([1, -1], np.int64), "row_shape")
    rows = []
    for k in range(count):
        unit = np.zeros(count, dtype)
        unit[k] = 1
        seed = builder.add_initializer(unit.reshape(dims), f"unit_{k}")
        row = build_vjp(builder, {output: seed}, [wrt], registry)[wrt]
        rows.append(
            builder.add_node1(
                "Reshape", [row if row is not None else ops.filled_like(builder, wrt, 0.0, "zeros"), flat_wrt]
            )
        )
    stacked = builder.add_node1("Concat", rows, axis=0) if len(rows) > 1 else rows[0]
    shape = builder.add_node1("Concat", [builder.add_initializer(np.array(dims, np.int64), "output_shape"),
                                         builder.add_node1("Shape", [wrt])], axis=0)  # fmt: skip
    result = builder.add_node("Reshape", [stacked, shape], [f"{output}_jacobian"])[0]
    builder.set_outputs([output, result])
    return builder.finalize()


def _names(names: Sequence[str], what: str) -> list[str]:
    if isinstance(names, str) or not all(isinstance(name, str) for name in names) or not names:
        raise TypeError(f"{what} must be a non-empty list of value names, not {names!r}")
    return list(names)


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


__all__ = ["MAX_JACOBIAN_ROWS", "hessian_vector_product", "jacobian"]
