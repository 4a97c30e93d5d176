"""What torch's dynamo exporter wrote on each node, and the parameters its optimizer changed for inference.

``torch.onnx.export(..., dynamo=True)`` writes in each node's
``metadata_props`` the module scopes of the torch code that made it
(``pkg.torch.onnx.name_scopes``, a list whose last entry is the operation)
and the FX node it came from (``pkg.torch.onnx.fx_node``), whose arguments
name the parameters torch read there: ``%p_<name>``, the parameter's name in
lower case with every character that is not a letter, digit or ``_`` made
``_`` (``p_model_bert_embeddings_layernorm_weight``). The graph's
``metadata_props`` hold the exported program's signature, which maps each
placeholder to the parameter's name (``pkg.torch.export.ExportedProgram.graph_signature``).

With ``optimize=True``, its default, the exporter then rewrites the graph
for inference, which changes what the parameters of a training graph are:

- **merged**: initializers of equal values become one. A model fresh from
  its initialisation has all its LayerNorm weights equal (ones), and its
  biases (zeros): one initializer then stands for all of them, and training
  ties them, its gradient the sum of theirs.
- **dropped**: a bias of zeros is removed from its ``Gemm`` or ``Add``:
  nothing is left to train.
- **folded**: a weight read through a ``Transpose`` becomes a new constant,
  its transpose (``val_80``): trained as torch would train it (the optimizers
  are element-wise), under that name and in that layout. A weight offset by a
  constant (Gemma's RMSNorm reads ``1 + w``) becomes a constant named after
  the folded FX node (``add_219``), which no ONNX node is left of: found by
  its readers' FX arguments, and paired with the parameters of their module
  that no node reads any more.

:func:`parameter_changes` finds them by comparing, for each FX node, the
parameters torch read with the initializers its ONNX nodes read. An export
with ``optimize=False`` (or TorchScript's, ``dynamo=False``) has none.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Literal

import onnx

from onnxtrain.graph import dtypes

#: The ``metadata_props`` key where torch's dynamo exporter writes a node's module scopes.
NAME_SCOPES_KEY = "pkg.torch.onnx.name_scopes"
#: The ``metadata_props`` key where torch's dynamo exporter writes the FX node a node came from.
FX_NODE_KEY = "pkg.torch.onnx.fx_node"
#: The ``metadata_props`` key where torch's dynamo exporter writes the classes of a node's module scopes.
CLASS_HIERARCHY_KEY = "pkg.torch.onnx.class_hierarchy"
#: The graph's ``metadata_props`` key where torch's dynamo exporter writes the exported program's signature.
SIGNATURE_KEY = "pkg.torch.export.ExportedProgram.graph_signature"

Change = Literal["merged", "dropped", "folded"]

_PARAMETER = re.compile(r"%(p_\w+)")
#: The placeholders of buffers (``%b_...``) and of tensor constants torch lifted (``%c_...``).
_BUFFER = re.compile(r"%([bc]_\w+)")
_SIGNATURE_INPUT = re.compile(r"^(\w+): (\w+) target='([^']*)'", re.M)
_CALL = re.compile(r"target=torch\.ops\.aten\.(\w+)\.default\]\(args = \((.*)\), kwargs = \{(.*)\}\)")
_KEYWORD = re.compile(r"(\w+): ([^,]+)")
#: The ATen batch normalizations whose sixth argument is ``training``.
_BATCH_NORMS = frozenset(
    {"_native_batch_norm_legit_functional", "_native_batch_norm_legit", "native_batch_norm", "batch_norm"}
)


def module_path(node: onnx.NodeProto) -> str:
    """The torch module that computed ``node``: from its dynamo scopes, else its TorchScript name (``""``: none).

    TorchScript names a node by its scopes (``/distilbert/transformer/layer.0/attention/q_lin/MatMul`` is
    module ``distilbert.transformer.layer.0.attention.q_lin``); the dynamo exporter lists them in
    :data:`NAME_SCOPES_KEY`, the entry before the last being the module."""
    scopes = _listed(node, NAME_SCOPES_KEY)
    if scopes is not None and len(scopes) >= 2:
        return scopes[-2]
    parts = node.name.lstrip("/").split("/")
    return ".".join(parts[:-1]) if len(parts) > 1 else ""


#: torch's dropout modules whose output is their input times a random mask scaled by ``1 / (1 - p)`` (inverted
#: dropout): their input itself in eval mode.
_INVERTED_DROPOUTS = frozenset(
    f"torch.nn.modules.dropout.{name}" for name in ("Dropout", "Dropout1d", "Dropout2d", "Dropout3d")
)


def dropout_call(node: onnx.NodeProto) -> tuple[str, ...] | None:
    """The scopes of the call of a torch inverted-dropout module (``nn.Dropout2d``...) that made ``node``, one
    per call; ``None`` where another module made it. The dynamo exporter writes ``nn.Dropout`` as a ``Dropout``
    node, but ``Dropout1d/2d/3d`` as the random mask's operators (``RandomUniformLike``, ``Less``, ``Div``) and
    the ``Mul`` by it."""
    scopes, classes = _listed(node, NAME_SCOPES_KEY), _listed(node, CLASS_HIERARCHY_KEY)
    if scopes is None or classes is None or len(scopes) != len(classes) or len(scopes) < 2:
        return None
    return tuple(scopes[:-1]) if classes[-2] in _INVERTED_DROPOUTS else None


def _listed(node: onnx.NodeProto, key: str) -> list[str] | None:
    """The list of strings ``node``'s metadata ``key`` holds, or ``None``."""
    text = _metadata(node, key)
    try:
        parsed = ast.literal_eval(text) if text is not None else None
    except (ValueError, SyntaxError):
        return None
    return parsed if isinstance(parsed, list) and all(isinstance(item, str) for item in parsed) else None


