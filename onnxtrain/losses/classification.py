"""Classification losses: cross-entropy, negative log-likelihood and binary cross-entropy."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from onnxtrain import caller
from onnxtrain.blocks import Abs, Add, Block, Div, Exp, Log, LogSoftmax, Mul, Neg, Sub
from onnxtrain.graph import dtypes, ops
from onnxtrain.graph.builder import GraphBuilder
from onnxtrain.losses._common import (
    Reduction,
    check_reduction,
    class_weights,
    dim_size,
    reduce_loss,
    require_float,
    target_input,
)
from onnxtrain.losses.label_check import checked_labels


def _label_type(loss: str, label_dtype: Any) -> int:
    """The ONNX element type of ``label_dtype``; ``TypeError`` unless int32 or int64."""
    try:
        elem_type: int | None = dtypes.to_elem_type(label_dtype)
    except TypeError:
        elem_type = None
    if elem_type is None or elem_type not in (onnx.TensorProto.INT32, onnx.TensorProto.INT64):
        got = repr(label_dtype) if elem_type is None else dtypes.dtype_name(elem_type)
        raise TypeError(f"{loss} needs label_dtype int32 or int64 (np.int32, np.int64), got {got}")
    return elem_type


class ClassAxisWarning(UserWarning):
    """A classification loss on scores shaped like ``[batch, seq, classes]``: it reads the classes on axis 1."""


def _class_axis_rank(b: GraphBuilder, loss: str, name: str, weight: np.ndarray | None) -> int | None:
    """The rank of ``name`` (``None``: unknown); ``ValueError`` without a class axis or one weight per class, and
    a :class:`ClassAxisWarning` where the scores look like ``[batch, seq, classes]`` (:func:`_sequence_first`)."""
    dims = b.shape(name)
    if dims is None:
        return None
    if len(dims) < 2:
        raise ValueError(
            f"{loss} needs {name!r} shaped (batch, classes, d1, ...), but it has rank {len(dims)}; "
            "add a batch axis with blocks.Unsqueeze([0])"
        )
    if weight is not None and isinstance(dims[1], int) and weight.size != dims[1]:
        raise ValueError(
            f"{loss} got {weight.size} weights, but {name!r} has {dims[1]} classes (axis 1); pass one weight per class"
        )
    if _sequence_first(dims):
        shape = "[" + ", ".join(str(d) if d is not None else "?" for d in dims) + "]"
        caller.warn(
            f"{loss} reads the classes on axis 1 of {name!r}, as ONNX's and torch's losses do, but {name!r} is "
            f"{shape}: its axis 1 has no fixed size and its last axis {dims[-1]}, as a [batch, seq, classes] output "
            f"(a language model's logits) has, and the labels would be shaped without axis 1. Flatten the scores to "
            f"[batch * seq, {dims[-1]}] and feed labels [batch * seq]: export the model returning "
            "logits.flatten(0, 1), or build the loss on blocks.Flatten(axis=2) of the scores; or put the classes on "
            "axis 1, logits.transpose(1, 2), whose labels stay [batch, seq], a row per sample as onnxtrain train's "
            'data files need (docs/artifacts.md, "A language model\'s logits")',
            ClassAxisWarning,
        )
    return len(dims)


def _sequence_first(dims: list[int | str | None]) -> bool:
    """Whether scores of ``dims`` look like ``[batch, seq, classes]``: rank 3 or more, axis 1 (the class axis)
    of no fixed size, the last axis a fixed count of more than one."""
    return len(dims) >= 3 and not isinstance(dims[1], int) and isinstance(dims[-1], int) and dims[-1] > 1


def _weighted_nll(
    b: GraphBuilder, log_probs: str, labels: str, weight: np.ndarray | None, reduction: str, ignore_index: int | None
) -> str:
    """ONNX ``NegativeLogLikelihoodLoss``: ``-w[y] log_probs[y]``, a weighted mean for ``"mean"``."""
    inputs = [log_probs, labels]
    if weight is not None:
        inputs.append(ops.constant_like(b, weight, log_probs, "class_weight"))
    attributes: dict[str, Any] = {"reduction": reduction}
    if ignore_index is not None:
        attributes["ignore_index"] = int(ignore_index)
    return b.add_node1("NegativeLogLikelihoodLoss", inputs, hint="nll", **attributes)


class NLLLoss(Block):
    """Negative log-likelihood of log-probabilities ``(N, C, d...)`` at integer labels ``(N, d...)``.

    ``torch.nn.NLLLoss`` semantics: per-class ``weight``, labels equal to
    ``ignore_index`` count for nothing, ``"mean"`` divides by the summed weights
    of the counted labels. Emits ONNX ``NegativeLogLikelihoodLoss``, reading
    the labels through a check that fails when one is outside ``[0, C)`` and
    not ``ignore_index`` (:mod:`onnxtrain.losses.label_check`).
    """

    def __init__(
        self,
        weight: Any = None,
        reduction: Reduction = "mean",
        ignore_index: int | None = -100,
        *,
        label_dtype: Any = np.int64,
    ) -> None:
        super().__init__()
        self._weight = class_weights("NLLLoss", weight)
        self._reduction = check_reduction("NLLLoss", reduction)
        self._ignore_index = ignore_index
        self._label_type = _label_type("NLLLoss", label_dtype)

    def build(self, loss_input_name: str, target_name: str = "target") -> str:
        b = self.builder
        require_float(b, "NLLLoss", loss_input_name)
        _class_axis_rank(b, "NLLLoss", loss_input_name, self._weight)
        labels = target_input(b, "NLLLoss", target_name, loss_input_name, elem_type=self._label_type, drop_axis=1)
        labels = checked_labels(b, "NLLLoss", labels, loss_input_name, self._ignore_index)
        return _weighted_nll(b, loss_input_name, labels, self._weight, self._reduction, self._ignore_index)


class CrossEntropyLoss(Block):
    """Softmax cross-entropy of scores ``(N, C, d...)`` against integer labels ``(N, d...)``, or against class
    probabilities ``(N, C, d...)``.

    ``torch.nn.CrossEntropyLoss`` semantics, including ``weight`` (an array),
    ``ignore_index`` and ``label_smoothing`` ``eps``:
    ``(1 - eps) * nll + eps / C * smooth``, where ``smooth`` is the reduced
    ``-sum_c w_c log p_c`` over counted labels. Emits ``LogSoftmax`` over
    axis 1 and ``NegativeLogLikelihoodLoss``, never the log of a softmax.
    Labels are int64, and no label is ignored unless ``ignore_index`` is
    given, as in ONNX Runtime's block (``label_dtype=np.int32`` for the int32
    labels of its oldest releases; PyTorch ignores ``-100`` by default).
    Labels outside ``[0, C)`` that are not ``ignore_index`` make the step fail
    (:mod:`onnxtrain.losses.label_check`).

    ``probabilities=True`` takes the target as the scores' type and shape, a
    distribution over the classes per sample (mixup, distillation), as torch
    does for a float target: ``-sum_c w_c t'_c log p_c`` per sample with
    ``t' = (1 - eps) t + eps / C``, ``"mean"`` over the samples (not the
    weights). ``None`` (the default) decides by the target: an existing value
    of the scores' float type is probabilities, anything else labels.
    ``ignore_index`` applies to labels only.
    """

    def __init__(
        self,
        weight: Any = None,
        reduction: Reduction = "mean",
        ignore_index: int | None = None,
        label_smoothing: float = 0.0,
        *,
        label_dtype: Any = np.int64,
        probabilities: bool | None = None,
    ) -> None:
        super().__init__()
        if probabilities not in (None, True, False):
            raise TypeError(f"CrossEntropyLoss's probabilities must be None, True or False, not {probabilities!r}")
        if probabilities and ignore_index is not None:
            raise ValueError(
                "CrossEntropyLoss ignores a label index (ignore_index) only with integer labels, not with "
                "probabilities=True: give the samples to skip all-zero targets instead"
            )
        self._probabilities = probabilities
        self._weight = class_weights("CrossEntropyLoss", weight)
        self._reduction = check_reduction("CrossEntropyLoss", reduction)
        self._ignore_index = ignore_index
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"CrossEntropyLoss needs 0 <= label_smoothing <= 1, got {label_smoothing}")
        self._smoothing = float(label_smoothing)
        self._label_type = _label_type("CrossEntropyLoss", label_dtype)

    def build(self, scores_input_name: str, labels_name: str = "labels") -> str:
        b = self.builder
        require_float(b, "CrossEntropyLoss", scores_input_name)
        rank = _class_axis_rank(b, "CrossEntropyLoss", scores_input_name, self._weight)
        probabilities = self._probabilities
        if probabilities is None:  # torch's rule: a float target is probabilities
            probabilities = (
                b.has(labels_name)
                and self._ignore_index is None
                and b.elem_type(labels_name) == b.elem_type(scores_input_name)
            )
        if probabilities:
            return self._probability_loss(b, scores_input_name, labels_name, rank)
        labels = target_input(
            b, "CrossEntropyLoss", labels_name, scores_input_name, elem_type=self._label_type, drop_axis=1
        )
        labels = checked_labels(b, "CrossEntropyLoss", labels, scores_input_name, self._ignore_index)
        log_probs = LogSoftmax(axis=1)(scores_input_name)
        nll = _weighted_nll(b, log_probs, labels, self._weight, self._reduction, self._ignore_index)
        if self._smoothing == 0.0:
            return nll
        smooth = self._smooth_term(b, log_probs, labels, rank)
        smoothing = ops.constant_like(b, self._smoothing, log_probs, "label_smoothing")
        eps_over_c = Div()(smoothing, dim_size(b, log_probs, 1))
        kept = ops.constant_like(b, 1.0 - self._smoothing, log_probs, "one_minus_smoothing")
        return Add()(Mul()(kept, nll), Mul()(eps_over_c, smooth))

    def _probability_loss(self, b: GraphBuilder, scores: str, targets_name: str, rank: int | None) -> str:
        """``-sum_c w_c t'_c log p_c`` per sample, reduced over the samples (see the class docstring)."""
        targets = target_input(b, "CrossEntropyLoss", targets_name, scores)
        log_probs = LogSoftmax(axis=1)(scores)
        if self._smoothing:
            kept = ops.constant_like(b, 1.0 - self._smoothing, log_probs, "one_minus_smoothing")
            smoothing = ops.constant_like(b, self._smoothing, log_probs, "label_smoothing")
            targets = Add()(Mul()(kept, targets), Div()(smoothing, dim_size(b, log_probs, 1)))
        if self._weight is not None:
            targets = Mul()(targets, self._class_weights(b, log_probs, rank))
        per_sample = Neg()(ops.reduce(b, "ReduceSum", Mul()(targets, log_probs), [1], keepdims=False))
        return reduce_loss(per_sample, self._reduction)

    def _class_weights(self, b: GraphBuilder, like: str, rank: int | None) -> str:
        """The class weights shaped to broadcast along axis 1 of ``like`` (of ``rank`` axes, or unknown)."""
        assert self._weight is not None
        if rank is not None:
            shape = [1, self._weight.size] + [1] * (rank - 2)
            return ops.constant_like(b, self._weight.reshape(shape), like, "class_weight")
        weight = ops.constant_like(b, self._weight.reshape(-1), like, "class_weight")
        trailing = Sub()(b.add_node1("Size", [b.add_node1("Shape", [like])]), ops.int64s(b, [2], "two"))
        ones = b.add_node1("ConstantOfShape", [b.add_node1("Reshape", [trailing, ops.int64s(b, [1], "one")])],
                           value=onnx.helper.make_tensor("one", onnx.TensorProto.INT64, [1], [1]))  # fmt: skip
        shape = b.add_node1("Concat", [ops.int64s(b, [1, self._weight.size], "classes"), ones], axis=0)
        return b.add_node1("Reshape", [weight, shape])

    def _smooth_term(self, b: GraphBuilder, log_probs: str, labels: str, rank: int | None) -> str:
        """``-sum_c w_c log p_c`` per label, zero where ignored, reduced like ``nll``."""
        if self._weight is None:
            per_label = Neg()(ops.reduce(b, "ReduceSum", log_probs, [1], keepdims=False))
        elif rank is not None:
            shape = [1, self._weight.size] + [1] * (rank - 2)
            weight = ops.constant_like(b, self._weight.reshape(shape), log_probs, "class_weight")
            per_label = Neg()(ops.reduce(b, "ReduceSum", Mul()(log_probs, weight), [1], keepdims=False))
        else:  # rank unknown: weigh the classes on an (N, C, rest) view, then take the labels' shape
            flat = b.add_node1("Reshape", [log_probs, ops.int64s(b, [0, 0, -1], "shape")])
            weight = ops.constant_like(b, self._weight.reshape(1, -1, 1), log_probs, "class_weight")
            summed = Neg()(ops.reduce(b, "ReduceSum", Mul()(flat, weight), [1], keepdims=False))
            per_label = b.add_node1("Reshape", [summed, b.add_node1("Shape", [labels])])
        if self._ignore_index is None:
            counted = None
        else:
            ignored = b.add_node1("Equal", [labels, ops.constant_like(b, self._ignore_index, labels, "ignore_index")])
            counted = b.add_node1("Not", [ignored])
            per_label = b.add_node1("Where", [counted, per_label, ops.constant_like(b, 0.0, log_probs, "zero")])
        if self._reduction != "mean":
            return reduce_loss(per_label, self._reduction)
        total = ops.reduce(b, "ReduceSum", per_label, None, keepdims=False)
        return Div()(total, self._mean_denominator(b, log_probs, labels, counted))

    def _mean_denominator(self, b: GraphBuilder, log_probs: str, labels: str, counted: str | None) -> str:
        """The number (or summed class weight) of the labels that count."""
        elem_type = b.elem_type(log_probs)
        if self._weight is None:
            ones = b.add_node1("Cast", [counted], to=elem_type) if counted else None
            if ones is None:
                size = b.add_node1("Size", [labels])
                return b.add_node1("Cast", [size], to=elem_type)
            return ops.reduce(b, "ReduceSum", ones, None, keepdims=False)
        safe = labels
        if counted is not None:
            safe = b.add_node1("Where", [counted, labels, ops.constant_like(b, 0, labels, "zero_label")])
        per_label = b.add_node1("Gather", [ops.constant_like(b, self._weight, log_probs, "class_weight"), safe])
        if counted is not None:
            per_label = b.add_node1("Where", [counted, per_label, ops.constant_like(b, 0.0, log_probs, "zero")])
        return ops.reduce(b, "ReduceSum", per_label, None, keepdims=False)


