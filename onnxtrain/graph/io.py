"""Loading base models, and light copies of them for shape inference."""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path

import onnx
from onnx import shape_inference, version_converter

from onnxtrain import caller
from onnxtrain.graph import dtypes, external, versions, walk, wire
from onnxtrain.graph.attributes import attribute
from onnxtrain.graph.contrib_types import RUNTIME_DEFAULT_DOMAIN_OPS, type_contrib_outputs
from onnxtrain.graph.naming import first_free
from onnxtrain.graph.passes.constants import fold_constants

#: Initializers with more elements than this are not handed to shape inference
#: with their values: only their type and shape matter for inference.
SMALL_TENSOR_ELEMENTS = 1024


def load_base_model(
    model: onnx.ModelProto | str | os.PathLike[str],
    *,
    check_data: bool = True,
    in_file: bool = False,
    upgrade: bool = True,
) -> tuple[onnx.ModelProto, Path | None]:
    """A private copy of ``model`` and the folder its external data lives in.

    A path is read without its external data: tensors stored beside the model
    stay on disk (models over 2 GB never pass through memory or temp files),
    and the folder is returned so the data can be found later. A ``ModelProto``
    is copied, so the caller's object is never changed; it has no folder, so
    it may not refer to external data. Every tensor is checked to hold the
    data its dims declare, and every external-data location to stay inside the
    model's folder (:mod:`onnxtrain.graph.external`), before anything is read:
    ``ValueError`` otherwise, and for an empty model. ``check_data=False``
    skips that check, for callers that read only names and types.
    ``in_file``: a path's large inline weights are left in the file too, each
    an external-data reference to its own bytes there
    (:func:`onnxtrain.graph.wire.load_light`), for callers that read or
    write the weights themselves and hand no model holding those references
    to the user (generation, reports); others get them inside the model.
    ``upgrade=False``: the model as written, not :func:`upgraded` (a report of
    the file's own versions).
    """
    prepare = upgraded if upgrade else _as_written
    if isinstance(model, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        _check_not_empty(copy, "the ModelProto")
        if check_data:
            external.check_model_data(copy, None)
        return prepare(copy), None
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise ValueError(f"no ONNX model at {str(path)!r}: pass an existing .onnx file or a ModelProto")
        resolved = path.resolve()
        folder = resolved.parent
        try:
            if in_file:  # its large inline weights refer to their bytes in the file, unread
                loaded = wire.load_light(path, location=resolved.name)
            else:
                loaded = onnx.load(os.fspath(path), load_external_data=False)
        except Exception as error:  # protobuf raises its own DecodeError
            raise ValueError(f"{str(path)!r} is not a readable ONNX model: {error}") from error
        _check_not_empty(loaded, repr(str(path)))
        if check_data:
            external.check_model_data(loaded, folder)
        return prepare(loaded), folder
    raise TypeError(f"model must be an onnx.ModelProto or a path to an .onnx file, not {type(model).__name__}")


def load_light(
    model: onnx.ModelProto | str | os.PathLike[str], *, in_file: bool = False
) -> tuple[onnx.ModelProto, external.TensorData]:
    """``model`` as :func:`load_base_model` reads it, with no tensor data copied: and where that data is.

    A path is read without its external data, as by :func:`load_base_model`
    (``in_file`` as there).
    A ``ModelProto`` is checked, then copied but for the data of its large
    initializers (not :func:`is_small`, not strings): each becomes a held stub
    (:func:`~onnxtrain.graph.external.held_stub`) that the returned
    :class:`~onnxtrain.graph.external.TensorData` resolves to the caller's
    tensor. The caller's model is never changed, and must not change while
    the copy is in use.
    """
    if not isinstance(model, onnx.ModelProto):
        proto, folder = load_base_model(model, in_file=in_file)
        return proto, external.TensorData(base_dir=folder)
    _check_not_empty(model, "the ModelProto")
    external.check_model_data(model, None)
    light = onnx.ModelProto()
    external.copy_fields(model, light, {"graph"})
    external.copy_fields(model.graph, light.graph, {"initializer"})
    held: list[onnx.TensorProto] = []
    for tensor in model.graph.initializer:
        if is_small(tensor) or tensor.data_type == onnx.TensorProto.STRING:
            light.graph.initializer.append(tensor)
        else:
            light.graph.initializer.append(external.held_stub(tensor, len(held)))
            held.append(tensor)
    return upgraded(light), external.TensorData(held=tuple(held))


def initializers_not_inputs(model: onnx.ModelProto) -> list[str]:
    """Drop from ``model``'s graph inputs each one that is also an initializer, in place; their names.

    IR 3 lists every initializer among the graph inputs, and exporters may too
    (torch's ``keep_initializers_as_inputs=True``); from IR 4 on such an input
    is a default that a caller may override. A training model's gradients
    are built for the values the initializers hold (the rules fold
    constants, a parameter's value is the checkpoint's), so each becomes a
    plain initializer: a constant, or a parameter where ``requires_grad``
    names it. The IR version is raised to 4 where it was lower, the first
    that lets an initializer be no input.
    """
    initializers = {tensor.name for tensor in model.graph.initializer}
    dropped = [value.name for value in model.graph.input if value.name in initializers]
    if not dropped:
        return []
    kept = [value for value in model.graph.input if value.name not in initializers]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    model.ir_version = max(model.ir_version, 4)
    return dropped


def constants_as_initializers(model: onnx.ModelProto, names: Sequence[str]) -> list[str]:
    """Make each of ``names`` that a ``Constant`` node of ``model``'s graph computes from a tensor (its ``value``)
    an initializer of that value, removing the node, in place; the names made so.

    Some converters and hand-written models hold weights in ``Constant`` nodes:
    named for training, they become the initializers a parameter is.
    """
    wanted = set(names)
    made: list[str] = []
    kept: list[onnx.NodeProto] = []
    for node in model.graph.node:
        value = attribute(node, "value") if node.op_type == "Constant" else None
        if value is not None and versions.is_standard(node) and node.output[0] in wanted:
            tensor = onnx.TensorProto()
            tensor.CopyFrom(value)
            tensor.name = node.output[0]
            model.graph.initializer.append(tensor)
            made.append(tensor.name)
        else:
            kept.append(node)
    if made:
        del model.graph.node[:]
        model.graph.node.extend(kept)
    return made


def _as_written(model: onnx.ModelProto) -> onnx.ModelProto:
    return model


def upgraded(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` importing ``ai.onnx`` once, at :data:`~onnxtrain.graph.versions.MIN_OPSET` or later.

    Several ``ai.onnx`` imports (a user appending a newer one to an older
    model) become one, of the newest version. A model older than the rules
    need (ONNX Runtime accepts any) is converted by onnx's version converter;
    its IR version is raised to 7 first, since the converter needs every
    initializer to be defined and IR 3 lists them as graph inputs. Other
    domains' imports are kept, and a domain its nodes use without an import
    is imported at version 1, as ONNX Runtime reads it.
    ``ValueError`` when the converter cannot.
    """
    versions.merge_imports(model)
    versions.import_used_domains(model)
    version = versions.opset_version(model, "")
    if version is None or version >= versions.MIN_OPSET:
        return model
    if model.ir_version < 7:
        model.ir_version = 7
    _warn_of_inert_dropouts(model, version)
    try:
        return _converted(model, versions.MIN_OPSET)
    except Exception as error:  # onnx's ConvertError and the like
        raise ValueError(
            f"the base model uses ai.onnx opset {version}, older than the gradient rules need ({versions.MIN_OPSET}), "
            f"and onnx's version converter cannot convert it: {error}; export the model with opset "
            f">= {versions.MIN_OPSET}{_fixed_dims_hint(model)}"
        ) from error


def _fixed_dims_hint(model: onnx.ModelProto) -> str:
    """What may let onnx's converter convert ``model``, whose conversion failed: numbers for its inputs' symbolic
    dimensions, which some of its steps need (Gemm's ``broadcast`` before opset 7); ``""`` where all are numbers."""
    initializers = {tensor.name for tensor in model.graph.initializer}
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim if value.type.HasField("tensor_type") else []
        if value.name not in initializers and any(not dim.HasField("dim_value") for dim in dims):
            return (
                ", or, for a model you cannot export again, give the inputs' symbolic dimensions numbers "
                f"({value.name!r} has one), which some of the converter's steps need: "
                "onnx.tools.update_model_dims.update_inputs_outputs_dims(model, {input: [sizes]}, {output: [sizes]})"
            )
    return ""


class OpsetConversionWarning(UserWarning):
    """A base model older than the gradient rules need was converted, and computes differently in training."""


def _warn_of_inert_dropouts(model: onnx.ModelProto, version: int) -> None:
    """:class:`OpsetConversionWarning` where ``model`` (of ``ai.onnx`` ``version``) has Dropout nodes that would
    drop in training: before opset 12 Dropout has no training mode, and converted it passes its input through."""
    if version >= 12:
        return
    dropping = [
        node.name or f"Dropout #{index}"
        for index, node in enumerate(walk.all_nodes(model.graph))
        if node.op_type == "Dropout"
        and versions.is_standard(node)
        and attribute(node, "ratio", 0.5) > 0
        and not attribute(node, "is_test", 0)
    ]
    if dropping:
        shown = ", ".join(map(repr, dropping[:3])) + (f" and {len(dropping) - 3} more" if len(dropping) > 3 else "")
        caller.warn(
            f"the base model's ai.onnx opset {version} is converted to {versions.MIN_OPSET}: ONNX's Dropout has "
            f"no training mode before opset 12, so its {len(dropping)} Dropout node(s) ({shown}) pass their input "
            "through in training too; to train with dropout, export the model at opset 12 or later in training "
            "mode (torch.onnx.export(..., opset_version=17, training=torch.onnx.TrainingMode.TRAINING))",
            OpsetConversionWarning,
        )


def _converted(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """``model`` converted to ``ai.onnx`` ``opset`` by onnx's version converter, each node keeping its
    ``metadata_props`` (which the converter drops: ``set_embedding``'s marks, say) where the converted model
    has a node of its name; unnamed nodes that hold some are named for the conversion only."""
    marks: dict[str, list[onnx.StringStringEntryProto]] = {}
    named: set[str] = set()
    taken = {node.name for node in walk.all_nodes(model.graph)}
    for node in walk.all_nodes(model.graph):
        if node.metadata_props:
            if not node.name:
                node.name = first_free("onnxtrain.converted", taken)
                taken.add(node.name)
                named.add(node.name)
            marks[node.name] = list(node.metadata_props)
    converted = version_converter.convert_version(model, opset)
    for node in walk.all_nodes(converted.graph):
        if node.name in marks and not node.metadata_props:
            node.metadata_props.extend(marks[node.name])
        if node.name in named:
            node.name = ""
    return converted


def _check_not_empty(model: onnx.ModelProto, what: str) -> None:
    """``ValueError`` for a model with no graph (an empty file parses as one)."""
    if not model.HasField("graph"):
        raise ValueError(
            f"{what} has no graph: it is empty or not an ONNX model; pass the .onnx file the exporter wrote"
        )


def is_small(tensor: onnx.TensorProto) -> bool:
    """Whether ``tensor`` holds its values inline and has at most :data:`SMALL_TENSOR_ELEMENTS`."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return False
    count = 1
    for dim in tensor.dims:
        count *= dim
    return count <= SMALL_TENSOR_ELEMENTS


def type_only_tensor(tensor: onnx.TensorProto) -> onnx.TensorProto:
    """A tensor with ``tensor``'s name, type and shape and no data.

    Its data is marked external at a location that does not exist: shape
    inference reads only the type and dims, and never opens the file.
    """
    stub = onnx.TensorProto(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims)
    stub.data_location = onnx.TensorProto.EXTERNAL
    stub.external_data.add(key="location", value="__onnxtrain_type_only__")
    return stub


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` (for a pass, which rewrites the model it is given, :mod:`onnxtrain.graph.passes`)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` without the values of its large initializers, for shape inference.

    Small initializers keep their values (shape tensors and axes, which shape
    inference reads); the skeleton stays small even for a model of many gigabytes.
    """
    light = onnx.ModelProto()
    for field in ("ir_version", "producer_name", "domain", "model_version"):
        setattr(light, field, getattr(model, field))
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    graph = model.graph
    target = light.graph
    target.name = graph.name
    target.node.extend(graph.node)
    target.input.extend(graph.input)
    target.output.extend(graph.output)
    target.value_info.extend(graph.value_info)
    target.initializer.extend(t if is_small(t) else type_only_tensor(t) for t in graph.initializer)
    return light


#: Integer vectors longer than this are data, not shapes: onnx's data propagation is not run over them.
LONGEST_SHAPE_VECTOR = 4096


def inferred_skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """:func:`skeleton` of ``model`` with inferred types, with onnx's data propagation where it is cheap.

    Its constant subgraphs are folded first (:func:`~onnxtrain.graph.passes.constants.fold_constants`),
    so that inference reads the values computed from small constants
    (``Resize`` scales that are a ``Concat`` of ``Constant`` nodes).

    The outputs of ONNX Runtime's contrib operators that onnx cannot type are
    typed where they follow from an input (:mod:`onnxtrain.graph.contrib_types`).

    Data propagation computes the values of the integer vectors that feed
    ``Reshape``, ``Expand`` and the like, for exact shapes; onnx 1.23 keeps
    every element (about 140 bytes each), so an integer vector as long as a
    static batch of 10**7 would take 1.4 GB. A first pass without it finds
    such vectors; only a model without them gets the second pass.
    """
    light = fold_constants(skeleton(model))
    plain = shape_inference.infer_shapes(light, strict_mode=False)
    for value in (*plain.graph.input, *plain.graph.value_info, *plain.graph.output):
        tensor = value.type.tensor_type
        if (
            value.type.HasField("tensor_type")
            and dtypes.is_integer(tensor.elem_type)
            and len(tensor.shape.dim) == 1
            and tensor.shape.dim[0].dim_value > LONGEST_SHAPE_VECTOR
        ):
            return type_contrib_outputs(plain, functools.partial(shape_inference.infer_shapes, strict_mode=False))
    infer = functools.partial(shape_inference.infer_shapes, strict_mode=False, data_prop=True)
    return type_contrib_outputs(infer(light), infer)


#: Operators onnx's checker refuses as deprecated at these opsets (first, last), which onnxruntime runs:
#: GroupNormalization-18 (its scale and bias per group; opset 21 made them per channel).
DEPRECATED_BUT_RUN: dict[str, tuple[int, int]] = {"GroupNormalization": (18, 20)}


def _move_runtime_contrib_nodes(model: onnx.ModelProto) -> None:
    """Move ``model``'s default-domain nodes of ONNX Runtime's contrib operators (where ONNX has no such
    operator at the model's opset) to ``com.microsoft``, importing that domain if needed (in place)."""
    opset = versions.opset_version(model) or 0
    moved = False
    for node in model.graph.node:
        if not versions.is_standard(node) or node.op_type not in RUNTIME_DEFAULT_DOMAIN_OPS:
            continue
        defined_since = RUNTIME_DEFAULT_DOMAIN_OPS[node.op_type]
        if defined_since is None or opset < defined_since:
            node.domain = "com.microsoft"
            moved = True
    for node in model.graph.node:  # deprecated by onnx's checker, run by onnxruntime as their schema says
        first, last = DEPRECATED_BUT_RUN.get(node.op_type, (0, -1))
        if versions.is_standard(node) and first <= opset <= last:
            node.domain = "com.microsoft"
            moved = True
    if moved and not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))


def checkable(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` for ``onnx.checker``, without two of its false alarms.

    Given a ``ModelProto``, the checker looks for external data files relative
    to the current directory, not the model's folder, and fails when they are
    not there. The values are not what it checks: only that they are defined
    with a type, which a graph input of the same type and shape says as well;
    so external-data initializers become typed inputs here.

    The checker also wants a shape on every graph input and output, while the
    IR lets a tensor type leave it out (unknown rank, e.g. the output of
    ``Squeeze`` without axes on a symbolic shape); such types get an empty
    shape here, in the copy only.

    ONNX Runtime registers a few contrib operators in the default domain
    (``SimplifiedLayerNormalization``, ``LayerNormalization`` before ONNX
    defined it at opset 17), which its transformer optimizer writes; the
    checker knows no such schema, so the copy moves those nodes to
    ``com.microsoft``, whose operators it does not check; so it does with the
    operators the checker refuses as deprecated and onnxruntime runs
    (:data:`DEPRECATED_BUT_RUN`).
    """
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    _move_runtime_contrib_nodes(copy)
    for value in (*graph.input, *graph.output):
        if value.type.HasField("tensor_type") and not value.type.tensor_type.HasField("shape"):
            value.type.tensor_type.shape.SetInParent()
    inputs = {value.name for value in graph.input}
    kept = []
    for tensor in graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            kept.append(tensor)
        elif tensor.name not in inputs:
            graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return copy
