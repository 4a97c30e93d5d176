"""The autocast pass: a float32 forward graph computing in float16 or bfloat16 where that is safe.

The policy is ``torch.amp``'s (:data:`POLICY`): matrix products,
convolutions, attention and recurrent layers compute in the half type;
softmax, normalizations, reductions that sum, exponentials, logarithms,
powers and losses in float32; every other operator follows its inputs
(half when all its floating inputs were computed in half, float32 when any
is float32, as PyTorch's type promotion gives).

The rewrite keeps every original value in float32 under its own name, so the
graph's inputs and outputs, the values a subgraph reads and the names a user
asks for do not change:

- a node computing in half reads ``Cast(x, to=half)`` of each float32 input
  of its data type (one cast per value, shared), writes ``y.<half>`` and a
  ``Cast(y.<half>, to=FLOAT)`` gives ``y``; a later half node reads
  ``y.<half>`` itself;
- a node computing in float32 reads the original names, unchanged.

Casts nothing reads are left for :func:`~onnxtrain.graph.passes.unused.prune_unused_nodes`.
Parameters stay float32 initializers (the master weights); their gradients,
through the casts, are float32.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping
from typing import Literal

import onnx
from onnx import helper

from onnxtrain.graph import dtypes, ops
from onnxtrain.graph.attributes import attribute
from onnxtrain.graph.builder import GraphBuilder
from onnxtrain.graph.naming import first_free, names_in
from onnxtrain.graph.versions import is_standard
from onnxtrain.graph.walk import names_read, readers_of, rename_values, subgraphs

Mode = Literal["half", "float32"]

#: ``precision=`` of ``generate_artifacts``: the half type each names (``fp32``: no autocast).
PRECISIONS: dict[str, int | None] = {
    "fp32": None,
    "bf16": onnx.TensorProto.BFLOAT16,
    "fp16": onnx.TensorProto.FLOAT16,
}

# fmt: off
#: Operators that compute in the half type: matrix products, convolutions, attention, recurrent layers
#: (``torch.amp``'s lower-precision list).
HALF_OPERATORS = (
    "MatMul", "Gemm", "Einsum", "Conv", "ConvTranspose", "PRelu", "Attention", "RNN", "GRU", "LSTM",
)
#: Operators that compute in float32: what overflows, underflows or sums many terms (``torch.amp``'s float32 list).
FLOAT32_OPERATORS = (
    # exponentials, logarithms, powers, and functions that lose digits in half
    "Exp", "Log", "Pow", "Reciprocal", "Sqrt", "Softplus", "Acos", "Asin", "Cosh", "Sinh", "Tan",
    # softmax and normalizations
    "Softmax", "LogSoftmax", "LayerNormalization", "BatchNormalization", "InstanceNormalization",
    "GroupNormalization", "RMSNormalization", "LpNormalization", "MeanVarianceNormalization", "LRN",
    # reductions that sum, cumulative sums, average pooling
    "ReduceSum", "ReduceMean", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
    "ReduceSumSquare", "CumSum", "AveragePool", "GlobalAveragePool", "LpPool", "GlobalLpPool",
    # losses
    "SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss",
)
# fmt: on

#: ``ai.onnx`` operator -> where it computes under autocast; an operator not listed follows its inputs.
POLICY: dict[str, Mode] = {**dict.fromkeys(HALF_OPERATORS, "half"), **dict.fromkeys(FLOAT32_OPERATORS, "float32")}

#: The prefix of the names of the ``Cast`` nodes :func:`autocast` adds (which :func:`strip_autocast` removes).
CAST_PREFIX = "autocast/"

#: The suffix of a value's half-precision copy (``y.float16``, ``y.bfloat16``).
HALF_SUFFIX = {onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.BFLOAT16: "bfloat16"}


class AutocastReport(dict[str, str]):
    """``{node name or op type#index: "half" | "float32"}``: where :func:`autocast` placed each float node."""


def check_precision(precision: object) -> int | None:
    """The half type ``precision`` names (``None`` for ``"fp32"``); ``ValueError`` for any other value."""
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not known; choose one of {list(PRECISIONS)}")
    return PRECISIONS[precision]


def check_overrides(overrides: Mapping[str, str] | None) -> dict[str, Mode]:
    """``overrides`` ({operator type: "half" | "float32"}) checked; ``ValueError`` names a bad entry."""
    checked: dict[str, Mode] = {}
    for op_type, mode in (overrides or {}).items():
        if not isinstance(op_type, str) or mode not in ("half", "float32"):
            raise ValueError(
                f"precision_overrides maps operator types to 'half' or 'float32'; {op_type!r}: {mode!r} is neither"
            )
        checked[op_type] = mode  # type: ignore[assignment]
    return checked


def autocast(
    model: onnx.ModelProto, half: int, overrides: Mapping[str, Mode] | None = None
) -> tuple[onnx.ModelProto, AutocastReport]:
    """``model`` (float32) computing in ``half`` where :data:`POLICY`, updated by ``overrides``, says, in place.

    Returns the model and where each node with a float32 data input now
    computes. Nodes of other domains, nodes with subgraphs and nodes whose
    outputs are not of their inputs' type are left as they are (float32).
    """
    policy = {**POLICY, **(overrides or {})}
    graph = model.graph
    types = GraphBuilder(model)
    taken = names_in(graph)
    suffix = HALF_SUFFIX[half]
    half_of: dict[str, str] = {}  # original float32 value -> its half copy (computed in half, or cast)
    native: set[str] = set()  # original values computed in half (their float32 name is a cast back)
    report = AutocastReport()
    nodes: list[onnx.NodeProto] = []
    for index, node in enumerate(graph.node):
        data = _data_positions(node, types)
        if data is None:
            nodes.append(node)
            continue
        inputs, outputs = data
        mode = policy.get(node.op_type, "follow")
        if mode == "follow":
            mode = "half" if all(node.input[k] in native for k in inputs) else "float32"
        if mode == "half" and not schema_takes(node, types.opset, half):
            mode = "float32"  # the operator's schema at this opset has no such type (Conv in bfloat16 before 22)
        report[node.name or f"{node.op_type}#{index}"] = mode
        if mode == "float32":
            nodes.append(node)
            continue
        for k in inputs:
            name = node.input[k]
            if name not in half_of:
                half_of[name] = first_free(f"{name}.{suffix}", taken)
                cast_name = first_free(f"{CAST_PREFIX}{half_of[name]}", taken)
                nodes.append(helper.make_node("Cast", [name], [half_of[name]], name=cast_name, to=half))
            node.input[k] = half_of[name]
        backs = []
        for k in outputs:
            name = node.output[k]
            half_of[name] = node.output[k] = first_free(f"{name}.{suffix}", taken)
            native.add(name)
            back_name = first_free(f"{CAST_PREFIX}{name}", taken)
            backs.append(helper.make_node("Cast", [half_of[name]], [name], name=back_name, to=onnx.TensorProto.FLOAT))
        nodes += [node, *backs]
    del graph.node[:]
    graph.node.extend(nodes)
    declare_like(graph, half_of, half)
    return model, report


def declare_like(graph: onnx.GraphProto, copies: Mapping[str, str], elem_type: int) -> None:
    """Declare each value of ``copies`` (``{value: its copy in another type}``) in ``graph.value_info`` with its
    original's shape, where that is declared, and ``elem_type``: a computed size the model's ``value_info``
    names (:mod:`onnxtrain.graph.symbolic`) stays named in the copy, which a ``Reshape`` now writes."""
    declared = {value.name: value for value in graph.value_info}
    for name, copy in copies.items():
        original = declared.get(name)
        if original is None or copy in declared or not original.type.tensor_type.HasField("shape"):
            continue
        value = graph.value_info.add()
        value.CopyFrom(original)
        value.name = copy
        value.type.tensor_type.elem_type = elem_type
        declared[copy] = value


def strip_autocast(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` as it was before :func:`autocast`, computing in float32 again, in place: each of its casts is
    removed, its readers reading what it read (a half node's output takes back its original name), and the
    half types declared for the values in between are dropped."""
    graph = model.graph
    casts = [node for node in graph.node if node.op_type == "Cast" and node.name.startswith(CAST_PREFIX)]
    # a cast to half: its readers read its input; a cast back: the half node writes the original name again
    renames = {
        **{n.output[0]: n.input[0] for n in casts if _cast_to(n) in HALF_SUFFIX},
        **{n.input[0]: n.output[0] for n in casts if _cast_to(n) not in HALF_SUFFIX},
    }
    dropped = {id(n) for n in casts}
    kept = [node for node in graph.node if id(node) not in dropped]
    del graph.node[:]
    graph.node.extend(kept)
    rename_values(graph, renames)
    declared = [
        value
        for value in graph.value_info
        if value.name not in renames and value.type.tensor_type.elem_type not in HALF_SUFFIX  # autocast's values
    ]
    del graph.value_info[:]
    graph.value_info.extend(declared)
    return model


def half_parameters(model: onnx.ModelProto) -> int:
    """Each initializer of ``model`` read only by :func:`autocast`'s casts to a half type stored in that type
    under the cast's output, the cast removed, in place (an inference model's weights at half their size).
    Returns how many were converted."""
    graph = model.graph
    readers = readers_of(graph.node, names_read)
    outputs = {value.name for value in graph.output}
    converted: dict[str, onnx.TensorProto] = {}
    dropped: set[int] = set()
    for tensor in graph.initializer:
        nodes = readers.get(tensor.name, [])
        casts = [
            n for n in nodes if n.op_type == "Cast" and n.name.startswith(CAST_PREFIX) and _cast_to(n) in HALF_SUFFIX
        ]
        if (
            not casts
            or len(casts) != len(nodes)
            or tensor.name in outputs
            or tensor.data_type != onnx.TensorProto.FLOAT
        ):
            continue
        array = onnx.numpy_helper.to_array(tensor)
        for cast in casts:
            half = array.astype(dtypes.to_numpy_dtype(_cast_to(cast)))
            converted[cast.output[0]] = onnx.numpy_helper.from_array(half, cast.output[0])
            dropped.add(id(cast))
        converted[tensor.name] = None  # type: ignore[assignment]  # the float32 original goes
    if not converted:
        return 0
    kept_nodes = [node for node in graph.node if id(node) not in dropped]
    del graph.node[:]
    graph.node.extend(kept_nodes)
    initializers = [t for t in graph.initializer if t.name not in converted]
    initializers += [t for t in converted.values() if t is not None]
    del graph.initializer[:]
    graph.initializer.extend(initializers)
    return sum(1 for t in converted.values() if t is None)


def _cast_to(node: onnx.NodeProto) -> int:
    return int(attribute(node, "to"))


def compute_in_float32(
    model: onnx.ModelProto,
    op_type: str,
    domain: str = "",
    *,
    where: Callable[[onnx.NodeProto], bool] | None = None,
) -> int:
    """Each ``op_type`` node of ``model`` (for which ``where`` holds) that computes in float16 or bfloat16 made
    to compute in float32, in place: its half data inputs cast to float32, its outputs of their type cast back
    (the fallback where an execution provider has no half kernel). Returns how many nodes changed."""
    graph = model.graph
    types = GraphBuilder(model)
    taken = names_in(graph)
    nodes: list[onnx.NodeProto] = []
    widened: dict[str, str] = {}  # value -> its float32 copy
    changed = 0
    for node in graph.node:
        chosen = node.op_type == op_type and node.domain == domain and (where is None or where(node))
        data = _half_positions(node, types) if chosen else None
        if data is None:
            nodes.append(node)
            continue
        inputs, outputs = data
        half = types.elem_type_if_known(node.input[inputs[0]])
        for k in inputs:
            wide = widened[node.input[k]] = first_free(f"{node.input[k]}.float32", taken)
            nodes.append(
                helper.make_node("Cast", [node.input[k]], [wide], name=f"{wide}.cast", to=onnx.TensorProto.FLOAT)
            )
            node.input[k] = wide
        backs = []
        for k in outputs:
            wide = widened[node.output[k]] = first_free(f"{node.output[k]}.float32", taken)
            backs.append(helper.make_node("Cast", [wide], [node.output[k]], name=f"{wide}.back", to=half))
            node.output[k] = wide
        nodes += [node, *backs]
        changed += 1
    del graph.node[:]
    graph.node.extend(nodes)
    declare_like(graph, widened, onnx.TensorProto.FLOAT)
    return changed


def defined_with(model: onnx.ModelProto, op_type: str) -> list[str]:
    """The operator types of ``model`` whose ONNX function bodies use ``op_type`` (``Relu`` for ``Max``):
    onnxruntime runs such an operator's body where its provider has no kernel for it, so a missing kernel
    can name an operator the graph does not hold."""
    opset = GraphBuilder(model).opset
    found = []
    for candidate in sorted({node.op_type for node in model.graph.node if is_standard(node)}):
        schema = _schema(onnx.helper.make_node(candidate, [], []), opset)
        if schema is not None and schema.has_function and any(n.op_type == op_type for n in schema.function_body.node):
            found.append(candidate)
    return found


def accumulate_in_float32(model: onnx.ModelProto) -> int:
    """``model``'s adding scatters (``ScatterND``/``ScatterElements`` with ``reduction="add"``, the gradients of
    gathers) that add in a half type made to add in float32, in place, as the policy sums: many small updates
    added into one value lose their digits in half (and onnxruntime's CPU provider adds in neither half type).
    Returns how many nodes changed."""
    if not any(n.op_type.startswith("Scatter") and ops.scatter_adds(n) for n in model.graph.node):
        return 0
    return sum(compute_in_float32(model, op, where=ops.scatter_adds) for op in ("ScatterND", "ScatterElements"))


def _half_positions(node: onnx.NodeProto, types: GraphBuilder) -> tuple[list[int], list[int]] | None:
    """The positions of ``node``'s float16 or bfloat16 inputs of one type variable (that of the first) and of
    its outputs of that variable (none for a comparison), or ``None`` where it reads no half value."""
    schema = _schema(node, types.opset) if is_standard(node) and not subgraphs(node) else None
    if schema is None or not schema.inputs:
        return None
    halves = [k for k, name in enumerate(node.input) if name and types.elem_type_if_known(name) in HALF_SUFFIX]
    if not halves:
        return None
    variable = _formal(schema.inputs, halves[0])
    inputs = [k for k in halves if _formal(schema.inputs, k) == variable]
    outputs = [k for k, name in enumerate(node.output) if name and _formal(schema.outputs, k) == variable]
    return inputs, outputs


def _formal(params: list[onnx.defs.OpSchema.FormalParameter], position: int) -> str:
    """The type string of the formal parameter at ``position`` (the last one, variadic, past the end)."""
    return params[min(position, len(params) - 1)].type_str


def _data_positions(
    node: onnx.NodeProto, types: GraphBuilder, elem_types: Container[int] = (onnx.TensorProto.FLOAT,)
) -> tuple[list[int], list[int]] | None:
    """The positions of ``node``'s data inputs of one of ``elem_types`` and of the outputs of their type (the
    inputs and outputs of the schema's type variable of output 0), or ``None`` where the node has none or is
    left alone (another domain, a subgraph, a ``Cast``)."""
    if not is_standard(node) or subgraphs(node) or not node.output or node.op_type == "Cast":
        return None
    schema = _schema(node, types.opset)
    if schema is None or not schema.outputs:
        return None
    variable = schema.outputs[0].type_str
    inputs = [
        k
        for k, name in enumerate(node.input)
        if name and _formal(schema.inputs, k) == variable and types.elem_type_if_known(name) in elem_types
    ]
    if not inputs:
        return None
    outputs = [k for k, name in enumerate(node.output) if name and _formal(schema.outputs, k) == variable]
    return inputs, outputs


def schema_takes(node: onnx.NodeProto, opset: int, elem_type: int) -> bool:
    """Whether ``node``'s schema lets its output-0 type variable be ``elem_type``."""
    schema = _schema(node, opset)
    return schema is not None and dtypes.schema_allows(schema, schema.outputs[0].type_str, elem_type)


def _schema(node: onnx.NodeProto, opset: int) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(node.op_type, opset, node.domain)
    except onnx.defs.SchemaError:
        return None


__all__ = [
    "CAST_PREFIX",
    "FLOAT32_OPERATORS",
    "HALF_OPERATORS",
    "HALF_SUFFIX",
    "POLICY",
    "PRECISIONS",
    "AutocastReport",
    "Mode",
    "accumulate_in_float32",
    "autocast",
    "check_overrides",
    "check_precision",
    "compute_in_float32",
    "declare_like",
    "defined_with",
    "half_parameters",
    "schema_takes",
    "strip_autocast",
]
