"""Reverse-mode autodiff over an ONNX graph, emitting standard ONNX operators: the backward walk.

:func:`backward` appends to a :class:`GraphBuilder` the nodes computing
``d loss / d x`` for each requested ``x``, named ``x_grad``, with the rules of
the registry it is given (:mod:`onnxtrain.autodiff.gradients` gives the
public functions, with the built-in rules by default). The engine does the
shared work once, so that rules stay pure math:

1. find the nodes on a path from a ``wrt`` value to the loss (the rest is pruned);
2. check every node on the path has a rule (or stops the gradient), before
   emitting anything;
3. seed ``d loss / d loss = 1`` and walk the path backwards, calling each rule
   with its output gradients, summing fan-out contributions with ``Sum`` and
   un-broadcasting the gradients of broadcasting rules;
4. run the graph passes over the draft (:mod:`onnxtrain.graph.passes`): merge
   repeated nodes, fold stacked transposes (``Transpose(Transpose(x))``,
   ``Transpose(Gemm(a, b))``), drop the nodes no requested gradient needs (a
   rule may emit gradients for inputs that turn out to be unwanted); then
   name the results ``x_grad``.

A rule may reuse an optional output its forward node omitted (Dropout's mask,
MaxPool's indices) through ``ctx.ensure_output``: the output is declared on
the forward node during the draft and kept only when a surviving gradient
node reads it; on error, or when unused, the node gets its outputs back.

Integer and bool values never carry gradients; ``wrt`` values the loss does
not depend on get zeros.

:func:`vector_jacobian_product` is the general form: it seeds several outputs
with given cotangents and returns ``None`` for the values they do not depend
on. The engine hands it, bound to its registry, to the rules' context, and
the control-flow rules run it on copies of their subgraphs
(:mod:`onnxtrain.autodiff.subgraph`); a rule may rewrite its forward node
(``ctx.extend_forward``: a loop body that also outputs its state at every
iteration), kept, like ``ensure_output``, only when a surviving gradient node
reads a new output. Gradient nodes may read values from subgraphs: the
pruning and renaming below follow those reads.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from onnxtrain.autodiff.broadcast import unbroadcast
from onnxtrain.autodiff.context import GraphView, NodeEdit, OutputRequest, RuleContext, Vjp
from onnxtrain.autodiff.errors import MissingGradientError, RuleError
from onnxtrain.autodiff.paths import Path, PathNode, find_path
from onnxtrain.autodiff.registry import GradientRegistry
from onnxtrain.graph import dtypes, ops
from onnxtrain.graph.attributes import attribute
from onnxtrain.graph.attributes import attributes as node_attributes
from onnxtrain.graph.builder import GraphBuilder, describe_type
from onnxtrain.graph.naming import names_in
from onnxtrain.graph.passes import fold_transposes, merge_duplicates, prune_unused_nodes
from onnxtrain.graph.versions import is_standard
from onnxtrain.graph.walk import names_read, node_label, rename_references, subgraph_references, subgraphs


def gradient_name(value: str) -> str:
    """The name of the gradient of ``value``: ``value + "_grad"``."""
    return f"{value}_grad"


def backward(builder: GraphBuilder, loss: str, wrt: Sequence[str], registry: GradientRegistry) -> dict[str, str]:
    """Append ``d loss / d x`` for every ``x`` in ``wrt`` with the rules of ``registry``; return ``{x: "x_grad"}``
    (:func:`onnxtrain.autodiff.gradients.build_gradients` says what is checked and raised). On error the model is
    left as it was."""
    builder.sync()
    wrt = _check_wrt(builder, wrt)
    _check_loss(builder, loss)
    for name in wrt:
        if gradient_name(name) in builder.names:
            raise ValueError(
                f"the gradient of {name!r} is named {gradient_name(name)!r}, but the model already uses that "
                "name; rename that value of the model"
            )
    path = find_path(builder, loss, wrt, registry)
    _check_rules(path, wrt, loss, registry)
    return _Backward(builder, path, registry).run(loss, wrt)


def vector_jacobian_product(
    builder: GraphBuilder, seeds: Mapping[str, str], wrt: Sequence[str], registry: GradientRegistry
) -> dict[str, str | None]:
    """Append ``sum_y <seeds[y], d y / d x>`` for every ``x`` in ``wrt`` with the rules of ``registry``; return
    ``{x: gradient value}``, ``None`` for an ``x`` no seeded value depends on
    (:func:`onnxtrain.autodiff.gradients.build_vjp`). On error the model is left as it was."""
    builder.sync()
    wrt = _check_wrt(builder, wrt)
    if not seeds:
        raise ValueError("seeds is empty: pass {output value: its cotangent} for at least one output")
    for value, seed in seeds.items():
        builder.require(value, role="seeded value")
        builder.require(seed, role=f"cotangent of {value!r}")
        have, want = builder.elem_type_if_known(seed), builder.elem_type_if_known(value)
        if have is not None and want is not None and have != want:
            raise ValueError(
                f"the cotangent {seed!r} of {value!r} is {dtypes.dtype_name(have)}, the value "
                f"{dtypes.dtype_name(want)}; a cotangent has its value's element type"
            )
    targets = list(seeds)
    path = find_path(builder, targets, wrt, registry)
    _check_rules(path, wrt, targets, registry)
    return _Backward(builder, path, registry).vjp(seeds, wrt)


# ---------------------------------------------------------------- checking


def _float_candidates(builder: GraphBuilder) -> list[str]:
    graph = builder.model.graph
    names = [t.name for t in graph.initializer] + [v.name for v in graph.input]
    result: list[str] = []
    for name in dict.fromkeys(names):
        type_proto = builder.type_of(name)
        tensor = type_proto is not None and type_proto.HasField("tensor_type")
        if tensor and dtypes.is_float(type_proto.tensor_type.elem_type):  # type: ignore[union-attr]
            result.append(name)
    return result


def _check_wrt(builder: GraphBuilder, wrt: Sequence[str]) -> list[str]:
    if isinstance(wrt, str):
        raise TypeError(f"wrt must be a list of value names, not the str {wrt!r}; pass [{wrt!r}]")
    names = list(dict.fromkeys(wrt))
    if not names:
        raise ValueError(
            "wrt is empty: pass the names of the values to differentiate (e.g. the trainable initializers)"
        )
    for name in names:
        if not isinstance(name, str) or not builder.has(name):
            raise ValueError(
                f"cannot differentiate with respect to {name!r}: the model has no such value. "
                f"Float initializers and inputs: {_float_candidates(builder)}"
            )
        type_proto = builder.type_of(name)
        if (
            type_proto is None
            or not type_proto.HasField("tensor_type")
            or not dtypes.is_float(type_proto.tensor_type.elem_type)
        ):
            raise ValueError(
                f"cannot differentiate with respect to {name!r} of type {describe_type(type_proto)}: only "
                f"floating-point tensors have gradients. Float initializers and inputs: {_float_candidates(builder)}"
            )
    return names


def _check_loss(builder: GraphBuilder, loss: str) -> None:
    builder.require(loss, role="loss")
    type_proto = builder.type_of(loss)
    described = describe_type(type_proto)
    if type_proto is None or not type_proto.HasField("tensor_type"):
        raise ValueError(f"the loss {loss!r} has type {described}; it must be a float tensor of known shape")
    if not dtypes.is_float(type_proto.tensor_type.elem_type):
        raise ValueError(f"the loss {loss!r} is {described}, not a floating-point tensor; cast it to float")
    dims = builder.shape(loss)
    if dims is not None and any(d != 1 for d in dims):
        raise ValueError(
            f"the loss {loss!r} has shape {described}, not a scalar: reduce it to shape [] (or all dims 1), "
            "e.g. with ReduceMean or ReduceSum over all axes"
        )


def _check_rules(path: Path, wrt: Sequence[str], loss: str | Sequence[str], registry: GradientRegistry) -> None:
    for item in path.nodes:
        if item.rule is None:
            node = item.node
            domain = node.domain or "ai.onnx"
            pair = registry.straight_through_of(node.op_type, node.domain)
            remedy = (
                "Register a rule on a copy of the registry (builtin_registry().copy().rule(...)) and pass "
                "registry=, or keep the values it depends on out of wrt"
            )
            if pair is not None:  # the first of a straight-through pair whose outputs something else reads
                outputs = {name for name in node.output if name}
                others = sorted(
                    {
                        f"{n.op_type} {n.name!r}"
                        for n in path.all_nodes
                        if outputs & set(n.input) and n.op_type != pair.reader
                    }
                )
                remedy = (
                    f"{node.op_type} is differentiated with the {pair.reader} that reads its outputs (a "
                    f"straight-through estimator), and here {', '.join(others)} read them too, which gives its "
                    "codes no gradient (a QOperator model's quantized kernels, say): quantize in the QDQ format "
                    "(onnxruntime.quantization.QuantFormat.QDQ) for quantization-aware training"
                )
            raise MissingGradientError(
                f"no gradient rule for operator {node.op_type} (domain {domain!r}, opset {item.opset}) at node "
                f"{node_label(node, item.index)}, which lies on the path {path.describe(item.index, wrt, loss)}. "
                + remedy
            )


# ---------------------------------------------------------------- backward


class _Backward:
    """One backward pass: accumulates contributions and calls the rules."""

    def __init__(self, builder: GraphBuilder, path: Path, registry: GradientRegistry) -> None:
        self.builder = builder
        self.path = path
        self.registry = registry
        self.constants: dict[tuple[Any, ...], str] = {}
        self.contributions: dict[str, list[str]] = {}
        # the nodes that make each value, indexed up to self._indexed (_producer)
        self._producers: dict[str, onnx.NodeProto] = {}
        self._indexed = 0
        # optional forward outputs and forward rewrites the rules declared
        self.requests: list[OutputRequest | NodeEdit] = []
        self.view = _graph_view(builder, path)
        # what the rules' context runs on subgraphs: this engine, with these rules
        self.nested_vjp: Vjp = functools.partial(vector_jacobian_product, registry=registry)

    def run(self, loss: str, wrt: Sequence[str]) -> dict[str, str]:
        """``d loss / d x`` for ``x`` in ``wrt`` (zeros where independent), named ``x_grad``."""
        results = self._run(lambda: {loss: self._ones_like(loss)}, wrt, complete=True)
        return {name: grad for name, grad in results.items() if grad is not None}

    def vjp(self, seeds: Mapping[str, str], wrt: Sequence[str]) -> dict[str, str | None]:
        """The vector-Jacobian product for ``seeds``, under generated names (``None`` where independent)."""
        return self._run(lambda: dict(seeds), wrt, complete=False)

    def _run(self, seeds: Callable[[], dict[str, str]], wrt: Sequence[str], complete: bool) -> dict[str, str | None]:
        builder = self.builder
        graph = builder.model.graph
        mark = builder.mark()  # the draft is rolled back; the commit appends what it needs
        try:
            results = self._draft(seeds(), wrt, complete)
        except BaseException:
            builder.rollback(mark)
            for request in reversed(self.requests):
                request.undo()
            raise
        nodes = list(graph.node[mark.lengths["node"] :])
        inits = list(graph.initializer[mark.lengths["initializer"] :])
        opsets = list(builder.model.opset_import[mark.opsets :])
        builder.rollback(mark)
        return self._commit(results, nodes, inits, opsets, rename=complete)

    # -- draft: every rule's output, some of it unneeded

    def _ones_like(self, loss: str) -> str:
        """``d loss / d loss``: ones of the loss's shape."""
        b = self.builder
        dims = b.shape(loss)
        if dims is not None:
            return ops.constant(b, np.ones([int(d) for d in dims]), b.elem_type(loss), hint="grad_seed")
        # a scalar whose rank inference could not tell (e.g. ReduceSum of unknown rank)
        one = onnx.helper.make_tensor("value", b.elem_type(loss), [1], [1])
        return b.add_node1("ConstantOfShape", [b.add_node1("Shape", [loss])], value=one, hint="grad_seed")

    def _draft(self, seeds: dict[str, str], wrt: Sequence[str], complete: bool) -> dict[str, str | None]:
        for target, seed in seeds.items():
            self.contributions.setdefault(target, []).append(seed)
        for item in reversed(self.path.nodes):
            self._differentiate(item)
        results: dict[str, str | None] = {}
        for name in wrt:
            grad = self._total(name)
            if grad is None and complete:
                ctx = self._context(None, [])
                grad = ctx.zeros_like(name)
            results[name] = grad
        return results

    def _context(self, item: PathNode | None, needs: Sequence[bool]) -> RuleContext:
        node = item.node if item is not None else onnx.helper.make_node("Identity", [], [], name="zeros")
        return RuleContext(
            self.builder,
            node,
            item.opset if item else 0,
            needs,
            self.constants,
            self.requests,
            self.view,
            vjp=self.nested_vjp,
        )

    def _total(self, name: str) -> str | None:
        """The sum of ``name``'s contributions (one value, made once).

        Contributions that an adding ``ScatterElements`` or ``ScatterND`` made
        from zeros (a ``Gather``'s gradient: an embedding's) are made again,
        scattering onto the sum of the others instead, one after the other: a
        tensor of the value's size fewer alive for each (GPT-2's tied
        embedding: 147 MiB), their zeros and the ``Sum`` gone. Where each row is
        scattered to once, the total is the sum's, bit for bit.
        """
        parts = self.contributions.get(name)
        if not parts:
            return None
        if len(parts) > 1:
            scatters = [p for p in parts if self._scattered_onto_zeros(p, name)]
            others = [p for p in parts if p not in scatters]
            if not scatters:
                total = self.builder.add_node1("Sum", parts, hint="grad_accum")
            elif others:
                total = others[0] if len(others) == 1 else self.builder.add_node1("Sum", others, hint="grad_accum")
            else:  # scatters only: the first keeps its zeros, the others add onto it
                total = scatters.pop(0)
            for scatter in scatters:
                node = self._producer(scatter)
                assert node is not None
                attributes = node_attributes(node)
                total = self.builder.add_node1(
                    node.op_type, [total, node.input[1], node.input[2]], hint="grad_accum", **attributes
                )
            parts[:] = [total]
        return parts[0]

    def _producer(self, value: str) -> onnx.NodeProto | None:
        """The node of the draft (or the forward graph) that makes ``value``."""
        graph = self.builder.model.graph
        if self._indexed > len(graph.node):  # a rollback since: index again
            self._producers.clear()
            self._indexed = 0
        for node in graph.node[self._indexed :]:
            for output in node.output:
                self._producers[output] = node
        self._indexed = len(graph.node)
        return self._producers.get(value)

    def _scattered_onto_zeros(self, part: str, value: str) -> bool:
        """Whether contribution ``part`` to ``value`` is ``ScatterND`` or ``ScatterElements`` of ``reduction="add"``
        onto zeros, of ``value``'s known shape."""
        node = self._producer(part)
        if node is None or node.op_type not in ("ScatterND", "ScatterElements") or not is_standard(node):
            return False
        if not ops.scatter_adds(node):
            return False
        shape = self.builder.shape_if_known(value)
        if shape is None or None in shape:
            return False
        parts = self.contributions.get(value, [])
        if not all(self._may_have(p, shape) for p in parts):  # the sum must not broadcast
            return False
        return self._is_zeros(node.input[0])

    def _may_have(self, part: str, shape: list[Any]) -> bool:
        """Whether ``part``'s inferred shape is ``shape`` where it is known (rank and every known size)."""
        have = self.builder.shape_if_known(part)
        if have is None or len(have) != len(shape):
            return False
        return all(h is None or h == w for h, w in zip(have, shape, strict=True))

    def _is_zeros(self, value: str) -> bool:
        """Whether ``value`` is made by ``ConstantOfShape`` of a zero (maybe reshaped or cast)."""
        node = self._producer(value)
        while node is not None and node.op_type in ("Reshape", "Cast") and is_standard(node):
            node = self._producer(node.input[0])
        if node is None or node.op_type != "ConstantOfShape" or not is_standard(node):
            return False
        fill = attribute(node, "value")
        return fill is None or not numpy_helper.to_array(fill).any()

    def _differentiate(self, item: PathNode) -> None:
        node, rule = item.node, item.rule
        assert rule is not None  # checked by _check_rules
        grads = [self._total(name) if name else None for name in node.output]
        if all(g is None for g in grads):
            return
        forward = self.path.forward
        needs = [bool(name) and name in forward and rule.differentiable(k) for k, name in enumerate(node.input)]
        if not any(needs) and not subgraph_references(node) & forward:
            return
        ctx = self._context(item, needs)
        result = list(rule.fn(ctx, grads))
        where = f"the {node.op_type} rule {rule.fn.__module__}.{rule.fn.__qualname__}"
        if len(result) != len(node.input):
            raise RuleError(
                f"{where} returned {len(result)} gradients for {node_label(node, item.index)}, which has "
                f"{len(node.input)} inputs; return one entry per input (None for no gradient)"
            )
        for k, (name, grad) in enumerate(zip(node.input, result, strict=True)):
            if grad is None or not needs[k]:
                continue
            self._check_gradient(where, f"input {k} ({name!r})", name, grad)
            if rule.broadcasting:
                grad = unbroadcast(ctx, grad, name, shaped_like=node.output[0])
            else:
                self._check_shape(where, f"input {k} ({name!r})", name, grad)
            self.contributions.setdefault(name, []).append(grad)
        for name, grad in ctx.contributed:  # a fused rule's gradients for values upstream of its inputs
            if name in forward:
                self._check_gradient(where, f"the upstream value {name!r}", name, grad)
                self.contributions.setdefault(name, []).append(grad)

    def _check_gradient(self, where: str, what: str, value: str, grad: object) -> None:
        """``RuleError`` unless ``grad`` names a value of ``value``'s element type."""
        if not isinstance(grad, str) or not self.builder.has(grad):
            raise RuleError(f"{where} returned {grad!r} for {what}; return a value name or None")
        have, want = self.builder.elem_type_if_known(grad), self.builder.elem_type_if_known(value)
        if have is not None and want is not None and have != want:
            raise RuleError(
                f"{where} returned a {dtypes.dtype_name(have)} gradient for {what}, which is "
                f"{dtypes.dtype_name(want)}; gradients have their value's element type"
            )

    def _check_shape(self, where: str, what: str, value: str, grad: str) -> None:
        """``RuleError`` where ``grad``'s shape is known to differ from ``value``'s (ranks, or numbered sizes): a
        rule of an operator that broadcasts its inputs is registered with ``broadcasting=True``."""
        have, want = self.builder.shape_if_known(grad), self.builder.shape_if_known(value)
        if have is None or want is None:
            return
        if len(have) == len(want) and all(
            not (isinstance(a, int) and isinstance(b, int)) or a == b for a, b in zip(have, want, strict=True)
        ):
            return
        raise RuleError(
            f"{where} returned a gradient of shape {_shape_text(have)} for {what}, of shape {_shape_text(want)}; a "
            "gradient has its value's shape: register the rule of an operator that broadcasts its inputs with "
            "broadcasting=True (the engine then sums over the broadcast axes), or reduce it in the rule"
        )

    # -- commit: only what the results need, under their final names

    def _commit(
        self,
        results: dict[str, str | None],
        nodes: list[onnx.NodeProto],
        inits: list[onnx.TensorProto],
        opsets: list[onnx.OperatorSetIdProto],
        rename: bool,
    ) -> dict[str, str | None]:
        live, results = _simplified(self.builder.model.graph.node, nodes, results)
        needed = {grad for grad in results.values() if grad is not None}
        needed.update(name for node in live for name in names_read(node))
        produced = {name for node in live for name in node.output}
        renames: dict[str, str] = {}
        copies: list[tuple[str, str]] = []
        for value, grad in results.items():
            if not rename or grad is None:
                continue
            target = gradient_name(value)
            if grad in produced and grad not in renames:
                renames[grad] = target
            else:
                copies.append((grad, target))
        builder = self.builder
        graph = builder.model.graph
        for request in reversed(self.requests):  # forward outputs a rule declared: kept where used
            if any(name in needed for name in request.names):
                for name in request.reserved:
                    builder.names.reserve(name)
                graph.value_info.extend(request.value_infos)
            else:
                request.undo()
        for node in live:
            rename_references(node, renames)
            node.output[:] = [renames.get(name, name) for name in node.output]
            for subgraph in subgraphs(node):  # names inside gradient subgraphs stay taken
                for name in names_in(subgraph):
                    builder.names.reserve(name)
        graph.node.extend(live)
        graph.initializer.extend(t for t in inits if t.name in needed)
        builder.model.opset_import.extend(opsets)
        builder.sync()
        for grad, target in copies:
            builder.add_node("Identity", [renames.get(grad, grad)], [target], hint="grad")
        if not rename:
            return results
        return {value: gradient_name(value) for value in results}


