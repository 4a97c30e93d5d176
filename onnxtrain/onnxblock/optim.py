"""ONNX Runtime's ``onnxblock.optim``: optimizer models whose tensors come in sequences.

``AdamW`` and ``SGD`` build, from ``TrainingBlock.parameters()``, a model with
ONNX Runtime's inputs, in its order::

    learning_rate  float[1]
    step           int64[1]   (the step being taken, 1-based)
    params, gradients, first_order_moments (, second_order_moments for AdamW)
                   sequences of tensors, in parameter order

``target="onnxruntime"`` (the default) writes standard operators, so that
any stock ``onnxruntime.InferenceSession`` runs it: each tensor is taken out
with ``SequenceAt``, updated by :mod:`onnxtrain.optim`'s emission, and the new
values come back as the sequences ``params.updated``,
``first_order_moments.updated`` (, ``second_order_moments.updated``). Calling
the block returns the name of ``params.updated``.

``target="onnxruntime-training"`` writes ONNX Runtime's own nodes
(``com.microsoft::AdamWOptimizer``, ``SGDOptimizerV2``, and
``InplaceClipGradNorm`` when clipping), which update in place and output only
a bool flag, whose name the call returns; only ONNX Runtime's training build
has their kernels.

``AdamW`` computes ONNX Runtime's math (``adam_mode=1``, Hugging Face's:
bias correction on the step size, weight decay after the update) unless
``adam_mode=0`` (torch's, what :class:`onnxtrain.optim.AdamW` computes by
default) is asked for. ``ClipGradNorm`` takes a list of gradient names or the
name of a sequence. onnxtrain's other optimizers (momentum SGD, Adam, Adagrad,
RMSprop) are in :mod:`onnxtrain.optim`, with one input per tensor.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import onnx
from onnx import helper

from onnxtrain import optim
from onnxtrain.blocks.block import Block, ForwardBlock
from onnxtrain.graph.builder import tensor_type
from onnxtrain.optim.base import ParameterSpec, grad_name, state_name, trainable_specs
from onnxtrain.optim.clip import ClipGradNorm
from onnxtrain.optim.emit import LEARNING_RATE, STEP, Scalars

Target = Literal["onnxruntime", "onnxruntime-training"]

PARAMS = "params"
GRADIENTS = "gradients"
MOMENTS = ("first_order_moments", "second_order_moments")
#: The suffix of the standard model's outputs: ``params.updated``, ...
UPDATED = ".updated"
#: Metadata key of the standard model: the optimizer it computes, as JSON (read back by :func:`optimizer_of`).
CONFIG_KEY = "onnxtrain.onnxblock.optimizer"

_TARGETS = ("onnxruntime", "onnxruntime-training")


class _SequenceOptimizer(ForwardBlock):
    """Builds the optimizer model of ``inner`` with ONNX Runtime's sequence interface."""

    op_type: str = ""  # the com.microsoft operator of the "onnxruntime-training" target
    flag_name: str = ""  # its output
    num_moment_inputs: int = 0  # how many moment sequences ONNX Runtime's model takes

    def __init__(self, inner: optim.Optimizer, target: Target) -> None:
        super().__init__()
        if target not in _TARGETS:
            raise ValueError(f"target={target!r} is not a known runtime; choose one of {list(_TARGETS)}")
        self._inner = inner
        self._target = target

    @property
    def optimizer(self) -> optim.Optimizer:
        """The :mod:`onnxtrain.optim` optimizer whose step this model takes."""
        return self._inner

    @property
    def target(self) -> Target:
        """The runtime the model is written for."""
        return self._target  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._inner!r}, target={self._target!r})"

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        """Build the model; return the name of ``params.updated`` (standard) or of the update flag."""
        names = super().__call__(*args, **kwargs)
        return names[0]

    def build(self, parameters: Any) -> list[str]:
        """Inputs, then the update; returns the output names (the first is what the call returns)."""
        owner = type(self).__name__
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
        moments = MOMENTS[: self.num_moment_inputs]
        for name in (PARAMS, GRADIENTS, *moments):
            b.add_input(name, sequence_type)
        if self._target == "onnxruntime-training":
            return [self._com_microsoft(lr, step, moments)]
        return self._standard(Scalars(b, lr, step), specs, elem_type)

    def _standard(self, scalars: Scalars, specs: list[ParameterSpec], elem_type: int) -> list[str]:
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
        """ONNX Runtime's node: updates in place, outputs a bool[1] flag."""
        b = self.builder
        gradients = GRADIENTS
        clip = self._inner.clip_grad
        if clip is not None:
            gradients = b.add_node1("InplaceClipGradNorm", [GRADIENTS], domain="com.microsoft",
                                    max_norm=float(clip.max_norm), hint="clip_grad_norm_output")  # fmt: skip
            b.model.graph.value_info.append(helper.make_value_info(gradients, b.type_of(GRADIENTS)))
        flag = b.add_node(
            self.op_type, self._node_inputs(lr, step, gradients, moments), [self.flag_name],
            domain="com.microsoft", **self._attributes(),
        )[0]  # fmt: skip
        b.model.graph.value_info.append(helper.make_tensor_value_info(flag, onnx.TensorProto.BOOL, [1]))
        b.sync()
        return flag

    def _node_inputs(self, lr: str, step: str, gradients: str, moments: Sequence[str]) -> list[str]:
        raise NotImplementedError

    def _attributes(self) -> dict[str, Any]:
        return {}