class BCEWithLogitsLoss(Block):
    """Binary cross-entropy on logits ``x``, computed stably (``torch.nn.BCEWithLogitsLoss``).

    ``loss = w * ((1 - t) x + (1 + (pos_weight - 1) t) softplus(-x))``;
    ``weight`` broadcasts against the input, ``pos_weight`` along the last axis.
    ``softplus(-x)`` is emitted as ``(|x| - x) / 2 + Log(1 + Exp(-|x|))``: it never
    overflows, runs in float64 (onnxruntime's CPU provider has no float64
    ``Softplus``), and its gradient at ``x = 0`` is the true ``-1/2`` with
    ``d|x|/dx = sign(x)`` (``Relu(-x)`` there would give ``0``).
    """

    def __init__(self, weight: Any = None, reduction: Reduction = "mean", pos_weight: Any = None) -> None:
        super().__init__()
        self._weight = None if weight is None else np.asarray(weight, dtype=np.float64)
        self._reduction = check_reduction("BCEWithLogitsLoss", reduction)
        self._pos_weight = None if pos_weight is None else np.asarray(pos_weight, dtype=np.float64)

    def build(self, loss_input_name: str, target_name: str = "target") -> str:
        b = self.builder
        x = loss_input_name
        require_float(b, "BCEWithLogitsLoss", x)
        t = target_input(b, "BCEWithLogitsLoss", target_name, x)
        one = ops.constant_like(b, 1.0, x, "one")
        magnitude = Abs()(x)
        negative_part = Mul()(Sub()(magnitude, x), ops.constant_like(b, 0.5, x, "half"))  # max(-x, 0)
        softplus = Add()(negative_part, Log()(Add()(one, Exp()(Neg()(magnitude)))))
        log_weight: str = one
        if self._pos_weight is not None:
            pos_minus_one = ops.constant_like(b, self._pos_weight - 1.0, x, "pos_weight_minus_one")
            log_weight = Add()(one, Mul()(pos_minus_one, t))
            softplus = Mul()(log_weight, softplus)
        loss = Add()(Mul()(Sub()(one, t), x), softplus)
        if self._weight is not None:
            loss = Mul()(ops.constant_like(b, self._weight, x, "weight"), loss)
        return reduce_loss(loss, self._reduction)


