"""The optimizer model interface, and the building shared by every optimizer.

An optimizer block builds a model, in standard ``ai.onnx`` operators, that
takes one optimizer step for all trainable parameters at once:

Inputs, in this order:

- ``learning_rate``: float32, shape ``[1]``;
- ``step``: int64, shape ``[1]``, the 1-based number of the step being taken
  (the state's step count + 1, as ONNX Runtime feeds it);
- then for each trainable parameter ``p``, in parameter order: ``p`` (its
  current value), ``p_grad`` (its gradient), and its state tensors
  ``p.momentum0``, ``p.momentum1``, ... (:meth:`Optimizer.state_specs`
  says how many and what they hold), each with ``p``'s type and shape.

Outputs, for each trainable parameter ``p`` in the same order: ``p.updated``,
then ``p.momentum0.updated``, ``p.momentum1.updated``, ... (the new values).

Hyper-parameters are constants of the graph; only the learning rate and the
step are inputs. Parameters may mix float16, bfloat16, float32 and float64:
each parameter's update runs in its own type (float16 and bfloat16 in float32,
cast back), with the learning rate and the step cast to it. Clipping
(:class:`~onnxtrain.optim.clip.ClipGradNorm` on all gradients together,
:class:`~onnxtrain.optim.clip.ClipGradValue` on each element) applies before
the update.
"""

from __future__ import annotations

import inspect
import warnings
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from onnxtrain.blocks.block import ForwardBlock
from onnxtrain.graph import dtypes
from onnxtrain.graph.builder import GraphBuilder, describe_type, tensor_type
from onnxtrain.graph.naming import matches, unknown_name_hint
from onnxtrain.optim import _checks
from onnxtrain.optim.clip import ClipGradNorm, ClipGradValue, GradientClipping
from onnxtrain.optim.emit import LEARNING_RATE, STEP, Math, Scalars, compute_type
from onnxtrain.optim.loss_scaling import SCALER_STATE, LossScaling

#: ``p`` + this suffix: the gradient input of parameter ``p``.
GRAD_SUFFIX = "_grad"
#: ``value`` + this suffix: the output with the new value of an input.
UPDATED_SUFFIX = ".updated"

_FLOAT_TYPES = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)


def grad_name(param: str) -> str:
    """``w -> w_grad``: the gradient input of parameter ``param``."""
    return f"{param}{GRAD_SUFFIX}"


def state_name(param: str, index: int) -> str:
    """``(w, 0) -> w.momentum0``: state tensor ``index`` of parameter ``param``."""
    return f"{param}.momentum{index}"


def updated_name(name: str) -> str:
    """``w -> w.updated``: the output carrying the new value of input ``name``."""
    return f"{name}{UPDATED_SUFFIX}"


@dataclass(frozen=True)
class StateSpec:
    """One state tensor an optimizer keeps per parameter.

    Attributes:
        name: ``momentum0``, ``momentum1``, ...: the suffix of its input name
            (``p.momentum0``) and its name in a checkpoint.
        role: what it holds, in ``torch.optim``'s words (``exp_avg``, ``sum``, ...).
        initial_value: the value every element starts from.
    """

    name: str
    role: str
    initial_value: float = 0.0


@dataclass(frozen=True)
class ParameterSpec:
    """A trainable parameter as the optimizer model sees it: name, element type, shape."""

    name: str
    elem_type: int
    shape: tuple[int | str | None, ...] | None

    @classmethod
    def of(cls, value: onnx.TensorProto | onnx.ValueInfoProto | ParameterSpec) -> ParameterSpec:
        """From a ``TensorProto`` (data never read), a ``ValueInfoProto`` or a spec."""
        if isinstance(value, ParameterSpec):
            return value
        if isinstance(value, onnx.TensorProto):
            return cls(value.name, value.data_type, tuple(value.dims))
        if isinstance(value, onnx.ValueInfoProto) and value.type.HasField("tensor_type"):
            tensor = value.type.tensor_type
            if not tensor.HasField("shape"):
                return cls(value.name, tensor.elem_type, None)
            shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim)
            return cls(value.name, tensor.elem_type, shape)
        raise TypeError(
            f"a parameter must be an onnx.TensorProto (as TrainingBlock.parameters() returns) or a "
            f"tensor onnx.ValueInfoProto, not {type(value).__name__}"
        )


ParameterLike = onnx.TensorProto | onnx.ValueInfoProto | ParameterSpec


