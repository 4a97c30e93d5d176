"""Opset and IR-version policy: which versions onnxtrain reads and writes, and why.

onnx 1.23 stamps IR version 14 on new models while onnxruntime 1.31 loads at
most IR 13, and onnxruntime 1.19 (the last training build) loads at most IR 10.
So onnxtrain never writes the ``onnx`` package's default: every model it emits
carries the *lowest* IR version that can express it (its opset imports and the
element types it uses). That is the version the widest range of runtimes loads.
"""

from __future__ import annotations

import onnx
from onnx import helper

from onnxtrain.graph.attributes import attribute
from onnxtrain.graph.walk import all_nodes

#: The default ``ai.onnx`` opset of models built from scratch (``empty_base``).
#: Opset 21 is loaded by every onnxruntime since 1.20 and needs only IR 10.
DEFAULT_OPSET = 21

#: The oldest ``ai.onnx`` opset a base model may have. From 13 on, the axes of
#: ReduceSum, Squeeze and Unsqueeze are inputs, which the blocks rely on.
MIN_OPSET = 13

#: The ``ai.onnx.ml`` opset used when a block needs that domain and the base
#: model does not import it yet (LabelEncoder with tensor attributes needs 4).
DEFAULT_ML_OPSET = 4

# The first IR version that can hold each element type (IR 9: float8, IR 10:
# 4-bit integers, IR 11: float4, IR 12: float8e8m0, IR 13: 2-bit integers).
_IR_FOR_ELEM_TYPE: dict[int, int] = {
    onnx.TensorProto.FLOAT8E4M3FN: 9,
    onnx.TensorProto.FLOAT8E4M3FNUZ: 9,
    onnx.TensorProto.FLOAT8E5M2: 9,
    onnx.TensorProto.FLOAT8E5M2FNUZ: 9,
    onnx.TensorProto.UINT4: 10,
    onnx.TensorProto.INT4: 10,
    onnx.TensorProto.FLOAT4E2M1: 11,
}
for _name, _ir in (("FLOAT8E8M0", 12), ("UINT2", 13), ("INT2", 13)):
    if hasattr(onnx.TensorProto, _name):
        _IR_FOR_ELEM_TYPE[getattr(onnx.TensorProto, _name)] = _ir
del _name, _ir

#: Model-local functions (``ModelProto.functions``) came with IR version 8.
_IR_FOR_LOCAL_FUNCTIONS = 8


def is_standard(node: onnx.NodeProto) -> bool:
    """Whether ``node`` is an operator of ONNX's default domain (written ``""`` or ``"ai.onnx"``)."""
    return node.domain in ("", "ai.onnx")


def opset_version(model: onnx.ModelProto, domain: str = "") -> int | None:
    """The version of ``domain`` the model imports (the newest, if imported twice), or ``None``."""
    found = [opset.version for opset in model.opset_import if opset.domain in (domain, _alias(domain))]
    return max(found) if found else None


def merge_imports(model: onnx.ModelProto) -> None:
    """Import each domain once, at the newest version the model imports it at; in place, order kept."""
    newest: dict[str, int] = {}
    for opset in model.opset_import:
        domain = "" if opset.domain == "ai.onnx" else opset.domain
        newest[domain] = max(newest.get(domain, opset.version), opset.version)
    if len(newest) != len(model.opset_import):
        del model.opset_import[:]
        model.opset_import.extend(helper.make_opsetid(domain, version) for domain, version in newest.items())


def import_used_domains(model: onnx.ModelProto) -> None:
    """Import at version 1 each non-default domain a node uses but the model does not import; in place.

    ONNX Runtime loads such models (its transformer optimizer writes
    ``com.microsoft`` nodes without the import at ``opt_level=0``); the gradient
    rules are looked up by the domain's version, which would otherwise be 0.
    """
    imported = {"" if opset.domain == "ai.onnx" else opset.domain for opset in model.opset_import}
    used: list[str] = []
    for node in all_nodes(model.graph):
        domain = "" if node.domain == "ai.onnx" else node.domain
        if domain and domain not in imported and domain not in used:
            used.append(domain)
    model.opset_import.extend(helper.make_opsetid(domain, 1) for domain in used)


def _alias(domain: str) -> str:
    return "ai.onnx" if domain == "" else domain


def check_opset(model: onnx.ModelProto) -> int:
    """Return the model's ``ai.onnx`` opset; raise ``ValueError`` if it is too old or newer than onnx knows."""
    version = opset_version(model, "")
    if version is None:
        raise ValueError(
            "the base model imports no ai.onnx opset; add one, e.g. "
            f"model.opset_import.append(onnx.helper.make_opsetid('', {DEFAULT_OPSET}))"
        )
    newest = onnx.defs.onnx_opset_version()
    if version > newest:
        raise ValueError(
            f"the base model uses ai.onnx opset {version}, newer than the installed onnx {onnx.__version__} knows "
            f"(up to {newest}): upgrade onnx (pip install -U onnx), or export the model with opset <= {newest}"
        )
    if version < MIN_OPSET:
        raise ValueError(
            f"the base model uses ai.onnx opset {version}, older than the oldest supported "
            f"({MIN_OPSET}); convert it first with "
            f"onnx.version_converter.convert_version(model, {MIN_OPSET})"
        )
    return version


def _elem_types(model: onnx.ModelProto) -> set[int]:
    graph = model.graph
    types = {t.data_type for t in graph.initializer}
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.type.HasField("tensor_type"):
            types.add(value.type.tensor_type.elem_type)
    for node in graph.node:
        to = attribute(node, "to")
        if isinstance(to, int):
            types.add(to)
    return types


def required_ir_version(model: onnx.ModelProto) -> int:
    """The lowest IR version that can express ``model``'s opsets, local functions and element types."""
    ir = helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    if model.functions:
        ir = max(ir, _IR_FOR_LOCAL_FUNCTIONS)
    for elem_type in _elem_types(model):
        ir = max(ir, _IR_FOR_ELEM_TYPE.get(elem_type, 3))
    return ir


def stamp_ir_version(model: onnx.ModelProto) -> None:
    """Import each domain once (:func:`merge_imports`), then set ``model.ir_version`` to
    :func:`required_ir_version`, in place."""
    merge_imports(model)
    model.ir_version = required_ir_version(model)
