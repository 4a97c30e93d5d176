"""The function pass: a loss operator that onnxruntime would replace by its body is written out as that body.

``NegativeLogLikelihoodLoss`` and ``SoftmaxCrossEntropyLoss`` are ONNX
functions. onnxruntime has kernels for them only in its training build;
elsewhere it replaces each by its body when it loads the model (ONNX's own
body for the node's attributes and input types), and the nodes it makes take
indices after every node of the graph. Under the priority-based order that
the runtime's sessions of a training model run in, those nodes run last
(onnxruntime's default order ran them late too): in a training graph
the forward loss's ``GatherElements`` then reads the log-probabilities at the
end of the step, which keeps them (``[N, C]``: for a language model, the size
of its logits) alive through the whole backward (GPT-2 small at 16 x 256:
785 MiB at the step's peak). Written out in the node's place, the body runs
where the loss was, and the arithmetic is the one onnxruntime would run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import onnx
from onnx import helper, shape_inference

from onnxtrain.graph.naming import NameGenerator, names_in
from onnxtrain.graph.versions import is_standard, opset_version

#: The function operators written out: onnxruntime's inference builds have no kernel for them.
EXPANDED_OPS = ("NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss")
#: The ``doc_string`` of each node written out: ``"<op> of '<first output>', written out"``.
_MARK = "{op} of {output!r}, written out"

TypeOf = Callable[[str], "onnx.TypeProto | None"]


def expand_loss_functions(model: onnx.ModelProto, *, type_of: TypeOf) -> onnx.ModelProto:
    """``model`` with each top-level node of :data:`EXPANDED_OPS` replaced by ONNX's body for it, in its place.

    ``type_of(name)``: a value's type (the context-dependent bodies depend on
    the input types). A body that holds another such operator
    (``SoftmaxCrossEntropyLoss``'s holds a ``NegativeLogLikelihoodLoss``) has
    it written out too. A node whose input types are unknown, or whose body
    does not check against the model's opset, is left as it is.
    """
    opset = opset_version(model)
    if opset is None or not any(_expandable(node) for node in model.graph.node):
        return model
    writer = _Writer(model, opset)
    nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        types = {name: type_of(name) for name in node.input if name}
        written = writer.write(node, types) if _expandable(node) else None
        nodes.extend([node] if written is None else written)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def function_inputs(model: onnx.ModelProto) -> list[str]:
    """The inputs of the top-level nodes :func:`expand_loss_functions` would write out (their types are needed)."""
    return list(dict.fromkeys(name for node in model.graph.node if _expandable(node) for name in node.input if name))


def written_out_from(node: onnx.NodeProto) -> str | None:
    """The ``doc_string`` naming the function node that ``node`` is part of the body of, where the pass wrote it;
    else ``None``."""
    return node.doc_string if node.doc_string.endswith(", written out") else None


def _expandable(node: onnx.NodeProto) -> bool:
    return node.op_type in EXPANDED_OPS and is_standard(node)


class _Writer:
    """Writes function nodes of one model out as their bodies: fresh names, the model's opset."""

    def __init__(self, model: onnx.ModelProto, opset: int) -> None:
        self.opset = opset
        self.names = NameGenerator(names_in(model.graph))
        self.opsets = list(model.opset_import)
        self.context = onnx.checker.C.CheckerContext()
        self.context.ir_version = model.ir_version
        self.context.opset_imports = {o.domain: o.version for o in model.opset_import}

    def write(
        self, node: onnx.NodeProto, types: dict[str, onnx.TypeProto | None], mark: str | None = None
    ) -> list[onnx.NodeProto] | None:
        """The nodes of ``node``'s body, reading its inputs and writing its outputs, every other value named
        afresh; ``None`` where an input type is unknown, or a body node refers to an attribute ``node`` does not
        resolve, is of another domain or does not check. ``types``: of the values read, grown with the body's."""
        body = self._body(node, types)
        if body is None:
            return None
        renamed: dict[str, str] = {"": ""}
        renamed.update(zip(body.input, list(node.input) + [""] * (len(body.input) - len(node.input)), strict=False))
        renamed.update((inner, outer) for inner, outer in zip(body.output, node.output, strict=False) if outer)
        stem = node.name or node.op_type
        mark = mark or _MARK.format(op=node.op_type, output=node.output[0])
        given = {a.name: a for a in node.attribute}
        written: list[onnx.NodeProto] = []
        for inner in body.node:
            attributes = _resolved(inner.attribute, given)
            if attributes is None or not is_standard(inner):
                return None
            for name in inner.output:
                if name not in renamed:
                    renamed[name] = self.names.fresh(f"{stem}/{name}")
            copy = helper.make_node(
                inner.op_type,
                [renamed.get(name, name) for name in inner.input],
                [renamed[name] for name in inner.output],
                name=self.names.fresh(f"{stem}/{inner.op_type}"),
                doc_string=mark,
            )
            copy.attribute.extend(attributes)
            if _expandable(copy):  # a function inside the function: written out as well
                nested = self.write(copy, types, mark)
                if nested is None:
                    return None
                written.extend(nested)
                continue
            try:
                onnx.checker.check_node(copy, self.context)  # type: ignore[arg-type]
            except onnx.checker.ValidationError:
                return None
            types.update(self._output_types(copy, types))
            written.append(copy)
        return written

    def _body(self, node: onnx.NodeProto, types: dict[str, onnx.TypeProto | None]) -> onnx.FunctionProto | None:
        """ONNX's body of ``node`` at the model's opset, for its attributes and input types."""
        given = []
        for name in node.input:
            if not name:  # an omitted optional input: the body is made for the inputs given
                break
            known = types.get(name)
            if known is None or not known.HasField("tensor_type") or not known.tensor_type.elem_type:
                return None
            given.append(known.SerializeToString())
        schema = onnx.defs.get_schema(node.op_type, self.opset, "")
        if not schema.has_context_dependent_function:
            return None
        body = onnx.FunctionProto()
        body.ParseFromString(schema.get_context_dependent_function(node.SerializeToString(), given))
        return body if body.node else None

    def _output_types(self, node: onnx.NodeProto, types: dict[str, onnx.TypeProto | None]) -> dict[str, Any]:
        """The types of ``node``'s outputs, from its schema; none where an input's is unknown."""
        inputs = {name: types.get(name) for name in node.input if name}
        if any(value is None for value in inputs.values()):
            return {}
        schema = onnx.defs.get_schema(node.op_type, self.opset, "")
        try:
            return dict(shape_inference.infer_node_outputs(schema, node, inputs, {}, opset_imports=self.opsets))
        except (shape_inference.InferenceError, onnx.checker.ValidationError, RuntimeError):
            return {}


def _resolved(
    attributes: Sequence[onnx.AttributeProto], given: dict[str, onnx.AttributeProto]
) -> list[onnx.AttributeProto] | None:
    """``attributes`` with each reference to an attribute of the function node replaced by that attribute (left
    out where the node does not give it: the operator's default); ``None`` for a reference of another type."""
    resolved = []
    for attribute in attributes:
        if not attribute.ref_attr_name:
            resolved.append(attribute)
            continue
        value = given.get(attribute.ref_attr_name)
        if value is None:
            continue
        if value.type != attribute.type:
            return None
        copy = onnx.AttributeProto()
        copy.CopyFrom(value)
        copy.name = attribute.name
        resolved.append(copy)
    return resolved


__all__ = ["EXPANDED_OPS", "expand_loss_functions", "function_inputs", "written_out_from"]
