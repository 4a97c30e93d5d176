"""ONNX Runtime's ``com.microsoft`` optimizer nodes: which optimizer each computes, and appending them.

ONNX Runtime's training build updates in place with its own kernels, which
output only a bool[1] flag:

- ``AdamWOptimizer(learning_rate, step, params, gradients, first_order_moments,
  second_order_moments)``: :class:`onnxtrain.optim.AdamW` without amsgrad
  (attributes ``alpha``, ``beta``: the betas, ``epsilon``, ``weight_decay``,
  ``correct_bias``: ``bias_correction``, ``adam_mode``);
- ``SGDOptimizerV2(learning_rate, params, gradients)``: :class:`onnxtrain.optim.SGD`
  without momentum or weight decay, ``p = p - lr * g``;
- ``InplaceClipGradNorm(gradients)``: :class:`onnxtrain.optim.ClipGradNorm` (``max_norm``).

The hyper-parameters are :class:`onnxtrain.optim.AdamW`'s: this module only
translates them to the nodes' attributes (:func:`adamw_attributes`) and back
(:func:`optimizer_of_nodes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import onnx
from onnx import helper

from onnxtrain.graph.attributes import attribute
from onnxtrain.graph.builder import GraphBuilder
from onnxtrain.optim.adam import AdamW
from onnxtrain.optim.base import Optimizer
from onnxtrain.optim.clip import ClipGradNorm
from onnxtrain.optim.sgd import SGD

MS_DOMAIN = "com.microsoft"
ADAMW_OP = "AdamWOptimizer"
SGD_OP = "SGDOptimizerV2"
CLIP_OP = "InplaceClipGradNorm"


@dataclass(frozen=True)
class OrtOptimizerNode:
    """ONNX Runtime's node for one optimizer, as its ``onnxblock.optim`` writes it.

    Attributes:
        name: the ``onnxblock.optim`` class that writes it (``AdamW``, ``SGD``).
        op_type: the ``com.microsoft`` operator.
        flag: the name of its bool[1] output in the sequence model.
        moment_sequences: how many moment sequences ONNX Runtime's model takes
            (SGD's ``first_order_moments`` is an input the node does not read).
    """

    name: str
    op_type: str
    flag: str
    moment_sequences: int

    def inputs(self, learning_rate: str, step: str, params: str, gradients: str, moments: Sequence[str]) -> list[str]:
        """The node's inputs, in ONNX Runtime's order (``SGDOptimizerV2`` reads no step and no moment)."""
        if self.op_type == SGD_OP:
            return [learning_rate, params, gradients]
        return [learning_rate, step, params, gradients, *moments]


ADAMW_NODE = OrtOptimizerNode("AdamW", ADAMW_OP, "adamw.updated_flag", 2)
SGD_NODE = OrtOptimizerNode("SGD", SGD_OP, "update_completed", 1)


def ort_node(optimizer: Optimizer) -> OrtOptimizerNode:
    """ONNX Runtime's node computing ``optimizer``'s step, or ``ValueError`` naming those there are.

    ONNX Runtime's on-device runtime knows AdamW (``adam_mode`` 0 or 1,
    without amsgrad) and plain SGD (no momentum, no weight decay).
    """
    hyper = optimizer.hyperparameters()
    clip = optimizer.clip_grad
    if clip is not None and (not isinstance(clip, ClipGradNorm) or clip.norm_type != 2.0):
        raise ValueError(
            f"{optimizer!r} clips with {clip!r}, and ONNX Runtime's on-device interface clips the gradients' L2 "
            "norm only (InplaceClipGradNorm): use ClipGradNorm(max_norm), or the per-parameter optimizer model "
            "(generate_artifacts, target='onnxruntime'), which takes any clipping"
        )
    if hyper.get("lr_scale"):
        raise ValueError(
            f"{optimizer!r} steps some parameters at another learning rate (lr_scale), which ONNX Runtime's on-device "
            "optimizers, with one learning rate for all, cannot: drop lr_scale, or target='onnxruntime'"
        )
    if hyper.get("no_decay") and hyper["weight_decay"]:
        raise ValueError(
            f"{optimizer!r} decays some parameters and not others (no_decay), which ONNX Runtime's on-device "
            "optimizers, with one weight_decay for all, cannot: drop no_decay, or target='onnxruntime'"
        )
    if isinstance(optimizer, AdamW) and not hyper["amsgrad"]:
        return ADAMW_NODE
    if type(optimizer) is SGD and not any(hyper[k] for k in ("momentum", "weight_decay", "nesterov")):
        return SGD_NODE
    raise ValueError(
        f"{optimizer!r} has no counterpart in ONNX Runtime's on-device training runtime, which has "
        "AdamW (without amsgrad) and SGD (without momentum or weight decay) only: choose one of those, or "
        "target='onnxruntime' for every optimizer"
    )


def node_attributes(optimizer: Optimizer) -> dict[str, Any]:
    """The attributes of the node :func:`ort_node` gives for ``optimizer`` (none for SGD)."""
    return adamw_attributes(optimizer) if isinstance(optimizer, AdamW) else {}


def adamw_attributes(optimizer: AdamW) -> dict[str, Any]:
    """The attributes of ``com.microsoft::AdamWOptimizer`` for ``optimizer`` (``alpha``, ``beta``: the betas)."""
    hyper = optimizer.hyperparameters()
    beta1, beta2 = hyper["betas"]
    return {
        "alpha": float(beta1), "beta": float(beta2), "epsilon": float(hyper["eps"]),
        "weight_decay": float(hyper["weight_decay"]), "correct_bias": int(bool(hyper["bias_correction"])),
        "adam_mode": int(hyper.get("adam_mode", 0)),
    }  # fmt: skip


def append_flag_node(
    builder: GraphBuilder,
    op_type: str,
    inputs: Sequence[str],
    attributes: dict[str, Any],
    *,
    output: str | None = None,
    hint: str | None = None,
) -> str:
    """Append ``com.microsoft::<op_type>`` writing ``output`` (else a fresh name from ``hint``); return its flag.

    The flag is declared bool[1]: onnx infers no type for ONNX Runtime's training operators.
    """
    if output is None:
        flag = builder.add_node1(op_type, list(inputs), domain=MS_DOMAIN, hint=hint, **attributes)
    else:
        flag = builder.add_node(op_type, list(inputs), [output], domain=MS_DOMAIN, **attributes)[0]
    builder.model.graph.value_info.append(helper.make_tensor_value_info(flag, onnx.TensorProto.BOOL, [1]))
    builder.sync()
    return flag


def append_clip_node(builder: GraphBuilder, gradients: str, clip: ClipGradNorm) -> str:
    """Append ``com.microsoft::InplaceClipGradNorm`` on the sequence ``gradients``; return its output."""
    clipped = builder.add_node1(
        CLIP_OP, [gradients], domain=MS_DOMAIN, max_norm=float(clip.max_norm), hint="clip_grad_norm_output"
    )
    builder.model.graph.value_info.append(helper.make_value_info(clipped, builder.type_of(gradients)))
    return clipped


def optimizer_of_nodes(model: onnx.ModelProto) -> Optimizer | None:
    """The optimizer ONNX Runtime's ``AdamWOptimizer``/``SGDOptimizerV2`` node of ``model`` computes
    (with its ``InplaceClipGradNorm``), or ``None`` where it has neither."""
    nodes = {node.op_type: node for node in model.graph.node if node.domain == MS_DOMAIN}
    clip_node = nodes.get(CLIP_OP)
    clip = None
    if clip_node is not None:
        clip = ClipGradNorm(_attribute(clip_node, "max_norm", 1.0))
    if ADAMW_OP in nodes:
        node = nodes[ADAMW_OP]
        return AdamW(
            bool(_attribute(node, "correct_bias", 1)),
            (_attribute(node, "alpha", 0.9), _attribute(node, "beta", 0.999)),
            _attribute(node, "epsilon", 1e-8),
            _attribute(node, "weight_decay", 0.0),
            clip,
            adam_mode=int(_attribute(node, "adam_mode", 0)),
        )
    if SGD_OP in nodes:
        return SGD(clip_grad=clip)
    return None


def _attribute(node: onnx.NodeProto, name: str, default: float) -> float:
    return float(attribute(node, name, default))


__all__ = [
    "ADAMW_NODE",
    "ADAMW_OP",
    "CLIP_OP",
    "MS_DOMAIN",
    "SGD_NODE",
    "SGD_OP",
    "OrtOptimizerNode",
    "adamw_attributes",
    "append_clip_node",
    "append_flag_node",
    "node_attributes",
    "optimizer_of_nodes",
    "ort_node",
]
