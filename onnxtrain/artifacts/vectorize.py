"""One update for many parameters: an optimizer's per-parameter chains of element-wise nodes run on packed tensors.

An optimizer model updates each parameter with its own chain of nodes: AdamW
reads ``p``, its gradient ``g`` and moments ``m``, ``v`` and writes ``p'``,
``m'``, ``v'`` in 12 element-wise nodes, the same 12 for every parameter, with
the same scalars (the step size, the bias corrections). onnxruntime spends
about 0.3 µs on each node however small its tensors, so a small model's step
costs its node count. :func:`pack_updates` finds the parameters whose chains
are the same element-wise computation (the same operators, attributes and
shared scalars, one dtype) and runs one chain for all of them on flat tensors
holding the parameters one after the other: the same arithmetic on each
element, so the same bits, in fewer nodes.

The packed tensors are inputs and outputs of the model (the epoch model's
``Scan`` carries them from iteration to iteration, :mod:`onnxtrain.artifacts.epoch`):
per group and role (the parameters, each moment, the gradients) one flat
tensor replaces the members' inputs and outputs. Inside, the updated
parameters are split back (``Split``, ``Reshape``) for the nodes that read
them, and the new gradients are flattened and concatenated into the packed
gradient output.

:func:`pack_in_place` packs inside the model instead, for the fused step on a
GPU, which updates each tensor in place (:mod:`onnxtrain.training.fused`): its
inputs and outputs stay one per tensor, seen as rows of one width, and one
``Concat`` per role packs them at every step.

Where the model runs on CUDA the parameters are split back by one ``Slice``
each instead: onnxruntime's CUDA ``Split`` copies a map of its axis, one
int64 per element, from the host to the device at every run, and waits for
it (measured on an H200, onnxruntime-gpu 1.31.1: 3.2 ms for the 670 thousand
parameters of the 784-512-512-10 MLP, against 0.75 ms for its whole step).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, MutableSequence, Sequence
from dataclasses import dataclass

import onnx
from onnx import TensorProto, helper

from onnxtrain.graph.fold import ShapeInference, onnx_shapes
from onnxtrain.graph.versions import is_standard
from onnxtrain.graph.walk import names_read, needed_nodes, rename_references

#: Element-wise operators a chain may be made of (each element of the result depends on the same element of
#: each input, and on scalars).
ELEMENTWISE = frozenset(
    {"Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Neg", "Abs", "Sign", "Reciprocal", "Exp", "Log", "Cast"}
    | {"Max", "Min", "Where", "Greater", "Less", "Equal", "GreaterOrEqual", "LessOrEqual", "Not", "And", "Or"}
    | {"Identity", "Clip"}
)

#: The most rows a group packed by :func:`pack_in_place` holds (onnxruntime's CUDA ``Concat`` copies one int64
#: per row to the device at every run: 8 MiB).
MAX_PACKED_ROWS = 1 << 20

#: ``(input, output)``: a tensor the model reads and writes a new value of.
Carried = tuple[str, str]


@dataclass(frozen=True)
class ParameterUpdate:
    """One trainable parameter's update: the parameter, its moments and its gradient, each as read and written."""

    parameter: Carried
    moments: tuple[Carried, ...]
    gradient: Carried
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Pack:
    """One flat tensor standing for a role (the parameters, a moment, the gradients) of a group of parameters.

    ``carried``: its input and output; ``members``: the per-parameter
    ``(input, output)`` it stands for, in order, with their ``shapes``;
    ``role``: ``"parameters"``, ``"gradients"`` or ``"moment0"``, ``"moment1"``...
    """

    carried: Carried
    members: tuple[Carried, ...]
    shapes: tuple[tuple[int, ...], ...]
    elem_type: int
    role: str
    #: The width of the rows its members are seen as (:func:`pack_in_place`); ``1`` for :func:`pack_updates`.
    width: int = 1


