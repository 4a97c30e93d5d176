"""Ids checked on the host against the rows of the table they look up, before a step runs.

A user input read as the indices of a ``Gather`` on axis 0 of a table of
known rows (a parameter or a constant: an embedding) takes ids in
``[0, rows)``; torch refuses any other (``IndexError``). onnxruntime fails on
one too large in the middle of the step, its error naming a node and no
input, and reads a negative one from the table's end without a word (ONNX's
``Gather`` counts negative indices from the end): a missing category encoded
as -1 trained the table's last row. The check is ``min`` and ``max`` of the
ids per step, the element-wise test only where one is out of range; ids
given as an ``OrtValue`` are not copied to the host for it.

The ids may also be computed from the user input by operators that pass its
values on (:class:`Step`): a column or a slice picked with constant positions
(``Gather`` on any axis, ``Slice``), a view (``Identity``, ``Squeeze``,
``Unsqueeze``, ``Reshape``, ``Flatten``) and a ``Cast`` to an integer type (of
an integer or float input). torch writes them so for ``emb_i(cats[:, i])``, one
input of the categories of a table of data, and for codes carried in a float
``X`` (``X[:, 0].long()``). The steps are run in NumPy on the user input, and
only the values that reach the lookup are checked (another column of ``X``
holds no ids); a bad id is named at its position in the user input. A lookup
whose ids come through anything else (``Add``, ``Range``, ``Where``, a
computed position) is not checked.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from onnxtrain.graph.attributes import attribute
from onnxtrain.graph.fold import FOLDABLE, evaluate_constant, folded_value
from onnxtrain.graph.passes.constants import SmallConstants
from onnxtrain.graph.versions import is_standard, opset_version
from onnxtrain.losses.label_check import listed_values

#: Operators that pass every element of their input 0 on once, reshaped at most.
_VIEWS = frozenset({"Identity", "Squeeze", "Unsqueeze", "Reshape", "Flatten"})


@dataclass(frozen=True, eq=False)
class Step:
    """A node on the way from a user input to a lookup's ids: ``node(value, *constants)`` (its input 0 the value,
    the others the ``constants``), as ONNX defines it, at ``opset``."""

    node: onnx.NodeProto
    constants: tuple[np.ndarray, ...]
    opset: int

    def apply(self, value: np.ndarray, *, cast: bool = True) -> np.ndarray | None:
        """The node's output for ``value``; ``None`` where it cannot be computed here (onnxruntime will say
        why). ``cast=False``: a ``Cast`` passes ``value`` on unchanged (positions followed through the steps)."""
        op = self.node.op_type
        if op == "Identity" or (op == "Cast" and not cast):
            return value
        if op == "Cast":  # an integer type, from an integer or float value: C's conversion, as onnxruntime's
            if value.dtype.kind not in "iuf":
                return None
            with np.errstate(invalid="ignore"):
                return value.astype(helper.tensor_dtype_to_np_dtype(attribute(self.node, "to")))
        if op == "Flatten":
            axis = int(attribute(self.node, "axis", 1))
            axis += value.ndim if axis < 0 else 0
            return value.reshape(math.prod(value.shape[:axis]), math.prod(value.shape[axis:]))
        try:
            return evaluate_constant(self.node, [value, *self.constants], self.opset)
        except (ValueError, LookupError, TypeError):  # out of range, a shape that does not fit: the step's error
            return None


@dataclass(frozen=True)
class Lookup:
    """User input ``ids`` (at ``position`` among the user inputs) read as the rows of ``table``, of ``rows``:
    directly, or through ``steps`` (:class:`Step`, in order from the user input)."""

    position: int
    ids: str
    table: str
    rows: int
    steps: tuple[Step, ...] = ()

    def looked_up(self, value: np.ndarray, *, cast: bool = True) -> np.ndarray | None:
        """The ids the lookup reads when the user input is ``value``; ``None`` where a step cannot run here.
        ``cast=False``: the steps' casts left out (where in the input each id comes from, given the positions)."""
        out: np.ndarray | None = value
        for step in self.steps:
            out = step.apply(out, cast=cast) if out is not None else None
        return out

    def error(self, value: np.ndarray, what: str) -> ValueError | None:
        """The ``ValueError`` naming the ids that the user input ``value`` gives the lookup outside ``[0, rows)``,
        each at its position in ``value`` (``what`` names the data or the step); ``None`` where there is none."""
        ids = self.looked_up(value)
        if ids is None or ids.dtype.kind not in "iu" or not ids.size:
            return None
        if ids.min() >= 0 and ids.max() < self.rows:
            return None
        bad = (ids < 0) | (ids >= self.rows)
        # each looked-up id at its position in the user input: the steps run on the positions
        positions = self.looked_up(np.arange(value.size).reshape(value.shape), cast=False) if self.steps else None
        if positions is not None:
            at = np.zeros(value.shape, ids.dtype)
            at.flat[positions.reshape(-1)] = ids.reshape(-1)
            at_bad = np.zeros(value.shape, bool)
            at_bad.flat[positions.reshape(-1)[bad.reshape(-1)]] = True
            ids, bad = at, at_bad
        count, shown = listed_values(ids, bad)
        return ValueError(
            f"{what}: input {self.ids!r} holds {count} id(s) outside the {self.rows} rows of the table "
            f"{self.table!r} it looks up (Gather): {shown} (rows counted from 0). torch refuses them; "
            "onnxruntime would fail on one too large in the middle of the step and read a negative one from the "
            "table's end: fix the ids (a tokenizer of another vocabulary? -1 for a missing category?), or map the "
            "unknown ones to a row of their own"
        )


