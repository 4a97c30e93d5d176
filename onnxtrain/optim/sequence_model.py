"""ONNX Runtime's optimizer-model interface, whose tensors come in sequences, for onnxtrain's optimizers.

:class:`SequenceOptimizer` builds, for an :mod:`onnxtrain.optim` optimizer and
from ``TrainingBlock.parameters()``, a model with ONNX Runtime's inputs, in its
order::

    learning_rate  float[1]
    step           int64[1]   (the step being taken, 1-based)
    params, gradients, first_order_moments (, second_order_moments for AdamW)
                   sequences of tensors, in parameter order

``target="onnxruntime"`` writes standard operators, so that any stock
``onnxruntime.InferenceSession`` runs it: each tensor is taken out with
``SequenceAt``, updated by the optimizer's own emission, and the new values
come back as the sequences ``params.updated``, ``first_order_moments.updated``
(, ``second_order_moments.updated``); the model's metadata records the
optimizer (:data:`CONFIG_KEY`). ``target="onnxruntime-training"`` writes ONNX
Runtime's own nodes (:mod:`onnxtrain.optim.ort_nodes`), which update in place
and output only a bool flag; only ONNX Runtime's training build has their
kernels. :func:`optimizer_of` reads the optimizer back from either model.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import onnx
from onnx import helper

from onnxtrain.blocks.block import ForwardBlock
from onnxtrain.graph.builder import tensor_type
from onnxtrain.optim.adam import AdamW
from onnxtrain.optim.base import Optimizer, ParameterSpec, grad_name, state_name, trainable_specs
from onnxtrain.optim.clip import ClipGradNorm
from onnxtrain.optim.emit import LEARNING_RATE, STEP, Scalars
from onnxtrain.optim.ort_nodes import (
    ADAMW_NODE,
    append_clip_node,
    append_flag_node,
    node_attributes,
    optimizer_of_nodes,
    ort_node,
)
from onnxtrain.optim.sgd import SGD

Target = Literal["onnxruntime", "onnxruntime-training"]

PARAMS = "params"
GRADIENTS = "gradients"
MOMENTS = ("first_order_moments", "second_order_moments")
#: The suffix of the standard model's outputs: ``params.updated``, ...
UPDATED = ".updated"
#: Metadata key of the standard model: the optimizer it computes, as JSON (read back by :func:`optimizer_of`).
CONFIG_KEY = "onnxtrain.onnxblock.optimizer"

TARGETS = ("onnxruntime", "onnxruntime-training")


class SequenceOptimizer(ForwardBlock):
    """Builds the optimizer model of ``optimizer`` with ONNX Runtime's sequence interface (module docstring).

    Only optimizers ONNX Runtime's on-device runtime has are accepted
    (:func:`onnxtrain.optim.ort_nodes.ort_node`); calling the block returns
    the name of ``params.updated`` (standard) or of the update flag.
    """

    def __init__(self, optimizer: Optimizer, target: Target = "onnxruntime") -> None:
        super().__init__()
        node = ort_node(optimizer)
        if target not in TARGETS:
            raise ValueError(f"target={target!r} is not a known runtime; choose one of {list(TARGETS)}")
        self._inner = optimizer
        self._node = node
        self._target = target

    @property
    def optimizer(self) -> Optimizer:
        """The :mod:`onnxtrain.optim` optimizer whose step this model takes."""
        return self._inner

    @property
    def target(self) -> Target:
        """The runtime the model is written for."""
        return self._target

    def __repr__(self) -> str:
        return f"{self._node.name}({self._inner!r}, target={self._target!r})"

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        """Build the model; return the name of ``params.updated`` (standard) or of the update flag."""
        names = super().__call__(*args, **kwargs)
        return names[0]

    def build(self, parameters: Any) -> list[str]:
        """Inputs, then the update; returns the output names (the first is what the call returns)."""
        owner = self._node.name
        specs = trainable_specs(owner, parameters)
        elem_types = {spec.elem_type for spec in specs}
        if len(elem_types) != 1:
            raise ValueError(
                f"{owner}: a sequence holds tensors of one element type, but the trainable parameters mix "
                f"{sorted(elem_types)}; use onnxtrain.optim's optimizers (one input per tensor) instead"
            )
        elem_type = elem_types.pop()
        b = self.builder
        lr = b.add_input(LEARNING_RATE, tensor_type(onnx.TensorProto.FLOAT, [1]))
        step = b.add_input(STEP, tensor_type(onnx.TensorProto.INT64, [1]))
        sequence_type = helper.make_sequence_type_proto(helper.make_tensor_type_proto(elem_type, None))
        moments = MOMENTS[: self._node.moment_sequences]
        for name in (PARAMS, GRADIENTS, *moments):
            b.add_input(name, sequence_type)
        if self._target == "onnxruntime-training":
            return [self._com_microsoft(lr, step, moments)]
        return self._standard(Scalars(b, lr, step), specs)

    def _standard(self, scalars: Scalars, specs: list[ParameterSpec]) -> list[str]:
        """``SequenceAt`` each tensor, update, ``SequenceConstruct`` the new values."""
        b = scalars.builder
        num_states = self._inner.num_states
        for index, spec in enumerate(specs):
            position = b.add_initializer(np.asarray(index, dtype=np.int64), f"index{index}")
            b.add_node("SequenceAt", [PARAMS, position], [spec.name])
            b.add_node("SequenceAt", [GRADIENTS, position], [grad_name(spec.name)])
            for k in range(num_states):
                b.add_node("SequenceAt", [MOMENTS[k], position], [state_name(spec.name, k)])
        updated = self._inner.emit_updates(scalars, specs)
        width = 1 + num_states
        outputs = []
        for k, sequence in enumerate((PARAMS, *MOMENTS[:num_states])):
            values = [updated[j * width + k] for j in range(len(specs))]
            outputs += b.add_node("SequenceConstruct", values, [sequence + UPDATED])
        b.model.metadata_props.add(key=CONFIG_KEY, value=json.dumps(_config(self._inner)))
        return outputs

    def _com_microsoft(self, lr: str, step: str, moments: Sequence[str]) -> str:
        """ONNX Runtime's node (after ``InplaceClipGradNorm`` when clipping): updates in place, outputs a flag."""
        b = self.builder
        gradients = GRADIENTS
        clip = self._inner.clip_grad
        if clip is not None:
            gradients = append_clip_node(b, GRADIENTS, clip)
        inputs = self._node.inputs(lr, step, PARAMS, gradients, moments)
        return append_flag_node(b, self._node.op_type, inputs, node_attributes(self._inner), output=self._node.flag)


