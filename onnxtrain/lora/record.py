"""What ``add_adapters`` added, recorded in the model's ``metadata_props`` so that merging can undo it.

The key :data:`METADATA_KEY` holds a JSON list with one object per adapted
weight (:class:`Adapter`): the adapter's two initializers, its scale, the
constants it added, and for each product it follows the nodes added, the
product's own output (renamed) and the output the adapter's ``Add`` now gives.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import onnx

from onnxtrain.lora.sites import SiteKind

#: The ``metadata_props`` key of the record.
METADATA_KEY = "onnxtrain.lora.adapters"


@dataclass(frozen=True)
class Placement:
    """The adapter beside one product: ``output = Add(base_output, scale * dropout(x) A B)``."""

    node: str  # the product node's name
    output: str  # the value the product gave before; the adapter's Add gives it now
    base_output: str  # the product's output, renamed
    added: list[str] = field(default_factory=list)  # names of the nodes added


@dataclass(frozen=True)
class Adapter:
    """One adapted weight: ``W + scale * A B`` (``[in, out]``; transposed when ``W`` is stored ``[out, in]``)."""

    weight: str
    kind: SiteKind
    a: str
    b: str
    rank: int
    scale: float
    transposed: bool
    constants: list[str]
    placements: list[Placement]


def adapters_of(model: onnx.ModelProto) -> list[Adapter]:
    """The adapters recorded in ``model`` (``[]`` when it has none)."""
    for prop in model.metadata_props:
        if prop.key == METADATA_KEY:
            entries = json.loads(prop.value)
            return [
                Adapter(**{**entry, "placements": [Placement(**p) for p in entry["placements"]]}) for entry in entries
            ]
    return []


def write(model: onnx.ModelProto, adapters: list[Adapter]) -> None:
    """Record ``adapters`` in ``model`` (the key removed when the list is empty)."""
    kept = [prop for prop in model.metadata_props if prop.key != METADATA_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    if adapters:
        model.metadata_props.add(key=METADATA_KEY, value=json.dumps([asdict(a) for a in adapters]))
