"""Gradient rules of the control-flow operators ``If``, ``Scan`` and ``Loop``.

Each subgraph's gradient is built by the engine itself, on a copy of the
subgraph (:class:`~onnxtrain.autodiff.subgraph.Subgraph`), so every rule and
nested control flow work inside. The gradient subgraph recomputes the forward
nodes it needs from the subgraph's inputs (as gradient checkpointing does), so
the forward node saves only those inputs:

- ``If``: the gradient is an ``If`` on the same condition whose branches are
  the gradients of the branches, for the values they read from the enclosing
  graph (zeros in a branch that does not read one);
- ``Scan``: the forward body also outputs its state inputs, so the forward
  ``Scan`` saves the state before every iteration; the gradient is a ``Scan``
  over the saved states, the scan inputs and the scan outputs' cotangents in
  the opposite directions, carrying the state cotangents and the sums of the
  gradients of the values the body reads from outside;
- ``Loop``: the forward body also outputs its iteration number (and the state
  inputs and condition it reads), so the forward ``Loop`` saves how many
  iterations it ran, whatever its trip count and condition; the gradient is a
  ``Loop`` running that many iterations backwards, reading iteration ``T-1-i``
  of the saved values with ``Gather``.

Values the subgraphs read from the enclosing graph get their gradients through
``ctx.contribute``. Limits: randomness inside a body (Dropout) is drawn again
by the recomputation; a saved loop state must keep its shape across
iterations (it is stacked); only float tensors carry gradients through a
loop's states (a sequence state on the path is refused with a ``ValueError``);
onnxruntime's ``Scan`` runs no zero-length sequences, forward or backward.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx
from onnx import helper

from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.paths import carries_float
from onnxtrain.autodiff.registry import Grads, Result
from onnxtrain.autodiff.rules._builtin import registry
from onnxtrain.autodiff.subgraph import Subgraph
from onnxtrain.graph import dtypes
from onnxtrain.graph.builder import describe_type

_INT64 = onnx.TensorProto.INT64
_BOOL = onnx.TensorProto.BOOL


def _is_float(type_proto: onnx.TypeProto | None) -> bool:
    """A tensor of a floating-point element type."""
    return (
        type_proto is not None
        and type_proto.HasField("tensor_type")
        and dtypes.is_float(type_proto.tensor_type.elem_type)
    )


def _wanted_captured(ctx: RuleContext, body: Subgraph) -> list[str]:
    """The values ``body`` reads from outside that want a gradient (``ValueError`` for non-tensor ones)."""
    wanted = []
    for c in body.captured:
        if ctx.depends_on_wrt(c):
            _check_tensor(ctx, "the value it reads from outside", c, ctx.builder.type_of(c))
            if _is_float(ctx.builder.type_of(c)):
                wanted.append(c)
    return wanted


def _check_tensor(ctx: RuleContext, what: str, name: str, type_proto: onnx.TypeProto | None) -> None:
    """``ValueError`` when a gradient would have to flow through ``name``, a sequence or optional of floats."""
    if type_proto is None or type_proto.HasField("tensor_type") or not carries_float(type_proto):
        return
    label = f"{ctx.node.op_type} {ctx.node.name!r}" if ctx.node.name else ctx.node.op_type
    raise ValueError(
        f"cannot differentiate {label} through {what} {name!r} of type {describe_type(type_proto)}: only "
        "float tensors carry gradients through control flow. Stack the values with a scan output (or a "
        "tensor state) instead of a sequence, or keep the value out of the path to the loss"
    )


def _check_states(ctx: RuleContext, body: Subgraph, states: Sequence[str], outer: Sequence[str], grads: Grads) -> None:
    """Loop-carried values that are not tensors may not carry a gradient (in or out)."""
    for k, name in enumerate(states):
        if grads[k] is not None or (outer[k] and ctx.depends_on_wrt(outer[k])):
            _check_tensor(ctx, "the loop-carried value", name, body.type_of(name))


def _seeds(body: Subgraph, pairs: Sequence[tuple[str, str]]) -> dict[str, str]:
    """``{output: cotangent}``, summing the cotangents of an output listed twice."""
    grouped: dict[str, list[str]] = {}
    for output, cotangent in pairs:
        grouped.setdefault(output, []).append(cotangent)
    sub = body.context()
    return {out: parts[0] if len(parts) == 1 else sub.op("Sum", *parts) for out, parts in grouped.items()}


def _stacked(type_proto: onnx.TypeProto | None, what: str) -> onnx.TypeProto:
    """The type of a tensor of ``type_proto`` values stacked along a new axis 0 of unknown size."""
    if type_proto is None or not type_proto.HasField("tensor_type") or not type_proto.tensor_type.elem_type:
        raise TypeError(
            f"the gradient needs to save {what} at every iteration, but its type is not a tensor of known "
            "element type; declare the body's input types"
        )
    tensor = type_proto.tensor_type
    dims: list[int | str | None] | None = None
    if tensor.HasField("shape"):
        dims = [None]
        for dim in tensor.shape.dim:
            dims.append(dim.dim_value if dim.HasField("dim_value") else dim.dim_param or None)
    return helper.make_tensor_type_proto(tensor.elem_type, dims)


def _element(type_proto: onnx.TypeProto | None, axis: int) -> onnx.TypeProto | None:
    """The type of one slice of a tensor along ``axis`` (``None`` when the rank is unknown)."""
    if type_proto is None or not type_proto.HasField("tensor_type") or not type_proto.tensor_type.HasField("shape"):
        return None
    tensor = type_proto.tensor_type
    dims = list(tensor.shape.dim)
    del dims[axis % len(dims)]
    shape = [d.dim_value if d.HasField("dim_value") else d.dim_param or None for d in dims]
    return helper.make_tensor_type_proto(tensor.elem_type, shape)


def _slice_type(ctx: RuleContext, body: Subgraph, output: str, grad: str | None, axis: int) -> onnx.TypeProto | None:
    """The type of one iteration's value of scan output ``output``: the body's, else a slice of its cotangent's."""
    declared = body.type_of(output)
    if declared is not None and declared.HasField("tensor_type") and declared.tensor_type.elem_type:
        return declared
    return _element(ctx.builder.type_of(grad), axis) if grad else None


