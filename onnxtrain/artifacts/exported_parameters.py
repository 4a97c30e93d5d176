"""Parameters that torch's exporters changed for inference, said before they are trained.

``torch.onnx.export(..., dynamo=True)`` optimizes its graph for inference by
default (``optimize=True``): it merges initializers of equal values, drops
biases of zeros and folds transposed weights into new constants
(:mod:`onnxtrain.graph.torch_metadata`). Trained, such a graph ties the
merged parameters and cannot train the dropped ones: a model fresh from its
initialisation (unit LayerNorm weights, zero biases) then trains differently
from torch. :func:`warn_changed_parameters` says so when a trained
initializer is involved; :func:`explain_missing` says why a parameter torch
has is not in the graph.

The TorchScript exporter (``dynamo=False``) in its default evaluation mode
computes some convolution weights at export time: a ``BatchNormalization``
merged into the convolution before it, a weight normalization applied. The
layers they were computed from are gone from the graph, and the results are
constants named ``onnx::Conv_N``: :func:`warn_folded_convolutions` says so
when they are trained. It also merges parameters of equal values and folds
a tied weight's transpose; those are undone before training
(:mod:`onnxtrain.graph.passes.untie`, :mod:`onnxtrain.graph.passes.retie`),
but for the constants it computed and merged, which stay one tensor:
:func:`warn_merged_constants` says so. A ``requires_grad`` list that names a
folded transpose is refused, naming the weight it is read as
(:func:`check_not_tied_copies`). An ``nn.InstanceNorm*d(track_running_stats=True)``
loses its running statistics in any export (ONNX's ``InstanceNormalization`` has
none): :func:`warn_untracked_statistics` says so where the dynamo exporter
recorded them.

tf2onnx's optimizer ``merge_duplication`` (on by default) stores tensors of
equal values once: a fresh Keras model's LayerNormalization scales, all
ones, become one initializer read by both layers, which trains them tied.
:func:`warn_tf2onnx_merges` says so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import onnx

from onnxtrain import caller
from onnxtrain.graph.attributes import text_attribute
from onnxtrain.graph.naming import GENERATED
from onnxtrain.graph.passes.untie import merged_constants
from onnxtrain.graph.roles import initializer_roles
from onnxtrain.graph.torch_metadata import (
    FX_NODE_KEY,
    NAME_SCOPES_KEY,
    Change,
    ParameterChange,
    instance_norm_statistics,
    module_path,
    parameter_changes,
)
from onnxtrain.graph.versions import is_standard
from onnxtrain.graph.walk import all_nodes

#: What to do about the changes, in every message.
REMEDY = (
    "Export with torch.onnx.export(..., dynamo=True, optimize=False), or dynamo=False in training mode "
    "(training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False: its default evaluation mode folds "
    "BatchNormalization into convolutions too), to keep every parameter as torch has it"
)
#: How torch's dynamo exporter names its nodes (``node_Gemm_0``; the TorchScript exporter's are ``/fc/Gemm``).
DYNAMO_NODE_PREFIX = "node_"
#: The changes listed by name in a warning, per kind.
LISTED = 3
#: The operators whose computed weights :func:`warn_folded_convolutions` names.
CONVOLUTIONS = frozenset({"Conv", "ConvTranspose"})
#: How to export a model whose convolutions and normalizations train as torch's.
TRAINING_EXPORT = (
    "torch.onnx.export(..., dynamo=False, training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)"
)

_MEANING: dict[Change, str] = {
    "merged": "parameters of equal values made one, which training ties",
    "dropped": "biases of zeros removed, which cannot be trained",
    "folded": "weights read as constants computed from them (a weight's transpose; 1 + w; a normalization merged "
    "into the convolution before it, which then normalizes nothing), trained under those names and layouts as plain "
    "weights, without the layers they were computed from",
}


class TorchExportWarning(UserWarning):
    """The parameters being trained are not torch's: its dynamo exporter merged, dropped or folded some."""


class Tf2onnxExportWarning(UserWarning):
    """The parameters being trained are not TensorFlow's: tf2onnx's optimizer merged some of equal values."""


