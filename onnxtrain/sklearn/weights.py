"""Which initializers of a model are its weights: the names ``weights_to_train`` should list.

Converters store more than weights as float initializers: skl2onnx writes a
classifier's ``negate``, ``unity`` and ``num_classes``, and a scaler's offset
and scale (``Sub`` and ``Div`` constants). Training those redraws them
(``warm_start=False`` starts vectors and scalars at zero) and divides by
zero. A weight is an initializer the graph reads as one
(:mod:`onnxtrain.graph.roles`, the same as ``onnxtrain generate
--requires-grad weights``): an operand of ``MatMul`` or ``Gemm``, a ``Conv``
kernel or bias, a normalization's scale or bias, an embedding table
(``Gather``'s data), a recurrent layer's weights, or a bias or scale applied
to what weights computed (not the scaler's, which comes before them).
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx

from onnxtrain.graph.roles import trainable_parameters

#: Element types of the initializers that can be weights (those of onnxcustom's ``get_train_initializer``).
FLOAT_TYPES: frozenset[int] = frozenset({onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE})


def trainable_weights(onx: onnx.ModelProto) -> list[str]:
    """The float initializers ``onx`` reads as weights, in initializer order: the weights of
    :func:`onnxtrain.artifacts.trainable_parameters` of the types ``get_train_initializer`` lists.

    Works on a model before or after ``add_loss_output``: the loss's own constants are not weights.
    """
    types = {tensor.name: tensor.data_type for tensor in onx.graph.initializer}
    return [name for name in trainable_parameters(onx) if types[name] in FLOAT_TYPES]


def not_weights(onx: onnx.ModelProto, names: Iterable[str]) -> list[str]:
    """The initializers among ``names`` that ``onx`` does not read as weights (:func:`trainable_weights`)."""
    weights = set(trainable_weights(onx))
    initializers = {tensor.name for tensor in onx.graph.initializer}
    return [name for name in names if name in initializers and name not in weights]


__all__ = ["FLOAT_TYPES", "not_weights", "trainable_weights"]
