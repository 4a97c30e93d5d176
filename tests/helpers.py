"""Shared test helpers: small base models and running models in onnxruntime.

Stable API (other test packages import these):

- ``make_model(inputs, nodes=(), outputs=None, initializers=(), opset=17, ...)``
- ``run_model(model, feeds) -> list[np.ndarray]``
- ``identity_model(inputs, opset=17)``: a model whose outputs are its inputs
- ``FLOAT``, ``DOUBLE``, ... shorthands for ``onnx.TensorProto`` element types
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from onnxtrain import onnxblock
from onnxtrain.sessions import inference_session

FLOAT = onnx.TensorProto.FLOAT
DOUBLE = onnx.TensorProto.DOUBLE
FLOAT16 = onnx.TensorProto.FLOAT16
INT32 = onnx.TensorProto.INT32
INT64 = onnx.TensorProto.INT64
BOOL = onnx.TensorProto.BOOL

#: An input or output spec: ``(elem_type, shape)``; shape entries are ints,
#: symbolic names ("batch") or None; ``shape=None`` means unknown rank.
ValueSpec = tuple[int, Sequence[int | str | None] | None]

#: The NumPy dtype <-> ONNX element type pairs the float tests cover.
FLOAT_DTYPES: dict[type, int] = {np.float32: FLOAT, np.float64: DOUBLE}


def value_info(name: str, elem_type: int, shape: Sequence[int | str | None] | None) -> onnx.ValueInfoProto:
    """A tensor ``ValueInfoProto``."""
    return helper.make_tensor_value_info(name, elem_type, None if shape is None else list(shape))


def make_model(
    inputs: Mapping[str, ValueSpec],
    nodes: Sequence[onnx.NodeProto] = (),
    outputs: Mapping[str, ValueSpec] | Sequence[str] | None = None,
    initializers: Sequence[onnx.TensorProto | tuple[str, np.ndarray]] = (),
    opset: int = 17,
    *,
    ir_version: int | None = None,
    extra_opsets: Mapping[str, int] | None = None,
) -> onnx.ModelProto:
    """A small base model.

    Args:
        inputs: ``{name: (elem_type, shape)}``, e.g. ``{"x": (FLOAT, ["batch", 3])}``.
        nodes: the graph's nodes (``onnx.helper.make_node``).
        outputs: ``{name: (elem_type, shape)}``, or a list of names whose types
            are inferred by onnx shape inference; ``None``: the inputs themselves
            when there are no nodes, else the outputs of the last node.
        initializers: ``TensorProto`` or ``(name, array)`` pairs.
        opset: the ``ai.onnx`` opset.
        ir_version: the model's IR version (default: the lowest for ``opset``).
        extra_opsets: further ``{domain: version}`` imports.
    """
    tensors = [
        t if isinstance(t, onnx.TensorProto) else numpy_helper.from_array(np.asarray(t[1]), t[0]) for t in initializers
    ]
    opsets = [helper.make_opsetid("", opset)]
    opsets += [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    graph_inputs = [value_info(name, *spec) for name, spec in inputs.items()]
    if outputs is None:
        outputs = list(inputs) if not nodes else [name for name in nodes[-1].output if name]
    typed: list[onnx.ValueInfoProto] = []
    untyped: list[str] = []
    if isinstance(outputs, Mapping):
        typed = [value_info(name, *spec) for name, spec in outputs.items()]
    else:
        untyped = list(outputs)
    graph = helper.make_graph(list(nodes), "test_graph", graph_inputs, typed, tensors)
    model = helper.make_model(graph, opset_imports=opsets, producer_name="onnxtrain-tests")
    model.ir_version = helper.find_min_ir_version_for(opsets, ignore_unknown=True) if ir_version is None else ir_version
    if untyped:
        known = {value.name: value for value in graph_inputs}
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        known.update({value.name: value for value in inferred.graph.value_info})
        known.update({value.name: value for value in inferred.graph.output})
        for name in untyped:
            if name not in known:
                raise ValueError(f"cannot infer the type of output {name!r}; pass outputs as a dict")
            model.graph.output.append(known[name])
    return model


def identity_model(inputs: Mapping[str, ValueSpec], opset: int = 17) -> onnx.ModelProto:
    """A model whose outputs ``<name>_out`` are Identity copies of its inputs."""
    nodes = [helper.make_node("Identity", [name], [f"{name}_out"]) for name in inputs]
    outputs = {f"{name}_out": spec for name, spec in inputs.items()}
    return make_model(inputs, nodes, outputs, opset=opset)


def session(model: onnx.ModelProto | str) -> ort.InferenceSession:
    """A CPU onnxruntime session for ``model`` (a ModelProto, or a path)."""
    source: Any = model if isinstance(model, str) else model.SerializeToString()
    return inference_session(source)


def skip_unless_onnxruntime_loads(model: onnx.ModelProto, what: str) -> None:
    """Skip the test when the installed onnxruntime cannot load ``model`` (an operator or opset newer than
    the release: CumProd needs opset 26, which onnxruntime 1.23 does not load)."""
    try:
        session(model)
    except Exception as error:
        pytest.skip(f"onnxruntime {ort.__version__} cannot load {what}: {error}")


def run_model(model: onnx.ModelProto | str, feeds: Mapping[str, Any]) -> list[np.ndarray]:
    """Run ``model`` on CPU in onnxruntime and return all its outputs."""
    return session(model).run(None, dict(feeds))


def output_names(model: onnx.ModelProto) -> list[str]:
    """The names of a model's graph outputs."""
    return [value.name for value in model.graph.output]


def tolerance(dtype: Any) -> dict[str, float]:
    """``assert_allclose`` tolerances for results in ``dtype``."""
    dtype = np.dtype(dtype)
    if dtype == np.float64:
        return {"rtol": 1e-10, "atol": 1e-12}
    if dtype == np.float16:
        return {"rtol": 1e-3, "atol": 1e-3}
    return {"rtol": 1e-5, "atol": 1e-6}


def export_for_training(
    module: Any,
    args: tuple[Any, ...],
    input_names: Sequence[str],
    output_names: Sequence[str],
    *,
    opset: int,
    dynamic_axes: Mapping[str, Mapping[int, str]] | None = None,
    **options: Any,
) -> onnx.ModelProto:
    """``module`` as torch's TorchScript exporter writes it for training: ``dynamo=False``,
    ``training=TrainingMode.TRAINING``, no constant folding, its deprecation notices silenced;
    ``options``: more of ``torch.onnx.export``'s arguments.

    The TorchScript exporter honours ``training`` (BatchNormalization and Dropout in training mode)
    and keeps the parameters as initializers named as in ``named_parameters()``; torch 2.13's default
    exporter does neither and needs ``onnxscript``.
    """
    import io
    import warnings

    import torch

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice, tracer warnings
        torch.onnx.export(
            module,
            args,
            buffer,
            dynamo=False,
            training=torch.onnx.TrainingMode.TRAINING,
            do_constant_folding=False,
            opset_version=opset,
            input_names=list(input_names),
            output_names=list(output_names),
            dynamic_axes=None if dynamic_axes is None else {k: dict(v) for k, v in dynamic_axes.items()},
            **options,
        )
    return onnx.load_from_string(buffer.getvalue())


class MSETraining(onnxblock.TrainingBlock):
    """The mean squared error of the base model's output against a new input ``target``."""

    def __init__(self) -> None:
        super().__init__()
        self.loss = onnxblock.loss.MSELoss()

    def build(self, output_name: str) -> str:
        return self.loss(output_name)
