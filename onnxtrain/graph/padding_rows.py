"""The row of an embedding table that gets no gradient: torch's ``nn.Embedding(padding_idx=p)``.

torch leaves row ``p`` of such a table out of the gradient of the lookup
(``aten.embedding``'s backward skips the positions whose index is ``p``), so
training never moves the padding token's vector. An ONNX ``Gather`` has no
such notion, and the gradient of ``Gather`` is the exact one: every position
adds its gradient to its row, ``p``'s included. :func:`padding_row` says
which ``Gather`` nodes follow torch's rule, and the ``Gather`` gradient rule
(:mod:`onnxtrain.autodiff.rules.indexing`) then adds nothing from the
positions whose index is that row. The rule applies to that lookup only: a
table that is also read elsewhere (a language model's tied output head)
still gets those reads' gradients in row ``p``, as in torch.

Where it comes from, for a ``Gather`` of axis 0:

- the node's ``metadata_props`` entry :data:`PADDING_IDX_KEY`
  (``"onnxtrain.padding_idx"``, the row as a decimal integer), which
  :func:`set_padding_idx` writes for a table named by its initializer: for
  exports that lose ``padding_idx`` (torch's TorchScript exporter, which
  warns about it);
- else the FX node torch's dynamo exporter records
  (:mod:`onnxtrain.graph.torch_metadata`): an ``aten.embedding`` call with a
  ``padding_idx`` other than -1.
"""

from __future__ import annotations

import onnx

from onnxtrain.graph import torch_metadata

#: The ``metadata_props`` key of a ``Gather`` whose positions of index ``int(value)`` add no gradient to that row.
PADDING_IDX_KEY = "onnxtrain.padding_idx"


def padding_row(node: onnx.NodeProto) -> int | None:
    """The row of ``node``'s table (a ``Gather`` of axis 0) that its lookup leaves without gradient, or ``None``."""
    if node.op_type != "Gather" or node.domain not in ("", "ai.onnx"):
        return None
    if any(a.name == "axis" and a.i != 0 for a in node.attribute):
        return None
    for prop in node.metadata_props:
        if prop.key == PADDING_IDX_KEY:  # -1: none, whatever torch's metadata says
            row = int(prop.value)
            return row if row >= 0 else None
    return torch_metadata.embedding_padding_idx(node)


def set_padding_idx(model: onnx.ModelProto, weight: str, padding_idx: int | None) -> int:
    """Mark every ``Gather`` of axis 0 of ``model``'s main graph that reads initializer ``weight`` as its table
    so that row ``padding_idx`` gets no gradient from it (``None``: every row does, torch's metadata ignored);
    in place, before ``generate_artifacts``. Returns how many were marked; ``ValueError`` where ``weight`` is no
    initializer of ``model``, no such ``Gather`` reads it, or ``padding_idx`` is not a row of it."""
    tables = {t.name: t for t in model.graph.initializer}
    if weight not in tables:
        raise ValueError(f"set_padding_idx: {weight!r} is not an initializer of the model")
    rows = tables[weight].dims[0] if tables[weight].dims else 0
    if padding_idx is not None:
        if isinstance(padding_idx, bool) or not isinstance(padding_idx, int):
            raise TypeError(f"set_padding_idx: padding_idx must be an int or None, not {type(padding_idx).__name__}")
        if not -rows <= padding_idx < rows:
            raise ValueError(f"set_padding_idx: padding_idx {padding_idx} is not a row of {weight!r} ({rows} rows)")
        padding_idx %= rows  # torch's nn.Embedding takes -1 as the last row
    lookups = [
        node
        for node in model.graph.node
        if node.op_type == "Gather"
        and node.domain in ("", "ai.onnx")
        and node.input[0] == weight
        and all(a.name != "axis" or a.i == 0 for a in node.attribute)
    ]
    if not lookups:
        raise ValueError(f"set_padding_idx: no Gather of axis 0 reads {weight!r} (its rows by index)")
    value = "-1" if padding_idx is None else str(padding_idx)
    for node in lookups:
        kept = [prop for prop in node.metadata_props if prop.key != PADDING_IDX_KEY]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)
        node.metadata_props.add(key=PADDING_IDX_KEY, value=value)
    return len(lookups)


__all__ = ["PADDING_IDX_KEY", "padding_row", "set_padding_idx"]
