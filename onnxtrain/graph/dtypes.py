"""Element types: names, NumPy equivalents and families of ONNX tensor types."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

FLOAT_TYPES: frozenset[int] = frozenset(
    {
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.BFLOAT16,
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.DOUBLE,
    }
)

INTEGER_TYPES: frozenset[int] = frozenset(
    {
        onnx.TensorProto.INT8,
        onnx.TensorProto.INT16,
        onnx.TensorProto.INT32,
        onnx.TensorProto.INT64,
        onnx.TensorProto.UINT8,
        onnx.TensorProto.UINT16,
        onnx.TensorProto.UINT32,
        onnx.TensorProto.UINT64,
    }
)


def dtype_name(elem_type: int) -> str:
    """``1 -> 'float'``, ``7 -> 'int64'``: the name ONNX's type strings use."""
    try:
        return onnx.TensorProto.DataType.Name(elem_type).lower()
    except ValueError:
        return f"<unknown element type {elem_type}>"


def schema_allows(schema: onnx.defs.OpSchema, type_param: str, elem_type: int) -> bool:
    """Whether ``schema``'s type parameter ``type_param`` (``T``, ``T2``...) may be tensors of ``elem_type``."""
    wanted = f"tensor({dtype_name(elem_type)})"
    return any(c.type_param_str == type_param and wanted in c.allowed_type_strs for c in schema.type_constraints)


def to_numpy_dtype(elem_type: int) -> np.dtype:
    """The NumPy dtype of an ONNX element type (bfloat16 and friends via ml_dtypes)."""
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def to_elem_type(dtype: np.dtype | type | int | str) -> int:
    """An ONNX element type from a NumPy dtype, a ``TensorProto`` enum value or a name."""
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        code = int(dtype)
        if code not in onnx.TensorProto.DataType.values() or code == 0:
            raise TypeError(f"{code} is not an ONNX element type (see onnx.TensorProto.DataType)")
        return code
    if isinstance(dtype, str) and dtype.upper() in onnx.TensorProto.DataType.keys():  # noqa: SIM118 - an EnumTypeWrapper has no __contains__
        return int(onnx.TensorProto.DataType.Value(dtype.upper()))
    try:
        if dtype is None:  # np.dtype(None) would be float64
            raise TypeError("None is no dtype")
        return int(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    except (TypeError, KeyError, ValueError) as error:
        raise TypeError(
            f"{dtype!r} is not a tensor element type; pass a NumPy dtype such as np.float32 "
            "or an onnx.TensorProto value such as onnx.TensorProto.FLOAT"
        ) from error


def is_float(elem_type: int) -> bool:
    """Whether tensors of this element type can carry gradients."""
    return elem_type in FLOAT_TYPES


def is_integer(elem_type: int) -> bool:
    """Whether this is a signed or unsigned integer element type."""
    return elem_type in INTEGER_TYPES
