"""What to tell a user whose scikit-learn model, converted by skl2onnx, cannot be trained as it is.

skl2onnx writes some models with ``ai.onnx.ml`` operators that keep their
coefficients in attributes and have no gradient (``LinearRegressor``,
``LinearClassifier``) or return a sequence of maps (``ZipMap``). Most have a
standard-operator form the converter writes on request.
"""

from __future__ import annotations

import onnx

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


__all__ = ["ALTERNATIVES", "NOT_DIFFERENTIABLE", "converter_hints", "with_converter_hints"]
