"""Class labels out of range: a check in the loss graph, and the error it becomes at run time.

ONNX's ``NegativeLogLikelihoodLoss`` takes the log-probability at each label
with ``GatherElements`` (its function body, which onnxruntime runs), whose
negative indices wrap: a label of -1 counts as class ``C - 1``, and a label
``>= C`` fails with onnxruntime's ``GatherElements`` error on the CPU (GPU
kernels need not check it at all). :func:`checked_labels` puts a check
between the labels and the loss, from the run-time shape, so a symbolic class
count ``C`` works too::

    valid   = (0 <= labels < C) or labels == ignore_index
    bad     = Compress(labels, Not(valid))           # the K labels out of range, shape [K]
    zero    = Reshape(ReduceSum(Reshape(bad, [K, C, 2]), keepdims=1), [])
    checked = Where(valid, labels, zero)

The first ``Reshape`` is the check: ``K`` elements take the shape
``[K, C, 2]`` exactly when ``K`` is 0, so it fails as soon as one label is out
of range, on every execution provider (a ``Reshape`` checks its shape on the
host). With ``C`` known the shape is the constant ``[0, C, 2]`` (a 0 in a
``Reshape`` shape keeps the input's dimension, ``K``), else
``Concat(Shape(bad), [C], [2])``. Both survive onnxruntime's graph
optimisations (``ORT_ENABLE_ALL``; tested). A check reshaping a constant
empty tensor did not: onnxruntime folded it to its zero in the generated eval
model. The sum keeps its dimensions and is then reshaped to a scalar because
onnxruntime's CUDA ``ReduceSum`` refuses ``keepdims=0`` over an axis of size 0
(ONNX defines that sum as 0).

The loss reads ``checked``, which equals ``labels`` bit for bit whenever the
check passes: the loss and its gradients are those of the labels, and no
optimisation can prune the check or run the loss before it. The ``Reshape``
node's ``doc_string`` carries what the runtime needs to explain a failure
(:func:`label_error`): the labels' name, ``ignore_index`` and where ``C``
comes from; onnxruntime's failure message carries the requested shape
``[K, C, 2]``, so a symbolic ``C`` can be named too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from onnxtrain.graph import ops
from onnxtrain.graph.builder import GraphBuilder
from onnxtrain.graph.passes import drop_unread_initializers

#: Starts the ``doc_string`` of every node of a label check.
PREFIX = "onnxtrain label check"
#: Starts the JSON part of the check ``Reshape``'s ``doc_string``.
MARKER = "onnxtrain.label_check:"
#: The advice that ends a label error: what a loss's own caller can do (``fit`` says what its users can).
LABEL_ADVICE = "Fix the labels, or give the loss ignore_index=<label> for a label to skip"
_NODE_NAME = re.compile(r"Name:'([^']*)'")
#: onnxruntime's message for the check's ``Reshape``: ``[K, C, 2]`` (``-1`` for ``K`` where its optimizer rewrote
#: the shape's 0 with the input's rank known, as it does in a model whose input shapes are fixed)
_REQUESTED = re.compile(r"requested shape:\{(-?\d+),(-?\d+),2\}")
_SHOWN = 5  # offending labels listed in a message


@dataclass(frozen=True)
class LabelCheck:
    """What a check node checks: ``labels`` against ``classes`` (or the size of axis 1 of ``scores``)."""

    loss: str
    labels: str
    scores: str
    classes: int | None
    ignore_index: int | None

    def doc_string(self) -> str:
        """The node's ``doc_string``: a sentence, then ``MARKER`` and this check as JSON."""
        ignored = "" if self.ignore_index is None else f" and not ignore_index {self.ignore_index}"
        sentence = (
            f"{PREFIX}: {self.loss} fails when a label of {self.labels!r} is outside [0, C){ignored}, C being the "
            f"size of axis 1 of {self.scores!r}; the input is then the K labels out of range, the shape [K, C, 2]."
        )
        fields = {
            "loss": self.loss,
            "labels": self.labels,
            "scores": self.scores,
            "classes": self.classes,
            "ignore_index": self.ignore_index,
        }
        return f"{sentence} {MARKER}{json.dumps(fields)}"

    @classmethod
    def of_node(cls, node: onnx.NodeProto) -> LabelCheck | None:
        """The check a node performs, or ``None`` if it is no label check."""
        _, marker, fields = node.doc_string.partition(MARKER)
        if not marker:
            return None
        try:
            return cls(**json.loads(fields))
        except (TypeError, ValueError):
            return None


