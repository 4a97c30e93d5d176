"""transformers' DistilBERT (tiny, random weights) in the three forms torch exports it, for the LoRA tests.

The model and its TorchScript export come from :mod:`tests.transformers.models`
(``distilbert``: 2 layers, hidden size 32, 4 heads, vocabulary 100, 3 classes).
Each ``Linear`` exports its weight differently:

- ``torchscript``: TorchScript in training mode, unfolded: ``MatMul(x, Transpose(W))``,
  ``W`` the parameter ``[out, in]`` under torch's name;
- ``folded``: the same with ``do_constant_folding=True``: ``MatMul(x, W^T)``, the
  transposed weight renamed ``onnx::MatMul_<n>``;
- ``dynamo``: torch's default exporter (needs ``onnxscript``): ``MatMul(x, W^T)``, named
  ``val_<n>``; the nodes' module scopes in their ``metadata_props``.

The node names of both TorchScript exports carry the module path
(``/model/distilbert/transformer/layer.0/attention/q_lin/MatMul``).
"""

from __future__ import annotations

import functools
import io
import warnings
from typing import Any, Literal

import numpy as np
import onnx
import pytest

from tests.transformers import models

Export = Literal["torchscript", "folded", "dynamo"]
EXPORTS: tuple[Export, ...] = ("torchscript", "folded", "dynamo")
#: The query and value projections of both layers, as torch names them.
ADAPTED = tuple(
    f"model.distilbert.transformer.layer.{i}.attention.{p}.weight" for i in (0, 1) for p in ("q_lin", "v_lin")
)


@functools.cache
def exported(how: Export) -> onnx.ModelProto:
    """DistilBERT exported as ``how`` says, ``ids: int64[batch, seq]`` to ``y: float[batch, 3]``."""
    if how == "torchscript":
        return models.exported("distilbert").model
    torch = pytest.importorskip("torch")
    module = models.exported("distilbert").module
    module.load_state_dict(models.exported("distilbert").state)
    ids = torch.from_numpy(models.batch("distilbert", np.random.default_rng(0), 5)["ids"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if how == "dynamo":
            pytest.importorskip("onnxscript")
            axes = {"ids": {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}}
            program = torch.onnx.export(
                module, (ids,), dynamo=True, input_names=["ids"], output_names=["y"], dynamic_shapes=axes, verbose=False
            )
            return program.model_proto
        buffer = io.BytesIO()
        torch.onnx.export(
            module,
            (ids,),
            buffer,
            dynamo=False,
            training=torch.onnx.TrainingMode.TRAINING,
            do_constant_folding=True,
            opset_version=models.OPSET,
            input_names=["ids"],
            output_names=["y"],
            dynamic_axes={"ids": {0: "batch", 1: "seq"}, "y": {0: "batch"}},
        )
    return onnx.load_from_string(buffer.getvalue())


def torch_names(model: onnx.ModelProto, weights: dict[str, bool]) -> dict[str, str]:
    """``{ONNX weight: torch parameter}``, found by value: a weight stored ``[out, in]`` (``weights[name]``
    true) is the parameter itself, one stored ``[in, out]`` its transpose."""
    parameters = {k: v.numpy() for k, v in models.exported("distilbert").state.items()}
    found = {}
    for tensor in model.graph.initializer:
        if tensor.name in weights:
            value = onnx.numpy_helper.to_array(tensor)
            value = value if weights[tensor.name] else value.T
            (found[tensor.name],) = [k for k, p in parameters.items() if p.shape == value.shape and (p == value).all()]
    return found


def torch_loss_and_gradients(
    adapters: dict[str, tuple[np.ndarray, np.ndarray]], scale: float, data: dict[str, np.ndarray]
) -> tuple[float, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """torch's cross-entropy with each named ``Linear`` weight ``W`` made ``W + scale (A B)^T``, and the
    gradients of each ``(A, B)`` (``A: [in, rank]``, ``B: [rank, out]``), by torch parameter name."""
    torch = pytest.importorskip("torch")
    ex = models.exported("distilbert")
    module: Any = ex.module
    module.load_state_dict(ex.state)
    module.train()
    leaves = {
        name: (torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True))
        for name, (a, b) in adapters.items()
    }
    overrides = {name: ex.state[name] + scale * (a @ b).T for name, (a, b) in leaves.items()}
    logits = torch.func.functional_call(module, overrides, (torch.from_numpy(data["ids"]),))
    loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(data["labels"]))
    loss.backward()
    return float(loss.item()), {name: (a.grad.numpy(), b.grad.numpy()) for name, (a, b) in leaves.items()}
