"""Shared pieces of the LoRA tests: the bases, adapters on them, training and running models."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from onnxtrain import artifacts
from onnxtrain.api import CheckpointState, Module, Optimizer
from tests.lora import quantize

BaseKind = Literal["float", "nbits", "dql"]
BASE_KINDS: tuple[BaseKind, ...] = ("float", "nbits", "dql")

#: The GPT-2 projections adapters go beside, as glob patterns (they also match the quantized weights'
#: names, and their scales and zero points, which are no adaptable weights).
TARGETS = ["*c_attn.weight*", "*c_fc.weight*", "*c_proj.weight*", "lm_head.weight*"]
#: Quantized in the quantized bases (``h0.attn.c_proj.weight`` stays float: a mixed base).
QUANTIZED = ["h0.attn.c_attn.weight", "h0.mlp.c_fc.weight", "h0.mlp.c_proj.weight", "lm_head.weight"]
RANK, ALPHA = 4, 8.0


@dataclass(frozen=True)
class Base:
    """A base model and, per quantized weight, the float value it stands for (stored as the float one was)."""

    kind: BaseKind
    model: onnx.ModelProto
    dequantized: Mapping[str, np.ndarray]

    def torch_name(self, weight: str) -> str:
        """The torch parameter an ONNX weight (maybe quantized: ``_Q4``, ``.int8``) comes from."""
        return weight.removesuffix("_Q4").removesuffix(".int8")


def make_base(exported: onnx.ModelProto, kind: BaseKind) -> Base:
    """The exported float model, or it with :data:`QUANTIZED` 4-bit (MatMulNBits) or int8 (DequantizeLinear)."""
    if kind == "float":
        return Base(kind, exported, {})
    if kind == "nbits":
        return Base(kind, *quantize.matmul_nbits(exported, QUANTIZED))
    return Base(kind, *quantize.dequantize_linear(exported, QUANTIZED))


def with_values(model: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of ``model`` with the initializers named in ``values`` replaced."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for tensor in copy.graph.initializer:
        if tensor.name in values:
            tensor.CopyFrom(numpy_helper.from_array(np.asarray(values[tensor.name], tensor_dtype(tensor)), tensor.name))
    return copy


def tensor_dtype(tensor: onnx.TensorProto) -> np.dtype:
    return onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)


def run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], optimized: bool = True) -> list[np.ndarray]:
    """All outputs of ``model``; ``optimized=False`` turns onnxruntime's graph optimizations off.

    onnxruntime fuses ``DequantizeLinear`` + ``MatMul`` into ``MatMulNBits`` with
    int8-quantized activations by default (``session.qdq_matmulnbits_accuracy_level``
    4), which is not exact: comparisons of a DequantizeLinear base run unoptimized.
    """
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return list(ort.InferenceSession(model.SerializeToString(), options).run(None, dict(feeds)))


def inference_op_types(model: onnx.ModelProto) -> list[str]:
    """The op types of ``model``'s nodes less the ``Constant`` nodes that give its Dropouts' training flags:
    the nodes a merged model keeps (its Dropouts in inference mode read no flag)."""
    flags = {n.input[2] for n in model.graph.node if n.op_type == "Dropout" and len(n.input) > 2}
    return [n.op_type for n in model.graph.node if not (n.op_type == "Constant" and set(n.output) <= flags)]


def generate(adapted: onnx.ModelProto, names: Sequence[str], folder: Path) -> Path:
    """Cross-entropy and AdamW artifacts training ``names`` only, in ``folder``."""
    artifacts.generate_artifacts(
        adapted,
        requires_grad=list(names),
        frozen_params=[],
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=folder,
    )
    return folder


def fine_tune(
    folder: Path, ids: np.ndarray, labels: np.ndarray, steps: int, learning_rate: float = 1e-2
) -> tuple[list[float], CheckpointState]:
    """``steps`` full-batch AdamW steps with the artifacts in ``folder``: the losses and the trained state."""
    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    module = Module(folder / "training_model.onnx", state, folder / "eval_model.onnx")
    optimizer = Optimizer(folder / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(learning_rate)
    losses = []
    for _ in range(steps):
        losses.append(float(module(ids, labels)))
        optimizer.step()
        module.lazy_reset_grad()
    return losses, state


def trained_values(state: CheckpointState, names: Sequence[str]) -> dict[str, np.ndarray]:
    """The values of ``names`` in the runtime's state."""
    return {name: np.asarray(state.parameters[name].data) for name in names}


def small_model() -> onnx.ModelProto:
    """``y = Gemm(Gather(E, ids) @ W1, W2, b)``: E is read by Gather, b is Gemm's third input."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(size=(5, 4)).astype(np.float32), "E"),
        numpy_helper.from_array(rng.normal(size=(4, 3)).astype(np.float32), "W1"),
        numpy_helper.from_array(rng.normal(size=(2, 3)).astype(np.float32), "W2"),
        numpy_helper.from_array(rng.normal(size=(2,)).astype(np.float32), "b"),
    ]
    nodes = [
        helper.make_node("Gather", ["E", "ids"], ["h"]),
        helper.make_node("MatMul", ["h", "W1"], ["u"]),
        helper.make_node("Gemm", ["u", "W2", "b"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