class BCELoss(Block):
    """Binary cross-entropy on probabilities ``p`` (``torch.nn.BCELoss``).

    ``loss = -w (t max(log p, -100) + (1 - t) max(log(1 - p), -100))``: the
    logs are clamped at -100 as PyTorch does, so ``p`` of 0 or 1 stays finite.
    Each log is taken of ``Where(v > 0, v, 1)`` and replaced by -100 where
    ``v == 0``: a clamped term then passes no gradient, where ``Log``'s
    derivative at 0 would make it ``0 * inf = nan``.
    """

    def __init__(self, weight: Any = None, reduction: Reduction = "mean") -> None:
        super().__init__()
        self._weight = None if weight is None else np.asarray(weight, dtype=np.float64)
        self._reduction = check_reduction("BCELoss", reduction)

    def build(self, loss_input_name: str, target_name: str = "target") -> str:
        b = self.builder
        p = loss_input_name
        require_float(b, "BCELoss", p)
        t = target_input(b, "BCELoss", target_name, p)
        one = ops.constant_like(b, 1.0, p, "one")
        zero = ops.constant_like(b, 0.0, p, "zero")
        floor = ops.constant_like(b, -100.0, p, "log_floor")

        def clamped_log(value: str) -> str:
            """``max(log(value), -100)``, with ``Log`` never evaluated at 0."""
            positive = b.add_node1("Greater", [value, zero])
            safe = b.add_node1("Where", [positive, value, one])
            log = b.add_node1("Where", [positive, b.add_node1("Log", [safe]), floor])
            return b.add_node1("Max", [log, floor])

        positive = Mul()(t, clamped_log(p))
        negative = Mul()(Sub()(one, t), clamped_log(Sub()(one, p)))
        loss = Neg()(Add()(positive, negative))
        if self._weight is not None:
            loss = Mul()(ops.constant_like(b, self._weight, p, "weight"), loss)
        return reduce_loss(loss, self._reduction)
