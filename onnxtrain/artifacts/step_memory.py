"""The static memory of a training step: live tensor bytes, node by node, at fixed input shapes.

For the models the runtime runs (:func:`step_memory`: the fused step of the
usual loop, :func:`~onnxtrain.artifacts.fuse.fuse_update_and_train`, and the
first step from reset gradients,
:func:`~onnxtrain.artifacts.accumulation.remove_gradient_accumulation`), or any
model (:func:`live_memory`), with the user inputs' shapes fixed:

1. **types**: every value's element type and dimensions, node by node from
   the operators' schemas (``onnx.shape_inference.infer_node_outputs``), with
   the values of small integer tensors computed along the way (``Shape``,
   ``Gather``, ``Concat``, ``Range``, ...: what a ``Reshape`` or ``Expand``
   reads), so that shapes computed at run time are known;
2. **order**: the nodes as onnxruntime runs them, a node's index being its
   place in the graph as listed (onnxruntime numbers them so when it loads a
   model): its default (a depth-first walk back from the graph's last nodes,
   each node's producers visited by ascending index: ``GraphViewer``'s
   topological order) or, for the runtime's sessions of the training model
   (the fused step's, the reset step's), its priority-based order (``Shape``
   and ``Size`` first, then the lowest index that is ready: the optimizer's
   nodes, listed first, run before the train step's);
3. **liveness**: graph inputs, initializers, ``Constant`` nodes and outputs
   bound into buffers that exist anyway (a gradient written where the
   runtime keeps it) are held for the whole run; every other tensor lives
   from its producer to its last reader (both included), a graph output to
   the end: the runtime's sessions of large steps run without onnxruntime's
   planned buffer reuse, which would keep a dead tensor's buffer allocated
   until the later tensor planned to take it dies
   (:func:`onnxtrain.training.options.default_session_options`).
   ``Reshape``, ``Squeeze``, ``Unsqueeze``, ``Flatten`` and
   ``Identity`` share their input's buffer, as onnxruntime's kernels do; an
   output written in place over an input (the fused step's parameters,
   moments and gradients) takes no memory of its own.

What it does not model: onnxruntime's graph optimizations (fusions remove
intermediates; constant folding adds initializers; ``step_memory``'s
``rewrite`` takes a model of what runs instead), kernels that reuse a dying
input's buffer for their output, a kernel's own scratch memory, the arena's
rounding and fragmentation, the insides of subgraphs (``If``, ``Loop``,
``Scan`` count as one node reading what they reference). The figures are the
graph's, not the process's: the same on any machine.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from onnxtrain.artifacts.accumulation import buffer_name, remove_gradient_accumulation
from onnxtrain.artifacts.fuse import fuse_update_and_train
from onnxtrain.graph.contrib_types import MS_DOMAIN, SAME_AS_FIRST_INPUT
from onnxtrain.graph.fold import evaluate_constant
from onnxtrain.graph.passes.shapes_early import SHAPE_READERS
from onnxtrain.graph.versions import is_standard
from onnxtrain.graph.walk import names_read, node_label, topological_order
from onnxtrain.optim.base import grad_name, state_name, updated_name

Order = Literal["graph", "default", "priority"]
Phase = Literal["held", "update", "forward", "backward"]
#: Operators whose output is a view of input 0 in onnxruntime (``KernelDefBuilder().Alias(0, 0)``).
ALIASING = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})
#: The most elements of a tensor whose values are computed (shape arithmetic: what later shapes depend on).
MAX_COMPUTED = 1024
#: Held categories of :func:`step_memory`, in the order reports list them.
CATEGORIES = ("parameters", "gradients", "moments", "inputs", "constants", "other inputs")


@dataclass(frozen=True)
class TensorInfo:
    """A value's element type and dimensions (``dims`` ``None``: not known at these shapes)."""

    elem_type: int
    dims: tuple[int, ...] | None

    @property
    def nbytes(self) -> int | None:
        """Its size in bytes; ``None`` where the dimensions or the element size are not known."""
        if self.dims is None or self.elem_type in (0, onnx.TensorProto.STRING):
            return None
        return math.prod(self.dims) * np.dtype(helper.tensor_dtype_to_np_dtype(self.elem_type)).itemsize