def placeholder(name: str) -> str:
    """The name torch's export gives the placeholder of parameter ``name``: ``p_`` and ``name`` in lower case,
    each character other than a letter, digit or ``_`` made ``_``."""
    return "p_" + re.sub(r"\W", "_", name).lower()


def parameters_read(node: onnx.NodeProto) -> tuple[str, ...]:
    """The placeholders of the parameters that ``node``'s FX node read (its arguments' ``%p_...``), in order."""
    return _placeholders(_metadata(node, FX_NODE_KEY))


def buffers_read(node: onnx.NodeProto) -> tuple[str, ...]:
    """The placeholders of the buffers and lifted constants that ``node``'s FX node read (its arguments'
    ``%b_...`` and ``%c_...``), in order."""
    return _placeholders(_metadata(node, FX_NODE_KEY), _BUFFER)


def has_fx_node(node: onnx.NodeProto) -> bool:
    """Whether torch's dynamo exporter wrote the FX node ``node`` came from."""
    return _metadata(node, FX_NODE_KEY) is not None


def _placeholders(fx: str | None, pattern: re.Pattern[str] = _PARAMETER) -> tuple[str, ...]:
    """The placeholders ``pattern`` finds (``%p_...``) among the arguments of FX node text ``fx`` (after its
    ``=``), in order."""
    if fx is None or " = " not in fx:
        return ()
    return tuple(dict.fromkeys(pattern.findall(fx.split(" = ", 1)[1])))


def embedding_arguments(node: onnx.NodeProto) -> tuple[int | None, bool] | None:
    """``(padding_idx, scale_grad_by_freq)`` of the ``aten.embedding`` call ``node`` came from (its FX node's
    third and fourth arguments, or keywords; ``None`` for a ``padding_idx`` of -1), ``None`` where ``node``
    came from another call."""
    call = _aten_call(node)
    if call is None or call[0] != "embedding":
        return None
    padding, scale = _argument(call, 2, "padding_idx", "-1"), _argument(call, 3, "scale_grad_by_freq", "False")
    try:
        row = int(padding)
    except ValueError:
        row = -1
    return (row if row >= 0 else None), scale == "True"


def batch_norm_training(node: onnx.NodeProto) -> bool | None:
    """Whether torch ran the batch normalization ``node`` came from in training mode (batch statistics, running
    statistics updated): its FX node's ``training`` argument (the sixth, or the keyword; ``False`` for
    ``_native_batch_norm_legit_no_training``); ``None`` where ``node`` came from another call.

    torch's dynamo exporter writes every such call as an inference ``BatchNormalization`` (``training_mode=0``,
    one output), whatever the module's mode: this is what torch computed."""
    call = _aten_call(node)
    if call is None or call[0] not in _BATCH_NORMS | {"_native_batch_norm_legit_no_training"}:
        return None
    return call[0] in _BATCH_NORMS and _argument(call, 5, "training", "False") == "True"


