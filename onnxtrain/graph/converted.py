"""What a converter left in a model that stands in the way of training, said before anything is built.

skl2onnx writes some models with ``ai.onnx.ml`` operators that keep their
coefficients in attributes and have no gradient (``LinearRegressor``,
``LinearClassifier``) or return a sequence of maps (``ZipMap``). Most have a
standard-operator form the converter writes on request:
:func:`converter_hints` says which.

tf2onnx leaves the TensorFlow operations it cannot convert in the graph as
they are, in ONNX's default domain (``Erfc``, ``StatelessRandomUniformV2``):
such a model is not ONNX, and :func:`check_known_operators` says so, naming
them, where the error would otherwise come from the models built on it.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx

from onnxtrain.graph.contrib_types import RUNTIME_COPY_OPS, RUNTIME_DEFAULT_DOMAIN_OPS
from onnxtrain.graph.versions import is_standard
from onnxtrain.graph.walk import all_nodes, subgraphs

#: ai.onnx.ml operators skl2onnx writes, and how to convert without them.
ALTERNATIVES: dict[str, str] = {
    "LinearRegressor": "to_onnx(model, X, black_op={'LinearRegressor'}) writes MatMul and Add with trainable "
    "initializers 'coef' and 'intercept'",
    "LinearClassifier": "to_onnx(model, X, black_op={'LinearClassifier'}, options={'zipmap': False}) writes "
    "MatMul, Add and Sigmoid or Softmax with trainable initializers 'coef' and 'intercept'",
    "Scaler": "its offset and scale stay as fitted (the layers after it train); to train them too, "
    "to_onnx(model, X, black_op={'Scaler'}) writes Sub and Div with initializers",
    "ZipMap": "to_onnx(model, X, options={'zipmap': False}) returns the probabilities as a tensor",
}
#: ai.onnx.ml operators of models that have no gradient at all (trees, kernels).
NOT_DIFFERENTIABLE: frozenset[str] = frozenset(
    {
        "TreeEnsemble",
        "TreeEnsembleRegressor",
        "TreeEnsembleClassifier",
        "SVMRegressor",
        "SVMClassifier",
    }
)
#: Operators ONNX Runtime runs in the default domain that onnx defines no schema for (its contrib normalizations,
#: its copies between devices): the runtime's, not a converter's leftovers.
RUNTIME_OPERATORS: frozenset[str] = frozenset({*RUNTIME_DEFAULT_DOMAIN_OPS, *RUNTIME_COPY_OPS})
#: The unknown operators a message names, at most.
LISTED = 5


def converter_hints(model: onnx.ModelProto) -> list[str]:
    """One sentence per ``ai.onnx.ml`` operator of ``model`` that stands in the way of training."""
    found = sorted({node.op_type for node in model.graph.node if node.domain == "ai.onnx.ml"})
    hints = [f"{op} (ai.onnx.ml): {ALTERNATIVES[op]}" for op in found if op in ALTERNATIVES]
    hints += [
        f"{op} (ai.onnx.ml) is piecewise constant or kernel-based and has no gradient: "
        "train a model made of differentiable layers instead"
        for op in found
        if op in NOT_DIFFERENTIABLE
    ]
    return hints


def with_converter_hints(message: str, model: onnx.ModelProto) -> str:
    """``message``, followed by :func:`converter_hints` when there are any."""
    hints = converter_hints(model)
    if not hints:
        return message
    return f"{message}. The model holds operators skl2onnx writes that cannot be trained: " + "; ".join(hints)


def unknown_operators(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The nodes of ``model`` (its graph, subgraphs and functions) whose operator is in ONNX's default domain
    (``""`` or ``ai.onnx``) and unknown to onnx's schema registry (``onnx.defs.has``), but for ONNX Runtime's
    (:data:`RUNTIME_OPERATORS`) and the model's own functions. Other domains are the user's (custom operators)."""
    local = {(function.domain, function.name) for function in model.functions}
    return [
        node
        for node in _every_node(model)
        if is_standard(node)
        and node.op_type not in RUNTIME_OPERATORS
        and (node.domain, node.op_type) not in local
        and ("", node.op_type) not in local
        and not onnx.defs.has(node.op_type, "")
    ]


def check_known_operators(model: onnx.ModelProto) -> None:
    """``ValueError`` naming the nodes and operators of :func:`unknown_operators`: ``model`` is not valid ONNX."""
    unknown = unknown_operators(model)
    if not unknown:
        return
    operators = sorted({node.op_type for node in unknown})
    labels = [_label(node) for node in unknown[:LISTED]]
    more = f" and {len(unknown) - LISTED} more" if len(unknown) > LISTED else ""
    raise ValueError(
        f"the model is not valid ONNX: {', '.join(labels)}{more}: {', '.join(operators)} "
        f"{'is no operator' if len(operators) == 1 else 'are no operators'} of ONNX (onnx.defs knows no such "
        f"operator in the default domain). Its converter{_producer(model)} left them as they "
        "were (tf2onnx leaves the TensorFlow operations it cannot convert): convert them (a newer converter or "
        "opset; tf2onnx's custom_op_handlers) or replace them with ONNX operators in the model before training it. "
        "An operator of your own belongs in a custom domain, run with its library (custom_op_library) and "
        "differentiated by your gradient rule (registry)"
    )


def check_types(model: onnx.ModelProto) -> None:
    """``ValueError`` where onnx's type check finds a node of ``model`` reading or writing a type its operator
    does not take (torch's TorchScript export of Falcon's alibi casts to complex128 and multiplies that): the
    model itself is not valid ONNX, and onnxruntime would refuse every model built from it. Shapes are not
    checked (onnx's inference, not strict); ``model`` may be a skeleton without the weights' values."""
    try:
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=False)
    except onnx.shape_inference.InferenceError as error:
        raise ValueError(
            f"the model is not valid ONNX: {error}. Its exporter{_producer(model)} wrote a "
            "type the operator does not take, which onnxruntime refuses to load: export it again (another opset, "
            "exporter or model setting) so that onnxruntime.InferenceSession loads it, then train it"
        ) from None


def _producer(model: onnx.ModelProto) -> str:
    """`` (pytorch 2.13.0)``: the program that wrote ``model``, as the messages name it; ``""`` where unsaid."""
    producer = " ".join(part for part in (model.producer_name, model.producer_version) if part)
    return f" ({producer})" if producer else ""


def _every_node(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    """The nodes of ``model``'s graph and of its functions, with those of their subgraphs."""
    yield from all_nodes(model.graph)
    for function in model.functions:
        for node in function.node:
            yield node
            for graph in subgraphs(node):
                yield from all_nodes(graph)


def _label(node: onnx.NodeProto) -> str:
    """``'model/Erfc' (Erfc)``, or the node's first output for an unnamed node."""
    name = node.name or next((output for output in node.output if output), "")
    return f"{name!r} ({node.op_type})" if name else node.op_type


__all__ = [
    "ALTERNATIVES",
    "LISTED",
    "NOT_DIFFERENTIABLE",
    "RUNTIME_OPERATORS",
    "check_known_operators",
    "check_types",
    "converter_hints",
    "unknown_operators",
    "with_converter_hints",
]