def checked_labels(b: GraphBuilder, loss: str, labels: str, scores: str, ignore_index: int | None) -> str:
    """``labels`` after a check that fails unless each is in ``[0, C)`` or ``ignore_index`` (module docstring).

    ``C`` is the size of axis 1 of ``scores``: a constant when known, else
    ``Gather(Shape(scores), [1])`` at run time (pass the scores, not the
    ``LogSoftmax`` of them: the log-probabilities' only reader must stay the
    loss, for the LogSoftmax + NLL gradient to fuse). Adds 9 nodes, 11 with
    an ``ignore_index`` that may be out of range, 4 (5 for int32 labels) more
    for a symbolic ``C``: element-wise passes over the labels, and scalars.
    """
    start = len(b.model.graph.node)
    label_type = b.elem_type(labels)
    dims = b.shape(scores)
    static = dims[1] if dims is not None and len(dims) > 1 and isinstance(dims[1], int) else None
    if static is not None:
        classes = classes_1d = ops.int64s(b, [static], "classes")
        if label_type != onnx.TensorProto.INT64:
            classes = ops.constant(b, [static], label_type, "classes")
    else:
        shape = b.add_node1("Shape", [scores])
        classes = classes_1d = b.add_node1("Gather", [shape, ops.int64s(b, [1], "axis")], axis=0, hint="classes")
        if label_type != onnx.TensorProto.INT64:
            classes = b.add_node1("Cast", [classes_1d], to=label_type, hint="classes")
    at_least_zero = b.add_node1("GreaterOrEqual", [labels, ops.constant(b, 0, label_type, "zero_label")])
    valid = b.add_node1("And", [at_least_zero, b.add_node1("Less", [labels, classes])], hint="in_range")
    if ignore_index is not None and not (static is not None and 0 <= ignore_index < static):
        ignored = b.add_node1("Equal", [labels, ops.constant(b, ignore_index, label_type, "ignore_index")])
        valid = b.add_node1("Or", [valid, ignored], hint="valid_label")
    out_of_range = b.add_node1("Compress", [labels, b.add_node1("Not", [valid])], hint="labels_out_of_range")
    if static is not None:  # a 0 in a Reshape shape keeps the input's dimension
        shape = ops.int64s(b, [0, static, 2], "check_shape")
    else:
        count = b.add_node1("Shape", [out_of_range])
        shape = b.add_node1("Concat", [count, classes_1d, ops.int64s(b, [2], "two")], axis=0, hint="check_shape")
    check = LabelCheck(loss, labels, scores, static, ignore_index)
    reshaped = b.names.fresh("label_check")
    b.model.graph.node.append(
        helper.make_node(
            "Reshape",
            [out_of_range, shape],
            [reshaped],
            name=b.names.fresh(f"{labels}_out_of_range"),
            doc_string=check.doc_string(),
        )
    )
    b.sync()
    # keepdims, then a Reshape to a scalar: CUDA's ReduceSum refuses keepdims=0 over an axis of size 0
    summed = ops.reduce(b, "ReduceSum", reshaped, None, keepdims=True, hint="label_check")
    passed = b.add_node1("Reshape", [summed, ops.int64s(b, [], "scalar_shape")], hint="label_check")
    checked = b.add_node1("Where", [valid, labels, passed], hint=f"{labels}_checked")
    for node in b.model.graph.node[start:]:
        node.doc_string = node.doc_string or f"{PREFIX} of {labels!r} ({loss})"
    return checked


def is_label_check(node: onnx.NodeProto) -> bool:
    """Whether ``node`` belongs to a label check (for counting the nodes a loss's math takes)."""
    return node.doc_string.startswith(PREFIX)


def label_error(
    error: BaseException,
    models: Iterable[onnx.ModelProto],
    value_of: Callable[[str], np.ndarray | None],
    step: str,
) -> ValueError | None:
    """The ``ValueError`` for onnxruntime's ``error`` when a label check of ``models`` raised it, else ``None``.

    ``value_of(name)`` gives the value of a user input (``None`` for other
    names), to list the offending labels; ``step`` says which step failed.
    """
    message = str(error)
    checks = label_checks(models)  # the failing node's name, after those of the nodes holding it (a Scan's)
    node = next((name for name in _NODE_NAME.findall(message) if name in checks), None)
    if node is None:
        return None
    check = checks[node]
    requested = _REQUESTED.search(message)
    count = int(requested.group(1)) if requested and int(requested.group(1)) >= 0 else None
    classes = int(requested.group(2)) if requested else check.classes
    found = _offending(value_of(check.labels), classes, check.ignore_index)
    listed = ""
    if found is not None:
        count, listed = found
    return _error(check, classes, count, listed, step, f"onnxruntime: node {node!r} failed")