class AdamW(_SequenceOptimizer):
    """ONNX Runtime's ``onnxblock.optim.AdamW``: its arguments, defaults, inputs and math (module docstring)."""

    op_type = "AdamWOptimizer"
    flag_name = "adamw.updated_flag"
    num_moment_inputs = 2

    def __init__(
        self,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        clip_grad: ClipGradNorm | None = None,
        *,
        adam_mode: int = 1,
        target: Target = "onnxruntime",
    ) -> None:
        inner = optim.AdamW(bias_correction, betas, eps, weight_decay, clip_grad, adam_mode=adam_mode)
        super().__init__(inner, target)

    def _node_inputs(self, lr: str, step: str, gradients: str, moments: Sequence[str]) -> list[str]:
        return [lr, step, PARAMS, gradients, *moments]

    def _attributes(self) -> dict[str, Any]:
        hyper = self._inner.hyperparameters()
        return _adamw_attributes(hyper["bias_correction"], hyper["betas"], hyper["eps"], hyper["weight_decay"],
                                 hyper.get("adam_mode", 0))  # fmt: skip


def _adamw_attributes(
    bias_correction: bool, betas: tuple[float, float], eps: float, weight_decay: float, adam_mode: int
) -> dict[str, Any]:
    """The attributes of ``com.microsoft::AdamWOptimizer`` (``alpha``, ``beta``: the betas)."""
    return {
        "alpha": float(betas[0]), "beta": float(betas[1]), "epsilon": float(eps),
        "weight_decay": float(weight_decay), "correct_bias": int(bool(bias_correction)), "adam_mode": int(adam_mode),
    }  # fmt: skip


class SGD(_SequenceOptimizer):
    """ONNX Runtime's ``onnxblock.optim.SGD``: ``p = p - lr * g``; ``first_order_moments`` is an input it
    does not read, as in ONNX Runtime."""

    op_type = "SGDOptimizerV2"
    flag_name = "update_completed"
    num_moment_inputs = 1

    def __init__(self, clip_grad: ClipGradNorm | None = None, *, target: Target = "onnxruntime") -> None:
        super().__init__(optim.SGD(clip_grad=clip_grad), target)

    def _node_inputs(self, lr: str, step: str, gradients: str, moments: Sequence[str]) -> list[str]:
        return [lr, PARAMS, gradients]


def sequence_optimizer(optimizer: optim.Optimizer, target: Target) -> _SequenceOptimizer:
    """The ONNX Runtime-interface block computing ``optimizer``'s step, or ``ValueError`` naming those there are.

    ONNX Runtime's on-device runtime knows AdamW (``adam_mode`` 0 or 1,
    without amsgrad) and plain SGD (no momentum, no weight decay).
    """
    hyper = optimizer.hyperparameters()
    clip = optimizer.clip_grad
    if isinstance(optimizer, optim.AdamW) and not hyper["amsgrad"]:
        return AdamW(hyper["bias_correction"], hyper["betas"], hyper["eps"], hyper["weight_decay"], clip,
                     adam_mode=hyper.get("adam_mode", 0), target=target)  # fmt: skip
    if type(optimizer) is optim.SGD and not any(hyper[k] for k in ("momentum", "weight_decay", "nesterov")):
        return SGD(clip, target=target)
    raise ValueError(
        f"{optimizer!r} has no counterpart in ONNX Runtime's on-device training runtime, which has "
        "AdamW (without amsgrad) and SGD (without momentum or weight decay) only: choose one of those, or "
        "target='onnxruntime' for every optimizer"
    )