def _trainable_and_frozen(owner: str, parameters: Any) -> tuple[Sequence[Any], Sequence[Any]]:
    """The trainable and the frozen parameters of ``parameters``: a ``(trainable, frozen)`` pair, a list of
    trainable ones or one (none frozen)."""
    if isinstance(parameters, (onnx.TensorProto, onnx.ValueInfoProto, ParameterSpec)):
        return [parameters], []
    if (
        isinstance(parameters, Sequence)
        and len(parameters) == 2
        and all(isinstance(part, Sequence) and not isinstance(part, (str, bytes)) for part in parameters)
    ):
        return parameters[0], parameters[1]
    if isinstance(parameters, Sequence) and not isinstance(parameters, (str, bytes)):
        return parameters, []
    raise TypeError(
        f"{owner}.build() takes the (trainable, frozen) pair of lists that TrainingBlock.parameters() "
        f"returns (or the list of trainable parameters), not {type(parameters).__name__}"
    )


def trainable_specs(owner: str, parameters: Any) -> list[ParameterSpec]:
    """The trainable parameters of ``parameters``: a ``(trainable, frozen)`` pair or a list.

    Checks that there is at least one, that each is a float tensor and that
    the names are unique.
    """
    specs = [ParameterSpec.of(p) for p in _trainable_and_frozen(owner, parameters)[0]]
    if not specs:
        raise ValueError(
            f"{owner}.build() got no trainable parameters, so there is nothing to optimize: mark some "
            "with TrainingBlock.requires_grad(name) (or requires_grad=[...] in generate_artifacts) first"
        )
    seen: set[str] = set()
    for spec in specs:
        if not spec.name:
            raise ValueError(f"{owner}: every trainable parameter needs a name")
        if spec.name in seen:
            raise ValueError(f"{owner}: the trainable parameter {spec.name!r} is listed twice")
        seen.add(spec.name)
        if spec.elem_type not in _FLOAT_TYPES:
            raise ValueError(
                f"{owner}: the trainable parameter {spec.name!r} has element type "
                f"{dtypes.dtype_name(spec.elem_type)}; only float16, bfloat16, float (float32) and double "
                "parameters can be trained: freeze it instead"
            )
    return specs


@dataclass
class Slot:
    """One parameter's update as an optimizer sees it: its values in the compute type.

    ``out_param`` and ``out_states`` are the names the last operator of each
    new value should write (``None``: any name; the base class casts or
    renames the result into the output).
    """

    name: str
    math: Math
    param: str
    grad: str
    states: list[str]
    out_param: str | None
    out_states: list[str | None] = field(default_factory=list)


@dataclass(frozen=True)
class Update:
    """What :meth:`Optimizer.update` returns: the new parameter and the new states, in state order."""

    param: str
    states: tuple[str, ...] = ()


class UnmatchedPatternWarning(UserWarning):
    """A ``no_decay`` or ``lr_scale`` pattern matches no parameter of the model being built (a typo, or Hugging
    Face's substring habit)."""


