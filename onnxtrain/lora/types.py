"""Types of ``com.microsoft::MatMulNBits`` outputs, declared so that onnx's shape inference sees past them.

onnx knows no ``com.microsoft`` schema: every value downstream of a
``MatMulNBits`` stays untyped, and the gradient graph needs those types. Its
output is ``A``'s shape with the last axis ``N``, in ``A``'s type; each pass
declares the outputs whose ``A`` has a known type, until no more can be.
"""

from __future__ import annotations

import onnx
from onnx import helper

from onnxtrain.graph.attributes import attribute
from onnxtrain.graph.io import inferred_skeleton


def _typed(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    graph = inferred_skeleton(model).graph
    types = {value.name: value.type for value in (*graph.input, *graph.value_info, *graph.output)}
    for tensor in model.graph.initializer:
        types[tensor.name] = helper.make_tensor_type_proto(tensor.data_type, list(tensor.dims))
    return {name: t for name, t in types.items() if t.HasField("tensor_type") and t.tensor_type.elem_type}


def declare_nbits_outputs(model: onnx.ModelProto) -> None:
    """Declare in ``graph.value_info`` the type of each ``MatMulNBits`` output that has none (in place)."""
    nodes = [n for n in model.graph.node if n.op_type == "MatMulNBits" and n.domain == "com.microsoft"]
    while nodes:
        types = _typed(model)
        waiting = []  # outputs still untyped, their input too
        for node in nodes:
            output = node.output[0]
            if output in types:
                continue
            if node.input[0] not in types:
                waiting.append(node)
                continue
            model.graph.value_info.append(_output_type(node, types[node.input[0]].tensor_type))
        if len(waiting) == len([n for n in nodes if n.output[0] not in types]):
            return  # nothing declared in this pass: the rest cannot be
        nodes = waiting


def _output_type(node: onnx.NodeProto, a: onnx.TypeProto.Tensor) -> onnx.ValueInfoProto:
    """``Y``'s type: ``A``'s element type, ``A``'s shape with the last axis ``N`` (no shape when ``A`` has none)."""
    n = int(attribute(node, "N"))
    value = onnx.ValueInfoProto(name=node.output[0])
    value.type.tensor_type.elem_type = a.elem_type
    if a.HasField("shape") and len(a.shape.dim) > 0:
        value.type.tensor_type.shape.dim.extend(a.shape.dim[:-1])
        value.type.tensor_type.shape.dim.add().dim_value = n
    return value