#: How to convert a Keras model with its parameters kept apart.
TF2ONNX_REMEDY = (
    "Convert with all of tf2onnx's optimizers but merge_duplication to keep them apart: "
    "tf2onnx.convert.from_keras(..., optimizers={name: o for name, o in tf2onnx.optimizer._get_optimizers().items() "
    "if name != 'merge_duplication'})"
)


def warn_changed_parameters(model: onnx.ModelProto, requires_grad: Sequence[str]) -> None:
    """A :class:`TorchExportWarning` naming the parameters the exporter changed where the nodes that read them
    read a parameter of ``requires_grad`` (a layer being trained), and, while anything trains, those it folded
    into what the roles call constants (CLIP's ``exp(logit_scale).clamp(max=100)``, a rank-0 ``clamp``, which
    :func:`~onnxtrain.graph.roles.trainable_parameters` leaves out: torch's parameter would not train at all);
    nothing otherwise."""
    trained = set(requires_grad)
    found = parameter_changes(model)
    changes = [change for change in found if trained.intersection(change.reads)]
    folded = [change for change in found if trained and change.change == "folded" and change not in changes]
    if folded:  # folds the roles call constants: no list of the weights would train them (a user's own choice not)
        roles = initializer_roles(model)
        changes += [change for change in folded if all(roles.get(n) == "constant" for n in change.read_as)]
    if not changes:
        return
    lines = []
    for kind in ("merged", "dropped", "folded"):
        of_kind = [change for change in changes if change.change == kind and trained.intersection(change.reads)]
        if of_kind:
            lines.append(f"{kind.capitalize()}, {_MEANING[kind]}: {_listed([clause(c) for c in of_kind])}.")
    constants = [change for change in changes if not trained.intersection(change.reads)]
    if constants:
        lines.append(
            "Folded into constants that are not trained, so that torch's parameters do not train at all: "
            f"{_listed([clause(c) for c in constants])}."
        )
    untied = _untied_copies(changes)
    if untied:
        lines.append(
            "Untied, each folded again for every use (a layer applied more than once, as ALBERT's shared layer): "
            "the copies train apart, each on its use's gradient, where torch trains one parameter on their sum: "
            + _listed([f"{name} as {', '.join(copies)}" for name, copies in untied.items()])
            + "."
        )
    caller.warn(
        "torch.onnx.export's optimizer (dynamo=True, optimize=True: its default) changed parameters of this model "
        "for inference: training it does not train torch's parameters as torch does.\n"
        + "\n".join(lines)
        + f"\n{REMEDY}.",
        TorchExportWarning,
    )


def warn_unrecorded_merges(model: onnx.ModelProto, requires_grad: Sequence[str]) -> None:
    """A :class:`TorchExportWarning` for a model of torch's dynamo exporter (its producer and node names) whose
    record of the parameters its optimizer changed is gone (no node keeps torch's metadata: torch converts a
    dynamo export to an opset below 18 after writing it, and drops it), naming the trained initializers that
    several nodes of one operator read, as the parameters its optimizer merged are (a fresh model's LayerNorm
    weights, all ones); nothing otherwise."""
    nodes = model.graph.node
    if model.producer_name != "pytorch" or not any(node.name.startswith(DYNAMO_NODE_PREFIX) for node in nodes):
        return
    if any(entry.key in (NAME_SCOPES_KEY, FX_NODE_KEY) for node in nodes for entry in node.metadata_props):
        return  # recorded: warn_changed_parameters reads what changed
    trained = set(requires_grad)
    readers: dict[str, Counter[str]] = {}
    for node in model.graph.node:
        for name in set(node.input) & trained:
            readers.setdefault(name, Counter())[node.op_type] += 1
    shared = [
        f"{name} (read by {count} {op}s)" for name, ops in readers.items() for op, count in ops.items() if count > 1
    ]
    if not shared:
        return
    caller.warn(
        f"{_listed(shared)}: this model of torch's dynamo exporter keeps no record of the parameters its optimizer "
        "changed (torch converts a dynamo export to an opset below 18 after writing it, and drops the record), and "
        "these parameters are read by several nodes of one operator, as parameters of equal values that the "
        "optimizer (optimize=True, the default) merged into one are (a fresh model's LayerNorm weights, all ones): "
        "training ties them, where torch trains them apart, unless the model applies one layer several times. "
        f"{REMEDY}.",
        TorchExportWarning,
    )