def _loose(type_proto: onnx.TypeProto | None) -> onnx.TypeProto | None:
    """``type_proto`` with its dimensions unknown (a loop state may change size between iterations)."""
    if type_proto is None or not type_proto.HasField("tensor_type"):
        return type_proto
    tensor = type_proto.tensor_type
    rank = len(tensor.shape.dim) if tensor.HasField("shape") else None
    return helper.make_tensor_type_proto(tensor.elem_type, None if rank is None else [None] * rank)


def _state_types(
    ctx: RuleContext, graph: onnx.GraphProto, outer: Sequence[str], first: int
) -> list[onnx.TypeProto | None]:
    """Body input types for loop states: the declared ones, else the initial values' (dimensions unknown)."""
    types: list[onnx.TypeProto | None] = [None] * len(graph.input)
    for k, name in enumerate(outer):
        declared = graph.input[first + k].type
        untyped = not declared.HasField("tensor_type") or not declared.tensor_type.elem_type
        if untyped and name and declared.WhichOneof("value") in (None, "tensor_type"):
            types[first + k] = _loose(ctx.builder.type_of(name))
    return types


def _save(
    ctx: RuleContext, graph: onnx.GraphProto, body: Subgraph, values: Sequence[str], **attributes: object
) -> list[str]:
    """Have the forward body also output ``values`` (its inputs), saved by the node at every iteration."""
    b = ctx.builder
    copy = onnx.GraphProto()
    copy.CopyFrom(graph)
    for value in values:
        out = b.names.fresh(f"{value}_saved")
        copy.node.append(helper.make_node("Identity", [value], [out], name=b.names.fresh("Identity")))
        info = onnx.ValueInfoProto(name=out)
        type_proto = body.type_of(value)
        if type_proto is not None:
            info.type.CopyFrom(type_proto)
        copy.output.append(info)
    types = [_stacked(body.type_of(value), f"{value!r}") for value in values]
    return ctx.extend_forward({"body": copy, **attributes}, types, hint=f"{ctx.node.op_type.lower()}_saved")