@dataclass(frozen=True)
class LiveTensor:
    """A buffer alive at some point: the value that made it, its type, size, producer and phase."""

    name: str
    dtype: str
    dims: tuple[int, ...] | None
    nbytes: int
    producer: str  # the operator, or "input", "initializer"
    phase: Phase
    views: int = 0  # values sharing its buffer (reshapes of it)


@dataclass(frozen=True)
class LiveMemory:
    """The live bytes of one run of a model, node by node in ``order``.

    ``held``: bytes held throughout, by category; ``live[i]``: the other
    tensors' bytes while the ``i``-th node of the order runs; ``peak`` (held
    and live) at position ``peak_at`` (node ``peak_node``, of ``peak_phase``);
    ``at_peak``: the buffers alive there, largest first; ``kept_for_backward``:
    the bytes of forward tensors a backward node reads the data of
    (activations the gradient keeps; a ``Shape`` or ``Size`` reads none),
    ``forward_end`` the position of the last forward node;
    ``unknown``: values of unknown size (counted as 0); ``op_counts``: nodes by
    operator; ``phase_peaks``: the largest ``live`` while a node of each phase
    runs; ``kept``: the tensors kept for the backward, largest first.
    """

    order: Order
    nodes: int
    held: Mapping[str, int]
    live: Sequence[int]
    peak: int
    peak_at: int
    peak_node: str
    peak_phase: Phase
    at_peak: Sequence[LiveTensor]
    kept_for_backward: int
    forward_end: int
    unknown: Sequence[str]
    op_counts: Mapping[str, int] = field(default_factory=dict)
    phase_peaks: Mapping[str, int] = field(default_factory=dict)
    kept: Sequence[LiveTensor] = ()

    @property
    def held_bytes(self) -> int:
        return sum(self.held.values())

    @property
    def peak_live(self) -> int:
        """The peak less what is held throughout: the run's own tensors."""
        return self.peak - self.held_bytes


@dataclass(frozen=True)
class StepMemory:
    """:func:`step_memory`'s result: the fused step (``None`` where the models do not fuse) and the reset step."""

    shapes: Mapping[str, tuple[int, ...]]
    fused: LiveMemory | None
    reset: LiveMemory


# ------------------------------------------------------------------------------------------------ types


def _const_value(node: onnx.NodeProto) -> np.ndarray | None:
    """The value of a ``Constant`` node."""
    for attribute in node.attribute:
        if attribute.name == "value":
            return numpy_helper.to_array(attribute.t)
        if attribute.name in ("value_float", "value_int"):
            kind = np.float32 if "float" in attribute.name else np.int64
            return np.array(helper.get_attribute_value(attribute), kind)
        if attribute.name in ("value_floats", "value_ints"):
            kind = np.float32 if "float" in attribute.name else np.int64
            return np.array(helper.get_attribute_value(attribute), kind)
    return None


def _type_proto(info: TensorInfo) -> onnx.TypeProto:
    return helper.make_tensor_type_proto(info.elem_type, None if info.dims is None else list(info.dims))


def _info_of(type_proto: onnx.TypeProto) -> TensorInfo | None:
    if not type_proto.HasField("tensor_type"):
        return None
    tensor = type_proto.tensor_type
    if not tensor.HasField("shape") or not all(d.HasField("dim_value") for d in tensor.shape.dim):
        return TensorInfo(tensor.elem_type, None)
    return TensorInfo(tensor.elem_type, tuple(d.dim_value for d in tensor.shape.dim))


