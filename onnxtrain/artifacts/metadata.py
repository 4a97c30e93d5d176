"""What ``generate_artifacts`` records in the training and eval models' metadata, and reading it back.

Three entries, so that tools given only the artifacts (``onnxtrain inspect``,
``onnxtrain export``) can say what the loss is and which values the forward
model computed:

- ``onnxtrain.loss``: the loss, by name (``CrossEntropyLoss``, the class of a
  custom loss block, or ``none`` when the model's first output is the loss);
- ``onnxtrain.loss_inputs``: the forward model's outputs fed to the loss (JSON list);
- ``onnxtrain.model_outputs``: every output of the forward model (JSON list).

Artifacts written before these entries existed simply lack them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import onnx

from onnxtrain.graph.walk import needed_nodes

#: Metadata key of the training and eval models: the loss, by name (``none``: the model's first output).
LOSS_KEY = "onnxtrain.loss"
#: Metadata key of the training and eval models: the forward model's outputs the loss reads (JSON list).
LOSS_INPUTS_KEY = "onnxtrain.loss_inputs"
#: Metadata key of the training and eval models: the forward model's outputs (JSON list).
MODEL_OUTPUTS_KEY = "onnxtrain.model_outputs"

#: Metadata key of the training and eval models: what the loss is a mean over (JSON,
#: :func:`onnxtrain.artifacts.loss_items.loss_items`); absent where it is the batch's rows.
LOSS_ITEMS_KEY = "onnxtrain.loss_items"

#: The keys above: they describe training, so an exported inference model drops them.
TRAINING_KEYS = (LOSS_KEY, LOSS_INPUTS_KEY, MODEL_OUTPUTS_KEY, LOSS_ITEMS_KEY)
#: Metadata key of the training and eval models: the half ``precision`` they were generated with (``bf16``,
#: ``fp16``); absent for float32.
PRECISION_KEY = "onnxtrain.precision"

#: The value of :data:`LOSS_KEY` when the model's first output already is the loss.
NO_LOSS = "none"


def training_metadata(loss: str, loss_inputs: Sequence[str], model_outputs: Sequence[str]) -> dict[str, str]:
    """The entries for a training or eval model: ``loss`` by name, and the forward model's outputs."""
    return {
        LOSS_KEY: loss,
        LOSS_INPUTS_KEY: json.dumps(list(loss_inputs)),
        MODEL_OUTPUTS_KEY: json.dumps(list(model_outputs)),
    }


def _rewrite(model: onnx.ModelProto, entries: Sequence[tuple[str, str]]) -> None:
    del model.metadata_props[:]
    for key, value in entries:
        model.metadata_props.add(key=key, value=value)


def set_metadata(model: onnx.ModelProto, entries: Mapping[str, str]) -> None:
    """Write ``entries`` into ``model.metadata_props``, replacing those keys and keeping the others."""
    kept = [(entry.key, entry.value) for entry in model.metadata_props if entry.key not in entries]
    _rewrite(model, [*kept, *entries.items()])


def read_metadata(model: onnx.ModelProto) -> dict[str, str]:
    """``{key: value}`` of ``model.metadata_props``."""
    return {entry.key: entry.value for entry in model.metadata_props}


def drop_metadata(model: onnx.ModelProto, key: str) -> None:
    """Remove the entry ``key`` from ``model``'s metadata, if any."""
    _rewrite(model, [(entry.key, entry.value) for entry in model.metadata_props if entry.key != key])


def drop_training_metadata(model: onnx.ModelProto) -> None:
    """Remove the entries of :data:`TRAINING_KEYS` from ``model`` (an inference model has no loss)."""
    _rewrite(model, [(entry.key, entry.value) for entry in model.metadata_props if entry.key not in TRAINING_KEYS])


def _names(metadata: Mapping[str, str], key: str) -> list[str]:
    if key not in metadata:
        return []
    try:
        names = json.loads(metadata[key])
    except ValueError:
        names = None
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise ValueError(f"the model's metadata {key!r} is not a JSON list of names: {metadata[key]!r}")
    return names


def inference_outputs(eval_model: onnx.ModelProto) -> list[str]:
    """The outputs an inference model exported from ``eval_model`` has by default.

    The forward model's outputs (from the metadata) and the eval model's
    additional outputs that are values of the forward model: the loss and a
    loss block's other outputs (which may read the labels) are left out.
    ``ValueError`` when that leaves nothing (artifacts without the metadata
    whose eval model outputs only the loss): the caller must then name the
    outputs.
    """
    metadata = read_metadata(eval_model)
    outputs = [value.name for value in eval_model.graph.output]
    excluded = set(outputs[:1])
    loss_inputs = _names(metadata, LOSS_INPUTS_KEY)
    model_outputs = _names(metadata, MODEL_OUTPUTS_KEY)
    if metadata.get(LOSS_KEY) == NO_LOSS and loss_inputs:
        excluded.add(loss_inputs[0])  # the forward model's first output is the loss itself
    elif loss_inputs:  # a loss block: its outputs after the loss are no values of the forward model
        forward = _forward_values(eval_model.graph, [*loss_inputs, *model_outputs])
        excluded.update(name for name in outputs[1:] if name not in forward)
    names = [name for name in dict.fromkeys(model_outputs + outputs[1:]) if name not in excluded]
    if not names:
        raise ValueError(
            "the eval model outputs only the loss and its metadata does not name the forward model's outputs "
            "(artifacts from an older onnxtrain): name the values to export"
        )
    return names


def _forward_values(graph: onnx.GraphProto, model_outputs: Sequence[str]) -> set[str]:
    """The values of ``graph`` that the forward model computes: ``model_outputs`` (the forward model's outputs)
    and every output of the nodes they depend on. The loss block's nodes come after them."""
    nodes = needed_nodes(graph.node, model_outputs)
    return {*model_outputs, *(name for node in nodes for name in node.output if name)}


def loss_description(model: onnx.ModelProto) -> str | None:
    """The loss a training or eval model records (``CrossEntropyLoss``, ``none``, ...), or ``None``."""
    return read_metadata(model).get(LOSS_KEY)


def loss_inputs(model: onnx.ModelProto) -> list[str]:
    """The forward model's outputs the loss reads, as a training or eval model records them (or ``[]``)."""
    return _names(read_metadata(model), LOSS_INPUTS_KEY)


__all__ = [
    "LOSS_INPUTS_KEY",
    "LOSS_ITEMS_KEY",
    "LOSS_KEY",
    "MODEL_OUTPUTS_KEY",
    "NO_LOSS",
    "PRECISION_KEY",
    "TRAINING_KEYS",
    "drop_metadata",
    "drop_training_metadata",
    "inference_outputs",
    "loss_description",
    "loss_inputs",
    "read_metadata",
    "set_metadata",
    "training_metadata",
]