# ---------------------------------------------------------------------------- If


def _branch_seed(body: Subgraph, output: str, seed: str) -> str:
    """``seed``, the cotangent of the ``If``'s output, as the gradient of the branch's ``output``: reshaped to its
    shape where the two ranks differ (TorchScript's ``squeeze(1)`` of a size it cannot tell is ``If(size == 1,
    Squeeze, Identity)``, the ``If`` declared at one branch's rank). At run time the branch taken gave the
    ``If``'s output, so the reshape changes nothing; it tells the branch's rules its value's shape."""
    b = body.builder
    shapes = [b.shape_if_known(name) for name in (output, seed)]
    if shapes[0] is None or shapes[1] is None or len(shapes[0]) == len(shapes[1]):
        return seed
    return b.add_node1("Reshape", [seed, b.add_node1("Shape", [output])], hint=f"{output}_grad_shaped")


@registry.rule("If", inputs=())
def if_(ctx: RuleContext, grads: Grads) -> Result:
    """dc = If(cond, vjp(then_branch), vjp(else_branch)) for each outer value c read (0 in a branch that does not)"""
    bodies = [Subgraph(ctx, ctx.attr(name)) for name in ("then_branch", "else_branch")]
    wanted = sorted({c for body in bodies for c in _wanted_captured(ctx, body)})
    if not wanted:
        return [None]
    results = []
    for body in bodies:
        pairs = [
            (out, _branch_seed(body, out, body.outer_value(g, body.type_of(out))))
            for out, g in zip(body.outputs, grads, strict=True)
            if g is not None
        ]
        results.append(body.vjp(_seeds(body, pairs), [c for c in wanted if c in body.captured]))
    kept = [c for c in wanted if any(result.get(c) is not None for result in results)]
    if not kept:
        return [None]
    branches = {}
    for attribute, body, result in zip(("then_branch", "else_branch"), bodies, results, strict=True):
        sub = body.context()
        outputs = [result.get(c) or sub.zeros_like(body.outer_value(c)) for c in kept]
        branches[attribute] = body.to_graph(ctx.builder.names.fresh(f"{attribute}_grad"), [], outputs, kept)
    for c, grad in zip(kept, ctx.op_n("If", len(kept), ctx.inputs[0], **branches), strict=True):
        ctx.contribute(c, grad)
    return [None]


# -------------------------------------------------------------------------- Scan


