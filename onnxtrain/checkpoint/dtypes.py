"""Element types a checkpoint tensor may have: ORT's numbering, NumPy's dtypes.

The file stores ``onnxruntime.fbs.TensorDataType``, which numbers types as
ONNX's ``TensorProto.DataType`` does, 1..20. STRING (8) is not supported: a
checkpoint holds numeric tensors only (``raw_data``). bfloat16 and the float8
types are ``ml_dtypes`` dtypes, as in ``onnx.helper``.

ONNX Runtime 1.19.2's checkpoint loader accepts fewer types than the format:
:data:`ORT_LOADABLE_ELEM_TYPES` (no float16, bfloat16, complex or float8).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import ml_dtypes
import numpy as np

#: code -> (ORT's TensorDataType name, NumPy dtype)
_TYPES: Mapping[int, tuple[str, np.dtype]] = MappingProxyType(
    {
        1: ("FLOAT", np.dtype(np.float32)),
        2: ("UINT8", np.dtype(np.uint8)),
        3: ("INT8", np.dtype(np.int8)),
        4: ("UINT16", np.dtype(np.uint16)),
        5: ("INT16", np.dtype(np.int16)),
        6: ("INT32", np.dtype(np.int32)),
        7: ("INT64", np.dtype(np.int64)),
        9: ("BOOL", np.dtype(np.bool_)),
        10: ("FLOAT16", np.dtype(np.float16)),
        11: ("DOUBLE", np.dtype(np.float64)),
        12: ("UINT32", np.dtype(np.uint32)),
        13: ("UINT64", np.dtype(np.uint64)),
        14: ("COMPLEX64", np.dtype(np.complex64)),
        15: ("COMPLEX128", np.dtype(np.complex128)),
        16: ("BFLOAT16", np.dtype(ml_dtypes.bfloat16)),
        17: ("FLOAT8E4M3FN", np.dtype(ml_dtypes.float8_e4m3fn)),
        18: ("FLOAT8E4M3FNUZ", np.dtype(ml_dtypes.float8_e4m3fnuz)),
        19: ("FLOAT8E5M2", np.dtype(ml_dtypes.float8_e5m2)),
        20: ("FLOAT8E5M2FNUZ", np.dtype(ml_dtypes.float8_e5m2fnuz)),
    }
)
_CODES: Mapping[np.dtype, int] = MappingProxyType({dtype: code for code, (_, dtype) in _TYPES.items()})
_NAMES: Mapping[int, str] = MappingProxyType(
    {0: "UNDEFINED", 8: "STRING", **{code: name for code, (name, _) in _TYPES.items()}}
)

#: Every element type a checkpoint can hold.
SUPPORTED_ELEM_TYPES: frozenset[int] = frozenset(_TYPES)

#: The element types onnxruntime-training 1.19.2 can load from a checkpoint (measured).
ORT_LOADABLE_ELEM_TYPES: frozenset[int] = frozenset({1, 2, 3, 4, 5, 6, 7, 9, 11, 12, 13})


def elem_type_name(code: int) -> str:
    """``1 -> 'FLOAT'``; ``'<unknown 99>'`` for numbers the format does not define."""
    return _NAMES.get(code, f"<unknown {code}>")


def numpy_dtype(code: int) -> np.dtype:
    """The NumPy dtype stored under ``code``; ``ValueError`` if unsupported."""
    if code not in _TYPES:
        raise ValueError(
            f"element type {code} ({elem_type_name(code)}) is not supported in a checkpoint; "
            "supported: the numeric types 1..20 of onnx.TensorProto except STRING (8)"
        )
    return _TYPES[code][1]


def native(dtype: np.dtype) -> np.dtype:
    """``dtype`` in the machine's byte order (``>f4`` -> ``float32``)."""
    return dtype if dtype.byteorder in "=|" else dtype.newbyteorder("=")


def elem_type(dtype: np.dtype) -> int:
    """The checkpoint element type of a NumPy dtype; ``TypeError`` if it has none."""
    code = _CODES.get(native(np.dtype(dtype)))
    if code is None:
        supported = ", ".join(sorted(str(d) for _, d in _TYPES.values()))
        raise TypeError(f"dtype {np.dtype(dtype)} cannot be stored in a checkpoint; supported: {supported}")
    return code
