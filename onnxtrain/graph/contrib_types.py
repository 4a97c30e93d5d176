"""Types of outputs onnx's shape inference leaves untyped: ONNX Runtime's contrib operators, a few ai.onnx.ml ones.

onnx knows no schema of ONNX Runtime's ``com.microsoft`` operators (nor of
the few it registers in the default domain), so its inference leaves their
outputs untyped, and with them every value after them: a model fused by ONNX
Runtime's transformer optimizer would have almost no types. For the
operators whose main outputs have the type and shape of their first input
(the GELUs, the fused and simplified layer normalizations, the rotary
embedding, the copies between devices that onnxruntime inserts;
``BiasSplitGelu`` with its last axis halved),
:func:`type_contrib_outputs` declares those outputs and runs the
inference again, until nothing more gets typed. Operators whose output
shapes depend on more (attention, ``FusedMatMul``) are left untyped: run
ONNX Runtime's ``SymbolicShapeInference`` on such a model first.

A few ``ai.onnx.ml`` operators that scikit-learn converters write before a
model's trained layers (``Scaler``, ``Normalizer``, ``Imputer``) have onnx
schemas that declare their output type but infer nothing; their outputs are
typed here the same way (float, or input 0's type, with input 0's shape).
"""

from __future__ import annotations

from collections.abc import Callable

import onnx

from onnxtrain.graph.versions import is_standard

MS_DOMAIN = "com.microsoft"
ML_DOMAIN = "ai.onnx.ml"

#: ONNX Runtime's contrib operators in the default domain, and the opset from which ONNX defines the name
#: itself (``None``: never).
RUNTIME_DEFAULT_DOMAIN_OPS: dict[str, int | None] = {"SimplifiedLayerNormalization": None, "LayerNormalization": 17}

#: The copies between devices that onnxruntime inserts in the default domain (a CUDA session's optimized model
#: holds them, named ``<value>_CUDAExecutionProvider``): the value itself, elsewhere.
RUNTIME_COPY_OPS = ("MemcpyFromHost", "MemcpyToHost")

#: ``(domain, operator) -> outputs`` that have the type and shape of input 0.
SAME_AS_FIRST_INPUT: dict[tuple[str, str], tuple[int, ...]] = {
    (MS_DOMAIN, "Gelu"): (0,),
    (MS_DOMAIN, "FastGelu"): (0,),
    (MS_DOMAIN, "BiasGelu"): (0,),
    (MS_DOMAIN, "QuickGelu"): (0,),
    (MS_DOMAIN, "BiasAdd"): (0,),
    (MS_DOMAIN, "BiasSoftmax"): (0,),  # CUDA's Softmax(x + bias), the bias broadcast to x
    (MS_DOMAIN, "RotaryEmbedding"): (0,),
    (MS_DOMAIN, "SkipLayerNormalization"): (0, 3),
    (MS_DOMAIN, "SkipSimplifiedLayerNormalization"): (0, 3),
    (ML_DOMAIN, "Imputer"): (0,),
    # below opset 17, LayerNormalization is ONNX Runtime's; from 17, onnx types ONNX's own
    **{("", op): (0,) for op in RUNTIME_DEFAULT_DOMAIN_OPS},
    **{("", op): (0,) for op in RUNTIME_COPY_OPS},
}


#: ``(domain, operator)`` whose output 0 has input 0's type with the last axis halved (a gated GELU).
HALF_LAST_AXIS: frozenset[tuple[str, str]] = frozenset({(MS_DOMAIN, "BiasSplitGelu")})

#: ``(domain, operator)`` whose output 0 is float with input 0's shape (their schemas say ``tensor(float)``).
FLOAT_OF_FIRST_INPUT_SHAPE: frozenset[tuple[str, str]] = frozenset({(ML_DOMAIN, "Scaler"), (ML_DOMAIN, "Normalizer")})


def _as_float(type_proto: onnx.TypeProto) -> onnx.TypeProto:
    """``type_proto`` with element type float and the same shape."""
    floating = onnx.TypeProto()
    floating.CopyFrom(type_proto)
    floating.tensor_type.elem_type = onnx.TensorProto.FLOAT
    return floating


def _halved(type_proto: onnx.TypeProto) -> onnx.TypeProto:
    """``type_proto`` with the size of its last axis halved (left unknown when it is not a number)."""
    halved = onnx.TypeProto()
    halved.CopyFrom(type_proto)
    shape = halved.tensor_type.shape
    if halved.tensor_type.HasField("shape") and shape.dim:
        last = shape.dim[-1]
        size = last.dim_value if last.HasField("dim_value") else None
        last.Clear()
        if size is not None:
            last.dim_value = size // 2
    return halved


def _declarable(node: onnx.NodeProto, known: dict[str, onnx.TypeProto]) -> list[onnx.ValueInfoProto]:
    """Declarations of the outputs of ``node`` that follow from its first input's type, where not known."""
    key = _key(node)
    if not node.input or node.input[0] not in known:
        return []
    source = known[node.input[0]]
    if key in HALF_LAST_AXIS:
        outputs, type_proto = (0,), _halved(source)
    elif key in FLOAT_OF_FIRST_INPUT_SHAPE:
        outputs, type_proto = (0,), _as_float(source)
    elif key in SAME_AS_FIRST_INPUT:
        outputs, type_proto = SAME_AS_FIRST_INPUT[key], source
    else:
        return []
    return [
        onnx.helper.make_value_info(node.output[index], type_proto)
        for index in outputs
        if index < len(node.output) and node.output[index] and node.output[index] not in known
    ]


def _key(node: onnx.NodeProto) -> tuple[str, str]:
    return ("" if is_standard(node) else node.domain, node.op_type)


def _known_types(graph: onnx.GraphProto) -> dict[str, onnx.TypeProto]:
    types = {value.name: value.type for value in (*graph.input, *graph.value_info, *graph.output)}
    for tensor in graph.initializer:
        types.setdefault(tensor.name, onnx.helper.make_tensor_type_proto(tensor.data_type, list(tensor.dims)))
    return {name: t for name, t in types.items() if t.HasField("tensor_type") and t.tensor_type.elem_type}


def type_contrib_outputs(
    model: onnx.ModelProto, infer: Callable[[onnx.ModelProto], onnx.ModelProto]
) -> onnx.ModelProto:
    """``model`` (already inferred by ``infer``) with the outputs of :data:`SAME_AS_FIRST_INPUT`,
    :data:`HALF_LAST_AXIS` and :data:`FLOAT_OF_FIRST_INPUT_SHAPE` operators declared in ``value_info``,
    and ``infer`` run again after each round that declared some."""
    for _ in range(len(model.graph.node) + 1):
        known = _known_types(model.graph)
        declared = []
        for node in model.graph.node:
            for value in _declarable(node, known):
                declared.append(value)
                known[value.name] = value.type
        if not declared:
            return model
        model.graph.value_info.extend(declared)
        model = infer(model)
    return model


__all__ = [
    "FLOAT_OF_FIRST_INPUT_SHAPE",
    "HALF_LAST_AXIS",
    "RUNTIME_COPY_OPS",
    "RUNTIME_DEFAULT_DOMAIN_OPS",
    "SAME_AS_FIRST_INPUT",
    "type_contrib_outputs",
]
