"""``generate_artifacts``: from a forward model to everything training needs, in one call.

Writes ``{prefix}training_model.onnx``, ``{prefix}eval_model.onnx``,
``{prefix}optimizer_model.onnx`` (when an optimizer is given),
``{prefix}checkpoint`` and, on request, ``{prefix}nominal_checkpoint`` and
``.ort`` versions of the models. Everything is checked and built in memory
(:func:`build_artifacts`), then written into a new version folder inside the
artifact directory and switched in at once (:func:`write_artifacts`): a
failure or a kill leaves the earlier set or the new one, never a mix.

``generate_artifacts`` builds on a light copy of the base model
(:func:`onnxtrain.graph.io.load_light`): the graphs refer to the base's
large tensors without their data, and the data of the checkpoint and of the
constants the models keep is read when it is written, a tensor at a time.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import onnx

from onnxtrain import checkpoint, optim
from onnxtrain.artifacts import model_files, ort_training
from onnxtrain.artifacts.exported_parameters import check_not_tied_copies
from onnxtrain.artifacts.kinds import LossType, OptimType, loss_block, optimizer_block
from onnxtrain.artifacts.loss_items import loss_items_entry
from onnxtrain.artifacts.metadata import NO_LOSS, PRECISION_KEY, set_metadata, training_metadata
from onnxtrain.artifacts.training_block import TrainingBlock
from onnxtrain.artifacts.training_model import check_parameters
from onnxtrain.autodiff import GradientRegistry
from onnxtrain.blocks import Block, PassThrough
from onnxtrain.filegroup import FileGroup
from onnxtrain.graph import dtypes, empty_base, external, versions
from onnxtrain.graph.context import loaded_base
from onnxtrain.graph.converted import check_known_operators, check_types, with_converter_hints
from onnxtrain.graph.declared import correct_declared_shapes
from onnxtrain.graph.io import constants_as_initializers, copy_model, initializers_not_inputs, load_light, skeleton
from onnxtrain.graph.naming import names_in
from onnxtrain.graph.passes import autocast
from onnxtrain.graph.passes.cast_like import cast_like_to_cast
from onnxtrain.graph.passes.retie import tie_transposed_copies, transposed_copies
from onnxtrain.graph.passes.static_shapes import fold_static_dims
from onnxtrain.graph.passes.untie import untie_identity_copies
from onnxtrain.graph.roles import running_statistics
from onnxtrain.graph.symbolic import with_symbolic_dims
from onnxtrain.losses._common import every_output
from onnxtrain.optim.loss_scaling import LOSS_SCALE, SCALER_STATE

Target = Literal["onnxruntime", "onnxruntime-training"]
TARGETS: tuple[str, ...] = ("onnxruntime", "onnxruntime-training")

#: Metadata key of the optimizer model: the initial value of each state tensor (JSON list).
INITIAL_STATE_KEY = "onnxtrain.optimizer.initial_state"
#: Metadata key of the optimizer model: the optimizer and its hyper-parameters.
OPTIMIZER_KEY = "onnxtrain.optimizer"

#: Models this large or larger cannot be one protobuf: their tensors go to ``<model file>.data``.
PROTOBUF_LIMIT = 2**31 - 1


class _Training(TrainingBlock):
    """The loss on the chosen outputs (and anything else the loss block returns), then the additional outputs."""

    def __init__(self, loss: Block, additional: Sequence[str], registry: GradientRegistry | None) -> None:
        super().__init__(registry=registry)
        self._loss = loss
        self._additional = list(additional)

    def build(self, *inputs_to_loss: str) -> list[str]:
        output = self._loss(*inputs_to_loss)
        names = [output] if isinstance(output, str) else list(output or [])
        if not names or not all(isinstance(name, str) for name in names):
            raise ValueError(
                f"the loss block {type(self._loss).__name__} returned {output!r}; its build() must return "
                "the name of the loss value"
            )
        # the loss first, then what else the loss block returns (ONNX Runtime's artifacts keep every output of it:
        # a loss=None over a model's outputs [loss, scores] outputs both), then the additional outputs
        return list(dict.fromkeys([*names, *self._additional]))


def _names(argument: str, values: Sequence[str] | None) -> list[str]:
    if values is None:
        return []
    if isinstance(values, str) or not all(isinstance(v, str) for v in values):
        raise TypeError(f"{argument} must be a list of names, not {values!r}")
    return list(dict.fromkeys(values))


def _check_outputs(model: onnx.ModelProto, argument: str, names: list[str], *, values: bool = False) -> None:
    graph = model.graph
    available = [o.name for o in graph.output]
    pool = set(available)
    if values:
        pool |= {name for node in graph.node for name in node.output} | {i.name for i in graph.input}
    unknown = [name for name in names if name not in pool]
    if unknown:
        raise ValueError(f"{argument} names {unknown}, which the model does not compute; its outputs are {available}")


def _optimizer_model(
    block: optim.Optimizer, parameters: tuple[list[onnx.TensorProto], list[onnx.TensorProto]], opset: int
) -> onnx.ModelProto:
    with empty_base(opset_version=max(opset, versions.MIN_OPSET)):
        block(parameters)
    model = block.to_model_proto()
    onnx.helper.set_model_props(
        model,
        {
            OPTIMIZER_KEY: repr(block),
            INITIAL_STATE_KEY: json.dumps([spec.initial_value for spec in block.state_specs()]),
        },
    )
    return model


@dataclass(frozen=True)
class ArtifactSet:
    """What ``generate_artifacts`` writes, in memory: the models and the initial checkpoint state.

    ``tensor_data``: where the data is of the tensors the models keep without it
    (external, or held stubs: :mod:`onnxtrain.graph.external`) and of the
    parameters of a lazy checkpoint, read when the set is written; ``None``
    when everything is in memory, as :func:`build_artifacts` gives it.
    """

    training_model: onnx.ModelProto
    eval_model: onnx.ModelProto
    optimizer_model: onnx.ModelProto | None
    checkpoint: checkpoint.CheckpointState
    tensor_data: external.TensorData | None = None

    def models(self) -> dict[str, onnx.ModelProto]:
        """``{artifact name: model}`` for the models present (file names without ``.onnx``)."""
        models = {"training_model": self.training_model, "eval_model": self.eval_model}
        if self.optimizer_model is not None:
            models["optimizer_model"] = self.optimizer_model
        return models


def build_artifacts(
    model: onnx.ModelProto | str | os.PathLike[str],
    requires_grad: Sequence[str] | None = None,
    frozen_params: Sequence[str] | None = None,
    loss: LossType | str | Block | None = None,
    optimizer: OptimType | str | optim.Optimizer | None = None,
    additional_output_names: Sequence[str] | None = None,
    loss_input_names: Sequence[str] | None = None,
    *,
    target: Target = "onnxruntime",
    registry: GradientRegistry | None = None,
    precision: str = "fp32",
    precision_overrides: Mapping[str, str] | None = None,
    loss_scaling: bool | optim.LossScaling | None = None,
    activation_checkpoints: str | Sequence[str] | None = None,
    in_memory: bool = True,
) -> ArtifactSet:
    """The artifacts of :func:`generate_artifacts`, built in memory and not written anywhere.

    The arguments are those of :func:`generate_artifacts`; :func:`write_artifacts`
    writes the set (after any change, e.g. to the checkpoint's properties). The runtime
    (``onnxtrain.api.Module``, ``Optimizer``) takes the models as they are, and
    ``onnxtrain.api.CheckpointState(artifacts.checkpoint)`` the state.
    Constants the models keep from a base model with external data are loaded
    into them. ``in_memory=False`` leaves the large tensors where they are
    (the base model's external data), as :func:`generate_artifacts` does: the
    set is then for :func:`write_artifacts` alone, which reads them a tensor
    at a time. Raises ``ValueError``/``TypeError`` for bad arguments.
    """
    built = _build(
        model, requires_grad, frozen_params, loss, optimizer, additional_output_names, loss_input_names,
        target, registry, precision, precision_overrides, loss_scaling, activation_checkpoints,
    )  # fmt: skip
    return _in_memory(built) if in_memory else built


def _build(
    model: onnx.ModelProto | str | os.PathLike[str],
    requires_grad: Sequence[str] | None,
    frozen_params: Sequence[str] | None,
    loss: LossType | str | Block | None,
    optimizer: OptimType | str | optim.Optimizer | None,
    additional_output_names: Sequence[str] | None,
    loss_input_names: Sequence[str] | None,
    target: Target,
    registry: GradientRegistry | None,
    precision: str = "fp32",
    precision_overrides: Mapping[str, str] | None = None,
    loss_scaling: bool | optim.LossScaling | None = None,
    activation_checkpoints: str | Sequence[str] | None = None,
) -> ArtifactSet:
    """:func:`build_artifacts`' set built on a light copy of ``model``: the models keep the constants of a large
    base without their data, and the checkpoint reads its parameters when written (``tensor_data`` says where)."""
    _check_target(target)
    half = autocast.check_precision(precision)
    overrides = autocast.check_overrides(precision_overrides)
    scaling = _loss_scaling(loss_scaling, precision)
    if (half is not None or scaling is not None) and target == "onnxruntime-training":
        raise ValueError(
            f"precision={precision!r} and loss scaling need target='onnxruntime' (ONNX Runtime's training build has "
            "neither)"
        )
    requires = _names("requires_grad", requires_grad)
    frozen = _names("frozen_params", frozen_params)
    additional = _names("additional_output_names", additional_output_names)
    proto, data = load_light(model, in_file=True)  # the weights are read as they are written, from where they are
    check_known_operators(proto)  # a converter's leftovers (tf2onnx's TensorFlow operations) named, not our output
    check_types(skeleton(proto))  # an exporter's invalid types (complex128 arithmetic), not the training model's
    initializers_not_inputs(proto)  # a default a caller could override: gradients hold for its value alone
    correct_declared_shapes(proto)  # a value or output declared at the export's size of a dynamic axis
    constants_as_initializers(proto, [*requires, *frozen])  # weights a converter held in Constant nodes
    # parameters the exporter stored once for their equal values, each its own; a tied weight's transpose that it
    # folded, read as computed again (in initializer_roles' order, so that both see the same parameters)
    tied = transposed_copies(proto, data)
    check_not_tied_copies(tied, requires, frozen)
    tie_transposed_copies(untie_identity_copies(proto), copies=tied)
    # a loss block of the user's may add parameters (checked once the training model is built); the base model's
    # names, and all of them for a built-in loss, which adds none, are checked now
    own_loss = isinstance(loss, Block) and not _built_in(loss)
    known = names_in(proto.graph) if own_loss else None
    check_parameters(
        proto, [n for n in requires if known is None or n in known], [n for n in frozen if known is None or n in known]
    )
    with_symbolic_dims(proto)  # sizes the export computes, named: gradients of known shapes need no run-time sums
    cast_like_to_cast(proto)  # the dynamo exporter's CastLike of a known type: a Cast, which folds on constants
    inputs_to_loss = _names("loss_input_names", loss_input_names) or [o.name for o in proto.graph.output]
    _check_outputs(proto, "loss_input_names", inputs_to_loss)
    _check_outputs(proto, "additional_output_names", additional, values=True)
    if not inputs_to_loss:
        raise ValueError("the model has no outputs to compute a loss from; pass loss_input_names")
    # the sizes the static dimensions decide, made constants (the parameters and running statistics are not: a
    # second call of a BatchNormalization reads the statistics the first updated, through dynamo's Identity)
    variables = [*requires, *frozen, *running_statistics(proto)]
    fold_static_dims(proto, keep=[*inputs_to_loss, *additional], variables=variables)
    if half is not None:  # the forward in half where the policy says; the loss, built after it, in float32
        autocast.autocast(proto, half, overrides)
    loss_of = PassThrough() if loss is None else loss_block(loss)
    optimizer_of = None if optimizer is None else optimizer_block(optimizer)
    if optimizer_of is not None and not requires:
        message = f"an optimizer needs trainable parameters: list them in requires_grad{_quantized_hint(proto)}"
        floats = any(dtypes.is_float(tensor.data_type) for tensor in proto.graph.initializer)
        raise ValueError(message if floats else with_converter_hints(message, proto))  # skl2onnx's ai.onnx.ml
    if optimizer_of is not None and target == "onnxruntime-training":
        ort_training.sequence_optimizer(optimizer_of, target)  # raises for an optimizer ORT's runtime lacks

    if scaling is not None:
        _add_loss_scale(proto, scaling)
        optimizer_of = None if optimizer_of is None else copy.copy(optimizer_of)  # the caller's block unchanged
        if optimizer_of is not None:
            optimizer_of.loss_scaling = scaling
    training_block = _Training(loss_of, additional, registry)
    training_block.checkpoint_activations(activation_checkpoints)
    if scaling is not None:
        training_block.requires_grad(LOSS_SCALE, False)
        training_block.scale_loss_by(LOSS_SCALE)
    for name in requires:
        training_block.requires_grad(name)
    for name in frozen:
        training_block.requires_grad(name, False)
    # a built-in loss over every output (the default): it takes the second as its target, which it says
    chosen = every_output() if _built_in(loss_of) and not loss_input_names else contextlib.nullcontext()
    with loaded_base(proto, data.base_dir), chosen:
        training_block(*inputs_to_loss)
    training, eval_model = training_block.to_model_proto()  # accumulating gradients, in ONNX Runtime's names
    trainable, frozen_tensors = training_block.parameters()
    described = training_metadata(_loss_name(loss), inputs_to_loss, [o.name for o in proto.graph.output])
    # what the loss is a mean over, for gradient accumulation (a built-in loss says its reduction)
    described |= loss_items_entry(eval_model, getattr(loss_of, "_reduction", None) if _built_in(loss_of) else None)
    if half is not None:  # absent: float32
        described[PRECISION_KEY] = precision
    for built_model in (training, eval_model):
        set_metadata(built_model, described)
    optimizer_model = None
    opset = versions.opset_version(proto, "") or versions.DEFAULT_OPSET
    if target == "onnxruntime-training":
        training = ort_training.to_inplace_accumulation(training, [t.name for t in trainable])
        if optimizer_of is not None:
            optimizer_model = ort_training.ort_training_optimizer_model(
                optimizer_of, training_block.parameters(), max(opset, versions.MIN_OPSET)
            )
    elif optimizer_of is not None:
        optimizer_model = _optimizer_model(optimizer_of, training_block.parameters(), opset)
    if scaling is not None:  # the optimizer model's part of the scaler's state, saved with the parameters
        initial = scaling.initial_state()
        frozen_tensors = [
            *frozen_tensors,
            *(onnx.numpy_helper.from_array(initial[name], name) for name in SCALER_STATE if name != LOSS_SCALE),
        ]
    state = checkpoint.lazy_from_tensors(trainable, frozen_tensors, data)
    built = ArtifactSet(training, eval_model, optimizer_model, state, data)
    if target == "onnxruntime-training":
        ort_training.check_loadable(built.models())
    return built


def _built_in(loss: Block) -> bool:
    """Whether ``loss`` is one of onnxtrain's losses (``onnxtrain.losses``), which add no parameters and take
    their inputs as the model's outputs come."""
    return type(loss).__module__.startswith("onnxtrain.losses.")


#: Operators of a model quantized in the QOperator format: integer kernels whose weights are integers.
QUANTIZED_KERNELS = frozenset(
    {"QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger", "QGemm", "QLinearAdd", "QAttention"}
)


def _quantized_hint(model: onnx.ModelProto) -> str:
    """Why a model may hold no trainable parameters: its products are quantized kernels, or its weights are stored
    as integers (``""`` otherwise)."""
    kernels = sorted({node.op_type for node in model.graph.node if node.op_type in QUANTIZED_KERNELS})
    integers = {t.name for t in model.graph.initializer if not dtypes.is_float(t.data_type)}
    stored = any(node.op_type == "DequantizeLinear" and node.input[0] in integers for node in model.graph.node)
    if not kernels and stored:
        return (
            " (this QDQ model stores its weights as integers that DequantizeLinear reads, quantize_static's "
            "default, and integers cannot be trained: quantize with extra_options={'AddQDQPairToWeight': True, "
            "'QuantizeBias': False} to keep float weights for quantization-aware training, or train LoRA adapters "
            "beside them; docs/artifacts.md)"
        )
    if not kernels:
        return ""
    return (
        f" (this model computes with quantized kernels, {', '.join(kernels)}, whose integer weights cannot be "
        "trained: quantize it in the QDQ format, onnxruntime.quantization.QuantFormat.QDQ, for quantization-aware "
        "training, docs/artifacts.md)"
    )


def _loss_scaling(option: bool | optim.LossScaling | None, precision: str) -> optim.LossScaling | None:
    """The loss scaling ``option`` asks for: ``None`` (the default) scales for ``fp16`` only."""
    if isinstance(option, optim.LossScaling):
        return option
    if option is None:
        option = precision == "fp16"
    if not isinstance(option, bool):
        raise TypeError(f"loss_scaling must be None, True, False or an onnxtrain.optim.LossScaling, not {option!r}")
    return optim.LossScaling() if option else None


def _add_loss_scale(proto: onnx.ModelProto, scaling: optim.LossScaling) -> None:
    """The loss scale as an initializer of the forward model, which the training model reads as a frozen
    parameter; ``ValueError`` where the model already has a value of that name."""
    if LOSS_SCALE in {value.name for value in proto.graph.input} | {t.name for t in proto.graph.initializer}:
        raise ValueError(f"the model already has a value named {LOSS_SCALE!r}, the loss scale's name: rename it")
    proto.graph.initializer.append(onnx.numpy_helper.from_array(scaling.initial_state()[LOSS_SCALE], LOSS_SCALE))


def _in_memory(built: ArtifactSet) -> ArtifactSet:
    """``built`` with the constants' data loaded into its models and its checkpoint's arrays read."""
    if built.tensor_data is not None:
        for proto in built.models().values():
            built.tensor_data.load_model(proto)
    state = built.checkpoint
    arrays = checkpoint.CheckpointState(dict(state.trainable), dict(state.frozen), state.optimizer, state.properties)
    return ArtifactSet(built.training_model, built.eval_model, built.optimizer_model, arrays)


def generate_artifacts(
    model: onnx.ModelProto | str | os.PathLike[str],
    requires_grad: Sequence[str] | None = None,
    frozen_params: Sequence[str] | None = None,
    loss: LossType | str | Block | None = None,
    optimizer: OptimType | str | optim.Optimizer | None = None,
    artifact_directory: str | os.PathLike[str] | None = None,
    prefix: str = "",
    ort_format: bool = False,
    custom_op_library: str | os.PathLike[str] | None = None,
    additional_output_names: Sequence[str] | None = None,
    nominal_checkpoint: bool = False,
    loss_input_names: Sequence[str] | None = None,
    *,
    target: Target = "onnxruntime",
    registry: GradientRegistry | None = None,
    precision: str = "fp32",
    precision_overrides: Mapping[str, str] | None = None,
    loss_scaling: bool | optim.LossScaling | None = None,
    activation_checkpoints: str | Sequence[str] | None = None,
) -> dict[str, Path]:
    """Write the training, eval and optimizer models and the checkpoint for ``model``.

    Arguments and file names are ONNX Runtime's (``onnxruntime.training.artifacts``).
    ``loss=None`` means the model's first output already is the loss;
    ``optimizer=None`` writes no optimizer model. ``loss_input_names`` are the
    outputs fed to the loss (default: all outputs, in order).
    ``additional_output_names`` are values the training and eval models also
    output. ``target="onnxruntime"`` (the default) writes standard operators
    for any stock onnxruntime; ``target="onnxruntime-training"`` writes ONNX
    Runtime's on-device conventions (``com.microsoft`` accumulators and
    optimizer, IR <= 10, :mod:`onnxtrain.artifacts.ort_training`), which
    its training runtime and onnxtrain's both run; ``registry`` replaces the
    built-in gradient rules (for custom operators). ``precision="bf16"`` or
    ``"fp16"`` computes the training and eval models in that half type where
    :data:`onnxtrain.graph.passes.autocast.POLICY` says (``precision_overrides``,
    ``{operator type: "half" | "float32"}``, changes it), with the parameters,
    gradients and optimizer state in float32. ``loss_scaling`` (default: on for
    ``"fp16"``; ``True`` or an ``optim.LossScaling`` for its settings) scales the
    loss dynamically as ``torch.amp.GradScaler`` (:mod:`onnxtrain.optim.loss_scaling`).
    ``activation_checkpoints`` trades compute for memory (activation
    checkpointing): ``"auto"`` keeps the layer boundaries for the backward and
    recomputes each layer's activations there, one more forward pass per step;
    a list of forward values keeps those; ``None`` (the default) keeps every
    value the backward reads (:mod:`onnxtrain.graph.passes.recompute`).
    Returns ``{artifact: path}``.
    :func:`build_artifacts` builds the same set in memory.

    Raises ``ValueError``/``TypeError`` for bad arguments, before anything is written.
    """
    _check_target(target)
    _check_prefix(prefix)
    built = _build(
        model, requires_grad, frozen_params, loss, optimizer, additional_output_names, loss_input_names,
        target, registry, precision, precision_overrides, loss_scaling, activation_checkpoints,
    )  # fmt: skip
    if ort_format:
        ort_training.check_ort_format(built.models())
    if custom_op_library is not None:
        _check_loadable(built, custom_op_library)
    return write_artifacts(
        built, artifact_directory, prefix, nominal_checkpoint=nominal_checkpoint, ort_format=ort_format
    )


def _check_target(target: object) -> None:
    if target not in TARGETS:
        raise ValueError(f"target={target!r} is not a known runtime; choose one of {list(TARGETS)}")


def _check_prefix(prefix: object) -> None:
    if not isinstance(prefix, str) or os.sep in prefix or (os.altsep and os.altsep in prefix):
        raise ValueError(f"prefix must be a file-name prefix without path separators, not {prefix!r}")


def _loss_name(loss: LossType | str | Block | None) -> str:
    """The loss as the models' metadata names it: its ``LossType`` name, its block's class, or ``none``."""
    if loss is None:
        return NO_LOSS
    if isinstance(loss, LossType):
        return loss.name
    return loss if isinstance(loss, str) else type(loss).__name__


def _check_loadable(built: ArtifactSet, custom_op_library: str | os.PathLike[str]) -> None:
    """Load each model (its constants' data inside, one model at a time) in onnxruntime with the custom operator
    library registered."""
    import onnxruntime as ort

    from onnxtrain.sessions import inference_session

    options = ort.SessionOptions()
    try:
        options.register_custom_ops_library(os.fspath(custom_op_library))
    except Exception as error:
        raise ValueError(f"custom_op_library={str(custom_op_library)!r} cannot be loaded: {error}") from error
    for name, proto in built.models().items():
        if built.tensor_data is not None and external.has_external_data(proto):
            proto = copy_model(proto)
            built.tensor_data.load_model(proto)
        try:
            inference_session(proto.SerializeToString(), options)
        except Exception as error:
            raise ValueError(f"the {name} does not load in onnxruntime with {custom_op_library!s}: {error}") from error


#: Every file an artifact set may have, after the prefix. A new set replaces all of them at once: the
#: names it lacks disappear. (The tensors of models over protobuf's limit stay inside the version folder.)
ARTIFACT_FILES: tuple[str, ...] = (
    "training_model.onnx",
    "eval_model.onnx",
    "optimizer_model.onnx",
    "checkpoint",
    "checkpoint" + checkpoint.EXTERNAL_DATA_SUFFIX,
    "nominal_checkpoint",
    "training_model.ort",
    "eval_model.ort",
    "optimizer_model.ort",
)


def artifact_files(directory: str | os.PathLike[str], prefix: str = "") -> FileGroup:
    """The artifact set with ``prefix`` in ``directory``, as one :class:`~onnxtrain.filegroup.FileGroup`."""
    return FileGroup(directory, "artifacts" + (f".{prefix}" if prefix else ""), [prefix + f for f in ARTIFACT_FILES])


def write_artifacts(
    artifact_set: ArtifactSet,
    artifact_directory: str | os.PathLike[str] | None = None,
    prefix: str = "",
    *,
    nominal_checkpoint: bool = False,
    ort_format: bool = False,
) -> dict[str, Path]:
    """Write ``artifact_set`` into ``artifact_directory`` (created if missing); ``{artifact: path}``.

    All files are written into a new hidden version folder, flushed to disk,
    and then switched in at once (:mod:`onnxtrain.filegroup`): a failure or a
    kill at any instant leaves an earlier set there complete and unchanged, or
    the new one complete; what a crash leaves behind is removed by the next write.
    """
    _check_prefix(prefix)
    directory = Path.cwd() if artifact_directory is None else Path(artifact_directory)
    created = not directory.exists()
    directory.mkdir(parents=True, exist_ok=True)
    try:
        with artifact_files(directory, prefix).replacing() as folder:
            written = _write_files(folder, prefix, artifact_set, nominal_checkpoint, ort_format)
    except BaseException:
        if created:  # nothing was written: leave no directory either
            shutil.rmtree(directory, ignore_errors=True)
        raise
    return {name: directory / file_name for name, file_name in written.items()}


def _write_files(
    folder: Path, prefix: str, artifact_set: ArtifactSet, nominal: bool, ort_format: bool
) -> dict[str, str]:
    """Write the set into the version ``folder``; ``{artifact: path relative to the artifact directory}``."""
    written: dict[str, str] = {}
    models = artifact_set.models()
    for name, proto in models.items():
        written[name] = f"{prefix}{name}.onnx"
        # its tensors, over protobuf's limit, go into the version folder, at a location relative to the artifact
        # directory (where the model is opened from), never beside another version's model
        data_file = model_files.DataFile(folder.parent, f"{folder.name}/{written[name]}.data")
        if model_files.save(proto, folder / written[name], data_file, artifact_set.tensor_data, PROTOBUF_LIMIT):
            written[f"{name}_data"] = data_file.location
    for name in checkpoint.write_files(artifact_set.checkpoint, folder, f"{prefix}checkpoint"):
        written["checkpoint_data" if name.endswith(checkpoint.EXTERNAL_DATA_SUFFIX) else "checkpoint"] = name
    if nominal:
        checkpoint.write_files(artifact_set.checkpoint.nominal(), folder, f"{prefix}nominal_checkpoint")
        written["nominal_checkpoint"] = f"{prefix}nominal_checkpoint"
    if ort_format:
        written.update(_to_ort_format(folder, {name: written[name] for name in models}))
    return written


def _to_ort_format(folder: Path, files: dict[str, str]) -> dict[str, str]:
    """Convert the models to ``.ort`` files next to them, with onnxruntime's converter."""
    from onnxruntime.tools.convert_onnx_models_to_ort import OptimizationStyle, convert_onnx_models_to_ort

    converted = folder / "ort"
    converted.mkdir()
    for file_name in files.values():
        shutil.copy(folder / file_name, converted / file_name)
    with contextlib.redirect_stdout(io.StringIO()):  # the converter narrates every file
        convert_onnx_models_to_ort(converted, output_dir=converted, optimization_styles=[OptimizationStyle.Fixed])
    result = {}
    for name, file_name in files.items():
        ort_file = Path(file_name).with_suffix(".ort").name
        produced = converted / ort_file
        if not produced.exists():
            raise RuntimeError(f"onnxruntime's converter wrote no {ort_file} for the {name}")
        os.replace(produced, folder / ort_file)
        result[f"{name}_ort"] = ort_file
    shutil.rmtree(converted)
    return result


__all__ = [
    "ARTIFACT_FILES",
    "INITIAL_STATE_KEY",
    "OPTIMIZER_KEY",
    "PROTOBUF_LIMIT",
    "TARGETS",
    "ArtifactSet",
    "Target",
    "artifact_files",
    "build_artifacts",
    "generate_artifacts",
    "write_artifacts",
]