class Optimizer(ForwardBlock):
    """Base class of the optimizer blocks; see the module docstring for the model they build.

    Subclasses give :meth:`state_specs`, :meth:`hyperparameters`,
    :meth:`update` (the ONNX) and ``reference_update`` (the NumPy reference,
    a function of ``(param, grad, states, lr=..., step=..., **hyperparameters)``).
    """

    reference_update: Callable[..., tuple[np.ndarray, list[np.ndarray]]]

    def __new__(cls, *args: Any, **kwargs: Any) -> Optimizer:
        """Refuse ``torch.optim``'s arguments (parameters, a learning rate, its positional order) with a hint."""
        parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
        positional = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in parameters)
        names = [p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        _checks.torch_habits(cls.__name__, names, positional, args, kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        clip_grad: GradientClipping | None = None,
        no_decay: Sequence[str] = (),
        lr_scale: Mapping[str, float] | None = None,
    ) -> None:
        super().__init__()
        self._no_decay = _checks.patterns(type(self).__name__, "no_decay", no_decay)
        self._lr_scale = _checks.scales(type(self).__name__, "lr_scale", lr_scale)
        if clip_grad is not None and not isinstance(clip_grad, (ClipGradNorm, ClipGradValue)):
            raise TypeError(
                f"{type(self).__name__}: clip_grad must be None, a ClipGradNorm(max_norm) or a "
                f"ClipGradValue(clip_value), not {type(clip_grad).__name__} {clip_grad!r}"
            )
        self._clip_grad = clip_grad
        self._loss_scaling: LossScaling | None = None

    # ----------------------------------------------------------- description

    @property
    def loss_scaling(self) -> LossScaling | None:
        """The dynamic loss scaling the model applies (:mod:`onnxtrain.optim.loss_scaling`), or ``None``."""
        return self._loss_scaling

    @loss_scaling.setter
    def loss_scaling(self, scaling: LossScaling | None) -> None:
        if scaling is not None and not isinstance(scaling, LossScaling):
            raise TypeError(f"loss_scaling must be None or an onnxtrain.optim.LossScaling, not {scaling!r}")
        self._loss_scaling = scaling

    @property
    def clip_grad(self) -> ClipGradNorm | None:
        """The gradient clipping applied before each step, or ``None``."""
        return self._clip_grad

    @property
    def no_decay(self) -> tuple[str, ...]:
        """The patterns of the parameters that weight decay leaves alone (:meth:`decays`)."""
        return self._no_decay

    def decays(self, name: str) -> bool:
        """Whether weight decay applies to parameter ``name``: no pattern of ``no_decay`` matches it
        (:func:`~onnxtrain.graph.naming.matches`: the whole name or its part after one of its dots)."""
        return not any(matches(pattern, name) for pattern in self._no_decay)

    @property
    def lr_scale(self) -> dict[str, float]:
        """``{pattern: factor}``: the parameters a pattern matches step at the learning rate times its factor
        (:meth:`lr_scale_of`)."""
        return dict(self._lr_scale)

    def lr_scale_of(self, name: str) -> float:
        """The factor of the learning rate for parameter ``name``: the first pattern of ``lr_scale`` that matches
        it (:func:`~onnxtrain.graph.naming.matches`), else 1."""
        return next((factor for pattern, factor in self._lr_scale.items() if matches(pattern, name)), 1.0)

    def weight_decay_of(self, name: str, weight_decay: float) -> float:
        """``weight_decay`` for parameter ``name``, 0 where :meth:`decays` says it is left alone."""
        return weight_decay if self.decays(name) else 0.0

    def _warn_unmatched_patterns(self, trainable: Sequence[str], names: Sequence[str]) -> None:
        """An :class:`UnmatchedPatternWarning` for each pattern of ``no_decay`` that matches none of ``names`` (a
        frozen parameter too: no typo), and of ``lr_scale`` that matches none of the ``trainable`` ones."""
        for argument, patterns, among, meaning in (
            ("no_decay", self._no_decay, names, "weight decay applies as if it were not given"),
            ("lr_scale", list(self._lr_scale), trainable, "its factor applies to nothing"),
        ):
            for pattern in patterns:
                if not any(matches(pattern, name) for name in among):
                    what = "trainable parameters" if among is trainable else "parameters"
                    inside = (
                        ""
                        if any(char in pattern for char in "*?[")
                        else f": {pattern + '.*'!r} or {'*' + pattern + '*'!r} match inside names"
                    )
                    warnings.warn(
                        f"{type(self).__name__}: the {argument} pattern {pattern!r} matches none of the "
                        f"{len(among)} {what}, so {meaning} (a pattern is a glob on a whole name or on the part after "
                        f"one of its dots, not a substring as Hugging Face's list{inside}); "
                        + unknown_name_hint(pattern, among),
                        UnmatchedPatternWarning,
                        stacklevel=3,
                    )

    def with_patterns(self, hyperparameters: dict[str, Any]) -> dict[str, Any]:
        """``hyperparameters``, ``no_decay`` and ``lr_scale``, where they name patterns (as constructor
        arguments)."""
        hyper = {**hyperparameters, "no_decay": list(self._no_decay)} if self._no_decay else hyperparameters
        return {**hyper, "lr_scale": dict(self._lr_scale)} if self._lr_scale else hyper

    @abstractmethod
    def hyperparameters(self) -> dict[str, Any]:
        """The hyper-parameters (without ``clip_grad``), as keyword arguments of the constructor."""

    @abstractmethod
    def state_specs(self) -> tuple[StateSpec, ...]:
        """The state tensors kept per parameter, in input order (``momentum0``, ``momentum1``, ...)."""

    @property
    def num_states(self) -> int:
        """How many state tensors each parameter has."""
        return len(self.state_specs())

    def __repr__(self) -> str:
        arguments = {**self.hyperparameters(), "clip_grad": self._clip_grad}
        text = f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"
        return text if self._loss_scaling is None else f"{text} with {self._loss_scaling!r}"

    def model_input_names(self, param_names: Sequence[str]) -> list[str]:
        """The optimizer model's input names for these trainable parameters, in order."""
        names = [LEARNING_RATE, STEP, *(SCALER_STATE if self._loss_scaling is not None else ())]
        for param in param_names:
            names += [param, grad_name(param)]
            names += [state_name(param, i) for i in range(self.num_states)]
        return names

    def model_output_names(self, param_names: Sequence[str]) -> list[str]:
        """The optimizer model's output names for these trainable parameters, in order."""
        names = []
        for param in param_names:
            names.append(updated_name(param))
            names += [updated_name(state_name(param, i)) for i in range(self.num_states)]
        if self._loss_scaling is not None:
            names += [updated_name(name) for name in SCALER_STATE]
        return names

    def initial_state(
        self, parameters: Mapping[str, np.ndarray] | Sequence[ParameterLike]
    ) -> dict[str, list[np.ndarray]]:
        """``{param: [momentum0, momentum1, ...]}``: the state before the first step.

        ``parameters`` maps names to arrays, or lists TensorProtos (their data
        is never read) or ValueInfoProtos with fixed shapes.
        """
        if isinstance(parameters, Mapping):
            items = [(name, np.asarray(value).dtype, np.shape(value)) for name, value in parameters.items()]
        else:
            items = []
            for spec in map(ParameterSpec.of, parameters):
                if spec.shape is None or not all(isinstance(d, int) for d in spec.shape):
                    raise ValueError(f"the shape of parameter {spec.name!r} is not fixed ({spec.shape}); pass arrays")
                items.append((spec.name, dtypes.to_numpy_dtype(spec.elem_type), spec.shape))
        return {
            name: [np.full(shape, s.initial_value, dtype=dtype) for s in self.state_specs()]
            for name, dtype, shape in items
        }

    # --------------------------------------------------------------- building

    @abstractmethod
    def update(self, slot: Slot) -> Update:
        """Emit one parameter's update; return the new parameter and states in its compute type."""

    def build(self, parameters: Any) -> list[str]:
        """Build the optimizer model for the trainable parameters of ``parameters``.

        ``parameters`` is the ``(trainable, frozen)`` pair of
        ``TrainingBlock.parameters()`` (frozen ones are ignored) or the list
        of trainable parameters. Returns the output names.
        """
        owner = type(self).__name__
        trainable, frozen_specs = _trainable_and_frozen(owner, parameters)
        specs = trainable_specs(owner, trainable)
        b = self.builder
        params = [spec.name for spec in specs]
        frozen = [ParameterSpec.of(p).name for p in frozen_specs]
        self._warn_unmatched_patterns(params, params + frozen)
        inputs, outputs = self.model_input_names(params), self.model_output_names(params)
        _check_names(owner, b, inputs + outputs, params)
        for name in outputs:
            b.names.reserve(name)

        lr = b.add_input(LEARNING_RATE, tensor_type(onnx.TensorProto.FLOAT, [1]))
        step = b.add_input(STEP, tensor_type(onnx.TensorProto.INT64, [1]))
        if self._loss_scaling is not None:
            self._loss_scaling.add_inputs(b)
        for spec in specs:
            value_type = tensor_type(spec.elem_type, None if spec.shape is None else list(spec.shape))
            for name in self.model_input_names([spec.name])[-2 - self.num_states :]:  # p, p_grad, p's states
                b.add_input(name, value_type)
        return self.emit_updates(Scalars(b, lr, step), specs)

    def emit_updates(self, scalars: Scalars, specs: Sequence[ParameterSpec]) -> list[str]:
        """Emit the step for values ``p``, ``p_grad``, ``p.momentum0``, ... of the model being built.

        Clips the gradients together, then updates each parameter; returns
        the output names (:meth:`model_output_names`). The values may be
        graph inputs (:meth:`build`) or computed (e.g. taken from sequences).
        """
        grads = [grad_name(spec.name) for spec in specs]
        scaling, found_inf, step, taken = self._loss_scaling, None, scalars.step_input, ""
        if scaling is not None:  # true gradients for the clipping and the update, the steps taken for the step
            grads, found_inf, taken = scaling.unscale(scalars.builder, grads, step)
            scalars = scalars.with_step(taken)
        if self._clip_grad is not None:
            grads = list(self._clip_grad(grads))
        result: list[str] = []
        scaled: dict[float, Scalars] = {1.0: scalars}  # the scalars of each learning rate's factor
        for spec, grad in zip(specs, grads, strict=True):
            factor = self.lr_scale_of(spec.name)
            if factor not in scaled:
                scaled[factor] = scalars.with_lr_scale(factor)
            own = scaled[factor]
            result += self._emit_update(own, spec, grad, keep_if=found_inf)
        if scaling is not None and found_inf is not None:
            outputs = [updated_name(name) for name in SCALER_STATE]
            scaling.update_state(scalars.builder, found_inf, step, taken, outputs)
            result += outputs
        return result

    def _emit_update(
        self, scalars: Scalars, spec: ParameterSpec, grad: str, *, keep_if: str | None = None
    ) -> list[str]:
        """One parameter's update; where ``keep_if`` (a bool scalar) holds, its parameter and states unchanged."""
        b = scalars.builder
        compute = compute_type(spec.elem_type)
        math = Math(scalars, compute, spec.name)
        cast = compute != spec.elem_type

        def widen(name: str, hint: str) -> str:
            return math.cast(name, compute, hint=f"{hint}.f32") if cast else name

        states = [state_name(spec.name, i) for i in range(self.num_states)]
        slot = Slot(
            name=spec.name,
            math=math,
            param=widen(spec.name, "param"),
            grad=widen(grad, "grad"),
            states=[widen(s, f"momentum{i}") for i, s in enumerate(states)],
            out_param=None if cast or keep_if else updated_name(spec.name),
            out_states=[None if cast or keep_if else updated_name(s) for s in states],
        )
        new = self.update(slot)
        if len(new.states) != len(states):
            raise RuntimeError(f"{type(self).__name__}.update returned {len(new.states)} states, not {len(states)}")
        outputs = []
        olds = (slot.param, *slot.states)
        for value, old, target in zip((new.param, *new.states), olds, (spec.name, *states), strict=True):
            out = updated_name(target)
            if keep_if is not None:  # a skipped step leaves the value as it was
                value = math.where(keep_if, old, value, hint="kept")
            if cast:
                math.cast(value, spec.elem_type, out=out)
            elif value != out:
                b.add_node("Identity", [value], [out])
            outputs.append(out)
        return outputs

    # -------------------------------------------------------------- reference

    def reference_step(
        self,
        learning_rate: float,
        step: int,
        params: Mapping[str, np.ndarray],
        grads: Mapping[str, np.ndarray],
        states: Mapping[str, Sequence[np.ndarray]],
    ) -> tuple[dict[str, np.ndarray], dict[str, list[np.ndarray]]]:
        """One step in NumPy (:mod:`onnxtrain.optim.reference`): ``(new params, new states)``.

        The same computation as the optimizer model: clipping over all
        gradients, then each parameter's update, with the learning rate
        rounded to float32 as the model's ``learning_rate`` input holds it.
        """
        from onnxtrain.optim import reference

        learning_rate = float(np.float32(learning_rate))
        names = list(params)
        gradients = [np.asarray(grads[name]) for name in names]
        clip = self._clip_grad
        if isinstance(clip, ClipGradNorm):
            gradients = reference.clip_grad_norm(gradients, clip.max_norm, clip.norm_type)
        elif clip is not None:
            gradients = reference.clip_grad_value(gradients, clip.clip_value)
        new_params: dict[str, np.ndarray] = {}
        new_states: dict[str, list[np.ndarray]] = {}
        update = type(self).reference_update
        hyper = self.hyperparameters()
        hyper.pop("no_decay", None)
        hyper.pop("lr_scale", None)
        for name, grad in zip(names, gradients, strict=True):
            own = {**hyper, "weight_decay": self.weight_decay_of(name, hyper["weight_decay"])}
            rate = float(np.float32(learning_rate) * np.float32(self.lr_scale_of(name)))  # as the model's Mul
            new_params[name], new_states[name] = update(
                params[name], grad, list(states[name]), lr=rate, step=step, **own
            )
        return new_params, new_states


def _check_names(owner: str, b: GraphBuilder, names: list[str], params: list[str]) -> None:
    """Every input and output name must be new and distinct (``w_grad`` may not be a parameter too)."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(
                f"{owner}: the optimizer model would use the name {name!r} twice; the trainable parameters "
                f"{params} clash with the names it derives ({LEARNING_RATE!r}, {STEP!r}, 'p_grad', "
                "'p.momentum0', 'p.updated', ...): rename the parameter"
            )
        seen.add(name)
        if b.has(name):
            type_text = describe_type(b.type_of(name))
            raise ValueError(
                f"{owner}: {name!r} ({type_text}) is already a value of the base model; build an optimizer "
                "inside `with onnxblock.empty_base():`"
            )