def warn_tf2onnx_merges(model: onnx.ModelProto, requires_grad: Sequence[str]) -> None:
    """A :class:`Tf2onnxExportWarning` for a model of tf2onnx (its producer) naming the trained initializers that
    nodes of different layers read, as tf2onnx's ``merge_duplication`` leaves the parameters of equal values it
    stores once; nothing otherwise. A node's layer is its name's scope (``functional_1/ln1_1`` of
    ``functional_1/ln1_1/mul``), one scope inside another being the same layer (``functional_1/ln1_1/moments``)."""
    if model.producer_name != "tf2onnx":
        return
    trained = set(requires_grad)
    scopes: dict[str, list[str]] = {}
    for node in all_nodes(model.graph):
        scope = node.name.rpartition("/")[0]
        for name in (set(node.input) & trained) if scope else ():
            scopes.setdefault(name, []).append(scope)
    shared = [
        f"{name} (read by {', '.join(layers[:LISTED])}{' ...' if len(layers) > LISTED else ''})"
        for name, found in scopes.items()
        if len(layers := _outermost(found)) > 1
    ]
    if not shared:
        return
    caller.warn(
        f"{_listed(shared)}: read by nodes of different layers of this model of tf2onnx, as the parameters of equal "
        "values that its optimizer merge_duplication (on by default) stores once are (a fresh Keras model's "
        "LayerNormalization scales, all ones): each trains as one tensor, on the sum of its layers' gradients, "
        "where Keras trains them apart, unless the model applies one layer several times. "
        f"{TF2ONNX_REMEDY}.",
        Tf2onnxExportWarning,
    )


def _outermost(scopes: Sequence[str]) -> list[str]:
    """The scopes of ``scopes`` inside none of the others (``a/b`` is inside ``a``), each once, in order of
    length."""
    kept: list[str] = []
    for scope in sorted(set(scopes), key=lambda s: (len(s), s)):
        if not any(scope == k or scope.startswith(k + "/") for k in kept):
            kept.append(scope)
    return kept


def warn_folded_convolutions(model: onnx.ModelProto, requires_grad: Sequence[str]) -> None:
    """A :class:`TorchExportWarning` naming the trained initializers that a convolution reads as its weight or
    bias under a name the TorchScript exporter gives to the constants it computes (see the module docstring);
    nothing otherwise."""
    trained = {name for name in requires_grad if name.startswith(GENERATED)}
    folded = [
        name
        for node in model.graph.node
        if node.op_type in CONVOLUTIONS and is_standard(node)
        for name in node.input[1:3]
        if name in trained
    ]
    if not folded:
        return
    caller.warn(
        f"{_listed(list(dict.fromkeys(folded)), 2 * LISTED, ', ')}: convolution weights that torch's "
        "exporter computed for inference (a BatchNormalization merged into its convolution, a weight "
        "normalization applied); they train as plain weights, without the layers they were computed from. To "
        f"train torch's layers, export in training mode: {TRAINING_EXPORT}.",
        TorchExportWarning,
    )


def warn_merged_constants(model: onnx.ModelProto, requires_grad: Sequence[str]) -> None:
    """A :class:`TorchExportWarning` naming each constant the TorchScript exporter computed that reads a trained
    initializer through an ``Identity``, left tied where the nodes' names do not tell one module from two
    (:func:`~onnxtrain.graph.passes.untie.merged_constants`); nothing otherwise."""
    trained = set(requires_grad)
    merged = [f"{copy} is {source}" for copy, source in merged_constants(model).items() if source in trained]
    if not merged:
        return
    caller.warn(
        f"{_listed(merged)}: torch's exporter merged constants of equal values that it computed from parameters (the "
        "transposes of weights), and they train as one tensor. That is torch's training where one layer is "
        "applied twice (ALBERT's shared layer), not where two layers were equal when exported "
        "(nn.TransformerEncoder copies one layer to make its layers): to train those apart, export in training "
        f"mode: {TRAINING_EXPORT}.",
        TorchExportWarning,
    )


