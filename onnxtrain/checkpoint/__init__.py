"""Checkpoints in ONNX Runtime's on-device training format.

``CheckpointState`` holds trainable and frozen parameters, the optimizer state
and properties; ``save`` writes it atomically as ORT's flatbuffer checkpoint
(identifier ``ODTC``, version 2, ``<path>.data`` for large tensors) and
``load`` reads one back, validating everything and raising
``CheckpointError`` for any defect. Nothing is ever unpickled.
"""

from __future__ import annotations

from onnxtrain.checkpoint.dtypes import ORT_LOADABLE_ELEM_TYPES, SUPPORTED_ELEM_TYPES
from onnxtrain.checkpoint.errors import CheckpointError
from onnxtrain.checkpoint.files import (
    DEFAULT_EXTERNAL_DATA_THRESHOLD,
    EXTERNAL_DATA_SUFFIX,
    checkpoint_files,
    external_data_path,
    load,
    save,
    write_files,
)
from onnxtrain.checkpoint.format import decode, encode
from onnxtrain.checkpoint.state import CheckpointState, OptimizerState, PropertyValue, from_tensors, lazy_from_tensors

__all__ = [
    "DEFAULT_EXTERNAL_DATA_THRESHOLD",
    "EXTERNAL_DATA_SUFFIX",
    "ORT_LOADABLE_ELEM_TYPES",
    "SUPPORTED_ELEM_TYPES",
    "CheckpointError",
    "CheckpointState",
    "OptimizerState",
    "PropertyValue",
    "checkpoint_files",
    "decode",
    "encode",
    "external_data_path",
    "from_tensors",
    "lazy_from_tensors",
    "load",
    "save",
    "write_files",
]