def _config(optimizer: optim.Optimizer) -> dict[str, Any]:
    clip = optimizer.clip_grad
    return {
        "optimizer": type(optimizer).__name__,
        "hyperparameters": optimizer.hyperparameters(),
        "max_norm": None if clip is None else clip.max_norm,
    }


def optimizer_of(model: onnx.ModelProto) -> optim.Optimizer | None:
    """The :mod:`onnxtrain.optim` optimizer a sequence-interface optimizer model computes, or ``None``.

    Reads the standard model's metadata, or the attributes of ONNX Runtime's
    ``AdamWOptimizer``/``SGDOptimizerV2`` (and ``InplaceClipGradNorm``).
    """
    metadata = {entry.key: entry.value for entry in model.metadata_props}
    if CONFIG_KEY in metadata:
        config = json.loads(metadata[CONFIG_KEY])
        kinds = {"AdamW": optim.AdamW, "SGD": optim.SGD}
        hyper = dict(config["hyperparameters"])
        if "betas" in hyper:
            hyper["betas"] = tuple(hyper["betas"])
        clip = None if config["max_norm"] is None else ClipGradNorm(config["max_norm"])
        return kinds[config["optimizer"]](**hyper, clip_grad=clip)
    nodes = {node.op_type: node for node in model.graph.node if node.domain == "com.microsoft"}
    clip_node = nodes.get("InplaceClipGradNorm")
    clip = None
    if clip_node is not None:
        clip = ClipGradNorm(_attribute(clip_node, "max_norm", 1.0))
    if "AdamWOptimizer" in nodes:
        node = nodes["AdamWOptimizer"]
        return optim.AdamW(
            bool(_attribute(node, "correct_bias", 1)),
            (_attribute(node, "alpha", 0.9), _attribute(node, "beta", 0.999)),
            _attribute(node, "epsilon", 1e-8),
            _attribute(node, "weight_decay", 0.0),
            clip,
            adam_mode=int(_attribute(node, "adam_mode", 0)),
        )
    if "SGDOptimizerV2" in nodes:
        return optim.SGD(clip_grad=clip)
    return None


def _attribute(node: onnx.NodeProto, name: str, default: float) -> float:
    for attribute in node.attribute:
        if attribute.name == name:
            return float(helper.get_attribute_value(attribute))
    return default


class AdamWOptimizer(Block):
    """ONNX Runtime's low-level block: one ``com.microsoft::AdamWOptimizer`` node on named inputs."""

    def __init__(
        self,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__()
        self._attributes = _adamw_attributes(bias_correction, betas, eps, weight_decay, adam_mode=1)

    def build(
        self, learning_rate_name: str, step_name: str, parameter_sequence_name: str, gradient_sequence_name: str,
        first_order_moment_sequence_name: str, second_order_moment_sequence_name: str,
    ) -> str:  # fmt: skip
        """Append the node; return its output (bool[1], true once the step is applied)."""
        inputs = [learning_rate_name, step_name, parameter_sequence_name, gradient_sequence_name,
                  first_order_moment_sequence_name, second_order_moment_sequence_name]  # fmt: skip
        return _flag_node(self, "AdamWOptimizer", inputs, "adamw.updated_flag", self._attributes)


class SGDOptimizer(Block):
    """ONNX Runtime's low-level block: one ``com.microsoft::SGDOptimizerV2`` node on named inputs."""

    def build(self, learning_rate_name: str, gradients_name: str, params_name: str) -> str:
        """Append the node (inputs in ONNX Runtime's order: rate, then the names as passed); return its flag."""
        return _flag_node(self, "SGDOptimizerV2", [learning_rate_name, gradients_name, params_name],
                          "update_completed", {})  # fmt: skip


def _flag_node(block: Block, op_type: str, inputs: list[str], hint: str, attributes: dict[str, Any]) -> str:
    b = block.builder
    flag = b.add_node1(op_type, inputs, domain="com.microsoft", hint=hint, **attributes)
    b.model.graph.value_info.append(helper.make_tensor_value_info(flag, onnx.TensorProto.BOOL, [1]))
    b.sync()
    return flag


__all__ = [
    "CONFIG_KEY",
    "SGD",
    "AdamW",
    "AdamWOptimizer",
    "ClipGradNorm",
    "SGDOptimizer",
    "optimizer_of",
    "sequence_optimizer",
]