@registry.rule("Scan")
def scan(ctx: RuleContext, grads: Grads) -> Result:
    """(ds0, dxs, dc) = Scan over reversed (saved s_t, x_t, dz_t) of vjp(body) carrying (ds, sum dc)"""
    graph: onnx.GraphProto = ctx.attr("body")
    m = int(ctx.attr("num_scan_inputs"))
    n = len(ctx.inputs) - m
    k = len(graph.output) - n
    in_dirs = list(ctx.attr("scan_input_directions") or [0] * m)
    in_axes = list(ctx.attr("scan_input_axes") or [0] * m)
    out_dirs = list(ctx.attr("scan_output_directions") or [0] * k)
    out_axes = list(ctx.attr("scan_output_axes") or [0] * k)
    types = _state_types(ctx, graph, ctx.inputs[:n], 0)
    for j in range(m):
        types[n + j] = _element(ctx.builder.type_of(ctx.inputs[n + j]), in_axes[j]) or types[n + j]
    body = Subgraph(ctx, graph, types)
    s_in, x_in = body.inputs[:n], body.inputs[n:]
    s_out, z_out = body.outputs[:n], body.outputs[n:]
    _check_states(ctx, body, s_in, ctx.inputs[:n], grads)
    states = [i for i in range(n) if _is_float(body.type_of(s_in[i]))]
    xs = [j for j in range(m) if ctx.needs(n + j)]
    captured = _wanted_captured(ctx, body)
    ds = {i: body.add_input(f"{s_in[i]}_grad", body.type_of(s_in[i])) for i in states}
    dz = {
        j: body.add_input(f"{z_out[j]}_grad", _slice_type(ctx, body, z_out[j], grads[n + j], out_axes[j]))
        for j in range(k)
        if grads[n + j]
    }
    acc = {c: body.add_input(f"{c}_grad_sum", ctx.builder.type_of(c)) for c in captured}
    seeds = _seeds(body, [(s_out[i], ds[i]) for i in states] + [(z_out[j], dz[j]) for j in dz])
    got = body.vjp(seeds, [s_in[i] for i in states] + [x_in[j] for j in xs] + captured)
    sub = body.context()
    outputs = [got[s_in[i]] or sub.zeros_like(ds[i]) for i in states]
    outputs += [sub.add(acc[c], got[c]) if got[c] else acc[c] for c in captured]
    outputs += [got[x_in[j]] or sub.zeros_like(x_in[j]) for j in xs]
    if not outputs:
        return [None] * len(ctx.inputs)
    read = body.reads(outputs)
    saved = [i for i in range(n) if s_in[i] in read]
    scanned = [j for j in range(m) if x_in[j] in read] or [0]  # a scan input sets the iteration count
    cotangents = [j for j in dz if dz[j] in read]
    inputs = [ds[i] for i in states] + [acc[c] for c in captured]
    inputs += [s_in[i] for i in saved] + [x_in[j] for j in scanned] + [dz[j] for j in cotangents]
    like = [ds[i] for i in states] + [acc[c] for c in captured] + [x_in[j] for j in xs]
    backward = body.to_graph(ctx.builder.names.fresh("scan_grad_body"), inputs, outputs, like)
    saved_names: list[str] = []
    if saved:
        extra: dict[str, object] = {}
        if ctx.attr("scan_output_directions") is not None:
            extra["scan_output_directions"] = out_dirs + [0] * len(saved)
        if ctx.attr("scan_output_axes") is not None:
            extra["scan_output_axes"] = out_axes + [0] * len(saved)
        saved_names = _save(ctx, graph, body, [s_in[i] for i in saved], **extra)
    initial = [grads[i] or ctx.zeros_like(ctx.inputs[i]) for i in states]
    initial += [ctx.zeros_like(c) for c in captured]
    sequences = [*saved_names, *(ctx.inputs[n + j] for j in scanned), *(grads[n + j] for j in cotangents)]
    attributes: dict[str, object] = {
        "num_scan_inputs": len(sequences),
        "scan_input_directions": [1] * len(saved)
        + [1 - in_dirs[j] for j in scanned]
        + [1 - out_dirs[j] for j in cotangents],
        "scan_input_axes": [0] * len(saved) + [in_axes[j] for j in scanned] + [out_axes[j] for j in cotangents],
    }
    if xs:
        attributes["scan_output_directions"] = [1 - in_dirs[j] for j in xs]
        attributes["scan_output_axes"] = [in_axes[j] for j in xs]
    results = ctx.op_n("Scan", len(outputs), *initial, *sequences, body=backward, **attributes)  # type: ignore[arg-type]
    grad_states = dict(zip(states, results[: len(states)], strict=True))
    for c, grad in zip(captured, results[len(states) : len(states) + len(captured)], strict=True):
        ctx.contribute(c, grad)
    grad_xs = dict(zip(xs, results[len(states) + len(captured) :], strict=True))
    return [grad_states.get(i) for i in range(n)] + [grad_xs.get(j) for j in range(m)]


# -------------------------------------------------------------------------- Loop


