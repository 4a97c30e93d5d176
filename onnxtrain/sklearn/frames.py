"""pandas data as NumPy arrays of numbers, as scikit-learn's ``check_array`` converts it.

``numpy.asarray`` turns a DataFrame of pandas' nullable dtypes (``Int64``,
``Float64``, ``boolean``: what ``read_csv(dtype_backend="numpy_nullable")``
and ``convert_dtypes()`` give) into an array of objects. :func:`as_numbers`
converts each column to its NumPy dtype instead, and ``pd.NA`` to NaN (so that
the checks of missing values name it). pandas is imported only when given
one of its objects: it is no dependency.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _from_pandas(value: Any) -> bool:
    return type(value).__module__.split(".", 1)[0] == "pandas"


def as_numbers(value: Any, what: str) -> Any:
    """``value`` (``what`` names it in errors) as a NumPy array where it is a pandas DataFrame or Series of numbers
    held in extension dtypes; any other value unchanged.

    The array's dtype is the NumPy types of the columns promoted together
    (``numpy.result_type``), and float64 where a value is missing (``pd.NA``
    becomes NaN). ``TypeError`` naming the columns of a DataFrame that hold
    no numbers (strings, categories, dates).
    """
    if not _from_pandas(value) or not hasattr(value, "dtypes"):
        return value
    import pandas as pd
    from pandas.api.types import is_numeric_dtype

    if isinstance(value, pd.DataFrame):
        columns = list(value.dtypes.items())
    elif isinstance(value, pd.Series):
        columns = [(value.name, value.dtype)]
    else:
        return value
    others = [f"{name!r} ({dtype})" for name, dtype in columns if not is_numeric_dtype(dtype)]
    if others and isinstance(value, pd.DataFrame):
        raise TypeError(
            f"{what} must hold numbers, but its column(s) {', '.join(others)} do not: encode them as numbers "
            "(sklearn.preprocessing.OrdinalEncoder, or a category's .cat.codes) or drop them"
        )
    extension = [dtype for _, dtype in columns if isinstance(dtype, pd.api.extensions.ExtensionDtype)]
    if others or not extension:  # numpy.asarray gives the array, or the caller's error for a Series
        return value
    numpy_types = [getattr(dtype, "numpy_dtype", None) for _, dtype in columns]
    dtype = np.result_type(*(np.float64 if kind is None else kind for kind in numpy_types))
    if value.isna().to_numpy().any():
        dtype = np.result_type(dtype, np.float64)
    return value.to_numpy(dtype=dtype, na_value=np.nan)


__all__ = ["as_numbers"]