def instance_norm_statistics(node: onnx.NodeProto) -> tuple[str, str] | None:
    """The running mean and variance (FX placeholders, ``%b_...``) that the torch instance normalization
    ``node`` came from reads: ``nn.InstanceNorm*d(track_running_stats=True)``, whose statistics ONNX's
    ``InstanceNormalization`` has no place for; ``None`` for another call or one without them."""
    call = _aten_call(node)
    if call is None or call[0] != "instance_norm":
        return None
    mean, variance = _argument(call, 3, "running_mean", "None"), _argument(call, 4, "running_var", "None")
    return None if "None" in (mean, variance) else (mean, variance)


def _aten_call(node: onnx.NodeProto) -> tuple[str, list[str], dict[str, str]] | None:
    """``(operator, arguments, keywords)`` of the ``aten.<operator>.default`` call of ``node``'s FX node, as
    text; ``None`` without one."""
    fx = _metadata(node, FX_NODE_KEY)
    found = _CALL.search(fx) if fx else None
    if found is None:
        return None
    arguments = [arg.strip() for arg in found.group(2).split(",") if arg.strip()]
    keywords = {key: value.strip() for key, value in _KEYWORD.findall(found.group(3))}
    return found.group(1), arguments, keywords


def _argument(call: tuple[str, list[str], dict[str, str]], position: int, keyword: str, default: str) -> str:
    """Argument ``position`` (or ``keyword``) of an :func:`_aten_call`, as text; ``default`` where absent."""
    _, arguments, keywords = call
    return keywords.get(keyword, arguments[position] if len(arguments) > position else default)


@dataclass(frozen=True)
class ParameterChange:
    """torch's ``parameters`` that one FX node read and its ONNX nodes do not, and what they read instead.

    ``node``: the FX node's first ONNX node; ``module``: its torch module; ``read_as``: the float initializers
    its ONNX nodes read that are not the parameters torch read there; ``reads``: all the float initializers they
    read; ``merged``: whether ``read_as`` holds parameters that torch read elsewhere."""

    node: str
    module: str
    parameters: tuple[str, ...]
    read_as: tuple[str, ...]
    reads: tuple[str, ...]
    merged: bool

    @property
    def change(self) -> Change:
        """``merged`` (another parameter read instead), ``dropped`` (nothing), or ``folded`` (a computed
        constant)."""
        return "merged" if self.merged else "folded" if self.read_as else "dropped"


def parameter_changes(model: onnx.ModelProto, *, folded_away: bool = True) -> list[ParameterChange]:
    """The FX nodes of a dynamo export whose ONNX nodes do not read, under its name, each parameter that torch
    read there (see the module docstring), in graph order, then (``folded_away``) the constants folded from FX
    nodes that no ONNX node is left of, paired with parameters by their module (a guess). Empty for a model
    without the exporter's metadata; for one whose initializers are not named as torch's parameters (no
    placeholder matches any), only those constants."""
    graph = model.graph
    floats = [t.name for t in graph.initializer if dtypes.is_float(t.data_type) and t.dims]
    float_names = set(floats)
    # a fold may be a scalar: CLIP's exp(logit_scale).clamp(max=100) folded into a rank-0 constant
    folds = {t.name for t in graph.initializer if dtypes.is_float(t.data_type)}
    # the initializer that stands for each placeholder: torch's name from the signature, else the one named so
    stands_for = {**{placeholder(name): name for name in floats}, **signature_parameters(graph)}
    groups: dict[str, list[onnx.NodeProto]] = {}  # the ONNX nodes of each FX node, by its text
    for node in graph.node:
        fx = _metadata(node, FX_NODE_KEY)
        if fx is not None:
            groups.setdefault(fx, []).append(node)
    read_by = {fx: found for fx in groups if (found := _placeholders(fx))}  # the FX nodes that read parameters
    parameters = {stands_for.get(p) for found in read_by.values() for p in found}
    if parameters.isdisjoint(float_names):
        return _folded_away(graph, folds, []) if folded_away else []
    changes = []
    for fx, found in read_by.items():
        nodes = groups[fx]
        wanted = {p: stands_for.get(p) for p in found}
        reads = tuple(dict.fromkeys(name for node in nodes for name in node.input if name in float_names))
        missing = [p for p, name in wanted.items() if name not in reads]
        if not missing:
            continue
        module = module_path(nodes[0])
        instead = tuple(name for name in reads if name not in wanted.values())
        changes.append(
            ParameterChange(
                node=nodes[0].name,
                module=module,
                parameters=tuple(wanted[p] or _torch_name(p, module) for p in missing),
                read_as=instead,
                reads=reads,
                merged=not parameters.isdisjoint(instead),
            )
        )
    return changes + _folded_away(graph, folds, changes) if folded_away else changes