def labels_out_of_range(check: LabelCheck, labels: np.ndarray, step: str) -> ValueError | None:
    """The ``ValueError`` :func:`label_error` gives when some of ``labels`` fail ``check`` (of a known class
    count), found on the host before running; ``None`` when all pass (told by ``min`` and ``max`` alone where
    every label is in range)."""
    labels = np.asarray(labels)
    if check.classes is not None and (not labels.size or (labels.min() >= 0 and labels.max() < check.classes)):
        return None
    count, listed = _offending(labels, check.classes, check.ignore_index) or (0, "")
    return _error(check, check.classes, count, listed, step, "checked before running") if count else None


def _error(check: LabelCheck, classes: int | None, count: int | None, listed: str, step: str, how: str) -> ValueError:
    how_many = "some labels are" if count is None else "1 label is" if count == 1 else f"{count} labels are"
    span = f"[0, {classes})" if classes is not None else f"[0, C), C the size of axis 1 of {check.scores!r}"
    allowed = (
        f"Labels must be in {span} (ignore_index is None: no label is skipped)"
        if check.ignore_index is None
        else f"Labels must be in {span} or equal ignore_index {check.ignore_index}"
    )
    return ValueError(
        f"{step}: {how_many} out of range in {check.labels!r} for {check.loss} on {check.scores!r} "
        f"({classes if classes is not None else 'C'} classes){listed}. {allowed}. {LABEL_ADVICE} ({how})"
    )


def strippable_label_checks(model: onnx.ModelProto, inputs: Iterable[str]) -> list[LabelCheck]:
    """The checks of labels that are among ``model``'s ``inputs`` and whose class count is known: those
    :func:`strip_label_checks` takes out."""
    given = set(inputs)
    return [c for c in label_checks([model]).values() if c.labels in given and c.classes is not None]


def strip_label_checks(model: onnx.ModelProto, *, inputs: Iterable[str]) -> onnx.ModelProto:
    """``model`` without the checks of :func:`strippable_label_checks`, in place (a pass,
    :mod:`onnxtrain.graph.passes`): a caller that runs the model on labels it checked itself (with
    :func:`labels_out_of_range`) saves their nodes. The loss then reads the labels themselves, which is what
    it read through the check whenever the check passed."""
    checks = strippable_label_checks(model, inputs)
    if not checks:
        return model
    graph = model.graph
    stripped = {check.labels for check in checks}
    owned = [n for n in graph.node if is_label_check(n) and _checked_labels(n) in stripped]
    renamed = {}
    for node in owned:
        if node.op_type == "Where" and node.input[1] in stripped:
            renamed[node.output[0]] = node.input[1]  # the checked labels: the labels
    dropped = {id(node) for node in owned}
    kept = [node for node in graph.node if id(node) not in dropped]
    for node in kept:
        node.input[:] = [renamed.get(name, name) for name in node.input]
    del graph.node[:]
    graph.node.extend(kept)
    return drop_unread_initializers(model)  # the checks' constants


def _checked_labels(node: onnx.NodeProto) -> str | None:
    """The labels a check node belongs to, from its ``doc_string``."""
    check = LabelCheck.of_node(node)
    if check is not None:
        return check.labels
    match = re.match(rf"{re.escape(PREFIX)} of '([^']*)'", node.doc_string)
    return match.group(1) if match else None


def _offending(labels: np.ndarray | None, classes: int | None, ignore_index: int | None) -> tuple[int, str] | None:
    """How many labels are out of range, and the first few as ``": -1 at [3], 10 at [5]"``."""
    if labels is None or classes is None:
        return None
    labels = np.asarray(labels)
    bad = (labels < 0) | (labels >= classes)
    if ignore_index is not None:
        bad &= labels != ignore_index
    if not bad.any():
        return 0, ""
    count, shown = listed_values(labels, bad)
    return count, f": {shown}"


def listed_values(values: np.ndarray, bad: np.ndarray) -> tuple[int, str]:
    """How many of ``values`` the mask ``bad`` marks, and the first few as ``"-1 at [3], 10 at [5] and 2 more"``."""
    where = np.argwhere(bad)
    shown = ", ".join(f"{values[tuple(i)]} at {list(map(int, i))}" for i in where[:_SHOWN])
    more = f" and {len(where) - _SHOWN} more" if len(where) > _SHOWN else ""
    return len(where), shown + more


def label_checks(models: Iterable[onnx.ModelProto]) -> Mapping[str, LabelCheck]:
    """The label checks of ``models``, by node name."""
    found = {}
    for model in models:
        for node in model.graph.node:
            check = LabelCheck.of_node(node) if node.doc_string else None
            if check is not None:
                found[node.name] = check
    return found


__all__ = [
    "LABEL_ADVICE",
    "MARKER",
    "PREFIX",
    "LabelCheck",
    "checked_labels",
    "is_label_check",
    "label_checks",
    "label_error",
    "labels_out_of_range",
    "listed_values",
    "strip_label_checks",
    "strippable_label_checks",
]
