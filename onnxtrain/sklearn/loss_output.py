"""``add_loss_output``: a scoring loss on a model's output, onnxcustom's helper built from blocks.

onnxcustom (``onnxcustom.utils.orttraining_helper``) edited the graph by hand;
here every loss is a block stacked on the model, so it is typed, checked and
named like any other onnxtrain build. Each score is a sum over the samples
``i`` (``w_i`` the optional per-sample weight, 1 without one)::

    squared_error, l2    sum_i w_i sum_j (f(x_i)_j - y_ij)^2
    absolute_error, l1   sum_i w_i sum_j |f(x_i)_j - y_ij|
    elastic              sum_i w_i sum_j (l1_weight |d_ij| + l2_weight d_ij^2)
    log                  -sum_i w_i log p_i[y_i], p_i clipped to [eps, 1 - eps] and renormalised

plus, for each penalised value ``v``, ``l1 * sum|v| + l2 * sum v^2``. The
penalty is part of every batch's loss (onnxcustom's convention): a pass over
``n`` samples in batches of ``b`` minimises the data term plus ``n / b`` times
the penalty.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from onnxtrain.blocks import Abs, Add, Block, Clip, Div, ForwardBlock, Log, Mul, Neg, ReduceSum, Sub
from onnxtrain.graph import base, dtypes, empty_base, ops
from onnxtrain.graph.builder import GraphBuilder, describe_type, tensor_type
from onnxtrain.graph.naming import keep_or_tag, names_in
from onnxtrain.graph.passes import prune_unused_nodes
from onnxtrain.graph.walk import rename_values
from onnxtrain.losses import NLLLoss
from onnxtrain.losses._common import target_input

#: Score names and their aliases, as onnxcustom spells them.
SCORES: dict[str, str] = {
    "squared_error": "squared_error",
    "l2": "squared_error",
    "absolute_error": "absolute_error",
    "l1": "absolute_error",
    "elastic": "elastic",
    "log": "log",
}
#: The keyword arguments each score takes, with their defaults.
SCORE_OPTIONS: dict[str, dict[str, float]] = {
    "squared_error": {},
    "absolute_error": {},
    "elastic": {"l1_weight": 0.5, "l2_weight": 0.5},
    "log": {"eps": 1e-6},
}
#: Element types onnxcustom's ``get_train_initializer`` returns.
_TRAINABLE_TYPES = (onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)


# ------------------------------------------------------------------ blocks


class Penalty(Block):
    """``l1 * ReduceSum(|v|) + l2 * ReduceSum(v * v)``, a scalar; a zero coefficient drops its term."""

    def __init__(self, l1: float | None = None, l2: float | None = None) -> None:
        super().__init__()
        self._l1 = _coefficient("l1", l1)
        self._l2 = _coefficient("l2", l2)
        if not (self._l1 or self._l2):
            raise ValueError(f"a penalty needs l1 or l2 above 0, got l1={l1!r} and l2={l2!r}")

    def build(self, value: str) -> str:
        b = self.builder
        terms = []
        if self._l1:
            terms.append(Mul()(ReduceSum(keepdims=False)(Abs()(value)), ops.constant_like(b, self._l1, value, "l1")))
        if self._l2:
            squares = ReduceSum(keepdims=False)(Mul()(value, value))
            terms.append(Mul()(squares, ops.constant_like(b, self._l2, value, "l2")))
        return terms[0] if len(terms) == 1 else Add()(*terms)


class _Score(Block):
    """The per-sample score of ``output`` against a label input, weighted and summed to a scalar."""

    def __init__(self, score: str, label_name: str, weight_name: str | None, options: Mapping[str, float]) -> None:
        super().__init__()
        self._score = score
        self._label_name = label_name
        self._weight_name = weight_name
        self._options = dict(options)

    def build(self, output: str) -> str:
        b = self.builder
        if self._score == "log":
            per_sample = self._log(output)
        else:
            label = target_input(b, "add_loss_output", self._label_name, output)
            diff = Sub()(output, label)
            if self._score == "squared_error":
                per_sample = Mul()(diff, diff)
            elif self._score == "absolute_error":
                per_sample = Abs()(diff)
            else:
                l1 = Mul()(Abs()(diff), ops.constant_like(b, self._options["l1_weight"], diff, "l1_weight"))
                l2 = Mul()(Mul()(diff, diff), ops.constant_like(b, self._options["l2_weight"], diff, "l2_weight"))
                per_sample = Add()(l1, l2)
        if self._weight_name is not None:
            per_sample = Mul()(per_sample, self._weights(output, per_sample))
        return ReduceSum(keepdims=False)(per_sample)

    def _log(self, output: str) -> str:
        """``-log p[label]`` per sample: ``output`` holds one probability per class (``[N, C]``, ``C >= 2``),
        or the probability of class 1 (``[N]`` or ``[N, 1]``)."""
        b = self.builder
        eps = self._options["eps"]
        rank = b.rank(output)
        dims = b.shape(output)
        clipped = Clip(eps, 1.0 - eps)(output)
        if rank == 2 and dims is not None and dims[1] != 1:
            probabilities = Div()(clipped, ReduceSum(axes=[1], keepdims=True)(clipped))
            return NLLLoss(reduction="none", ignore_index=None)(Log()(probabilities), target_name=self._label_name)
        if rank not in (1, 2):
            raise ValueError(
                f"add_loss_output(score_name='log') needs probabilities of shape [N, C] or [N], but {output!r} is "
                f"{describe_type(b.type_of(output))}"
            )
        label = target_input(b, "add_loss_output", self._label_name, output, elem_type=onnx.TensorProto.INT64)
        truth = b.add_node1("Cast", [label], to=b.elem_type(output))
        one = ops.constant_like(b, 1.0, output, "one")
        log_likelihood = Add()(Mul()(truth, Log()(clipped)), Mul()(Sub()(one, truth), Log()(Sub()(one, clipped))))
        return Neg()(log_likelihood)

    def _weights(self, output: str, per_sample: str) -> str:
        """The weight input ``[N]``, unsqueezed to broadcast over the other axes of ``per_sample``."""
        b = self.builder
        assert self._weight_name is not None
        batch = b.shape(output)
        dims = [batch[0]] if batch else [None]
        weights = b.add_input(self._weight_name, tensor_type(b.elem_type(output), dims))
        rank = b.rank(per_sample)
        if rank is None:
            raise ValueError(f"add_loss_output: the rank of {output!r} is unknown, so the weights cannot broadcast")
        return ops.unsqueeze(b, weights, list(range(1, rank)), "weights") if rank > 1 else weights


class _LossOutput(ForwardBlock):
    """Outputs ``[loss_name, output]``: the score of ``output`` plus the penalties."""

    def __init__(self, score: _Score, penalties: Mapping[str, Penalty], loss_name: str) -> None:
        super().__init__()
        self._score = score
        self._penalties = dict(penalties)
        self._loss_name = loss_name

    def build(self, output: str) -> list[str]:
        b = self.builder
        total = self._score(output)
        for name, penalty in self._penalties.items():
            _require_float(b, name)
            term = penalty(name)
            if b.elem_type(term) != b.elem_type(total):
                term = b.add_node1("Cast", [term], to=b.elem_type(total))
            total = Add()(total, term)
        loss = b.add_node("Identity", [total], [self._loss_name])[0]
        return [loss, output]


def _require_float(b: GraphBuilder, name: str) -> None:
    """``ValueError`` unless ``name`` is a floating-point value of the model (a penalised one)."""
    if not b.has(name):
        raise ValueError(f"penalty names {name!r}, which is not an initializer, input or value of the model")
    type_proto = b.type_of(name)
    if type_proto is None or not type_proto.HasField("tensor_type") or not dtypes.is_float(b.elem_type(name)):
        raise ValueError(f"penalty names {name!r}, which is {describe_type(type_proto)}, not a float tensor")


# ------------------------------------------------------------- functions


def add_loss_output(
    onx: onnx.ModelProto,
    score_name: str = "squared_error",
    loss_name: str = "loss",
    label_name: str = "label",
    weight_name: str | None = None,
    penalty: Mapping[str, float | Mapping[str, float]] | None = None,
    output_index: int | str | None = None,
    **kwargs: float,
) -> onnx.ModelProto:
    """A copy of ``onx`` whose outputs are ``[loss_name, the scored output]`` (onnxcustom's helper).

    Args:
        onx: the model (not changed).
        score_name: ``"squared_error"``/``"l2"``, ``"absolute_error"``/``"l1"``,
            ``"elastic"`` (``l1_weight``, ``l2_weight``, default 0.5 each) or
            ``"log"`` (probabilities ``[N, C]`` or of class 1 ``[N]``/``[N, 1]``;
            integer labels; ``eps``, default 1e-6); see the module docstring.
        loss_name: the name of the loss output (a scalar).
        label_name: the name of the new label input: the output's type and shape
            (``int64 [N]`` for ``"log"``).
        weight_name: the name of a new per-sample weight input ``[N]``, or ``None``.
        penalty: ``{value: {"l1": a, "l2": b}}`` or ``{value: b}`` (L2 only):
            adds ``a * sum|v| + b * sum v^2`` for each initializer or input ``v``.
        output_index: the output to score, by position or name; required when
            the model has several outputs.

    Nodes only the other outputs used are removed. Unlike onnxcustom, the loss
    is a scalar (not ``[1, 1]``), the weights broadcast over every axis but the
    first, and ``"log"`` sums over samples like the other scores (onnxcustom
    averaged it) and takes any number of classes.
    """
    if not isinstance(onx, onnx.ModelProto):
        raise TypeError(f"add_loss_output takes an onnx.ModelProto, not {type(onx).__name__}")
    score = _score(score_name)
    options = _options(score, kwargs)
    output = _output_name(onx, output_index)
    _check_scored_output(onx, output)
    penalties = {name: Penalty(**spec) for name, spec in _penalty_specs(penalty).items()}
    new_names = {"label_name": label_name, "loss_name": loss_name} | (
        {"weight_name": weight_name} if weight_name else {}
    )
    model = _free_names(onx, output, new_names)
    block = _LossOutput(_Score(score, label_name, weight_name, options), penalties, loss_name)
    with base(model):
        block(output)
    model = block.to_model_proto()
    prune_unused_nodes(model)
    return model


def get_train_initializer(onx: onnx.ModelProto) -> OrderedDict[str, tuple[np.ndarray, onnx.TensorProto]]:
    """``{name: (value, tensor)}`` for the float16, float and double initializers, in model order."""
    return OrderedDict(
        (tensor.name, (numpy_helper.to_array(tensor), tensor))
        for tensor in onx.graph.initializer
        if tensor.data_type in _TRAINABLE_TYPES
    )


def penalty_loss_onnx(
    name: str,
    dtype: Any,
    l1: float | None = None,
    l2: float | None = None,
    existing_names: Iterable[str] | None = None,
) -> tuple[list[onnx.TensorProto], list[onnx.NodeProto]]:
    """``(initializers, nodes)`` computing ``l1 * sum|name| + l2 * sum name^2`` (onnxcustom's helper).

    The penalty is the output of the last node. New names avoid
    ``existing_names``; ``dtype`` is the NumPy dtype of ``name``.
    """
    block = Penalty(l1, l2)
    elem_type = dtypes.to_elem_type(np.dtype(dtype))
    with empty_base() as b:
        for taken in existing_names or ():
            b.names.reserve(taken)
        b.add_input(name, tensor_type(elem_type, None))
        block(name)
    graph = b.model.graph
    return list(graph.initializer), list(graph.node)


# ------------------------------------------------------------- arguments


def _score(score_name: str) -> str:
    if score_name not in SCORES:
        raise ValueError(f"score_name={score_name!r} is not a known score; choose one of {list(SCORES)}")
    return SCORES[score_name]


def _options(score: str, kwargs: Mapping[str, Any]) -> dict[str, float]:
    allowed = SCORE_OPTIONS[score]
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise TypeError(
            f"add_loss_output(score_name={score!r}) got unexpected arguments {unknown}; "
            f"it takes {sorted(allowed) or 'none'}"
        )
    options = dict(allowed) | dict(kwargs)
    for key, value in options.items():
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not np.isfinite(value):
            raise ValueError(f"add_loss_output: {key} must be a finite number, not {value!r}")
    if score == "log" and not 0 < options["eps"] < 0.5:
        raise ValueError(f"add_loss_output: eps must be in (0, 0.5), not {options['eps']!r}")
    return {key: float(value) for key, value in options.items()}


def _output_name(onx: onnx.ModelProto, output_index: int | str | None) -> str:
    outputs = [value.name for value in onx.graph.output]
    if output_index is None:
        if len(outputs) != 1:
            raise ValueError(
                f"the model has {len(outputs)} outputs {outputs}; pass output_index (a position or a name) "
                "to choose the one to score"
            )
        return outputs[0]
    if isinstance(output_index, bool) or not isinstance(output_index, (int, str)):
        raise TypeError(f"output_index must be an int or an output name, not {output_index!r}")
    if isinstance(output_index, str):
        if output_index not in outputs:
            zipmap = any(node.op_type == "ZipMap" and node.domain == "ai.onnx.ml" for node in onx.graph.node)
            hint = (
                " (a classifier converted by skl2onnx with ZipMap: convert it with options={'zipmap': False} "
                "to get the tensor outputs 'label' and 'probabilities')"
                if zipmap
                else ""
            )
            raise ValueError(
                f"output_index={output_index!r} is not an output of the model; its outputs are {outputs}{hint}"
            )
        return output_index
    if not -len(outputs) <= output_index < len(outputs):
        raise ValueError(f"output_index={output_index} is out of range: the model has {len(outputs)} outputs {outputs}")
    return outputs[output_index]


def _free_names(onx: onnx.ModelProto, output: str, new_names: Mapping[str, str]) -> onnx.ModelProto:
    """A copy of ``onx`` in which the values computed by nodes and named like a new input or the loss
    are renamed (``label`` -> ``label.renamed0``): skl2onnx's classifiers output a ``label`` of their own.

    The scored output, graph inputs and initializers keep their names: a clash with one of them is an error.
    """
    model = onnx.ModelProto()
    model.CopyFrom(onx)
    graph = model.graph
    fixed = {value.name for value in graph.input} | {tensor.name for tensor in graph.initializer}
    for argument, name in new_names.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"add_loss_output: {argument} must be a non-empty str, not {name!r}")
        if name == output or (name in fixed and argument == "loss_name"):
            what = "the scored output" if name == output else "an input or initializer"
            raise ValueError(
                f"add_loss_output: {argument}={name!r} is already {what} of the model; pass another {argument}"
            )
    if len(set(new_names.values())) != len(new_names):
        raise ValueError(f"add_loss_output: the new names must differ, got {dict(new_names)}")
    taken = names_in(graph)
    renames = {name: keep_or_tag(taken, "renamed")(name) for name in new_names.values() if name in taken - fixed}
    if renames:
        rename_values(graph, renames)
    return model


def _check_scored_output(onx: onnx.ModelProto, output: str) -> None:
    """``ValueError`` unless ``output`` is a float tensor, naming the converter option that makes it one."""
    value = next(v for v in onx.graph.output if v.name == output)
    if value.type.HasField("tensor_type") and dtypes.is_float(value.type.tensor_type.elem_type):
        return
    writer = next((node for node in onx.graph.node if output in node.output), None)
    hint = ""
    if writer is not None and writer.op_type == "ZipMap":
        hint = (
            "; it is written by ZipMap (ai.onnx.ml): convert the scikit-learn model with "
            "skl2onnx.to_onnx(model, X, options={'zipmap': False}) to get the probabilities as a tensor"
        )
    elif value.type.HasField("tensor_type"):
        hint = "; score the probabilities or scores output instead of the labels"
    raise ValueError(
        f"add_loss_output can only score a floating-point tensor, but output {output!r} is "
        f"{describe_type(value.type)}{hint}"
    )


def _penalty_specs(penalty: Mapping[str, Any] | None) -> dict[str, dict[str, float | None]]:
    if penalty is None:
        return {}
    if not isinstance(penalty, Mapping):
        raise TypeError(f"penalty must be a dict {{name: {{'l1': a, 'l2': b}}}} or {{name: b}}, not {penalty!r}")
    specs: dict[str, dict[str, float | None]] = {}
    for name, spec in penalty.items():
        if isinstance(spec, Mapping):
            unknown = sorted(set(spec) - {"l1", "l2"})
            if unknown:
                raise ValueError(f"penalty[{name!r}] has keys {unknown}; use 'l1' and 'l2'")
            specs[name] = {"l1": spec.get("l1"), "l2": spec.get("l2")}
        else:
            specs[name] = {"l1": None, "l2": spec}
    return specs


def _coefficient(what: str, value: float | None) -> float:
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not value >= 0:
        raise ValueError(f"a penalty's {what} must be a number >= 0, not {value!r}")
    return float(value)


__all__ = ["SCORES", "Penalty", "add_loss_output", "get_train_initializer", "penalty_loss_onnx"]
