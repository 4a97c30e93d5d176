"""Which initializers of a model are its weights: the names ``weights_to_train`` should list.

Converters store more than weights as float initializers: skl2onnx writes a
classifier's ``negate``, ``unity`` and ``num_classes``, and a scaler's offset
and scale (``Sub`` and ``Div`` constants). Training those redraws them
(``warm_start=False`` starts vectors and scalars at zero) and divides by
zero. A weight is an initializer the graph reads as one: an operand of
``MatMul`` or ``Gemm``, a ``Conv`` kernel or bias, a normalization's scale
or bias, an embedding table (``Gather``'s data), a recurrent layer's weights,
or the bias an ``Add`` puts on a ``MatMul``, ``Gemm`` or ``Conv`` output.
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx

#: Element types of the initializers that can be weights (those of onnxcustom's ``get_train_initializer``).
FLOAT_TYPES: frozenset[int] = frozenset({onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE})
#: ``op_type -> input positions`` that hold weights.
WEIGHT_INPUTS: dict[str, tuple[int, ...]] = {
    "MatMul": (0, 1),
    "Gemm": (0, 1, 2),
    "Conv": (1, 2),
    "ConvTranspose": (1, 2),
    "BatchNormalization": (1, 2),
    "InstanceNormalization": (1, 2),
    "LayerNormalization": (1, 2),
    "GroupNormalization": (1, 2),
    "Gather": (0,),
    "RNN": (1, 2, 3),
    "GRU": (1, 2, 3),
    "LSTM": (1, 2, 3, 7),
    "PRelu": (1,),
}
#: Operators whose output a following ``Add`` offsets by a bias weight.
BIASED: frozenset[str] = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose"})


def trainable_weights(onx: onnx.ModelProto) -> list[str]:
    """The float initializers ``onx`` reads as weights, in initializer order (see the module's docstring).

    Works on a model before or after ``add_loss_output``: the loss's own constants are not weights.
    """
    floats = {tensor.name for tensor in onx.graph.initializer if tensor.data_type in FLOAT_TYPES}
    standard = [node for node in onx.graph.node if node.domain in ("", "ai.onnx")]
    biased = {output for node in standard if node.op_type in BIASED for output in node.output}
    read: set[str] = set()
    for node in standard:
        read.update(node.input[i] for i in WEIGHT_INPUTS.get(node.op_type, ()) if i < len(node.input))
        if node.op_type == "Add" and len(node.input) == 2 and biased.intersection(node.input):
            read.update(node.input)
    return [tensor.name for tensor in onx.graph.initializer if tensor.name in floats and tensor.name in read]


def not_weights(onx: onnx.ModelProto, names: Iterable[str]) -> list[str]:
    """The initializers among ``names`` that ``onx`` does not read as weights (:func:`trainable_weights`)."""
    weights = set(trainable_weights(onx))
    initializers = {tensor.name for tensor in onx.graph.initializer}
    return [name for name in names if name in initializers and name not in weights]


__all__ = ["BIASED", "FLOAT_TYPES", "WEIGHT_INPUTS", "not_weights", "trainable_weights"]
