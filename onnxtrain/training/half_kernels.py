"""Half-precision nodes an execution provider has no kernel for, run in float32 instead.

Artifacts generated with ``precision="bf16"`` or ``"fp16"`` compute matrix
products and what follows them in the half type. An execution provider may
lack the half kernel of an operator (onnxruntime's CPU provider has float16
kernels for most operators and bfloat16 kernels for almost none): the session
then fails with "Could not find an implementation for Gemm(13) node ...".
:func:`open_session` makes every node of that operator compute in float32
(:func:`~onnxtrain.graph.passes.autocast.compute_in_float32`: its inputs cast
up, its outputs cast back), warns naming the operator, and tries again, so
that the same artifacts train on any provider.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TypeVar

import onnx
from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

from onnxtrain import caller
from onnxtrain.artifacts.metadata import PRECISION_KEY, read_metadata
from onnxtrain.graph import external
from onnxtrain.graph.io import copy_model
from onnxtrain.graph.passes.autocast import compute_in_float32, defined_with
from onnxtrain.training.models import LoadedModel

Session = TypeVar("Session")

#: What onnxruntime says when a provider has no kernel for a node's operator and types.
MISSING_KERNEL = re.compile(r"Could not find an implementation for (\w+)\(\d+\) node with name")


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
            found = MISSING_KERNEL.search(str(error))
            if found is None or found.group(1) in widened:
                raise
            if model.path is not None and external.has_external_data(model.proto):
                raise  # its data stays on disk; rewriting it here would need all of it in memory
            copy = copy_model(model.with_data())
            op_type = widen(copy, found.group(1))
            if op_type is None:
                raise
            widened.append(found.group(1))
            described[found.group(1)] = op_type
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
        return session


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
    "MISSING_KERNEL",
    "HalfPrecisionFallbackWarning",
    "missing_half_kernel",
    "open_session",
    "warn_of_a_half_export",
    "widen",
]