def _graph_view(builder: GraphBuilder, path: Path) -> GraphView:
    """Producers and reader counts of the forward graph, for rules that fuse with a neighbour: the readers the loss
    depends on (one whose outputs the loss ignores passes no gradient back: a dead copy half precision left)."""
    producers: dict[str, onnx.NodeProto] = {}
    readers: dict[str, int] = {}
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in path.all_nodes:
        for name in node.output:
            if name:
                producers[name] = node
        if not any(name in path.backward for name in node.output if name):
            continue
        for name in {n for n in node.input if n} | subgraph_references(node):
            readers[name] = readers.get(name, 0) + 1
        for position, name in enumerate(node.input):
            if name:
                consumers.setdefault(name, []).append((node, position))
    outputs = frozenset(value.name for value in builder.model.graph.output)
    return GraphView(producers, readers, outputs, frozenset(path.forward), consumers)


def _simplified(
    forward: Sequence[onnx.NodeProto], draft: Sequence[onnx.NodeProto], results: Mapping[str, str | None]
) -> tuple[list[onnx.NodeProto], dict[str, str | None]]:
    """The draft gradient nodes after the graph passes (duplicates merged, transposes folded, what no result
    needs pruned), over a model of the forward nodes (read-only) and the draft; and ``results`` renamed where
    a result was merged into an equal value."""
    model = onnx.ModelProto()
    model.graph.node.extend(forward)
    model.graph.node.extend(draft)
    fixed = len(forward)
    wanted = [grad for grad in results.values() if grad is not None]
    model.graph.output.extend(onnx.ValueInfoProto(name=name) for name in wanted)
    merge_duplicates(model, fixed=fixed)
    aliases = {old: value.name for old, value in zip(wanted, model.graph.output, strict=True)}
    fold_transposes(model, fixed=fixed)
    prune_unused_nodes(model, fixed=fixed)
    renamed = {value: None if grad is None else aliases[grad] for value, grad in results.items()}
    return list(model.graph.node[fixed:]), renamed


def _shape_text(dims: Sequence[object]) -> str:
    """``[N, 4]``: a shape's dimensions, ``?`` where unknown."""
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


__all__ = ["backward", "gradient_name", "vector_jacobian_product"]