class ScatterWarning(UserWarning):
    """A scatter without a reduction writes one of the updates to a repeated index, where torch's operation the
    export came from may sum them."""


#: The scatters that write one of several updates to a repeated index unless given a reduction.
SCATTERS = frozenset({"ScatterElements", "ScatterND"})


def warn_scatters(model: onnx.ModelProto) -> None:
    """A :class:`TorchExportWarning` naming each initializer a scatter writes into before it is read (a parameter
    renormalized in the forward, as torch's ``nn.Embedding(max_norm=...)`` does); a :class:`ScatterWarning`
    naming each other ``ScatterElements``/``ScatterND`` without a reduction whose indices
    come from the data (a graph input that is no initializer): at a repeated index it writes one of the updates
    (which one, ONNX leaves undefined), where torch's ``index_add_``, ``index_put_(accumulate=True)`` and
    ``scatter_reduce`` sum or average them; torch's exporters write some of those as such a scatter (the model then
    computes another function than torch's on a graph's edges); nothing otherwise."""
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    from_data = {value.name for value in graph.input if value.name not in initializers}
    copies = {node.output[0]: node.input[0] for node in graph.node if node.op_type == "Identity" and node.input}
    found, rewritten = [], []
    for node in graph.node:
        if any(name in from_data for name in node.input if name):
            from_data.update(name for name in node.output if name)
        if node.op_type not in SCATTERS or not is_standard(node) or len(node.input) < 2:
            continue
        reduction = text_attribute(node, "reduction", "none")
        source = node.input[0]
        while source in copies:  # torch's detach() is an Identity
            source = copies[source]
        if source in initializers:
            rewritten.append(source)
        elif reduction == "none" and node.input[1] in from_data:
            found.append(f"{node.name or node.output[0]} ({node.op_type})")
    if rewritten:
        caller.warn(
            f"{_listed(list(dict.fromkeys(rewritten)))}: the forward writes rows of this parameter with a scatter "
            "before reading it, as torch's nn.Embedding(max_norm=...) renormalizes the rows it looks up (in place, "
            "without a gradient). Trained here, its gradient goes through the renormalization where torch's does "
            "not, and the stored rows are never renormalized (parameter roles class it a constant: "
            "trainable_parameters leaves it out). Build the embedding without max_norm and renormalize its rows "
            "after each optimizer step, or keep it frozen",
            TorchExportWarning,
        )
    if not found:
        return
    caller.warn(
        f"{_listed(found)}: a scatter without a reduction, at indices from the data, writes one of the updates to "
        "an index that repeats (which one, ONNX leaves undefined). Where the model sums or averages them (torch's "
        "index_add_, index_put_(accumulate=True), scatter_reduce; a graph's messages to a node), torch's exporter "
        "wrote the wrong operator: check the exported model against torch on data whose indices repeat (torch's "
        "dynamo exporter writes index_add_ and scatter_add with reduction='add')",
        ScatterWarning,
    )


def warn_untracked_statistics(model: onnx.ModelProto) -> None:
    """A :class:`TorchExportWarning` naming each ``InstanceNormalization`` that torch ran with running statistics
    (``track_running_stats=True``), which the export leaves out; nothing otherwise."""
    tracked = [
        f"{node.name or node.output[0]} ({', '.join(stats)})"
        for node in model.graph.node
        if node.op_type == "InstanceNormalization" and (stats := instance_norm_statistics(node)) is not None
    ]
    if not tracked:
        return
    caller.warn(
        f"{_listed(tracked)}: torch's InstanceNorm with track_running_stats=True, whose running statistics the "
        "export leaves out (ONNX's InstanceNormalization has none). Training normalizes each sample by its own "
        "statistics, as torch's training mode does, and so does the eval model, where torch's eval mode would "
        "normalize by the running ones; build the layer with track_running_stats=False to export what is trained",
        TorchExportWarning,
    )


def _listed(items: Sequence[str], count: int = LISTED, separator: str = "; ") -> str:
    """The first ``count`` of ``items`` joined by ``separator``, and how many more there are."""
    more = f" (and {len(items) - count} more)" if len(items) > count else ""
    return separator.join(items[:count]) + more


