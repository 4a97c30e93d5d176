"""``Module.scale_grad``: the accumulated gradients multiplied by a factor, where they lie.

One onnxruntime run of a model that, for each trainable parameter's
gradient ``g_i``, computes::

    scaled_i = Mul(g_i, Cast(factor, to=type(g_i)))                               # float, double
    scaled_i = Cast(Mul(Cast(g_i, to=FLOAT), Cast(factor, to=FLOAT)), to=type(g_i))  # float16, bfloat16

``factor`` is a float64 scalar fed from host memory. Each ``scaled_i`` is
written into the gradient's spare buffer, which then becomes its value
(:meth:`~onnxtrain.training.store.StateTensor.swap`): no kernel reads and
writes the same memory, and a run that fails leaves the gradients as they
were. One pass over the gradients; on a GPU one kernel per gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx

from onnxtrain.graph.builder import tensor_type
from onnxtrain.graph.context import empty_base
from onnxtrain.training import values
from onnxtrain.training.binding import BoundSession
from onnxtrain.training.models import LoadedModel
from onnxtrain.training.store import StateTensor

#: Gradient types multiplied in float32 (their own precision would round the product twice).
_WIDENED = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


class GradientScale:
    """The scaling session for one set of gradient tensors (see the module docstring)."""

    def __init__(self, gradients: Sequence[StateTensor], session: BoundSession) -> None:
        self.gradients = tuple(gradients)
        self.session = session

    @classmethod
    def create(
        cls, gradients: Sequence[StateTensor], open_session: Callable[[LoadedModel, str], BoundSession]
    ) -> GradientScale:
        """The scaling of ``gradients``, its session made by ``open_session(model, what)``."""
        model = scaling_model(gradients)
        loaded = LoadedModel(model, model.SerializeToString())
        return cls(gradients, open_session(loaded, "gradient scaling"))

    def __call__(self, factor: float) -> None:
        """Multiply every gradient by ``factor`` (their values are replaced; see the module docstring)."""
        session = self.session
        session.select(tuple([grad.flips & 1 for grad in self.gradients]))
        session.bind_input("factor", np.asarray(factor, dtype=np.float64))
        if not session.settled:
            for index, grad in enumerate(self.gradients):
                assert grad.value is not None, "place the state on a device first"
                session.bind_value(f"grad{index}", grad.value)
                session.bind_output_into(f"scaled{index}", grad.spare())
            session.settle()
        session.run()
        for grad in self.gradients:
            grad.swap()


def scaling_model(gradients: Sequence[StateTensor]) -> onnx.ModelProto:
    """``scaled_i = g_i * factor`` for each gradient ``g_i`` (the module docstring's model)."""
    with empty_base() as b:
        factor = b.add_input("factor", tensor_type(onnx.TensorProto.DOUBLE, []))
        casts: dict[int, str] = {}  # the factor in each type it multiplies in, cast once

        def factor_in(elem: int) -> str:
            if elem not in casts:
                casts[elem] = factor if elem == onnx.TensorProto.DOUBLE else b.add_node1("Cast", [factor], to=elem)
            return casts[elem]

        outputs = []
        for index, grad in enumerate(gradients):
            elem = values.elem_type_of(grad.dtype)
            value = b.add_input(f"grad{index}", tensor_type(elem, list(grad.shape)))
            name = f"scaled{index}"
            if elem in _WIDENED:
                wide = b.add_node1("Cast", [value], to=onnx.TensorProto.FLOAT)
                product = b.add_node1("Mul", [wide, factor_in(onnx.TensorProto.FLOAT)])
                b.add_node("Cast", [product], [name], to=elem)
            else:
                b.add_node("Mul", [value, factor_in(elem)], [name])
            outputs.append(name)
        b.set_outputs(outputs)
        return b.finalize()


__all__ = ["GradientScale", "scaling_model"]
