"""What the training, eval and optimizer models take and give, checked against the checkpoint.

The training model's inputs are, in order (docs/artifacts.md): the user
inputs, every parameter, ``<p>_grad.accumulation.buffer`` per trainable
parameter and ``lazy_reset_grad``; its outputs the loss, the additional
outputs, ``<p>_grad.accumulation.out`` per trainable parameter and
``<stat>.updated`` per BatchNormalization running statistic. As in ONNX
Runtime, inputs are classified by name against the checkpoint: a checkpoint
parameter is a parameter, the rest are user inputs. Every mismatch between
the checkpoint and a model raises ``ValueError`` here, before anything runs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from onnxtrain.artifacts.accumulation import LAZY_RESET_GRAD, accumulated_name, buffer_name
from onnxtrain.artifacts.generate import INITIAL_STATE_KEY
from onnxtrain.graph.naming import unknown_name_hint
from onnxtrain.optim.base import grad_name, state_name, updated_name
from onnxtrain.optim.emit import LEARNING_RATE, STEP
from onnxtrain.optim.loss_scaling import SCALER_STATE
from onnxtrain.training.inputs import UserInputs
from onnxtrain.training.tensor_spec import TensorSpec, shape_text


@dataclass(frozen=True)
class ParameterInfo:
    """A checkpoint parameter as the models must see it."""

    requires_grad: bool
    dtype: np.dtype
    shape: tuple[int, ...]


def static_input_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """The shapes of ``model``'s tensor inputs whose every dimension is a number (:attr:`TensorSpec.static`)."""
    tensors = (value for value in model.graph.input if value.type.HasField("tensor_type"))
    specs = (TensorSpec.of(value, "model") for value in tensors)
    return {spec.name: spec.shape for spec in specs if spec.static}


def _check_parameter(spec: TensorSpec, info: ParameterInfo, model: str) -> None:
    if not spec.fits(info.dtype, info.shape):
        raise ValueError(
            f"the checkpoint's parameter {spec.name!r} is {info.dtype}{shape_text(info.shape)}, but the {model} "
            f"takes {spec.describe()}: the checkpoint does not belong to this model"
        )


def _parameters(
    specs: Sequence[TensorSpec], state: Mapping[str, ParameterInfo], model: str, reserved: set[str]
) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Split the inputs into (user inputs, parameters); errors for parameters missing from either side."""
    users, params = [], []
    for spec in specs:
        if spec.name in reserved:
            continue
        if spec.name in state:
            _check_parameter(spec, state[spec.name], model)
            params.append(spec)
        elif params:  # the artifacts put every parameter after the user inputs
            raise ValueError(
                f"the {model} takes {spec.name!r} ({spec.describe()}) among its parameters, but the checkpoint has "
                f"no parameter of that name ({unknown_name_hint(spec.name, sorted(state))})"
            )
        else:
            users.append(spec)
    return users, params


# --------------------------------------------------------------- training model


@dataclass(frozen=True)
class TrainingModelIO:
    """The training model's interface, checked against the checkpoint."""

    inputs: UserInputs
    parameters: tuple[str, ...]  # every parameter input, in model order
    trainable: tuple[str, ...]  # in model order
    buffers: Mapping[str, str]  # param -> <p>_grad.accumulation.buffer
    flag: str
    outputs: tuple[str, ...]  # the loss, then the additional outputs
    gradients: Mapping[str, str]  # param -> <p>_grad.accumulation.out
    statistics: Mapping[str, str]  # param -> <p>.updated (BatchNorm running statistics)
    output_specs: tuple[TensorSpec, ...]  # of the user outputs, in order

    @property
    def strings(self) -> bool:
        """Whether a user input or output is a STRING tensor, which onnxruntime's IOBinding cannot bind."""
        return self.inputs.strings or any(spec.is_string for spec in self.output_specs)


#: The end of the errors about a trainable set that differs between the checkpoint and the training model.
_UNFREEZE = (
    "the artifacts were regenerated to train other parameters: then set state.parameters[name].requires_grad = "
    "{value} for {names} before making the Module"
)