def _computed(node: onnx.NodeProto, inputs: list[np.ndarray], opset: int) -> np.ndarray | None:
    """``node``'s one output from known ``inputs``, for the operators of shape arithmetic; ``None`` otherwise."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    op = node.op_type
    try:
        if op == "Range":
            start, limit, delta = (x.item() for x in inputs)
            return np.arange(start, limit, delta, dtype=inputs[0].dtype)
        if op == "Slice":
            data, starts, ends = inputs[:3]
            axes = inputs[3] if len(inputs) > 3 else np.arange(len(starts))
            steps = inputs[4] if len(inputs) > 4 else np.ones(len(starts), np.int64)
            index = [slice(None)] * data.ndim
            for a, s, e, t in zip(axes.tolist(), starts.tolist(), ends.tolist(), steps.tolist(), strict=True):
                index[a] = slice(s, e, t)
            return data[tuple(index)]
        if op == "ConstantOfShape":
            fill = numpy_helper.to_array(attrs["value"]) if "value" in attrs else np.zeros(1, np.float32)
            return np.full([int(d) for d in inputs[0]], fill.reshape(-1)[0], fill.dtype)
        if op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or"):
            functions = {"Equal": np.equal, "Less": np.less, "Greater": np.greater, "LessOrEqual": np.less_equal,
                         "GreaterOrEqual": np.greater_equal, "And": np.logical_and, "Or": np.logical_or}  # fmt: skip
            return np.asarray(functions[op](inputs[0], inputs[1]))
        if op == "Not":
            return np.logical_not(inputs[0])
        if op == "Where":
            return np.where(inputs[0], inputs[1], inputs[2]).astype(inputs[1].dtype)
        if op in ("Min", "Max"):
            return np.asarray((np.minimum if op == "Min" else np.maximum).reduce(np.broadcast_arrays(*inputs)))
        if op == "Abs":
            return np.abs(inputs[0])
        if op == "NonZero":
            return np.array(np.nonzero(inputs[0]), np.int64)
        if op in ("ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin"):
            axes = attrs.get("axes") if len(inputs) < 2 else inputs[1].tolist()
            function = {"ReduceProd": np.prod, "ReduceSum": np.sum, "ReduceMax": np.max, "ReduceMin": np.min}[op]
            keep = bool(attrs.get("keepdims", 1))
            return np.asarray(function(inputs[0], axis=None if axes is None else tuple(axes), keepdims=keep))
        if op == "Div" and inputs[0].dtype.kind in "iu" and inputs[1].dtype.kind in "iu":
            return np.asarray(np.trunc(inputs[0] / inputs[1]), inputs[0].dtype)  # ONNX truncates
        if op == "Mod" and not attrs.get("fmod", 0):
            return np.asarray(np.mod(inputs[0], inputs[1]))
        return evaluate_constant(node, inputs, opset)
    except (ValueError, LookupError, TypeError, AttributeError):
        return None


def _split(node: onnx.NodeProto, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The outputs of a ``Split`` of a known value (onnxruntime's optimizer splits shapes so); [] if unsure."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    data, axis = inputs[0], int(attrs.get("axis", 0))
    sizes = inputs[1].tolist() if len(inputs) > 1 else attrs.get("split")
    if sizes is None:
        count = int(attrs.get("num_outputs", len(node.output)))
        if data.ndim == 0 or data.shape[axis] % count:
            return []
        sizes = [data.shape[axis] // count] * count
    if data.ndim == 0 or sum(sizes) != data.shape[axis] or len(sizes) != len(node.output):
        return []
    return np.split(data, np.cumsum(sizes)[:-1].tolist(), axis=axis)


def value_types(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> dict[str, TensorInfo]:
    """Every value's element type and dimensions with the inputs ``shapes`` fixed (see the module docstring).

    ``shapes`` names graph inputs (``input_ids: [4, 128]``) or symbolic
    dimensions of the inputs (``batch: [4]``). Values whose type cannot be
    inferred (operators of other domains and what follows them) are absent or
    have ``dims`` ``None``.
    """
    graph = model.graph
    opsets = {entry.domain or "": entry.version for entry in model.opset_import}
    onnx_opset = opsets.get("", opsets.get("ai.onnx", 0))
    infos: dict[str, TensorInfo] = {}
    values: dict[str, np.ndarray] = {}
    dims_by_name = {name: int(shape[0]) for name, shape in shapes.items() if len(shape) == 1}
    for value in graph.input:
        tensor = value.type.tensor_type
        if value.name in shapes:
            infos[value.name] = TensorInfo(tensor.elem_type, tuple(int(d) for d in shapes[value.name]))
            continue
        dims = []
        for d in tensor.shape.dim:
            dims.append(d.dim_value if d.HasField("dim_value") else dims_by_name.get(d.dim_param))
        known = tensor.HasField("shape") and all(d is not None for d in dims)
        infos[value.name] = TensorInfo(tensor.elem_type, tuple(dims) if known else None)  # type: ignore[arg-type]
    for initializer in graph.initializer:
        infos[initializer.name] = TensorInfo(initializer.data_type, tuple(initializer.dims))
        external = initializer.data_location == onnx.TensorProto.EXTERNAL
        if not external and math.prod(initializer.dims) <= MAX_COMPUTED:
            values[initializer.name] = numpy_helper.to_array(initializer)
    for index in topological_order(graph.node):
        _type_node(graph.node[index], infos, values, opsets, onnx_opset, model.opset_import)
    return infos


def _type_node(
    node: onnx.NodeProto,
    infos: dict[str, TensorInfo],
    values: dict[str, np.ndarray],
    opsets: Mapping[str, int],
    onnx_opset: int,
    opset_import: Iterable[onnx.OperatorSetIdProto],
) -> None:
    """Type ``node``'s outputs into ``infos``, and compute its small integer output into ``values``."""
    standard = is_standard(node)
    if standard and node.op_type == "Constant":
        value = _const_value(node)
        if value is not None:
            infos[node.output[0]] = TensorInfo(helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
            if value.size <= MAX_COMPUTED:
                values[node.output[0]] = value
        return
    inputs = [name for name in node.input if name]
    if standard and node.op_type == "Where" and len(inputs) == 3 and inputs[1] == inputs[2] and inputs[1] in values:
        values[node.output[0]] = values[inputs[1]]  # Where(c, x, x) is x, whatever c (a hold)
    if standard and len(node.output) == 1 and all(name in values for name in inputs):
        value = _computed(node, [values[name] for name in inputs], onnx_opset)
        if value is not None and value.size <= MAX_COMPUTED:
            values[node.output[0]] = value
    if standard and node.op_type == "Split" and all(name in values for name in inputs):
        values.update(zip(node.output, _split(node, [values[name] for name in inputs]), strict=False))
    if standard and node.op_type in SHAPE_READERS and infos.get(node.input[0], TensorInfo(0, None)).dims:
        dims = infos[node.input[0]].dims or ()
        if node.op_type == "Size":
            values[node.output[0]] = np.array(math.prod(dims), np.int64)
        else:
            attrs = {a.name: a.i for a in node.attribute}
            values[node.output[0]] = np.array(dims, np.int64)[attrs.get("start", 0) : attrs.get("end", len(dims))]
    if any(name not in infos for name in inputs):
        return
    if not standard:
        infos.update(_contrib_types(node, infos))
        return
    version = opsets.get(node.domain or "", opsets.get("ai.onnx"))
    if version is None:
        return
    try:
        schema = onnx.defs.get_schema(node.op_type, version, node.domain)
    except onnx.defs.SchemaError:  # an operator onnx does not define: onnxruntime's of the default domain, or unknown
        infos.update(_contrib_types(node, infos))
        return
    types = {name: _type_proto(infos[name]) for name in inputs}
    data = {name: numpy_helper.from_array(values[name], name) for name in inputs if name in values}
    try:
        inferred = shape_inference.infer_node_outputs(schema, node, types, data, opset_imports=list(opset_import))
    except (shape_inference.InferenceError, onnx.checker.ValidationError, RuntimeError):
        inferred = {}
    for name in node.output:
        if name in values:  # computed: exact
            value = values[name]
            infos[name] = TensorInfo(helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
        elif name in inferred and (info := _info_of(inferred[name])) is not None:
            infos[name] = info


def _contrib_types(node: onnx.NodeProto, infos: Mapping[str, TensorInfo]) -> dict[str, TensorInfo]:
    """The outputs of onnxruntime's contrib operators its CPU and CUDA optimizers write: ``FusedMatMul`` (a
    ``MatMul`` of inputs transposed as its attributes say) and those whose outputs are input 0's type."""
    key = (node.domain, node.op_type)
    first = infos[node.input[0]] if node.input and node.input[0] else None
    if key in SAME_AS_FIRST_INPUT and first is not None:
        return {node.output[i]: first for i in SAME_AS_FIRST_INPUT[key] if i < len(node.output) and node.output[i]}
    if key != (MS_DOMAIN, "FusedMatMul") or first is None or len(node.input) < 2:
        return {}
    a, b = first.dims, infos[node.input[1]].dims
    attrs = {attribute.name: attribute.i for attribute in node.attribute}
    if a is None or b is None or len(a) < 2 or len(b) < 2 or attrs.get("transBatchA") or attrs.get("transBatchB"):
        return {}
    rows = a[-1] if attrs.get("transA") else a[-2]
    columns = b[-2] if attrs.get("transB") else b[-1]
    batch = np.broadcast_shapes(a[:-2], b[:-2])
    return {node.output[0]: TensorInfo(first.elem_type, (*batch, rows, columns))}


# ------------------------------------------------------------------------------------------------ order


def execution_order(nodes: Sequence[onnx.NodeProto], order: Order) -> list[int]:
    """Indices of ``nodes`` as onnxruntime runs them (see the module docstring); ``graph``: as listed."""
    if order == "graph":
        return list(range(len(nodes)))
    producer = {name: i for i, node in enumerate(nodes) for name in node.output if name}
    inputs_of = [sorted({producer[n] for n in names_read(node) if n in producer} - {i}) for i, node in enumerate(nodes)]
    if order == "priority":
        return _priority_order(nodes, inputs_of)
    readers: list[list[int]] = [[] for _ in nodes]
    for i, sources in enumerate(inputs_of):
        for j in sources:
            readers[j].append(i)
    leaves = [i for i in range(len(nodes)) if not readers[i]]
    visited = [False] * len(nodes)
    result: list[int] = []
    stack: list[tuple[int, bool]] = [(i, False) for i in leaves]
    while stack:
        i, leaving = stack.pop()
        if leaving:
            result.append(i)
            continue
        if visited[i]:
            continue
        visited[i] = True
        stack.append((i, True))
        stack.extend((j, False) for j in inputs_of[i] if not visited[j])
    return result


def _priority_order(nodes: Sequence[onnx.NodeProto], inputs_of: Sequence[Sequence[int]]) -> list[int]:
    """Kahn's sort taking ``Shape`` and ``Size`` first, then the lowest index (onnxruntime's priority order)."""
    waiting = [len(sources) for sources in inputs_of]
    readers: list[list[int]] = [[] for _ in nodes]
    for i, sources in enumerate(inputs_of):
        for j in sources:
            readers[j].append(i)

    def key(i: int) -> tuple[int, int]:
        return (0 if nodes[i].op_type in SHAPE_READERS else 1, i)

    ready = [key(i) for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    result = []
    while ready:
        _, i = heapq.heappop(ready)
        result.append(i)
        for j in readers[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, key(j))
    if len(result) != len(nodes):
        raise ValueError("the graph has a cycle; an ONNX graph must be acyclic")
    return result


# ------------------------------------------------------------------------------------------------ liveness


def phases(model: onnx.ModelProto, loss: str, updates: Iterable[str] = ()) -> list[Phase]:
    """Per node: ``update`` (what the outputs ``updates`` need: an optimizer's), ``forward`` (what ``loss``
    needs besides), ``backward`` (the rest)."""
    nodes = model.graph.node
    producer = {name: i for i, node in enumerate(nodes) for name in node.output if name}

    def ancestors(outputs: Iterable[str]) -> set[int]:
        found: set[int] = set()
        stack = [producer[name] for name in outputs if name in producer]
        while stack:
            i = stack.pop()
            if i in found:
                continue
            found.add(i)
            stack.extend(producer[n] for n in names_read(nodes[i]) if n in producer)
        return found

    update = ancestors(updates)
    forward = ancestors([loss]) - update
    return ["update" if i in update else "forward" if i in forward else "backward" for i in range(len(nodes))]


@dataclass
class _Buffers:
    """The run's buffers: each a root value and its views (``root[name]``), held throughout or made by a node."""

    held: Counter[str] = field(default_factory=Counter)  # bytes by category
    root: dict[str, str] = field(default_factory=dict)
    held_roots: set[str] = field(default_factory=set)
    made_at: dict[str, int] = field(default_factory=dict)  # root -> position of its producer
    last_read: dict[str, int] = field(default_factory=dict)  # root -> position of its last reader
    producer: dict[str, tuple[str, Phase]] = field(default_factory=dict)
    kept: set[str] = field(default_factory=set)  # roots made forward and read backward

    def hold(self, name: str, category: str, nbytes: int, made_by: str) -> None:
        self.held[category] += nbytes
        self.root[name] = name
        self.held_roots.add(name)
        self.producer[name] = (made_by, "held")


def _buffers(
    model: onnx.ModelProto,
    position: Mapping[int, int],
    node_phase: Sequence[Phase],
    size: Callable[[str], int],
    in_place: Mapping[str, str],
    held_outputs: Mapping[str, str],
    categories: Mapping[str, str],
) -> _Buffers:
    """Who holds what: the rules of the module docstring, node by node in graph order."""
    graph = model.graph
    buffers = _Buffers()
    for value in graph.input:
        buffers.hold(value.name, categories.get(value.name, "inputs"), size(value.name), "input")
    for initializer in graph.initializer:
        buffers.hold(initializer.name, "constants", size(initializer.name), "initializer")
    root = buffers.root
    for node_index in topological_order(graph.node):  # producers before readers, whatever the listed order
        node = graph.node[node_index]
        p, phase, standard = position[node_index], node_phase[node_index], is_standard(node)
        for name in names_read(node):
            base = root.get(name, name)
            buffers.last_read[base] = max(buffers.last_read.get(base, p), p)
            reads_data = not (standard and node.op_type in SHAPE_READERS)  # a shape: not the data
            if phase == "backward" and reads_data and buffers.producer.get(base, ("", "held"))[1] == "forward":
                buffers.kept.add(base)
        for k, name in enumerate(node.output):
            if not name:
                continue
            if standard and node.op_type == "Constant":
                buffers.hold(name, "constants", size(name), "Constant")
            elif name in in_place:
                root[name] = root.get(in_place[name], in_place[name])
            elif name in held_outputs:
                buffers.hold(name, held_outputs[name], size(name), node.op_type)
            elif k == 0 and standard and node.op_type in ALIASING and node.input:
                root[name] = root.get(node.input[0], node.input[0])
            else:
                root[name] = name
                buffers.made_at[name] = p
                buffers.producer[name] = (node.op_type, phase)
    for value in graph.output:  # alive to the end of the run
        base = root.get(value.name, value.name)
        if base in buffers.made_at:
            buffers.last_read[base] = len(graph.node) - 1
    return buffers


def live_memory(
    model: onnx.ModelProto,
    shapes: Mapping[str, Sequence[int]],
    *,
    order: Order = "default",
    loss: str | None = None,
    updates: Iterable[str] = (),
    in_place: Mapping[str, str] | None = None,
    held_outputs: Mapping[str, str] | None = None,
    categories: Mapping[str, str] | None = None,
    largest: int = 12,
) -> LiveMemory:
    """The live bytes of one run of ``model`` with its inputs ``shapes`` fixed (see the module docstring).

    ``loss``: the output whose computation is the forward pass (default: the
    first output); ``updates``: outputs of an optimizer's update (their nodes
    are the ``update`` phase); ``in_place``: ``{output: input}`` written over
    the input's buffer; ``held_outputs``: ``{output: category}`` written into
    buffers held anyway; ``categories``: ``{input: category}`` for the held
    inputs (default ``"inputs"``; initializers and constants are
    ``"constants"``); ``largest``: how many of the buffers alive at the peak to
    list.
    """
    nodes = list(model.graph.node)
    infos = value_types(model, shapes)
    sequence = execution_order(nodes, order)
    position = {node_index: p for p, node_index in enumerate(sequence)}
    node_phase = phases(model, loss or model.graph.output[0].name, updates)
    unknown: set[str] = set()

    def size(name: str) -> int:
        nbytes = infos[name].nbytes if name in infos else None
        if nbytes is None:
            unknown.add(name)
        return nbytes or 0

    buffers = _buffers(model, position, node_phase, size, in_place or {}, held_outputs or {}, categories or {})
    sizes = {name: size(name) for name in buffers.made_at}
    ends = {name: max(buffers.last_read.get(name, start), start) for name, start in buffers.made_at.items()}
    delta = [0] * (len(nodes) + 1)
    for name, start in buffers.made_at.items():
        delta[start] += sizes[name]
        delta[ends[name] + 1] -= sizes[name]
    live = list(itertools.accumulate(delta[: len(nodes)]))
    peak_at = max(range(len(live)), key=live.__getitem__) if live else 0
    alive = [n for n, start in buffers.made_at.items() if start <= peak_at <= ends[n] and sizes[n]]
    alive.sort(key=lambda n: -sizes[n])
    views = Counter(base for name, base in buffers.root.items() if name != base)
    phase_peaks: dict[str, int] = {}
    for p, node_index in enumerate(sequence):
        phase_peaks[node_phase[node_index]] = max(phase_peaks.get(node_phase[node_index], 0), live[p])
    forward = [position[i] for i, phase in enumerate(node_phase) if phase == "forward"]
    kept = sorted((buffers.kept - buffers.held_roots) & set(sizes), key=lambda n: -sizes[n])
    return LiveMemory(
        order=order,
        nodes=len(nodes),
        held=dict(buffers.held),
        live=live,
        peak=sum(buffers.held.values()) + (live[peak_at] if live else 0),
        peak_at=peak_at,
        peak_node=node_label(nodes[sequence[peak_at]], sequence[peak_at]) if nodes else "",
        peak_phase=node_phase[sequence[peak_at]] if nodes else "held",
        at_peak=[_live_tensor(n, infos, sizes[n], buffers.producer[n], views[n]) for n in alive[:largest]],
        kept_for_backward=sum(sizes.get(n, 0) for n in kept),
        forward_end=max(forward, default=-1),
        unknown=sorted(unknown),
        op_counts=dict(Counter(node.op_type for node in nodes).most_common()),
        phase_peaks=phase_peaks,
        kept=[_live_tensor(n, infos, sizes[n], buffers.producer[n], views[n]) for n in kept],
    )


def _live_tensor(
    name: str, infos: Mapping[str, TensorInfo], nbytes: int, made: tuple[str, Phase], views: int
) -> LiveTensor:
    info = infos.get(name, TensorInfo(0, None))
    dtype = helper.tensor_dtype_to_np_dtype(info.elem_type).name if info.elem_type else "?"
    return LiveTensor(name, dtype, info.dims, nbytes, made[0], made[1], views)


# ------------------------------------------------------------------------------------------------ artifacts


def trainable_of(training: onnx.ModelProto) -> list[str]:
    """The trainable parameters of a training model: the inputs that have a gradient accumulation buffer."""
    names = {value.name for value in training.graph.input}
    return [value.name for value in training.graph.input if buffer_name(value.name) in names]


def step_memory(
    training: onnx.ModelProto | str | Path,
    optimizer: onnx.ModelProto | str | Path | None,
    shapes: Mapping[str, Sequence[int]],
    *,
    largest: int = 12,
    rewrite: Callable[[onnx.ModelProto], onnx.ModelProto] | None = None,
) -> StepMemory:
    """The live memory of the runtime's steps at the user inputs' ``shapes``: the fused step (the optimizer's
    update, then a train step, in onnxruntime's priority-based order, parameters, moments and gradients
    written in place) and the step from reset gradients (the same order, gradients written into their
    buffers). ``training`` and ``optimizer``: the artifacts' models (or paths, read without external data).

    ``rewrite``: what runs instead of each step's model, keeping its inputs' and outputs' names (onnxruntime's
    optimized graph, say); the models as written by default.
    """
    run = rewrite or (lambda model: model)
    training = _load(training)
    trainable = trainable_of(training)
    reset = remove_gradient_accumulation(training, trainable)
    user = [v.name for v in reset.model.graph.input if v.name not in set(trainable)]
    fixed = {name: tuple(int(d) for d in dims) for name, dims in shapes.items()}
    _check_fixed([v for v in reset.model.graph.input if v.name in user], fixed)
    categories = {**dict.fromkeys(trainable, "parameters"), **{name: "inputs" for name in user}}
    gradients = dict.fromkeys(reset.gradients.values(), "gradients")
    reset_memory = live_memory(
        run(reset.model), fixed, order="priority", held_outputs=gradients, categories=categories, largest=largest
    )
    fused_memory = None
    if optimizer is not None:
        fused = fuse_update_and_train(training, _load(optimizer), trainable)
        inputs = {value.name for value in fused.model.graph.input}
        in_place: dict[str, str] = {}
        fused_categories = dict(categories)
        for p in trainable:
            in_place[fused.name_of(updated_name(p))] = p
            in_place[fused.gradients[p]] = fused.name_of(grad_name(p))
            fused_categories[fused.name_of(grad_name(p))] = "gradients"
            index = 0
            while (moment := fused.name_of(state_name(p, index))) in inputs:
                in_place[fused.name_of(updated_name(state_name(p, index)))] = moment
                fused_categories[moment] = "moments"
                index += 1
        for name in inputs - set(fused_categories):
            fused_categories[name] = "other inputs"  # the learning rate, the step
        fused_memory = live_memory(
            run(fused.model),
            fixed,
            order="priority",
            loss=training.graph.output[0].name,
            updates=[fused.name_of(updated_name(p)) for p in trainable],
            in_place=in_place,
            categories=fused_categories,
            largest=largest,
        )
    return StepMemory(fixed, fused_memory, reset_memory)


def _check_fixed(inputs: Iterable[onnx.ValueInfoProto], shapes: Mapping[str, tuple[int, ...]]) -> None:
    """``ValueError`` naming the user inputs whose dimensions ``shapes`` leaves unknown."""
    unfixed = []
    for value in inputs:
        dims = value.type.tensor_type.shape.dim
        names = [d.dim_param if d.HasField("dim_param") else str(d.dim_value) if d.HasField("dim_value") else "?"
                 for d in dims]  # fmt: skip
        unknown = any(not d.HasField("dim_value") and d.dim_param not in shapes for d in dims)
        if value.name not in shapes and (unknown or not value.type.tensor_type.HasField("shape")):
            unfixed.append(f"{value.name} [{', '.join(names)}]")
    if unfixed:
        raise ValueError(
            f"give the shapes of {', '.join(unfixed)}: NAME=DxD... for an input (input_ids=4x128), or NAME=D for a "
            "symbolic dimension (batch=4)"
        )


def _load(model: onnx.ModelProto | str | Path) -> onnx.ModelProto:
    return model if isinstance(model, onnx.ModelProto) else onnx.load(str(model), load_external_data=False)


def _size(nbytes: float) -> str:
    """``532 B``, ``18.8 KiB``, ``3.1 MiB``, ``2.7 GiB``."""
    value, unit = float(nbytes), "B"
    for bigger in ("KiB", "MiB", "GiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"


def describe(memory: LiveMemory, listed: int = 8) -> list[str]:
    """``memory`` as indented lines: nodes, held bytes, the peak and where, what the backward keeps, and the
    ``listed`` largest tensors alive at the peak."""
    held = ", ".join(f"{name} {_size(memory.held[name])}" for name in CATEGORIES if memory.held.get(name))
    lines = [
        f"  {memory.nodes:,} nodes, in onnxruntime's {memory.order} order",
        f"  held throughout: {held or 'nothing'}",
        f"  peak: {_size(memory.peak)}, of it {_size(memory.peak_live)} live, at node {memory.peak_at + 1} "
        f"{memory.peak_node} ({memory.peak_phase})",
        f"  activations kept for the backward: {_size(memory.kept_for_backward)}",
        "  largest tensors alive at the peak:",
    ]
    rows = [("name", "shape", "dtype", "size", "made by", "phase")]
    rows += [
        (t.name, "[" + ", ".join(map(str, t.dims or ())) + "]", t.dtype, _size(t.nbytes), t.producer, t.phase)
        for t in memory.at_peak[:listed]
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [c.rjust(w) if i == 3 else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append(("    " + "  ".join(cells)).rstrip())
    if memory.unknown:
        lines.append(f"  sizes not known before running (counted as 0): {', '.join(memory.unknown[:4])}"
                     + (f" and {len(memory.unknown) - 4} more" if len(memory.unknown) > 4 else ""))  # fmt: skip
    return lines


def parse_shapes(texts: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """``["input_ids=4x128", "labels=512"]`` -> ``{"input_ids": (4, 128), "labels": (512,)}``; ``ValueError``
    naming the text that is not ``NAME=DxDx...``."""
    shapes = {}
    for text in texts:
        name, _, dims = text.partition("=")
        try:
            shapes[name.strip()] = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            name = ""
        if not name.strip() or not dims or any(d < 0 for d in shapes.get(name.strip(), ())):
            raise ValueError(f"{text!r} is not NAME=DxD... (an input or a symbolic dimension, its sizes): "
                             "e.g. input_ids=4x128 or batch=4")  # fmt: skip
    return shapes


__all__ = [
    "ALIASING",
    "CATEGORIES",
    "LiveMemory",
    "LiveTensor",
    "StepMemory",
    "TensorInfo",
    "describe",
    "execution_order",
    "live_memory",
    "parse_shapes",
    "phases",
    "step_memory",
    "trainable_of",
    "value_types",
]
