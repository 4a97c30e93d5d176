"""Plain-text tables and the descriptions of tensors that the ``inspect`` command prints."""

from __future__ import annotations

import math
from collections.abc import Sequence


def table(rows: Sequence[Sequence[str]], right: Sequence[int] = (), indent: str = "  ") -> list[str]:
    """``rows`` as aligned lines; columns whose index is in ``right`` are right-aligned."""
    if not rows:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append(indent + "  ".join(cells).rstrip())
    return lines


def shape_text(dims: Sequence[int | str | None] | None) -> str:
    """``[batch, 64]``; ``?`` for an unknown dimension, ``[...]`` for an unknown rank."""
    if dims is None:
        return "[...]"
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def elements(dims: Sequence[int]) -> int:
    """The number of elements of a tensor of shape ``dims``."""
    return math.prod(int(d) for d in dims)


def number(value: int) -> str:
    """``4,810``."""
    return f"{value:,}"


__all__ = ["elements", "number", "shape_text", "table"]
