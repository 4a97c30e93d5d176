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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from onnxtrain.graph.attributes import attribute
from onnxtrain.graph.versions import is_standard
from onnxtrain.losses.label_check import listed_values


@dataclass(frozen=True)
class Lookup:
    """User input ``ids`` (at ``position`` among the user inputs) read as the rows of ``table``, of ``rows``."""

    position: int
    ids: str
    table: str
    rows: int

    def error(self, ids: np.ndarray, what: str) -> ValueError | None:
        """The ``ValueError`` naming the ids of ``ids`` outside ``[0, rows)`` (``what`` names the data or the
        step); ``None`` where there is none."""
        if ids.dtype.kind not in "iu" or not ids.size or (ids.min() >= 0 and ids.max() < self.rows):
            return None
        count, shown = listed_values(ids, (ids < 0) | (ids >= self.rows))
        return ValueError(
            f"{what}: input {self.ids!r} holds {count} id(s) outside the {self.rows} rows of the table "
            f"{self.table!r} it looks up (Gather): {shown} (rows counted from 0). torch refuses them; "
            "onnxruntime would fail on one too large in the middle of the step and read a negative one from the "
            "table's end: fix the ids (a tokenizer of another vocabulary? -1 for a missing category?), or map the "
            "unknown ones to a row of their own"
        )


def lookups(model: onnx.ModelProto, user_inputs: Sequence[str]) -> tuple[Lookup, ...]:
    """The user inputs of ``model`` (among ``user_inputs``) that a standard ``Gather`` on axis 0 reads as the
    rows of an initializer or a graph input of a known first size that is no user input."""
    position = {name: k for k, name in enumerate(user_inputs)}
    rows: dict[str, int] = {t.name: t.dims[0] for t in model.graph.initializer if t.dims}
    for value in model.graph.input:
        tensor = value.type.tensor_type
        dims = tensor.shape.dim if tensor.HasField("shape") else []
        if dims and dims[0].HasField("dim_value") and value.name not in position:
            rows.setdefault(value.name, dims[0].dim_value)
    found: dict[tuple[str, str], Lookup] = {}
    for node in model.graph.node:
        if node.op_type != "Gather" or not is_standard(node) or len(node.input) < 2:
            continue
        axis = attribute(node, "axis", 0)
        table, ids = node.input[0], node.input[1]
        if axis == 0 and ids in position and rows.get(table):
            found.setdefault((ids, table), Lookup(position[ids], ids, table, rows[table]))
    return tuple(found.values())


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


__all__ = ["HostLookupChecks", "Lookup", "lookups"]
