"""The cast-like pass: ``CastLike(x, like)`` becomes ``Cast(x, to=T)`` where the type ``T`` of ``like`` is known.

torch's dynamo exporter writes ``CastLike`` to give a Python scalar the type
of the tensor it meets (``CastLike(Constant 0.5, x)``). onnxruntime expands
the operator's function body when it makes a session, after its constant
folding has looked for a CPU kernel of ``CastLike`` and warned, once per
node and session, that it found none. A ``Cast`` to the known type is the
same computation (ONNX defines ``CastLike`` as that ``Cast``); on a constant
it folds (:mod:`onnxtrain.graph.passes.static_shapes`), and nothing warns.
"""

from __future__ import annotations

import onnx
from onnx import helper

from onnxtrain.graph.versions import is_standard
from onnxtrain.graph.walk import all_nodes


def cast_like_to_cast(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each ``CastLike`` of the top-level graph whose second input's element type is declared (a
    graph input, an initializer, a ``value_info``, a ``Constant``) made a ``Cast`` to that type, in place; its
    ``saturate`` attribute (opset 19) kept."""
    graph = model.graph
    types = {t.name: t.data_type for t in graph.initializer}
    for value in (*graph.input, *graph.value_info, *graph.output):
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
            types[value.name] = value.type.tensor_type.elem_type
    for node in all_nodes(graph):
        if node.op_type == "Constant" and is_standard(node) and node.attribute and node.attribute[0].name == "value":
            types[node.output[0]] = node.attribute[0].t.data_type
    for position, node in enumerate(graph.node):
        if node.op_type != "CastLike" or not is_standard(node) or len(node.input) != 2:
            continue
        elem_type = types.get(node.input[1])
        if not elem_type:
            continue
        saturate = {a.name: a for a in node.attribute}.get("saturate")
        attributes = {"to": elem_type, **({"saturate": saturate.i} if saturate is not None else {})}
        cast = helper.make_node("Cast", [node.input[0]], list(node.output), name=node.name, **attributes)
        cast.doc_string = node.doc_string
        cast.metadata_props.extend(node.metadata_props)
        graph.node[position].CopyFrom(cast)
    return model


__all__ = ["cast_like_to_cast"]