def check_not_tied_copies(tied: Mapping[str, str], requires: Sequence[str], frozen: Sequence[str]) -> None:
    """``ValueError`` where ``requires_grad`` or ``frozen_params`` name one of the ``tied`` copies (``{copy:
    weight}``), which the model reads as its weight transposed again: the weight is the parameter to name."""
    for argument, names in (("requires_grad", requires), ("frozen_params", frozen)):
        named = [name for name in names if name in tied]
        if named:
            weights = list(dict.fromkeys(tied[name] for name in named))
            raise ValueError(
                f"{argument} names {named}, which the exporter computed as the transpose of {weights} (a weight "
                f"the model reads twice, tied, as a language model's embedding and its head): it is trained as "
                f"{weights}, tied as torch trains it; name {weights} instead"
            )


def explain_missing(model: onnx.ModelProto, name: str) -> str:
    """Why torch's parameter ``name`` is not an initializer of ``model``, where the exporter's changes say
    (``""`` otherwise)."""
    for change in parameter_changes(model):
        if name in change.parameters:
            instead = ", ".join(change.read_as)
            what = {
                "merged": f"merged it with parameters of equal values into {instead}",
                "dropped": "removed it, a bias of zeros",
                "folded": f"folded it into {instead}, a constant computed from it for inference",
            }[change.change]
            return f" (torch.onnx.export's optimizer {what}. {REMEDY})"
    return _folded_into_a_convolution(model, name)


def _folded_into_a_convolution(model: onnx.ModelProto, name: str) -> str:
    """Why torch's ``<module>.weight`` or ``.bias`` (or a BatchNorm's statistics) is missing where convolutions
    read weights the TorchScript exporter computed (a BatchNormalization merged into the convolution before it,
    in eval mode): the convolution of that module, or, for a module no node is left of (the BatchNorm merged
    away), the convolutions that read such weights; ``""`` otherwise."""
    module, _, kind = name.rpartition(".")
    if not module or kind not in ("weight", "bias", "running_mean", "running_var"):
        return ""
    folded = [
        (node, computed)
        for node in model.graph.node
        if node.op_type in CONVOLUTIONS
        and is_standard(node)
        and (computed := [value for value in node.input[1:3] if value.startswith(GENERATED)])
    ]
    own = [(node, computed) for node, computed in folded if module_path(node) == module]
    gone = not any(module_path(node) == module for node in model.graph.node)
    if not own and not (gone and folded):
        return ""
    convolutions = ", ".join(f"{node.name!r} reads {', '.join(computed)}" for node, computed in (own or folded)[:3])
    merged = "" if own else f"no node of {module!r} is left: "
    return (
        f" ({merged}the exporter computed convolutions' weights for inference ({convolutions}): a "
        "BatchNormalization merged into the convolution before it, torch.onnx.export's default evaluation mode "
        f"with constant folding. To train torch's layers, export in training mode: {TRAINING_EXPORT})"
    )


def _untied_copies(changes: Sequence[ParameterChange]) -> dict[str, list[str]]:
    """``{parameter: constants}`` for each torch parameter folded into more than one constant."""
    copies: dict[str, list[str]] = {}
    for change in changes:
        if change.change == "folded" and len(change.parameters) == 1:
            found = copies.setdefault(change.parameters[0], [])
            found += [name for name in change.read_as if name not in found]
    return {name: found for name, found in copies.items() if len(found) > 1}


def clause(change: ParameterChange) -> str:
    """``change``'s parameters, and what reads them instead."""
    parameters = ", ".join(change.parameters) or f"a parameter of {change.module or 'the model'}"
    return f"{parameters} read as {', '.join(change.read_as)}" if change.read_as else parameters


__all__ = [
    "REMEDY",
    "SCATTERS",
    "TF2ONNX_REMEDY",
    "ScatterWarning",
    "Tf2onnxExportWarning",
    "TorchExportWarning",
    "check_not_tied_copies",
    "clause",
    "explain_missing",
    "warn_changed_parameters",
    "warn_folded_convolutions",
    "warn_merged_constants",
    "warn_scatters",
    "warn_tf2onnx_merges",
    "warn_unrecorded_merges",
    "warn_untracked_statistics",
]
