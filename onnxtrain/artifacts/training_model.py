"""From a forward-plus-loss model to the training model and the eval model.

Both models take every parameter (trainable and frozen) as a graph input, in
initializer order, after the user inputs, so that one set of parameter values
can be fed to either. The training model outputs the loss, the additional
outputs, ``<input>_grad`` for each graph input whose gradient is asked for
(graph-input order), ``<param>_grad`` for each trainable parameter (in the
same order), then ``<stat>.updated`` for the running statistics of
training-mode BatchNormalization nodes whose statistics are parameters. The eval model
outputs the loss and the additional outputs, with Dropout and
BatchNormalization switched to inference mode.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import onnx
from onnx import helper

from onnxtrain import caller
from onnxtrain.artifacts.exported_parameters import (
    explain_missing,
    warn_changed_parameters,
    warn_folded_convolutions,
    warn_merged_constants,
    warn_scatters,
    warn_tf2onnx_merges,
    warn_unrecorded_merges,
    warn_untracked_statistics,
)
from onnxtrain.artifacts.running_variance import from_torch, torch_running_statistics
from onnxtrain.autodiff import GradientRegistry, build_gradients
from onnxtrain.graph import dtypes, versions
from onnxtrain.graph.builder import GraphBuilder
from onnxtrain.graph.converted import converter_hints, with_converter_hints
from onnxtrain.graph.io import constants_as_initializers, copy_model
from onnxtrain.graph.naming import first_free, first_names, names_in, unknown_name_hint
from onnxtrain.graph.passes import (
    fuse_pads_into_convs,
    prune_unused_nodes,
    read_shapes_early,
    recompute_elementwise,
    recompute_from_checkpoints,
    replace_dropout_masks,
    replace_identity_dropouts,
    replace_zero_pads,
)
from onnxtrain.graph.passes.autocast import accumulate_in_float32
from onnxtrain.graph.passes.checkpoint_choice import choose_checkpoints
from onnxtrain.graph.passes.functions import expand_loss_functions, function_inputs
from onnxtrain.graph.roles import running_statistics
from onnxtrain.graph.torch_metadata import batch_norm_training
from onnxtrain.graph.versions import is_standard
from onnxtrain.graph.walk import names_read, needed_nodes
from onnxtrain.optim.loss_scaling import scaled_loss

#: The suffix of the training-model outputs carrying updated running statistics.
UPDATED_SUFFIX = ".updated"


@dataclass(frozen=True)
class TrainingModels:
    """What :func:`build_training_models` returns.

    Attributes:
        training: the training model (forward, loss and gradients).
        eval: the eval model (forward and loss, inference mode).
        trainable: the trainable parameters, in graph-input order.
        frozen: the frozen parameters, in graph-input order.
        running_stats: ``{statistic parameter: training-model output}`` for
            training-mode BatchNormalization.
    """

    training: onnx.ModelProto
    eval: onnx.ModelProto
    trainable: list[onnx.TensorProto]
    frozen: list[onnx.TensorProto]
    running_stats: dict[str, str]


def check_parameters(model: onnx.ModelProto, requires_grad: Sequence[str], frozen: Sequence[str]) -> None:
    """``ValueError`` unless ``requires_grad`` names floating-point initializers of ``model`` and
    ``frozen`` names initializers, none in both (the messages use ``generate_artifacts``' argument names)."""
    initializers = {t.name: t for t in model.graph.initializer}
    floats = [name for name, t in initializers.items() if dtypes.is_float(t.data_type)]
    overlap = sorted(set(requires_grad) & set(frozen))
    if overlap:
        raise ValueError(f"{overlap} are in both requires_grad and frozen_params; a parameter is one or the other")
    for name in requires_grad:
        tensor = initializers.get(name)
        if tensor is None or not dtypes.is_float(tensor.data_type):
            what = "is not an initializer" if tensor is None else f"is {dtypes.dtype_name(tensor.data_type)}"
            why = explain_missing(model, name) if tensor is None else ""
            if not floats and converter_hints(model):  # skl2onnx's ai.onnx.ml operators hold the coefficients
                raise ValueError(
                    with_converter_hints(
                        f"requires_grad names {name!r}, which {what} of the model{why}; the model has no "
                        "floating-point initializers to train",
                        model,
                    )
                )
            raise ValueError(
                f"requires_grad names {name!r}, which {what} of the model{why}; trainable parameters are "
                f"floating-point initializers ({unknown_name_hint(name, floats)}; trainable_parameters(model) "
                "lists those the graph reads as weights)"
            )
    for name in frozen:
        if name not in initializers:
            raise ValueError(
                f"frozen_params names {name!r}, which is not an initializer of the model; "
                f"initializers: {list(initializers)}"
            )


class RunningStatisticsWarning(UserWarning):
    """BatchNormalization's running statistics are not what the user likely meant: named in ``requires_grad``
    (they are updated, not trained), or constants of an inference-mode node in a model being trained (an
    eval-mode export)."""


def statistics_as_parameters(
    model: onnx.ModelProto, requires_grad: Sequence[str], frozen: Sequence[str]
) -> tuple[list[str], list[str]]:
    """``(requires_grad, frozen)`` with BatchNormalization's running statistics where they belong.

    Running statistics are never trained: those ``requires_grad`` names leave
    it, with a :class:`RunningStatisticsWarning` naming them. Those of a
    training-mode BatchNormalization are parameters whatever the lists say:
    each train step outputs their new values (``<stat>.updated``, momentum as
    the node's attribute), which the runtime keeps, as torch updates its
    buffers; they join ``frozen`` (not trained) where no list names them.
    """
    statistics = running_statistics(model)
    trained = [name for name in requires_grad if name in set(statistics)]
    if trained:
        caller.warn(
            f"requires_grad names {trained}, the running statistics of BatchNormalization: the optimizer does not "
            "train them; each train step in training mode updates them (they are kept as frozen parameters, "
            "updated as torch updates its buffers). Leave them out of requires_grad",
            RunningStatisticsWarning,
        )
    merged = [
        (node.name or node.output[0], shared)
        for node in model.graph.node
        if node.op_type == "BatchNormalization" and is_standard(node)
        for shared in sorted(set(node.input[1:3]) & set(node.input[3:5]) - {""})
    ]
    if merged:
        listed = ", ".join(f"{name!r} in {node!r}" for node, name in merged[:4])
        caller.warn(
            f"BatchNormalization reads one tensor as its scale or bias and as a running statistic ({listed}): "
            "torch's exporter merged tensors of equal values (torch.onnx.export's optimize=True, its default, on a "
            "freshly initialized model: the weight and the running variance are all ones). They can neither train "
            "nor update as torch's: export with optimize=False",
            RunningStatisticsWarning,
        )
    opset = _opset(model)
    updated = {name for node in model.graph.node if _trains_statistics(node, opset) for name in node.input[3:5]}
    stored = {t.name for t in model.graph.initializer} | {
        name for node in model.graph.node if node.op_type in ("Constant", "Identity") for name in node.output
    }
    inference = [  # statistics the graph computes (track_running_stats=False: each batch's own) are not constants
        node
        for node in model.graph.node
        if node.op_type == "BatchNormalization"
        and is_standard(node)
        and not _trains_statistics(node, opset)
        and stored.issuperset(node.input[3:5])
    ]
    if inference and requires_grad:
        constants = first_names([name for node in inference for name in node.input[3:5]], 4)
        caller.warn(
            f"{len(inference)} BatchNormalization node(s) are in inference mode (their running statistics "
            f"{constants} are constants): they normalize every batch with those statistics and never "
            "update them, as torch's eval() does, where torch's train() normalizes with each batch's own statistics. "
            "The model was exported in eval mode, torch.onnx.export's default: export it with "
            "training=torch.onnx.TrainingMode.TRAINING (and dynamo=False, do_constant_folding=False, or dynamo=True "
            "with optimize=False) to train as torch's train() does; keep it so for frozen statistics",
            RunningStatisticsWarning,
        )
    requires = [name for name in requires_grad if name not in set(trained)]
    added = [name for name in statistics if (name in updated or name in trained) and name not in set(frozen)]
    return requires, [*frozen, *added]


def _opset(model: onnx.ModelProto) -> int:
    """``model``'s ``ai.onnx`` opset."""
    return versions.opset_version(model, "") or versions.DEFAULT_OPSET


def _trains_statistics(node: onnx.NodeProto, opset: int) -> bool:
    """Whether ``node`` is a training-mode BatchNormalization, which outputs new running statistics: by its
    ``training_mode``, or where torch's dynamo exporter wrote in inference mode a call that torch ran in training
    mode (:func:`~onnxtrain.graph.torch_metadata.batch_norm_training`); before opset 14, which has no
    ``training_mode``, by its optional outputs (torch's TorchScript exports for training at opsets 9-13)."""
    if node.op_type != "BatchNormalization" or not is_standard(node):
        return False
    if opset < 14:
        return sum(1 for name in node.output if name) > 1
    return bool(_attribute(node, "training_mode", 0)) or bool(batch_norm_training(node))


def _check_loss_reads_a_parameter(model: onnx.ModelProto, loss: str, wrt: Sequence[str]) -> None:
    """``ValueError`` where ``loss`` depends on none of ``wrt`` (a loss block wired to the targets alone): every
    gradient would be zero, and training would change nothing (torch: "does not require grad")."""
    if not wrt:
        return
    read = {loss} | {name for node in needed_nodes(list(model.graph.node), [loss]) for name in names_read(node)}
    if read.intersection(wrt):
        return
    inputs = [value.name for value in model.graph.input if value.name in read and value.name not in wrt]
    reads = f"it reads the inputs {inputs} and no parameter" if inputs else "it reads no input and no parameter"
    raise ValueError(
        f"the loss {loss!r} depends on none of the {len(wrt)} values to train ({first_names(list(wrt), 3)}): "
        f"{reads}, so every gradient would be zero. Check the loss block's wiring (a model output passed to it, "
        "not only its targets)"
    )


def _check_input_gradients(model: onnx.ModelProto, names: Sequence[str]) -> list[str]:
    """``names``, checked to be float graph inputs of ``model`` that are not initializers."""
    initializers = {t.name for t in model.graph.initializer}
    inputs = {v.name: v for v in model.graph.input if v.name not in initializers}
    for name in names:
        value = inputs.get(name)
        tensor = value.type.tensor_type if value is not None and value.type.HasField("tensor_type") else None
        if tensor is None or not dtypes.is_float(tensor.elem_type):
            floats = [n for n, v in inputs.items() if dtypes.is_float(v.type.tensor_type.elem_type)]
            raise ValueError(
                f"requires_grad names {name!r}, which is neither an initializer nor a float graph input of the "
                f"model; float graph inputs: {floats}"
            )
    return list(names)


def move_initializers_to_inputs(model: onnx.ModelProto, names: Sequence[str]) -> list[onnx.TensorProto]:
    """Turn the initializers ``names`` into graph inputs (initializer order); return them."""
    wanted = set(names)
    moved = [t for t in model.graph.initializer if t.name in wanted]
    kept = [t for t in model.graph.initializer if t.name not in wanted]
    existing_inputs = {value.name for value in model.graph.input}
    for tensor in moved:
        if tensor.name not in existing_inputs:
            model.graph.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return moved


def _attribute(node: onnx.NodeProto, name: str, default: int) -> int:
    for attribute in node.attribute:
        if attribute.name == name:
            return attribute.i
    return default


def _set_attribute(node: onnx.NodeProto, name: str, value: int) -> None:
    """``node``'s integer attribute ``name`` set to ``value`` (added where it has none)."""
    for attribute in node.attribute:
        if attribute.name == name:
            attribute.i = value
            return
    node.attribute.append(helper.make_attribute(name, value))


def set_inference_mode(model: onnx.ModelProto) -> None:
    """Dropout without its training flag, BatchNormalization with ``training_mode=0`` (before opset 14: without
    the optional outputs that switch training on) and one output, a torch dropout module written as its random
    mask's operators an identity (:func:`~onnxtrain.graph.passes.identities.replace_dropout_masks`)."""
    replace_dropout_masks(model)
    opset = _opset(model)
    for node in model.graph.node:
        if not is_standard(node):
            continue
        if node.op_type == "Dropout" and len(node.input) > 2:
            node.input[2] = ""
        elif node.op_type == "BatchNormalization" and (_attribute(node, "training_mode", 0) or opset < 14):
            if opset >= 14:
                _set_attribute(node, "training_mode", 0)
            del node.output[1:]


def _expose_running_stats(model: onnx.ModelProto, parameters: set[str]) -> dict[str, str]:
    """Make the running statistics of training-mode BatchNormalization graph outputs: the node's, or for a
    model torch exported, the statistics torch's update gives (:mod:`onnxtrain.artifacts.running_variance`).

    A module applied several times in one forward (SimCLR's projection head over both views) updates its
    statistics once per call, in order, as torch updates its buffers: each node after the first reads the
    statistics the one before it updated, and the last node's are the outputs.
    Works on the proto before any builder sees it, so that whole-model type
    inference runs on nodes that declare all three outputs.
    """
    taken = names_in(model.graph)
    latest: dict[str, str] = {}  # each statistic's value after the nodes so far
    around: dict[int, tuple[list[onnx.NodeProto], list[onnx.NodeProto]]] = {}  # by node index: nodes before, after
    as_torch = from_torch(model)
    elem_types = {tensor.name: tensor.data_type for tensor in model.graph.initializer}
    elem_types.update((v.name, v.type.tensor_type.elem_type) for v in model.graph.input)
    opset = _opset(model)
    copies = {  # the Identity copies of a statistic that a second call reads (torch's dynamo exporter)
        node.output[0]: node.input[0]
        for node in model.graph.node
        if node.op_type == "Identity" and is_standard(node) and node.input[0] in parameters
    }
    for index, node in enumerate(model.graph.node):
        if not _trains_statistics(node, opset):
            continue
        if opset >= 14:
            _set_attribute(node, "training_mode", 1)  # where torch's exporter wrote it in inference mode
        stats = (copies.get(node.input[3], node.input[3]), copies.get(node.input[4], node.input[4]))
        if not all(stat in parameters for stat in stats):
            continue
        node.input[3], node.input[4] = (latest.get(stat, stat) for stat in stats)
        while len(node.output) < 3:
            node.output.append("")
        for position, stat in enumerate(stats, start=1):
            if not node.output[position]:
                node.output[position] = first_free(f"{stat}.running", taken)
        if as_torch:
            update = torch_running_statistics(node, elem_types[stats[1]], taken)
            around[index] = (update.before, update.after)
            latest.update(zip(stats, (update.mean, update.variance), strict=True))
        else:
            latest.update(zip(stats, node.output[1:3], strict=True))
    if around:
        ordered = [
            new
            for index, node in enumerate(model.graph.node)
            for new in (*around.get(index, ((), ()))[0], node, *around.get(index, ((), ()))[1])
        ]
        del model.graph.node[:]
        model.graph.node.extend(ordered)
    exposed = {stat: first_free(f"{stat}{UPDATED_SUFFIX}", taken) for stat in latest}
    model.graph.node.extend(helper.make_node("Identity", [latest[stat]], [out]) for stat, out in exposed.items())
    return exposed


def _declare_gradient_types(model: onnx.ModelProto, parameters: dict[str, str]) -> None:
    """Declare each gradient output with its parameter's type: where inference lost the shape on the way
    (a ``Reshape`` to a computed shape at opset 13, say), the gradient still has the parameter's shape."""
    inputs = {value.name: value for value in model.graph.input}
    for value in model.graph.output:
        parameter = parameters.get(value.name)
        if parameter is not None and not value.type.tensor_type.HasField("shape"):
            value.type.CopyFrom(inputs[parameter].type)


def _checkpoints(
    model: onnx.ModelProto,
    builder: GraphBuilder,
    forward_nodes: int,
    parameters: Collection[str],
    checkpoints: str | Sequence[str],
) -> list[str]:
    """The forward values to keep for the backward: ``checkpoints`` checked, or chosen for ``"auto"``."""
    values = [name for node in model.graph.node[:forward_nodes] for name in node.output if name]
    if isinstance(checkpoints, str):
        if checkpoints != "auto":
            raise ValueError(
                f"activation_checkpoints={checkpoints!r}: pass 'auto' (the layer boundaries), a list of forward "
                "values to keep, or None"
            )
        batch_inputs = [value.name for value in model.graph.input if value.name not in parameters]
        types = {name: _type_of(builder, name) for name in values}
        return choose_checkpoints(model, backward_from=forward_nodes, batch_inputs=batch_inputs, types=types)
    if not isinstance(checkpoints, (list, tuple)) or not all(isinstance(name, str) for name in checkpoints):
        raise TypeError(
            f"activation_checkpoints must be 'auto', a list of forward value names or None, not {checkpoints!r} "
            "(on the command line, --activation-checkpoints alone means 'auto')"
        )
    if not checkpoints:
        raise ValueError(
            "activation_checkpoints=[] names no value to keep, so nothing would be recomputed (the values after "
            "the last checkpoint are kept): pass None for no checkpointing, 'auto', or names of the forward's values"
        )
    inputs = {value.name for value in model.graph.input}
    unknown = [name for name in checkpoints if name not in set(values)]
    if unknown:
        given = [name for name in unknown if name in inputs]
        what = f" ({given} are inputs or parameters, which are there anyway)" if given else ""
        raise ValueError(
            f"activation_checkpoints names {unknown}, which the forward's nodes do not compute{what}; name outputs "
            "of the model's nodes (or pass 'auto')"
        )
    return list(checkpoints)


def _type_of(builder: GraphBuilder, name: str) -> tuple[int, list[int | str | None]] | None:
    """``(element type, dimensions)`` of tensor ``name``, or ``None`` where either is unknown."""
    elem_type, dims = builder.elem_type_if_known(name), builder.shape_if_known(name)
    return None if elem_type is None or dims is None else (elem_type, dims)


def build_training_models(
    forward: onnx.ModelProto,
    outputs: Sequence[str],
    requires_grad: Sequence[str],
    frozen_params: Sequence[str] = (),
    *,
    input_gradients: Sequence[str] = (),
    registry: GradientRegistry | None = None,
    loss_scale: str | None = None,
    activation_checkpoints: str | Sequence[str] | None = None,
) -> TrainingModels:
    """The training and eval models of ``forward``, whose output ``outputs[0]`` is the loss.

    ``input_gradients`` names float graph inputs whose gradients the training
    model outputs too (before the parameters'). ``forward`` is not changed.
    BatchNormalization's running statistics are never trainable, and those of
    a training-mode node are always parameters (:func:`statistics_as_parameters`).
    Raises ``ValueError`` for unknown, integer or overlapping parameter names,
    and the engine's errors for a non-scalar loss or an operator without a
    gradient rule. ``loss_scale``: a frozen parameter (float32 ``[1]``) the
    loss is multiplied by before it is differentiated (the gradients come
    out scaled; the loss output is not), for dynamic loss scaling.
    ``activation_checkpoints``: the forward values kept for the backward,
    everything else the backward reads being recomputed from them
    (:func:`~onnxtrain.graph.passes.recompute.recompute_from_checkpoints`);
    ``"auto"``: the layer boundaries
    (:func:`~onnxtrain.graph.passes.checkpoint_choice.choose_checkpoints`);
    ``None`` (the default): every value is kept, but element-wise chains.
    """
    if not outputs:
        raise ValueError("a training model needs a loss: pass its name first in outputs")
    named = {*requires_grad, *frozen_params}
    if any(node.op_type == "Constant" and node.output[0] in named for node in forward.graph.node):
        forward = copy_model(forward)  # its weights held in Constant nodes made initializers, on a copy
        constants_as_initializers(forward, list(named))
    check_parameters(forward, requires_grad, frozen_params)
    warn_changed_parameters(forward, requires_grad)
    warn_unrecorded_merges(forward, requires_grad)
    warn_tf2onnx_merges(forward, requires_grad)
    warn_folded_convolutions(forward, requires_grad)
    warn_merged_constants(forward, requires_grad)
    warn_untracked_statistics(forward)
    warn_scatters(forward)
    requires_grad, frozen_params = statistics_as_parameters(forward, requires_grad, frozen_params)
    input_order = {value.name: k for k, value in enumerate(forward.graph.input)}
    wrt_inputs = sorted(dict.fromkeys(_check_input_gradients(forward, input_gradients)), key=input_order.__getitem__)
    order = {t.name: k for k, t in enumerate(forward.graph.initializer)}
    trainable_names = sorted(dict.fromkeys(requires_grad), key=order.__getitem__)
    parameter_names = set(trainable_names) | set(frozen_params)

    eval_model = onnx.ModelProto()
    eval_model.CopyFrom(forward)
    moved = move_initializers_to_inputs(eval_model, list(parameter_names))
    set_inference_mode(eval_model)
    fuse_pads_into_convs(replace_zero_pads(eval_model))
    eval_builder = GraphBuilder(eval_model)
    eval_builder.set_outputs(outputs)
    prune_unused_nodes(eval_model)

    training_model = onnx.ModelProto()
    training_model.CopyFrom(forward)
    move_initializers_to_inputs(training_model, list(parameter_names))
    replace_identity_dropouts(training_model)  # no copy and no mask kept for the backward
    fuse_pads_into_convs(replace_zero_pads(training_model))  # no padded copies kept for the backward
    running = _expose_running_stats(training_model, parameter_names)
    builder = GraphBuilder(training_model)
    wrt = [*wrt_inputs, *trainable_names]
    _check_loss_reads_a_parameter(training_model, outputs[0], wrt)
    forward_nodes = len(training_model.graph.node)
    seed = outputs[0] if loss_scale is None else scaled_loss(builder, outputs[0])
    grads = build_gradients(builder, seed, wrt, registry) if wrt else {}
    builder.set_outputs([*outputs, *(grads[name] for name in wrt), *running.values()])
    forward_values = [name for node in training_model.graph.node[:forward_nodes] for name in node.output if name]
    shapes = {name: builder.shape_if_known(name) for name in forward_values}
    loss_types = {name: builder.type_of(name) for name in function_inputs(training_model)}
    if activation_checkpoints is not None:
        kept = _checkpoints(training_model, builder, forward_nodes, parameter_names, activation_checkpoints)
        recompute_from_checkpoints(
            training_model,
            backward_from=forward_nodes,
            shapes=shapes,
            checkpoints=kept,
            elem_type=builder.elem_type_if_known,
        )
    recompute_elementwise(  # activations not kept, their copies held back until the backward
        training_model, backward_from=forward_nodes, shapes=shapes, elem_type=builder.elem_type_if_known
    )
    accumulate_in_float32(training_model)  # gathers' gradients in a half type add up in float32
    _declare_gradient_types(training_model, {grads[name]: name for name in wrt})
    prune_unused_nodes(training_model)
    read_shapes_early(training_model)  # forward values are not kept alive for the shapes the backward reads
    expand_loss_functions(training_model, type_of=loss_types.get)  # the loss runs in the forward, not last

    return TrainingModels(
        training=GraphBuilder(training_model).finalize(),
        eval=GraphBuilder(eval_model).finalize(),
        trainable=[t for t in moved if t.name in set(trainable_names)],
        frozen=[t for t in moved if t.name not in set(trainable_names)],
        running_stats=running,
    )


__all__ = [
    "UPDATED_SUFFIX",
    "RunningStatisticsWarning",
    "TrainingModels",
    "build_training_models",
    "check_parameters",
    "move_initializers_to_inputs",
    "set_inference_mode",
    "statistics_as_parameters",
]