def lookups(model: onnx.ModelProto, user_inputs: Sequence[str]) -> tuple[Lookup, ...]:
    """The user inputs of ``model`` (among ``user_inputs``) that a standard ``Gather`` on axis 0 reads as the
    rows of an initializer or a graph input of a known first size that is no user input: as its indices, or
    through steps that pass the input's values on (:class:`Step`)."""
    position = {name: k for k, name in enumerate(user_inputs)}
    rows: dict[str, int] = {t.name: t.dims[0] for t in model.graph.initializer if t.dims}
    for value in model.graph.input:
        tensor = value.type.tensor_type
        dims = tensor.shape.dim if tensor.HasField("shape") else []
        if dims and dims[0].HasField("dim_value") and value.name not in position:
            rows.setdefault(value.name, dims[0].dim_value)
    tracer = _Tracer(model, position)
    found: dict[tuple[str, str], Lookup] = {}
    for node in model.graph.node:
        if node.op_type != "Gather" or not is_standard(node) or len(node.input) < 2:
            continue
        axis = attribute(node, "axis", 0)
        table, ids = node.input[0], node.input[1]
        if axis != 0 or not rows.get(table) or (ids, table) in found:
            continue
        traced = tracer.trace(ids)
        if traced is not None:
            source, steps = traced
            found[ids, table] = Lookup(position[source], source, table, rows[table], steps)
    return tuple(found.values())


class _Tracer:
    """Follows a value back to the user input whose values it carries (see :func:`lookups`)."""

    def __init__(self, model: onnx.ModelProto, position: Mapping[str, int]) -> None:
        self._model = model
        self._position = position
        self._opset = opset_version(model) or 0
        self._producers = {name: node for node in model.graph.node for name in node.output if name}
        self._constants: SmallConstants | None = None

    def trace(self, name: str) -> tuple[str, tuple[Step, ...]] | None:
        """``(user input, steps)`` whose steps compute ``name`` from the user input; ``None`` where it is
        computed otherwise."""
        steps: list[Step] = []
        while name not in self._position:
            node = self._producers.get(name)
            constants = self._step_constants(node) if node is not None else None
            if node is None or constants is None:
                return None
            steps.append(Step(node, constants, self._opset))
            name = node.input[0]
        return name, tuple(reversed(steps))

    def _step_constants(self, node: onnx.NodeProto) -> tuple[np.ndarray, ...] | None:
        """The constant inputs (after input 0) of a node that passes its input 0's values on; ``None`` for
        another node."""
        op = node.op_type
        if not is_standard(node) or len(node.output) != 1 or not node.input or not node.input[0]:
            return None
        if op == "Cast":
            to = attribute(node, "to")
            integer = to is not None and helper.tensor_dtype_to_np_dtype(to).kind in "iu"
            return () if integer and len(node.input) == 1 else None
        if op not in _VIEWS and op not in ("Gather", "Slice"):
            return None
        if op == "Slice" and self._opset < 10:  # starts and ends as attributes: not followed
            return None
        rest = list(node.input[1:])
        while rest and not rest[-1]:
            rest.pop()
        if (op in ("Gather", "Reshape") and len(rest) != 1) or (op == "Slice" and len(rest) < 2):
            return None
        if op == "Unsqueeze" and self._opset >= 13 and len(rest) != 1:
            return None
        constants = self._constant_values()
        if not all(name and name in constants for name in rest):  # a skipped optional input, or a computed one
            return None
        values = tuple(constants[name] for name in rest)
        return values if all(v.dtype.kind in "iu" for v in values) else None

    def _constant_values(self) -> SmallConstants:
        """The graph's small constants: initializers that are no graph input, ``Constant`` nodes and what folds
        from them (torch's ``Unsqueeze`` of a ``Constant`` for a ``Slice``'s start)."""
        if self._constants is None:
            graph = self._model.graph
            inputs = {value.name for value in graph.input}
            constants = SmallConstants([t for t in graph.initializer if t.name not in inputs])
            for node in graph.node:
                if node.op_type == "Constant" and is_standard(node):
                    constants.add_constant_node(node)
                elif node.op_type in FOLDABLE and len(node.output) == 1:
                    value = folded_value(node, {}, constants, self._opset)
                    if value is not None:
                        constants.add_value(node.output[0], value)
            self._constants = constants
        return self._constants


@dataclass(frozen=True)
class HostLookupChecks:
    """The lookups a module checks on the host before each step (see the module docstring)."""

    checks: tuple[Lookup, ...] = ()

    @classmethod
    def of(cls, model: onnx.ModelProto, user_inputs: Sequence[str]) -> HostLookupChecks:
        return cls(lookups(model, user_inputs))

    def __bool__(self) -> bool:
        return bool(self.checks)

    def raise_if_out_of_range(self, feeds: Sequence[object], what: str) -> None:
        """``ValueError`` (``what`` names the step or data) when an id of ``feeds`` (the user inputs, in order,
        NumPy arrays checked) is outside its table's rows."""
        for check in self.checks:
            ids = feeds[check.position]
            if isinstance(ids, np.ndarray):
                error = check.error(ids, what)
                if error is not None:
                    raise error


__all__ = ["HostLookupChecks", "Lookup", "Step", "lookups"]