def training_io(model: onnx.ModelProto, state: Mapping[str, ParameterInfo]) -> TrainingModelIO:
    """Classify the training model's inputs and outputs; ``ValueError`` where model and checkpoint disagree."""
    what = "training model"
    specs = [TensorSpec.of(value, what) for value in model.graph.input]
    names = {spec.name for spec in specs}
    if LAZY_RESET_GRAD not in names:
        raise ValueError(
            f"the {what} has no {LAZY_RESET_GRAD!r} input, so it is not a training model written by "
            "onnxtrain.artifacts.generate_artifacts (ONNX Runtime's com.microsoft training models do not run on "
            "stock onnxruntime); regenerate the artifacts with onnxtrain"
        )
    suffix = buffer_name("")
    buffers = {spec.name[: -len(suffix)]: spec.name for spec in specs if spec.name.endswith(suffix)}
    users, params = _parameters(specs, state, what, {LAZY_RESET_GRAD, *buffers.values()})
    in_model = {spec.name for spec in params}
    extra = [name for name in state if name not in in_model and name not in SCALER_STATE]  # the optimizer's
    if extra:
        taken = [spec.name for spec in params] or list(buffers)  # none in common: those the model trains
        others = [spec.name for spec in users if spec.name not in buffers]
        raise ValueError(
            f"the checkpoint has parameter(s) {extra} that the {what} does not take; it takes the parameters "
            f"{taken} and the inputs {others}: the checkpoint does not belong to this model"
        )
    inputs = {spec.name for spec in users}
    gradients_of_inputs = [param for param in buffers if param in inputs]
    if gradients_of_inputs:
        raise ValueError(
            f"the {what} outputs the gradients of its input(s) {gradients_of_inputs} (requires_grad on a graph input): "
            "Module trains parameters and takes no such model; run the training model in onnxruntime directly for "
            "them (feed each <input>_grad.accumulation.buffer and lazy_reset_grad), or build the artifacts without "
            "requires_grad on inputs"
        )
    for param in buffers:
        if param not in state:
            raise ValueError(
                f"the {what} trains {param!r}, but the checkpoint has no such parameter; it has {sorted(state)}"
            )
        if not state[param].requires_grad:
            raise ValueError(
                f"the {what} trains {param!r}, but the checkpoint has it frozen: the checkpoint does not belong "
                f"to this model, or {_UNFREEZE.format(names=[param], value=True)}"
            )
    trainable = tuple(spec.name for spec in params if spec.name in buffers)
    untrained = [name for name, info in state.items() if info.requires_grad and name not in buffers]
    if untrained:
        freeze = _UNFREEZE.format(names=untrained, value=False)
        raise ValueError(
            f"the checkpoint has {untrained} trainable, but the {what} computes no gradient for them (they are "
            f"frozen there): the checkpoint does not belong to this model, or {freeze}"
        )
    outputs = [value.name for value in model.graph.output]
    gradients = {p: accumulated_name(p) for p in trainable}
    missing = [name for name in gradients.values() if name not in outputs]
    if missing:
        raise ValueError(f"the {what} lacks the accumulated-gradient output(s) {missing}; regenerate the artifacts")
    statistics = {
        name[: -len(".updated")]: name
        for name in outputs
        if name.endswith(".updated") and name[: -len(".updated")] in state
    }
    hidden = set(gradients.values()) | set(statistics.values())
    user_outputs = [value for value in model.graph.output if value.name not in hidden]
    return TrainingModelIO(
        inputs=UserInputs(users, what),
        parameters=tuple(spec.name for spec in params),
        trainable=trainable,
        buffers={p: buffers[p] for p in trainable},
        flag=LAZY_RESET_GRAD,
        outputs=tuple(value.name for value in user_outputs),
        gradients=gradients,
        statistics=statistics,
        output_specs=tuple(TensorSpec.of(value, what) for value in user_outputs),
    )


# ------------------------------------------------------------------- eval model


@dataclass(frozen=True)
class EvalModelIO:
    """The eval model's interface: user inputs, parameter inputs, outputs."""

    inputs: UserInputs
    parameters: tuple[str, ...]
    outputs: tuple[str, ...]
    output_specs: tuple[TensorSpec, ...] = ()  # of the outputs, in order

    @property
    def strings(self) -> bool:
        """Whether a user input or output is a STRING tensor, which onnxruntime's IOBinding cannot bind."""
        return self.inputs.strings or any(spec.is_string for spec in self.output_specs)


