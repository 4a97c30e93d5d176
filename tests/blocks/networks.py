"""Small point-wise networks for the tests of derivatives inside losses, in ONNX and in torch."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ACTIVATIONS = ("Tanh", "Sigmoid", "Softplus", "Relu", "Gelu", "Erf")


def mlp(
    widths: Sequence[int],
    *,
    activation: str = "Tanh",
    elem_type: int = TensorProto.DOUBLE,
    seed: int = 0,
    batch: int | str = "N",
    opset: int = 20,
) -> onnx.ModelProto:
    """``y = Gemm(act(... act(Gemm(x, W0, b0)) ...), W_last, b_last)``: input ``x: [batch, widths[0]]``, output
    ``y: [batch, widths[-1]]``; parameters ``W0, b0, W1, b1, ...`` (scaled normal draws)."""
    rng = np.random.default_rng(seed)
    dtype = helper.tensor_dtype_to_np_dtype(elem_type)
    initializers, nodes = [], []
    value = "x"
    for layer, (fan_in, fan_out) in enumerate(itertools.pairwise(widths)):
        weight = rng.normal(size=(fan_in, fan_out)) / np.sqrt(fan_in) * 1.5
        bias = rng.normal(size=fan_out) * 0.3
        initializers += [
            numpy_helper.from_array(weight.astype(dtype), f"W{layer}"),
            numpy_helper.from_array(bias.astype(dtype), f"b{layer}"),
        ]
        last = layer == len(widths) - 2
        out = "y" if last else f"a{layer}"
        nodes.append(helper.make_node("Gemm", [value, f"W{layer}", f"b{layer}"], [out]))
        if not last:
            value = f"h{layer}"
            nodes.append(helper.make_node(activation, [out], [value]))
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", elem_type, [batch, widths[0]])],
        [helper.make_tensor_value_info("y", elem_type, [batch, widths[-1]])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def parameters(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The model's initializers as arrays."""
    return {tensor.name: numpy_helper.to_array(tensor) for tensor in model.graph.initializer}


def torch_mlp(model: onnx.ModelProto, activation: str = "Tanh") -> tuple[dict[str, Any], Callable[[Any], Any]]:
    """The same network in torch (float64): its parameters (leaf tensors that require gradients) and ``f(x)``."""
    import torch

    functions = {
        "Tanh": torch.tanh,
        "Sigmoid": torch.sigmoid,
        "Softplus": torch.nn.functional.softplus,
        "Relu": torch.relu,
        "Gelu": torch.nn.functional.gelu,
        "Erf": torch.erf,
    }
    act = functions[activation]
    params = {name: torch.tensor(array, requires_grad=True) for name, array in parameters(model).items()}
    layers = len(params) // 2

    def forward(x: Any) -> Any:
        for layer in range(layers):
            x = x @ params[f"W{layer}"] + params[f"b{layer}"]
            if layer < layers - 1:
                x = act(x)
        return x

    return params, forward