def sequence_optimizer(optimizer: Optimizer, target: Target) -> SequenceOptimizer:
    """The ONNX Runtime-interface block computing ``optimizer``'s step, or ``ValueError`` naming those there are.

    ONNX Runtime's on-device runtime knows AdamW (``adam_mode`` 0 or 1,
    without amsgrad) and plain SGD (no momentum, no weight decay). The block
    holds a plain :class:`~onnxtrain.optim.AdamW` or :class:`~onnxtrain.optim.SGD`
    with ``optimizer``'s hyper-parameters and clipping.
    """
    clip = optimizer.clip_grad
    if ort_node(optimizer) is ADAMW_NODE:
        return SequenceOptimizer(AdamW(**optimizer.hyperparameters(), clip_grad=clip), target)
    return SequenceOptimizer(SGD(clip_grad=clip), target)


def _config(optimizer: Optimizer) -> dict[str, Any]:
    clip = optimizer.clip_grad
    return {
        "optimizer": type(optimizer).__name__,
        "hyperparameters": optimizer.hyperparameters(),
        "max_norm": None if clip is None else clip.max_norm,
    }


def optimizer_of(model: onnx.ModelProto) -> Optimizer | None:
    """The :mod:`onnxtrain.optim` optimizer a sequence-interface optimizer model computes, or ``None``.

    Reads the standard model's metadata, or the attributes of ONNX Runtime's
    ``AdamWOptimizer``/``SGDOptimizerV2`` (and ``InplaceClipGradNorm``).
    """
    metadata = {entry.key: entry.value for entry in model.metadata_props}
    if CONFIG_KEY not in metadata:
        return optimizer_of_nodes(model)
    config = json.loads(metadata[CONFIG_KEY])
    kinds: dict[str, type[AdamW] | type[SGD]] = {"AdamW": AdamW, "SGD": SGD}
    hyper = dict(config["hyperparameters"])
    if "betas" in hyper:
        hyper["betas"] = tuple(hyper["betas"])
    clip = None if config["max_norm"] is None else ClipGradNorm(config["max_norm"])
    return kinds[config["optimizer"]](**hyper, clip_grad=clip)


__all__ = [
    "CONFIG_KEY",
    "GRADIENTS",
    "MOMENTS",
    "PARAMS",
    "TARGETS",
    "UPDATED",
    "SequenceOptimizer",
    "Target",
    "optimizer_of",
    "sequence_optimizer",
]