def eval_io(model: onnx.ModelProto, state: Mapping[str, ParameterInfo]) -> EvalModelIO:
    """Classify the eval model's inputs; ``ValueError`` where it and the checkpoint disagree."""
    what = "eval model"
    specs = [TensorSpec.of(value, what) for value in model.graph.input]
    users, params = _parameters(specs, state, what, set())
    return EvalModelIO(
        inputs=UserInputs(users, what),
        parameters=tuple(spec.name for spec in params),
        outputs=tuple(value.name for value in model.graph.output),
        output_specs=tuple(TensorSpec.of(value, what) for value in model.graph.output),
    )


# -------------------------------------------------------------- optimizer model


@dataclass(frozen=True)
class OptimizerModelIO:
    """The optimizer model's interface for the trainable parameters."""

    trainable: tuple[str, ...]
    num_states: int
    initial_values: tuple[float, ...]  # one per state tensor
    #: Frozen parameters of the state the model also updates in place (``<name>.updated``): the loss scaler's.
    shared_state: tuple[str, ...] = ()


def optimizer_io(
    model: onnx.ModelProto, trainable: Sequence[str], state: Mapping[str, ParameterInfo]
) -> OptimizerModelIO:
    """Check the optimizer model against the module's trainable parameters; read its state layout."""
    what = "optimizer model"
    inputs = [value.name for value in model.graph.input]
    specs = {value.name: TensorSpec.of(value, what) for value in model.graph.input}
    if inputs[:2] != [LEARNING_RATE, STEP]:
        raise ValueError(
            f"the {what}'s first inputs are {inputs[:2]}, not [{LEARNING_RATE!r}, {STEP!r}]: it is not an "
            "optimizer model written by onnxtrain (ONNX Runtime's com.microsoft optimizers do not run on stock "
            "onnxruntime)"
        )
    shared = tuple(name for name in SCALER_STATE if name in specs)
    missing = [name for name in shared if name not in state]
    if missing:
        raise ValueError(
            f"the {what} scales the loss, but the checkpoint lacks the scaler's state {missing}: load the checkpoint "
            "written with these artifacts"
        )
    params = [name for name in inputs[2:] if name in state and name not in shared]
    if sorted(params) != sorted(trainable):
        raise ValueError(
            f"the {what} updates {params}, but the training model trains {list(trainable)}: the artifacts do "
            "not belong together"
        )
    first = trainable[0]
    num_states = 0
    while state_name(first, num_states) in specs:
        num_states += 1
    outputs = {value.name for value in model.graph.output}
    for param in trainable:
        _check_parameter(specs[param], state[param], what)
        expected = [grad_name(param)] + [state_name(param, i) for i in range(num_states)]
        absent = [name for name in expected if name not in specs]
        absent += [
            name
            for name in (updated_name(param), *(updated_name(state_name(param, i)) for i in range(num_states)))
            if name not in outputs
        ]
        if absent:
            raise ValueError(f"the {what} lacks {absent} for parameter {param!r}; regenerate the artifacts")
    metadata = {entry.key: entry.value for entry in model.metadata_props}
    initial: tuple[float, ...] = (0.0,) * num_states
    if INITIAL_STATE_KEY in metadata:
        try:
            initial = tuple(float(v) for v in json.loads(metadata[INITIAL_STATE_KEY]))
        except (ValueError, TypeError) as error:
            raise ValueError(
                f"the {what}'s metadata {INITIAL_STATE_KEY!r} is not a JSON list of numbers: {error}"
            ) from None
        if len(initial) != num_states:
            raise ValueError(
                f"the {what}'s metadata {INITIAL_STATE_KEY!r} lists {len(initial)} initial values, but the model "
                f"keeps {num_states} state tensor(s) per parameter"
            )
    return OptimizerModelIO(tuple(trainable), num_states, initial, shared)


__all__ = [
    "EvalModelIO",
    "OptimizerModelIO",
    "ParameterInfo",
    "TrainingModelIO",
    "eval_io",
    "optimizer_io",
    "training_io",
]
