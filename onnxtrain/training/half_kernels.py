"""Half-precision nodes an execution provider has no kernel for, run in float32 instead.

Artifacts generated with ``precision="bf16"`` or ``"fp16"`` compute matrix
products and what follows them in the half type. An execution provider may
lack the half kernel of an operator.

- bfloat16: the session fails with "Could not find an implementation for
  Gemm(13) node ..." (onnxruntime's CPU provider has bfloat16 kernels for
  almost no operator). :func:`open_session` makes every node of that
  operator compute in float32
  (:func:`~onnxtrain.graph.passes.autocast.compute_in_float32`: its inputs
  cast up, its outputs cast back), warns naming the operator, and tries
  again, so that the same artifacts train on any provider.
- float16: the session loads, and onnxruntime runs each float16 node its
  providers have no float16 kernel for in float32 itself (its
  ``InsertCastTransformer``), removing the casts that then meet (float32 to
  float16 and back), so those values are not even rounded to float16. Its
  CPU provider (1.32, x86-64) has no float16 ``MatMul``, ``Gemm``, ``Conv``,
  ``ConvTranspose``, ``Einsum``, ``Add``, ``Mul``, ``Relu``, ``Tanh`` or
  ``Sigmoid`` kernel (only data movement such as ``Transpose``, ``Reshape``
  and ``Gather``, and a few others: ``LayerNormalization``, ``Max``,
  ``Min``, ``Attention``): float16 artifacts compute there in float32,
  rounded to float16 only where a node with a float16 kernel keeps a value
  in it (a ``Transpose`` of the backward), with casts around the products.
  :func:`open_session` warns of those operators
  (:func:`float32_in_onnxruntime`), as for bfloat16.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TypeVar

import onnx
from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

from onnxtrain import caller
from onnxtrain.artifacts.metadata import PRECISION_KEY, read_metadata
from onnxtrain.graph import external, versions
from onnxtrain.graph.attributes import attribute
from onnxtrain.graph.builder import GraphBuilder
from onnxtrain.graph.io import copy_model
from onnxtrain.graph.passes.autocast import compute_in_float32, defined_with
from onnxtrain.training.models import LoadedModel

Session = TypeVar("Session")

#: What onnxruntime says when a provider has no kernel for a node's operator and types.
MISSING_KERNEL = re.compile(r"Could not find an implementation for (\w+)\(\d+\) node with name")

#: How onnxruntime's kernel registry names the float16 tensor type.
FLOAT16_TYPE = "tensor(float16)"


class HalfPrecisionFallbackWarning(UserWarning):
    """An operator runs in float32 where the artifacts compute it in half: the provider has no half kernel."""


def open_session(
    model: LoadedModel,
    what: str,
    make: Callable[[LoadedModel], Session],
    widened: list[str] | None = None,
    warned: set[str] | None = None,
) -> Session:
    """``make(model)``, or, where it fails for a missing kernel of a half-precision operator, ``make`` of the
    model with that operator computing in float32, once per operator that lacks one (each appended to
    ``widened``); one warning names those not in ``warned`` (the operators a module's other sessions warned of),
    which it then holds."""
    widened = [] if widened is None else widened
    warned = set() if warned is None else warned
    described: dict[str, str] = {}  # the operators this call widened, as the warning names them
    while True:
        try:
            session = make(model)
        except ort_errors.NotImplemented as error:
            missing = missing_half_kernel(error)
            if missing is None or missing in widened:
                raise
            if model.path is not None and external.has_external_data(model.proto):
                raise  # its data stays on disk; rewriting it here would need all of it in memory
            copy = copy_model(model.with_data())
            op_type = widen(copy, missing)
            if op_type is None:
                raise
            widened.append(missing)
            described[missing] = op_type
            model = LoadedModel(copy, copy.SerializeToString())
            continue
        news = [text for op, text in described.items() if op not in warned]
        if news:
            caller.warn(
                f"the {what} computes {', '.join(news)} in a half type that this execution provider has no kernel "
                "for; they run in float32 (casts added around each). Generate the artifacts with "
                "precision='fp32', or use a provider with half kernels (CUDA), to avoid the casts",
                HalfPrecisionFallbackWarning,
            )
        warned.update(described)
        by_onnxruntime = [op for op in float32_in_onnxruntime(model.proto, _providers(session)) if op not in warned]
        if by_onnxruntime:
            caller.warn(
                f"the {what} computes {', '.join(by_onnxruntime)} in float16, which this execution provider has no "
                "float16 kernel for: onnxruntime runs them in float32 (its own casts around each, and where two "
                "such casts meet it drops both, so those values are not rounded to float16 either): on it, the "
                "artifacts compute about as float32 ones do, more slowly. Generate them with precision='fp32' for "
                "this provider, or use one with float16 kernels (CUDA)",
                HalfPrecisionFallbackWarning,
            )
            warned.update(by_onnxruntime)
        return session


def _providers(session: object) -> list[str] | None:
    """The execution providers of an ``InferenceSession`` (``None`` for another object)."""
    get_providers = getattr(session, "get_providers", None)
    return list(get_providers()) if callable(get_providers) else None


def float32_in_onnxruntime(model: onnx.ModelProto, providers: Sequence[str] | None) -> list[str]:
    """The operators of ``model``'s float16 nodes (its top graph's nodes reading a float16 value, but ``Cast``)
    for which no provider of ``providers`` has a float16 kernel at the model's opset: onnxruntime runs those in
    float32 itself (module docstring), where a bfloat16 node without a kernel fails the session.

    Told from onnxruntime's kernel registry (``get_all_opkernel_def``). Empty where that cannot tell: without
    ``providers``, where one of them lists no kernels there (a provider that compiles the graph, as TensorRT or
    OpenVINO do), or for an operator no provider has any kernel for (onnxruntime runs its ONNX function body).
    """
    if not providers or not _has_float16(model):
        return []
    try:
        kernels = ort_errors.get_all_opkernel_def()
    except AttributeError:  # a build without the registry's listing
        return []
    if not set(providers) <= {kernel.provider for kernel in kernels}:
        return []
    types = GraphBuilder(model)
    reading = dict.fromkeys(
        (node.op_type, node.domain)
        for node in model.graph.node
        if node.op_type != "Cast"
        and any(name and types.elem_type_if_known(name) == onnx.TensorProto.FLOAT16 for name in node.input)
    )
    found = []
    for op_type, domain in reading:
        opset = versions.opset_version(model, domain)
        usable = [
            kernel
            for kernel in kernels
            if kernel.op_name == op_type
            and _domain(kernel.domain) == _domain(domain)
            and kernel.provider in providers
            and opset is not None
            and kernel.version_range[0] <= opset <= kernel.version_range[1]
        ]
        if usable and not any(FLOAT16_TYPE in allowed for k in usable for allowed in k.type_constraints.values()):
            found.append(op_type)
    return found


def _domain(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


def _has_float16(model: onnx.ModelProto) -> bool:
    """Whether ``model`` casts to float16 or holds a float16 input or initializer (a cheap test, before its types
    are inferred)."""
    graph = model.graph
    if any(t.data_type == onnx.TensorProto.FLOAT16 for t in graph.initializer):
        return True
    if any(v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16 for v in graph.input):
        return True
    return any(node.op_type == "Cast" and attribute(node, "to") == onnx.TensorProto.FLOAT16 for node in graph.node)


def widen(model: onnx.ModelProto, op_type: str) -> str | None:
    """Make ``op_type``'s half nodes of ``model`` compute in float32, in place, or those of the functions whose
    ONNX definition onnxruntime runs with it (Relu as Max); how the warning names what changed, ``None`` where
    nothing did."""
    if compute_in_float32(model, op_type):
        return op_type
    defining = defined_with(model, op_type)
    if sum(compute_in_float32(model, parent) for parent in defining):
        return f"{op_type} (in the definition of {', '.join(defining)})"
    return None


def missing_half_kernel(error: BaseException) -> str | None:
    """The operator onnxruntime found no kernel for, where ``error`` (or its cause) says so; else ``None``."""
    for raised in (error, error.__cause__):
        found = None if raised is None else MISSING_KERNEL.search(str(raised))
        if found is not None:
            return found.group(1)
    return None


def warn_of_a_half_export(model: onnx.ModelProto, computes: str | None, widened: Sequence[str]) -> None:
    """A :class:`HalfPrecisionFallbackWarning` where an exported ``model`` computes in the half type of the
    eval model it comes from (``computes``, its ``onnxtrain.precision``) and the module's provider had no kernel
    for the operators ``widened`` in it: the module ran those in float32, the export keeps them in half."""
    exported = read_metadata(model).get(PRECISION_KEY)
    if not widened or exported is None or exported != computes:
        return
    caller.warn(
        f"the exported model computes {', '.join(widened)} in {exported}, which this module's execution provider "
        "has no kernel for (the module ran them in float32): it runs on a provider with those kernels (CUDA); "
        "pass precision='fp32' to export a model any provider runs",
        HalfPrecisionFallbackWarning,
    )


__all__ = [
    "FLOAT16_TYPE",
    "MISSING_KERNEL",
    "HalfPrecisionFallbackWarning",
    "float32_in_onnxruntime",
    "missing_half_kernel",
    "open_session",
    "warn_of_a_half_export",
    "widen",
]
