"""How an embedding lookup's gradient departs from ``Gather``'s: torch's ``nn.Embedding`` options.

torch's ``nn.Embedding(padding_idx=p, scale_grad_by_freq=s)`` changes the
gradient of its lookup (``aten.embedding``'s backward), where an ONNX
``Gather`` has the exact one, every position adding its gradient to its row:

- ``padding_idx=p``: the positions whose index is ``p`` add nothing, so
  training never moves the padding token's vector;
- ``scale_grad_by_freq=True``: each position's gradient is divided by the
  number of times its index occurs in the batch (the padding positions
  counted too).

:func:`embedding_rule` says which ``Gather`` nodes follow torch's rules, and
the ``Gather`` gradient rule (:mod:`onnxtrain.autodiff.rules.indexing`)
applies them. Only that lookup's gradient changes: a table also read
elsewhere (a language model's tied output head) still gets those reads'
gradients, as in torch.

Where the rules come from, for a ``Gather`` of axis 0:

- the node's ``metadata_props`` entries :data:`PADDING_IDX_KEY`
  (``"onnxtrain.padding_idx"``: the row, ``-1`` for none) and
  :data:`SCALE_GRAD_BY_FREQ_KEY` (``"onnxtrain.scale_grad_by_freq"``:
  ``"1"`` or ``"0"``), which :func:`set_embedding` writes for a table named
  by its initializer: for exports that lose them (torch's TorchScript
  exporter, which warns about ``padding_idx``);
- else the FX node torch's dynamo exporter records
  (:func:`onnxtrain.graph.torch_metadata.embedding_arguments`).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from onnxtrain.graph import torch_metadata
from onnxtrain.graph.attributes import attribute
from onnxtrain.graph.naming import unknown_name_hint

#: The ``metadata_props`` key of a ``Gather`` whose positions of index ``int(value)`` add no gradient to that row
#: (``-1``: none).
PADDING_IDX_KEY = "onnxtrain.padding_idx"
#: The ``metadata_props`` key of a ``Gather`` whose positions' gradients are divided by their index's count
#: (``"1"``), or not (``"0"``).
SCALE_GRAD_BY_FREQ_KEY = "onnxtrain.scale_grad_by_freq"


@dataclass(frozen=True)
class EmbeddingRule:
    """How a lookup's gradient departs from ``Gather``'s: the row it leaves out, and whether it scales by the
    indices' counts."""

    padding_idx: int | None = None
    scale_grad_by_freq: bool = False

    def __bool__(self) -> bool:
        return self.padding_idx is not None or self.scale_grad_by_freq

    def describe(self) -> str:
        """``padding row 0, gradient scaled by frequency`` (what ``onnxtrain inspect`` lists)."""
        parts = [] if self.padding_idx is None else [f"padding row {self.padding_idx}"]
        return ", ".join(parts + (["gradient scaled by frequency"] if self.scale_grad_by_freq else []))


def embedding_rule(node: onnx.NodeProto) -> EmbeddingRule:
    """The rule of ``node``'s lookup (a ``Gather`` of axis 0); a false one (``Gather``'s own gradient) for any
    other node or where nothing says otherwise."""
    if not _is_lookup(node):
        return EmbeddingRule()
    marks = {prop.key: prop.value for prop in node.metadata_props}
    if PADDING_IDX_KEY in marks or SCALE_GRAD_BY_FREQ_KEY in marks:  # set_embedding's, over torch's
        row = int(marks.get(PADDING_IDX_KEY, "-1"))
        return EmbeddingRule(row if row >= 0 else None, marks.get(SCALE_GRAD_BY_FREQ_KEY, "0") == "1")
    found = torch_metadata.embedding_arguments(node)
    return EmbeddingRule() if found is None else EmbeddingRule(*found)


def set_embedding(
    model: onnx.ModelProto, weight: str, *, padding_idx: int | None = None, scale_grad_by_freq: bool = False
) -> int:
    """Give every ``Gather`` of axis 0 of ``model``'s main graph that reads initializer ``weight`` the gradient
    of torch's ``nn.Embedding(padding_idx=..., scale_grad_by_freq=...)`` (the defaults: ``Gather``'s own,
    whatever torch's metadata says); in place, before ``generate_artifacts``. Returns how many lookups were
    marked; ``ValueError`` where ``weight`` is no initializer, nothing looks it up, or ``padding_idx`` is not a
    row of it (``-1`` is the last, as in torch)."""
    tables = {t.name: t for t in model.graph.initializer}
    if weight not in tables:
        looked_up = list(dict.fromkeys(n.input[0] for n in model.graph.node if _is_lookup(n) and n.input[0] in tables))
        raise ValueError(
            f"set_embedding: {weight!r} is not an initializer of the model (an export keeps one of the names of "
            f"a tied table); the tables its lookups read: {unknown_name_hint(weight, looked_up)}"
        )
    rows = tables[weight].dims[0] if tables[weight].dims else 0
    if padding_idx is not None:
        if isinstance(padding_idx, bool) or not isinstance(padding_idx, int):
            raise TypeError(f"set_embedding: padding_idx must be an int or None, not {type(padding_idx).__name__}")
        if not -rows <= padding_idx < rows:
            raise ValueError(f"set_embedding: padding_idx {padding_idx} is not a row of {weight!r} ({rows} rows)")
        padding_idx %= rows
    if not isinstance(scale_grad_by_freq, bool):
        raise TypeError(f"set_embedding: scale_grad_by_freq must be a bool, not {type(scale_grad_by_freq).__name__}")
    lookups = [node for node in model.graph.node if _is_lookup(node) and node.input[0] == weight]
    if not lookups:
        raise ValueError(f"set_embedding: no Gather of axis 0 reads {weight!r} (its rows by index)")
    marks = {
        PADDING_IDX_KEY: str(-1 if padding_idx is None else padding_idx),
        SCALE_GRAD_BY_FREQ_KEY: "01"[scale_grad_by_freq],
    }
    for node in lookups:
        kept = [prop for prop in node.metadata_props if prop.key not in marks]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)
        for key, value in marks.items():
            node.metadata_props.add(key=key, value=value)
    return len(lookups)


def _is_lookup(node: onnx.NodeProto) -> bool:
    """Whether ``node`` is an ONNX ``Gather`` of rows (axis 0), as an embedding's lookup is."""
    rows = attribute(node, "axis", 0) == 0
    return node.op_type == "Gather" and node.domain in ("", "ai.onnx") and rows


__all__ = ["PADDING_IDX_KEY", "SCALE_GRAD_BY_FREQ_KEY", "EmbeddingRule", "embedding_rule", "set_embedding"]