@registry.rule("Loop")
def loop(ctx: RuleContext, grads: Grads) -> Result:
    """(dv0, dc) = Loop T times, t = T-1-i: vjp(body) at the saved (i_t, v_t, dz_t), carrying (dv, sum dc)"""
    graph: onnx.GraphProto = ctx.attr("body")
    n = len(ctx.inputs) - 2
    k = len(graph.output) - 1 - n
    types = _state_types(ctx, graph, ctx.inputs[2:], 2)
    types[0] = helper.make_tensor_type_proto(_INT64, [])
    types[1] = helper.make_tensor_type_proto(_BOOL, [])
    body = Subgraph(ctx, graph, types)
    iteration, condition, v_in = body.inputs[0], body.inputs[1], body.inputs[2:]
    v_out, z_out = body.outputs[1 : 1 + n], body.outputs[1 + n :]
    _check_states(ctx, body, v_in, ctx.inputs[2:], grads)
    states = [i for i in range(n) if _is_float(body.type_of(v_in[i]))]
    captured = _wanted_captured(ctx, body)
    dv = {i: body.add_input(f"{v_in[i]}_grad", body.type_of(v_in[i])) for i in states}
    dz = {
        j: body.add_input(f"{z_out[j]}_grad", _slice_type(ctx, body, z_out[j], grads[n + j], 0))
        for j in range(k)
        if grads[n + j]
    }
    acc = {c: body.add_input(f"{c}_grad_sum", ctx.builder.type_of(c)) for c in captured}
    seeds = _seeds(body, [(v_out[i], dv[i]) for i in states] + [(z_out[j], dz[j]) for j in dz])
    got = body.vjp(seeds, [v_in[i] for i in states] + captured)
    sub = body.context()
    outputs = [got[v_in[i]] or sub.zeros_like(dv[i]) for i in states]
    outputs += [sub.add(acc[c], got[c]) if got[c] else acc[c] for c in captured]
    if not outputs:
        return [None] * len(ctx.inputs)
    read = body.reads(outputs)
    saved = [iteration] + [name for name in (condition, *v_in) if name in read]  # the iterations: always
    cotangents = [j for j in dz if dz[j] in read]
    stepped = [*saved, *(dz[j] for j in cotangents)]  # the values of iteration t
    carried = [dv[i] for i in states] + [acc[c] for c in captured]
    inner = body.to_graph(ctx.builder.names.fresh("loop_grad_body"), [*stepped, *carried], outputs, carried)
    saved_names = _save(ctx, graph, body, saved)
    shape = ctx.op("Shape", saved_names[0])
    count = ctx.op("Gather", shape, ctx.const(0, shape))  # the iterations the forward ran (a scalar)
    last = ctx.sub(count, ctx.const(1, shape))
    sources = [*saved_names, *(grads[n + j] for j in cotangents)]
    backward = _backwards(ctx, inner, stepped, sources, last)  # type: ignore[arg-type]
    initial = [grads[i] or ctx.zeros_like(ctx.inputs[2 + i]) for i in states]
    initial += [ctx.zeros_like(c) for c in captured]
    results = ctx.op_n("Loop", len(carried), count, "", *initial, body=backward)
    for c, grad in zip(captured, results[len(states) :], strict=True):
        ctx.contribute(c, grad)
    grad_states = dict(zip(states, results[: len(states)], strict=True))
    return [None, None] + [grad_states.get(i) for i in range(n)]


def _backwards(
    ctx: RuleContext, inner: onnx.GraphProto, stepped: Sequence[str], sources: Sequence[str], last: str
) -> onnx.GraphProto:
    """A ``Loop`` body running ``inner`` at iteration ``t = last - i``: each ``stepped`` input of ``inner`` is
    ``Gather(source, t)`` of its stacked ``sources`` (outer values), the others are carried."""
    names = ctx.builder.names
    i, condition, condition_out, t = (names.fresh(hint) for hint in ("grad_i", "grad_cond", "grad_cond_out", "grad_t"))
    nodes = [
        helper.make_node("Identity", [condition], [condition_out], name=names.fresh("Identity")),
        helper.make_node("Sub", [last, i], [t], name=names.fresh("Sub")),
    ]
    nodes += [
        helper.make_node("Gather", [source, t], [value], name=names.fresh("Gather"), axis=0)
        for value, source in zip(stepped, sources, strict=True)
    ]
    nodes += inner.node
    inputs = [
        helper.make_tensor_value_info(i, _INT64, []),
        helper.make_tensor_value_info(condition, _BOOL, []),
        *inner.input[len(stepped) :],
    ]
    outputs = [helper.make_tensor_value_info(condition_out, _BOOL, []), *inner.output]
    return helper.make_graph(nodes, inner.name, inputs, outputs, list(inner.initializer))