def _folded_away(graph: onnx.GraphProto, floats: set[str], found: list[ParameterChange]) -> list[ParameterChange]:
    """Folds of FX nodes that no ONNX node is left of: a constant named after the FX node (Gemma's RMSNorm weight
    ``1 + w`` as ``add_219``), which the nodes of its readers read, paired with the parameters of its reader's
    module that no node reads any more. Where that module also has a buffer or constant no node reads, the
    constant may be computed from it (a rotary table from its frequencies): not said."""
    kinds = signature_kinds(graph)
    read = {name for node in graph.node for name in node.input}
    unread = [name for name, kind in kinds.items() if kind == "PARAMETER" and name not in read]
    unread_others = {
        name.rpartition(".")[0] for name, kind in kinds.items() if kind != "PARAMETER" and name not in read
    }
    told = {name for change in found for name in (*change.parameters, *change.read_as)}
    changes: list[ParameterChange] = []
    for node in graph.node:
        fx = _metadata(node, FX_NODE_KEY)
        arguments = fx.split(" = ", 1)[1] if fx is not None and " = " in fx else ""
        for name in node.input:
            if name not in floats or name in kinds or name in told:
                continue
            if not re.search(rf"%{re.escape(name)}\b", arguments):
                continue
            module = module_path(node)
            parameters = tuple(p for p in unread if p not in told and p.rpartition(".")[0] == module)
            if not parameters or module in unread_others:
                continue
            told.update((name, *parameters))
            reads = tuple(dict.fromkeys(n for n in node.input if n in floats))
            changes.append(ParameterChange(node.name, module, parameters, (name,), reads, merged=False))
    return changes


def signature_parameters(graph: onnx.GraphProto) -> dict[str, str]:
    """``{placeholder: torch's name}`` of the parameters in the export's signature (:data:`SIGNATURE_KEY`, lines
    ``p_fc_weight: PARAMETER target='fc.weight'``); empty without one."""
    return {p: target for p, kind, target in _signature(graph) if kind == "PARAMETER"}


def signature_kinds(graph: onnx.GraphProto) -> dict[str, str]:
    """``{torch's name: kind}`` of the tensors in the export's signature: ``PARAMETER``, ``BUFFER``,
    ``CONSTANT_TENSOR``; empty without one."""
    return {target: kind for _, kind, target in _signature(graph)}


def _signature(graph: onnx.GraphProto) -> list[tuple[str, str, str]]:
    """``(placeholder, kind, target)`` for each input of the signature with a target."""
    signature = next((prop.value for prop in graph.metadata_props if prop.key == SIGNATURE_KEY), "")
    return _SIGNATURE_INPUT.findall(signature)


def _torch_name(parameter: str, module: str) -> str:
    """The parameter's name in torch without the signature: ``module`` (its case kept) and the attribute after
    it in placeholder ``parameter``; the placeholder itself where it does not start with the module's."""
    prefix = placeholder(module) + "_" if module else "p_"
    if module and parameter.startswith(prefix) and len(parameter) > len(prefix):
        return f"{module}.{parameter[len(prefix) :]}"
    return parameter


def _metadata(node: onnx.NodeProto, key: str) -> str | None:
    return next((prop.value for prop in node.metadata_props if prop.key == key), None)


__all__ = [
    "CLASS_HIERARCHY_KEY",
    "FX_NODE_KEY",
    "NAME_SCOPES_KEY",
    "SIGNATURE_KEY",
    "ParameterChange",
    "batch_norm_training",
    "dropout_call",
    "embedding_arguments",
    "instance_norm_statistics",
    "module_path",
    "parameter_changes",
    "parameters_read",
    "placeholder",
    "signature_kinds",
    "signature_parameters",
]
