"""Blocks that introduce values: constants, new inputs, sequences, label maps."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np

from onnxtrain.blocks.block import Block
from onnxtrain.graph import dtypes


def _as_array(value: Any, dtype: Any) -> np.ndarray:
    """``value`` as an array; Python floats default to float32 (ONNX Runtime's choice)."""
    if dtype is not None:
        return np.asarray(value, dtype=dtypes.to_numpy_dtype(dtypes.to_elem_type(dtype)))
    array = np.asarray(value)
    if array.dtype == np.float64 and not isinstance(value, np.ndarray) and not isinstance(value, np.generic):
        array = array.astype(np.float32)
    if array.dtype.kind in "US":
        raise TypeError("Constant holds numbers or booleans; string tensors are not supported")
    return array


class Constant(Block):
    """A constant tensor (an initializer) of any element type and shape.

    ``Constant(0.4)`` is a float32 scalar; ``Constant([1, 2], dtype=np.int64)``
    a vector; a NumPy array keeps its dtype and shape.
    """

    def __init__(self, value: Any, dtype: Any = None) -> None:
        super().__init__()
        self._value = _as_array(value, dtype)

    def build(self) -> str:
        return self.builder.add_initializer(self._value, "constant")


class SequenceConstruct(Block):
    """A sequence of the input tensors (ONNX ``SequenceConstruct``)."""

    def build(self, *sequence_input_names: str) -> str:
        if not sequence_input_names:
            raise ValueError("SequenceConstruct needs at least one input name")
        return self.builder.add_node1("SequenceConstruct", list(sequence_input_names))


class PassThrough(Block):
    """Returns its input names unchanged and adds nothing."""

    def build(self, *input_names: str) -> tuple[str, ...]:
        for name in input_names:
            self.builder.require(name)
        return input_names


class InputLike(Block):
    """A new graph input with the type and shape of value ``like``.

    ``like`` is a graph input, a graph output or any value whose type is known;
    symbolic dimensions are kept.
    """

    def __init__(self, like: str) -> None:
        super().__init__()
        self._like = like

    def build(self, input_name: str | None = None) -> str:
        b = self.builder
        type_proto = copy.deepcopy(b.tensor_type_of(b.require(self._like, role="'like' value")))
        return b.add_input(input_name or b.names.fresh("input"), type_proto)


class LabelEncoder(Block):
    """Maps keys to values (``ai.onnx.ml`` ``LabelEncoder``), with ONNX Runtime's arguments.

    Give one ``keys_*`` and one ``values_*`` list; unknown keys map to the
    ``default_*`` of the values' type.
    """

    def __init__(
        self,
        default_float: float = 0.0,
        default_int64: int = -1,
        default_string: str = "_Unused",
        keys_floats: Sequence[float] | None = None,
        keys_int64s: Sequence[int] | None = None,
        keys_strings: Sequence[str] | None = None,
        values_floats: Sequence[float] | None = None,
        values_int64s: Sequence[int] | None = None,
        values_strings: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        keys = {
            k: v
            for k, v in (("keys_floats", keys_floats), ("keys_int64s", keys_int64s), ("keys_strings", keys_strings))
            if v is not None
        }
        values = {
            k: v
            for k, v in (
                ("values_floats", values_floats),
                ("values_int64s", values_int64s),
                ("values_strings", values_strings),
            )
            if v is not None
        }
        if len(keys) != 1 or len(values) != 1:
            raise ValueError("LabelEncoder needs exactly one keys_* list and one values_* list")
        (key_list,), (value_list,) = keys.values(), values.values()
        if len(key_list) != len(value_list):
            raise ValueError(
                f"LabelEncoder got {len(key_list)} keys but {len(value_list)} values; give one value per key"
            )
        self._attributes: dict[str, Any] = {
            "default_float": float(default_float),
            "default_int64": int(default_int64),
            "default_string": default_string,
            **{k: list(v) for k, v in keys.items()},
            **{k: list(v) for k, v in values.items()},
        }

    def build(self, label_encoder_input_name: str) -> str:
        return self.builder.add_node1(
            "LabelEncoder",
            [label_encoder_input_name],
            domain="ai.onnx.ml",
            hint="label_encoder.output",
            **self._attributes,
        )