def pack_updates(
    model: onnx.ModelProto,
    updates: Sequence[ParameterUpdate],
    unique: Callable[[str], str],
    shapes_of: ShapeInference = onnx_shapes,
    *,
    slices: bool = False,
) -> tuple[onnx.ModelProto, list[Pack]]:
    """``model`` with the identical chains of ``updates`` run once per group on packed tensors, and the packs.

    A group is packed where it saves nodes; chains that are not purely
    element-wise over the parameter's own tensors and scalars (gradient
    clipping reads all gradients) are left as they are. ``unique(hint)``
    gives new names; ``shapes_of`` infers the sizes of the values the chains
    share (scalars only); ``slices``: split the parameters back with
    ``Slice`` nodes (for CUDA, see the module docstring). ``model`` is not
    changed.
    """
    copy, groups = _groups(model, updates, shapes_of, read_elsewhere=False)
    packs: list[Pack] = []
    for members, chains in groups:
        chain_length = len(chains[0])
        reshapes = sum(2 for m in members if len(m.shape) != 1)
        packing = reshapes + 1 + (len(members) if slices else 1)  # the reshapes, the Concat, the Split or Slices
        if chain_length * (len(members) - 1) <= packing:
            continue  # packing would not save nodes
        packs += _pack_group(copy.graph, members, _current(copy.graph, chains), unique, slices)
    return copy, packs


def pack_in_place(
    model: onnx.ModelProto,
    updates: Sequence[ParameterUpdate],
    unique: Callable[[str], str],
    shapes_of: ShapeInference = onnx_shapes,
    *,
    max_rows: int = MAX_PACKED_ROWS,
    split: bool = False,
) -> tuple[onnx.ModelProto, list[Pack]]:
    """``model`` with the identical chains of ``updates`` run once per group on packed tensors made inside the
    model, and the packs: the model's inputs and outputs stay one per tensor, for a step that updates them in
    place.

    A group's tensors are seen as rows of one width ``C``, the greatest
    common divisor of their sizes: each member's input (the parameter, its
    gradient, each moment) is declared ``[size / C, C]``, and so are its new
    parameter and moments; the caller binds the tensor's own buffer with that
    shape (:attr:`Pack.views`), so nothing copies to reshape it. Per role one
    ``Concat`` of the rows packs the members' inputs, the chain runs once, and
    one ``Slice`` per member writes each new parameter and moment into its
    output; the nodes that read a new parameter read it through a ``Reshape``
    to its shape (no copy). The new gradients, which the rest of the model
    writes, are left as they are. Packs' ``carried`` names are the model's
    packed values, not inputs or outputs.

    onnxruntime's CUDA ``Concat`` of inputs of different lengths builds and
    copies to the device one int64 per row at every run: a group holds at most
    ``max_rows`` rows. Members are taken largest first, and one that would
    shrink the width past that is left with its own chain (GPT-2 small's 148
    tensors: all, 162 thousand rows of 768). A group is packed where it
    saves nodes. ``split``: one ``Split`` per role writes the members' new
    values instead of a ``Slice`` each (onnxruntime's CUDA ``Split`` copies a
    map of one int64 per row at every run; which costs less is measured in
    ``benchmarks/real_size``). ``model`` is not changed.
    """
    copy, groups = _groups(model, updates, shapes_of, read_elsewhere=True)
    packs: list[Pack] = []
    for members, chains in groups:
        kept, width = _rows_of_one_width(members, max_rows)
        chains = [chain for member, chain in zip(members, chains, strict=True) if member in kept]
        unpacking = sum(1 + len(m.moments) + (len(m.shape) != 1) for m in kept)  # Slices, Reshapes
        if len(chains[0]) * (len(kept) - 1) <= unpacking + 2 + len(kept[0].moments):  # and the Concats
            continue
        packs += _pack_group_in_place(copy.graph, kept, _current(copy.graph, chains), width, unique, split)
    return copy, packs


def _current(graph: onnx.GraphProto, chains: list[list[onnx.NodeProto]]) -> list[list[onnx.NodeProto]]:
    """``chains`` as ``graph`` holds their nodes now: packing a group lists the graph's nodes anew (protobuf copies
    them), so the next group's chains are found again by their first outputs, which are unique."""
    by_output = {node.output[0]: node for node in graph.node if node.output}
    return [[by_output[node.output[0]] for node in chain] for chain in chains]


def _rows_of_one_width(members: Sequence[ParameterUpdate], max_rows: int) -> tuple[list[ParameterUpdate], int]:
    """The members to pack, in their order, and the width of their rows: the greatest common divisor of their
    sizes, taken largest first, each kept where the rows stay at most ``max_rows``."""
    kept: set[int] = set()
    width, total = 0, 0
    for index in sorted(range(len(members)), key=lambda i: -math.prod(members[i].shape)):
        size = math.prod(members[index].shape)
        narrower = math.gcd(width, size)
        if narrower and (total + size) // narrower <= max_rows:
            kept.add(index)
            width, total = narrower, total + size
    return [member for i, member in enumerate(members) if i in kept], max(width, 1)


def views_in_place(packs: Sequence[Pack]) -> tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int]]]:
    """The inputs and the outputs whose shapes :func:`pack_in_place` declared as rows, with those shapes."""
    inputs: dict[str, tuple[int, int]] = {}
    outputs: dict[str, tuple[int, int]] = {}
    for pack in packs:
        for (name, out), shape in zip(pack.members, pack.shapes, strict=True):
            rows = (math.prod(shape) // pack.width, pack.width)
            inputs[name] = rows
            if pack.role != "gradients":
                outputs[out] = rows
    return inputs, outputs


def _groups(
    model: onnx.ModelProto, updates: Sequence[ParameterUpdate], shapes_of: ShapeInference, *, read_elsewhere: bool
) -> tuple[onnx.ModelProto, list[tuple[list[ParameterUpdate], list[list[onnx.NodeProto]]]]]:
    """A copy of ``model`` and, in it, the groups of two or more ``updates`` whose chains are the same
    element-wise computation, each with its members' chains (``read_elsewhere``: see :func:`_chain`)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph  # the chains are found in the copy, whose nodes are then replaced
    sizes = _element_counts(model, shapes_of)
    for name in _single_elements(graph, sizes):
        sizes[name] = 1
    elem_types = {value.name: value.type.tensor_type.elem_type for value in graph.input}
    chains = {}
    for update in updates:
        chain = _chain(graph, update, sizes, elem_types.get(update.parameter[0], 0), read_elsewhere=read_elsewhere)
        if chain is not None:
            chains[update.parameter[0]] = chain
    groups: dict[tuple, list[ParameterUpdate]] = {}
    for update in updates:
        found = chains.get(update.parameter[0])
        if found is not None:
            groups.setdefault(found[1], []).append(update)
    return copy, [
        (members, [chains[m.parameter[0]][0] for m in members]) for members in groups.values() if len(members) > 1
    ]


def _element_counts(model: onnx.ModelProto, shapes_of: ShapeInference) -> dict[str, int | None]:
    """Elements per value read by a node, where its shape is known (inputs, initializers, inferred values)."""
    counts: dict[str, int | None] = {t.name: math.prod(t.dims) for t in model.graph.initializer}
    for value in model.graph.input:
        tensor = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
        known = tensor.HasField("shape") and all(d is not None for d in dims)
        counts[value.name] = math.prod(dims) if known else None  # type: ignore[arg-type]
    read = {name for node in model.graph.node for name in node.input if name and name not in counts}
    for name, dims in shapes_of(model, sorted(read)).items():
        counts[name] = None if dims is None else math.prod(dims)
    return counts


def _single_elements(graph: onnx.GraphProto, sizes: dict[str, int | None]) -> set[str]:
    """The values of one element: known so, or computed element-wise (or squeezed) from such values only (the
    step sizes and bias corrections of an update, which shape inference may leave unknown)."""
    single = {name for name, size in sizes.items() if size is not None and size <= 1}
    for node in graph.node:
        inputs = [name for name in node.input if name]
        spreads = node.op_type in ELEMENTWISE or node.op_type in ("Squeeze", "Unsqueeze", "Reshape")
        if spreads and is_standard(node) and inputs and all(n in single for n in inputs):
            single.update(node.output)
    return single


def _chain(
    graph: onnx.GraphProto,
    update: ParameterUpdate,
    sizes: dict[str, int | None],
    elem_type: int,
    *,
    read_elsewhere: bool = False,
) -> tuple[list[onnx.NodeProto], tuple] | None:
    """The nodes from ``update``'s tensors to its new parameter and moments, and their canonical form; ``None``
    where they are not an element-wise chain over those tensors and scalars.

    A reduction of the tensors to one element (clipping's norm, the loss
    scaler's check that every gradient is finite) is no part of the chain:
    its result is a scalar the chain reads, shared where every member reads
    the same. ``read_elsewhere``: the tensors and the chain's intermediate
    values may be read outside the chain (by such reductions: the loss
    scaler checks the unscaled gradients), else not.
    """
    roles = {update.parameter[0]: 0, update.gradient[0]: 1}
    roles.update({m[0]: 2 + k for k, m in enumerate(update.moments)})
    ends = {update.parameter[1], *(m[1] for m in update.moments)}
    downstream = set(roles)
    for node in graph.node:
        if any(name in downstream for name in node.input) and not _reduces(node, sizes):
            downstream.update(node.output)
    upstream = set(ends)
    for node in reversed(graph.node):
        if any(name in upstream for name in node.output) and not _reduces(node, sizes):
            upstream.update(name for name in node.input if name)
    chain = [n for n in graph.node if any(o in downstream and o in upstream for o in n.output)]
    made = {name for node in chain for name in node.output}
    if not ends <= made:
        return None
    position = {name: (i, k) for i, node in enumerate(chain) for k, name in enumerate(node.output)}
    in_chain = {id(node) for node in chain}
    readers_outside = {name for node in graph.node if id(node) not in in_chain for name in names_read(node)}
    outputs = {value.name for value in graph.output}
    signature: list[tuple] = []
    for node in chain:
        if node.op_type not in ELEMENTWISE or not is_standard(node) or len(node.output) != 1:
            return None
        read_outside = node.output[0] in readers_outside and not read_elsewhere
        if node.output[0] not in ends and (read_outside or node.output[0] in outputs):
            return None  # an intermediate read elsewhere would have to be unpacked too
        refs = []
        for name in node.input:
            if name in roles:
                refs.append(("role", roles[name]))
            elif name in position:
                refs.append(("node", position[name]))
            elif sizes.get(name) in (0, 1):
                refs.append(("shared", name))  # a scalar: broadcasts over the packed tensor alike
            else:
                return None
        ending = (
            "param"
            if node.output[0] == update.parameter[1]
            else next((f"moment{k}" for k, m in enumerate(update.moments) if m[1] == node.output[0]), "")
        )
        attrs = tuple(sorted((a.name, a.SerializeToString()) for a in node.attribute))
        signature.append((node.op_type, attrs, tuple(refs), ending))
    for name in roles:  # the update's tensors are read by its chain only (or, read_elsewhere, by reductions too)
        if name in outputs or (name in readers_outside and not read_elsewhere):
            return None
    return chain, (*signature, (len(update.moments), elem_type))


def _reduces(node: onnx.NodeProto, sizes: Mapping[str, int | None]) -> bool:
    """Whether ``node`` makes single elements from a larger input (a norm, a flag): a scalar the chains share,
    not a step of theirs."""
    made = [name for name in node.output if name]
    read = [sizes.get(name) for name in node.input if name]
    return bool(made) and all(sizes.get(name) == 1 for name in made) and any(size and size > 1 for size in read)


def _roles(
    members: Sequence[ParameterUpdate], unique: Callable[[str], str]
) -> tuple[list[list[Carried]], list[str], list[Carried]]:
    """The members' tensors by role (parameters, gradients, each moment), the roles' names, and a new name for
    each role's packed tensor and its update."""
    roles: list[list[Carried]] = [[m.parameter for m in members], [m.gradient for m in members]]
    roles += [[m.moments[k] for m in members] for k in range(len(members[0].moments))]
    names = ["parameters", "gradients", *(f"moment{k}" for k in range(len(roles) - 2))]
    head = members[0].parameter[0]
    return roles, names, [(unique(f"{head}.packed_{n}"), unique(f"{head}.packed_{n}.updated")) for n in names]


def _packed_chain(
    template: Sequence[onnx.NodeProto],
    roles: Sequence[Sequence[Carried]],
    packed: Sequence[Carried],
    unique: Callable[[str], str],
) -> list[onnx.NodeProto]:
    """The first member's chain ``template``, run on the ``packed`` tensors of ``roles``: reading each role's
    packed input, writing each role's packed update but the gradients'."""
    renamed = {role[0][0]: packed[r][0] for r, role in enumerate(roles)}
    outputs_of_role = {role[0][1]: packed[r][1] for r, role in enumerate(roles) if r != 1}
    nodes = []
    for node in template:
        clone = onnx.NodeProto()
        clone.CopyFrom(node)
        clone.name = unique(f"{node.name or node.op_type}.packed")
        clone.input[:] = [renamed.get(name, name) for name in node.input]
        out = node.output[0]
        renamed[out] = outputs_of_role.get(out) or unique(f"{out}.packed")
        clone.output[:] = [renamed[out]]
        nodes.append(clone)
    return nodes


def _pack_group(
    graph: onnx.GraphProto,
    members: list[ParameterUpdate],
    chains: list[list[onnx.NodeProto]],
    unique: Callable[[str], str],
    slices: bool,
) -> list[Pack]:
    """Replace the chains of ``members`` by one chain on packed tensors (see the module docstring)."""
    inputs = {value.name: value for value in graph.input}
    elem_type = inputs[members[0].parameter[0]].type.tensor_type.elem_type
    shapes = tuple(m.shape for m in members)
    total = sum(math.prod(shape) for shape in shapes)
    roles, names, packed = _roles(members, unique)
    new_nodes = _packed_chain(chains[0], roles, packed, unique)
    # the new parameters, split back for the nodes that read them; the new gradients, packed
    parameters = [m.parameter[1] for m in members]
    new_nodes += split_and_reshape(packed[0][1], shapes, parameters, unique, graph.initializer, slices=slices)
    gradients = [m.gradient[1] for m in members]
    new_nodes += flatten_and_concat(gradients, shapes, packed[1][1], unique, graph.initializer)

    dropped = {id(node) for chain in chains for node in chain}
    kept = [node for node in graph.node if id(node) not in dropped]
    known = {value.name for value in graph.input} | {tensor.name for tensor in graph.initializer}
    known |= {name for name, _ in packed}
    ordered = _topological([*kept, *new_nodes], known)
    del graph.node[:]
    graph.node.extend(ordered)

    member_names = {name for members_of_role in roles for pair in members_of_role for name in pair}
    kept_inputs = [value for value in graph.input if value.name not in member_names]
    kept_outputs = [value for value in graph.output if value.name not in member_names]
    del graph.input[:]
    graph.input.extend(kept_inputs)
    graph.input.extend(helper.make_tensor_value_info(name, elem_type, [total]) for name, _ in packed)
    del graph.output[:]
    graph.output.extend(kept_outputs)
    graph.output.extend(helper.make_tensor_value_info(out, elem_type, [total]) for _, out in packed)
    return [
        Pack(carried, tuple(members_of_role), shapes, elem_type, role)
        for carried, members_of_role, role in zip(packed, roles, names, strict=True)
    ]


def _pack_group_in_place(
    graph: onnx.GraphProto,
    members: list[ParameterUpdate],
    chains: list[list[onnx.NodeProto]],
    width: int,
    unique: Callable[[str], str],
    split: bool,
) -> list[Pack]:
    """Replace the chains of ``members`` by one chain on tensors packed inside ``graph`` (see
    :func:`pack_in_place`)."""
    elem_type = next(v for v in graph.input if v.name == members[0].parameter[0]).type.tensor_type.elem_type
    shapes = tuple(m.shape for m in members)
    sizes = [math.prod(shape) for shape in shapes]
    roles, names, packed = _roles(members, unique)
    new_nodes = [  # the members' rows, one after the other
        helper.make_node(
            "Concat", [name for name, _ in role], [packed[r][0]], name=unique(f"{packed[r][0]}.pack"), axis=0
        )
        for r, role in enumerate(roles)
    ]
    new_nodes += _packed_chain(chains[0], roles, packed, unique)
    rows = [size // width for size in sizes]
    for r, role in enumerate(roles):  # each new parameter and moment sliced into its own output, as rows
        if r != 1:
            outputs = [out for _, out in role]
            # one Slice per output along axis 0 (or one Split), each ``count`` rows long (no Reshape: written as rows)
            row_counts = [(count,) for count in rows]
            new_nodes += split_and_reshape(
                packed[r][1], row_counts, outputs, unique, graph.initializer, slices=not split
            )
    # the rest of the model reads each new parameter in its shape: a Reshape of the output
    shaped = {
        m.parameter[1]: unique(f"{m.parameter[1]}.shaped")
        for m, count in zip(members, rows, strict=True)
        if m.shape != (count, width)
    }
    dropped = {id(node) for chain in chains for node in chain} - _made_for_others(graph, chains, members)
    kept = [node for node in graph.node if id(node) not in dropped]
    # the members' tensors read elsewhere (by a norm, a finiteness check), read there in their shapes
    read_elsewhere = {name for node in kept for name in names_read(node)}
    aliases = {
        name: unique(f"{name}.shaped")
        for role in roles
        for (name, _), member, count in zip(role, members, rows, strict=True)
        if name in read_elsewhere and member.shape != (count, width)
    }
    for node in kept:
        rename_references(node, {**shaped, **aliases})
    shape_of = {name: member.shape for role in roles for (name, _), member in zip(role, members, strict=True)}
    shape_of.update({member.parameter[1]: member.shape for member in members})
    reshapes = {}
    for original, alias in {**aliases, **shaped}.items():
        dims = _shape_constant(graph.initializer, unique, original, shape_of[original])
        reshapes[original] = helper.make_node("Reshape", [original, dims], [alias], name=unique(f"{alias}.reshape"))
    input_views = [reshapes[name] for name in aliases]  # read only inputs: run first
    new_nodes += [reshapes[name] for name in shaped]
    # the packed update and what it reads first, then the rest in its order: onnxruntime, which runs the ready
    # node listed first, then applies the update before any node of the training step runs (onnxtrain.training.fused)
    update = {id(node) for node in needed_nodes(kept, {name for node in new_nodes for name in names_read(node)})}
    known = {value.name for value in graph.input} | {tensor.name for tensor in graph.initializer}
    first = [node for node in kept if id(node) in update]
    rest = [node for node in kept if id(node) not in update]
    ordered = _topological([*input_views, *first, *new_nodes, *rest], known)
    del graph.node[:]
    graph.node.extend(ordered)

    declared = {}  # the members' inputs and their new parameters and moments, as rows
    for r, role in enumerate(roles):
        for (name, out), count in zip(role, rows, strict=True):
            declared[name] = count
            if r != 1:
                declared[out] = count
    for value in (*graph.input, *graph.output):
        if value.name in declared:
            _declare(value, (declared[value.name], width))
    kept_infos = [info for info in graph.value_info if info.name not in declared]
    del graph.value_info[:]
    graph.value_info.extend(kept_infos)
    return [
        Pack(carried, tuple(role), shapes, elem_type, name, width)
        for carried, role, name in zip(packed, roles, names, strict=True)
    ]


def _made_for_others(
    graph: onnx.GraphProto, chains: Sequence[Sequence[onnx.NodeProto]], members: Sequence[ParameterUpdate]
) -> set[int]:
    """``id()`` of the chains' nodes that make what nodes outside the chains read (the unscaled gradient the
    loss scaler checks), with the chain nodes they need: kept per member beside the packed chain."""
    in_chains = {id(node) for chain in chains for node in chain}
    outside = {name for node in graph.node if id(node) not in in_chains for name in names_read(node)}
    needed: set[int] = set()
    for chain, member in zip(chains, members, strict=True):
        ends = {member.parameter[1], *(out for _, out in member.moments)}
        read = {name for node in chain for name in node.output if name in outside and name not in ends}
        needed.update(id(node) for node in needed_nodes(chain, read))
    return needed


def _shape_constant(
    initializers: MutableSequence[onnx.TensorProto], unique: Callable[[str], str], name: str, shape: Sequence[int]
) -> str:
    """A new initializer holding ``shape`` (for a ``Reshape`` to ``name``'s shape), appended to ``initializers``;
    its name."""
    dims = unique(f"{name}.shape")
    initializers.append(helper.make_tensor(dims, TensorProto.INT64, [len(shape)], list(shape)))
    return dims


def _declare(value: onnx.ValueInfoProto, dims: Sequence[int]) -> None:
    """Declare ``value`` (a tensor) of shape ``dims``."""
    shape = value.type.tensor_type.shape
    del shape.dim[:]
    for size in dims:
        shape.dim.add().dim_value = size


def flatten_and_concat(
    names: Sequence[str],
    shapes: Sequence[tuple[int, ...]],
    output: str,
    unique: Callable[[str], str],
    initializers: MutableSequence[onnx.TensorProto],
) -> list[onnx.NodeProto]:
    """The nodes writing ``output``: the tensors ``names`` (of ``shapes``) flattened (``Reshape``, none for a
    1-D one) and concatenated, one after the other; the shape they need is added to ``initializers``."""
    flat = unique("flat_shape")
    initializers.append(helper.make_tensor(flat, TensorProto.INT64, [1], [-1]))
    nodes, pieces = [], []
    for name, shape in zip(names, shapes, strict=True):
        if len(shape) == 1:
            pieces.append(name)
        else:
            pieces.append(unique(f"{name}.flat"))
            nodes.append(helper.make_node("Reshape", [name, flat], [pieces[-1]], name=unique(f"{name}.flatten")))
    nodes.append(helper.make_node("Concat", pieces, [output], name=unique(f"{output}.pack"), axis=0))
    return nodes


def split_and_reshape(
    packed: str,
    shapes: Sequence[tuple[int, ...]],
    outputs: Sequence[str],
    unique: Callable[[str], str],
    initializers: MutableSequence[onnx.TensorProto],
    *,
    slices: bool = False,
) -> list[onnx.NodeProto]:
    """The nodes writing each of ``outputs`` (of ``shapes``) from its part of the flat ``packed``: one ``Split``,
    or with ``slices`` one ``Slice`` per output, then a ``Reshape`` for each that is not 1-D; the sizes, bounds
    and shapes they need are added to ``initializers``."""
    sizes = [math.prod(shape) for shape in shapes]
    pieces = [out if len(shape) == 1 else unique(f"{out}.flat") for out, shape in zip(outputs, shapes, strict=True)]
    if slices:
        nodes = []
        bounds = [0, *itertools.accumulate(sizes)]
        for piece, start, end in zip(pieces, bounds[:-1], bounds[1:], strict=True):
            names = [unique(f"{piece}.start"), unique(f"{piece}.end")]
            for name, bound in zip(names, (start, end), strict=True):
                initializers.append(helper.make_tensor(name, TensorProto.INT64, [1], [bound]))
            nodes.append(helper.make_node("Slice", [packed, *names], [piece], name=unique(f"{piece}.unpack")))
    else:
        split = unique(f"{packed}.sizes")
        initializers.append(helper.make_tensor(split, TensorProto.INT64, [len(sizes)], sizes))
        nodes = [helper.make_node("Split", [packed, split], pieces, name=unique(f"{packed}.unpack"), axis=0)]
    for out, piece, shape in zip(outputs, pieces, shapes, strict=True):
        if piece != out:
            dims = _shape_constant(initializers, unique, out, shape)
            nodes.append(helper.make_node("Reshape", [piece, dims], [out], name=unique(f"{out}.unflatten")))
    return nodes


def _topological(nodes: Sequence[onnx.NodeProto], known: set[str]) -> list[onnx.NodeProto]:
    """``nodes`` in an order where each runs after what it reads (subgraphs' outer reads included), keeping
    their given order wherever it already is one."""
    available = set(known) | {""}
    waiting = list(nodes)
    ordered: list[onnx.NodeProto] = []
    while waiting:
        still = []
        for node in waiting:
            if names_read(node) <= available:
                ordered.append(node)
                available.update(node.output)
            else:
                still.append(node)
        if len(still) == len(waiting):
            raise ValueError(f"nodes read values nothing computes: {sorted(names_read(still[0]) - available)}")
        waiting = still
    return ordered


__all__ = [
    "ELEMENTWISE",
    "MAX_PACKED_ROWS",
    "Pack",
    "ParameterUpdate",
    "flatten_and_concat",
    "pack_in_place",
    "pack_updates",
    "split_and_reshape",
    "views_in_place",
]
