"""Training data from a file: one array per user input of the training model, cast and shaped to fit it.

- ``.npz``: arrays named after the inputs (``pixels``, ``labels``), or ``X``
  (or ``x``) and ``y`` for the first input and the target (the second input);
- ``.csv``: numbers, with an optional header row; the last column (or the
  ``target_column``, by header name or index) is the target and the other
  columns the features. A model with one user input takes every column.

Each array is cast to its input's dtype (floats become integers only when
they hold whole numbers) and shaped for its input: axes of size 1 are added
or removed (a ``[N]`` label for an input declared ``[batch, 1]``), and rows
of values are reshaped to the input's per-sample shape only when asked
(``reshape``). All must have the same number of samples (the first
dimension). Problems raise ``ValueError`` or ``TypeError`` naming the array
and the input, and say how to fix the array (the transposition that turns
channels-last images into channels-first ones, ``--reshape``).
"""

from __future__ import annotations

import csv
import math
import os
import re
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from onnxtrain import caller
from onnxtrain.training.tensor_spec import TensorSpec, axes_permutation, layout_hint

#: Names an .npz may use for the first input and the target, when its arrays are not named after the inputs.
FEATURE_NAMES = ("X", "x")
TARGET_NAMES = ("y",)


class UnusedDataWarning(UserWarning):
    """A data file holds arrays that no input of the training model takes (a tokenizer's ``token_type_ids``)."""


def load_data(
    path: str | os.PathLike[str],
    inputs: Sequence[TensorSpec],
    target_column: str | Sequence[str] | None = None,
    reshape: bool = False,
) -> list[np.ndarray]:
    """The arrays for the user inputs ``inputs``, in their order, from an .npz or a .csv file (``reshape``: see
    :func:`fit_to_inputs`)."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"no data file {str(file)!r}")
    suffix = file.suffix.lower()
    if suffix == ".npz":
        if target_column is not None:
            raise ValueError("a target column applies to .csv data; an .npz names its arrays after the inputs")
        named = _npz_arrays(file, inputs)
    elif suffix == ".csv":
        named = _csv_arrays(file, inputs, target_column)
    else:
        raise ValueError(
            f"{file.name}: unknown data format {suffix or '(no suffix)'!r}; give an .npz (arrays named after the "
            "model's inputs, or X and y) or a .csv of numbers"
        )
    return fit_to_inputs(named, inputs, file.name, reshape)


def fit_to_inputs(
    named: Sequence[tuple[str, np.ndarray]], inputs: Sequence[TensorSpec], source: str, reshape: bool = False
) -> list[np.ndarray]:
    """``(what the array is, array)`` per input, cast and shaped for the inputs; as many samples in each.

    ``what`` names the array in errors: ``array 'X'``, ``the target column 'label'``.
    Axes of size 1 are added or removed as the input needs; rows of values
    (``[N, k]``) are reshaped to the input's per-sample shape, in C order, only
    with ``reshape`` (``onnxtrain train --reshape``): flattened data of another
    layout would be scrambled silently. One symbolic per-sample dimension is
    sized to hold the row (numpy's ``-1``); two or more cannot be.
    """
    arrays = []
    for (name, array), spec in zip(named, inputs, strict=True):
        try:
            arrays.append(_fit(np.asarray(array), spec, name, source, reshape))
        except ValueError as error:
            raise ValueError(f"{error}{_rows_hint(spec, inputs)}") from None
    for (name, array), spec in zip(named[1:], inputs[1:], strict=True):
        if len(array) != len(arrays[0]):
            raise ValueError(
                f"{source}: {name} (for input {spec.name!r}) has {len(array)} samples, but {named[0][0]} "
                f"(for input {inputs[0].name!r}) has {len(arrays[0])}; every array needs one row per sample"
            )
    if arrays and len(arrays[0]) == 0:
        raise ValueError(f"{source} holds no samples")
    return arrays


def _rows_hint(spec: TensorSpec, inputs: Sequence[TensorSpec]) -> str:
    """Why an array for ``spec`` cannot have one row per sample: its first axis is not the other inputs' (labels
    ``[batch * seq]`` for a loss over flattened tokens, or ``[rows, classes]`` of one over ``[batch, seq,
    classes]`` scores); ``""`` where it is theirs."""
    first = spec.dims[0] if spec.dims else None
    others = {other.dims[0] for other in inputs if other is not spec and other.dims}
    if not isinstance(first, str) or not others or first in others:
        return ""
    return (
        f". Its first axis ({first}) is not the other inputs' ({', '.join(sorted(map(str, others)))}), and the data "
        "gives each input one row per sample: a loss over a sequence's tokens takes its labels [batch, seq] when "
        "the model outputs the scores [batch, classes, seq] (export logits.transpose(1, 2)), not flattened to "
        "[batch * seq, classes] nor [batch, seq, classes]"
    )


def _signature(inputs: Sequence[TensorSpec]) -> str:
    return ", ".join(f"{spec.name}: {spec.describe()}" for spec in inputs)


def _npz_arrays(file: Path, inputs: Sequence[TensorSpec]) -> list[tuple[str, np.ndarray]]:
    try:
        with np.load(file, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (zipfile.BadZipFile, EOFError, ValueError) as error:
        if not zipfile.is_zipfile(file):  # numpy then reads it as a pickle, and says so
            raise ValueError(
                f"{file.name} is not an .npz archive (a zip of .npy arrays, as numpy.savez writes): save the "
                "arrays with numpy.savez(path, X=..., y=...), or give a .csv"
            ) from None
        raise ValueError(f"{file.name} is not a readable .npz archive ({error})") from None
    chosen = []
    used: set[str] = set()
    for k, spec in enumerate(inputs):
        # an input's own name; else X (or x) for the first input and y for the last, the target
        aliases = (spec.name, *(FEATURE_NAMES if k == 0 else ()), *(TARGET_NAMES if k == len(inputs) - 1 > 0 else ()))
        found = next((name for name in aliases if name in arrays), None)
        if found is None:
            raise ValueError(
                f"{file.name} holds arrays {sorted(arrays)}, but the training model takes {_signature(inputs)}: "
                f"no array for input {spec.name!r}; name the arrays after these inputs (X may name the first, y the "
                "last, the target)"
            )
        chosen.append((f"array {found!r}", arrays[found]))
        used.add(found)
    unused = [name for name in arrays if name not in used]
    if unused:
        caller.warn(
            f"{file.name} holds arrays {unused} that no input of the training model takes ({_signature(inputs)}): "
            "they are left out",
            UnusedDataWarning,
        )
    return chosen


def _csv_arrays(
    file: Path, inputs: Sequence[TensorSpec], target_column: str | Sequence[str] | None
) -> list[tuple[str, np.ndarray]]:
    if len(inputs) not in (1, 2):
        raise ValueError(
            f"a .csv gives features and a target, but the training model takes {len(inputs)} inputs "
            f"({_signature(inputs)}): give an .npz with one array per input"
        )
    header, table = _read_csv(file)
    if len(inputs) == 1:
        if target_column is not None:
            raise ValueError(
                f"the training model takes one input ({_signature(inputs)}), so {file.name} has no target column"
            )
        return [("the columns", table)]
    width = _values_per_sample(inputs[1])
    if table.shape[1] < width + 1:
        raise ValueError(
            f"{file.name} has {table.shape[1]} column(s); it needs feature columns and {width} target column(s) "
            f"(input {inputs[1].name!r} takes {inputs[1].describe()})"
        )
    if target_column is None:  # the last columns, as many as the target takes per sample
        columns = list(range(table.shape[1] - width, table.shape[1]))
    else:
        names = [target_column] if isinstance(target_column, str) else list(target_column)
        columns = [_column_index(name, header, table.shape[1], file.name) for name in names]
    shown = [header[c] if header else c for c in columns]
    label = f"the target column {shown[0]!r}" if len(columns) == 1 else f"the target columns {shown}"
    target = table[:, columns[0]] if len(columns) == 1 else table[:, columns]
    return [("the feature columns", np.delete(table, columns, axis=1)), (label, target)]


def _values_per_sample(spec: TensorSpec) -> int:
    """The values the target input takes per sample (its axes after the first), where they are fixed; else 1."""
    rest = spec.dims[1:] if spec.dims else []
    return math.prod(rest) if rest and all(isinstance(d, int) for d in rest) else 1


def _read_csv(file: Path) -> tuple[list[str] | None, np.ndarray]:
    """``(header or None, table of float64)``; a first row that is not all numbers is the header."""
    with open(file, newline="", encoding="utf-8") as handle:
        rows = [row for row in csv.reader(handle) if row and any(cell.strip() for cell in row)]
    if not rows:
        raise ValueError(f"{file.name} is empty")
    header = None
    if not all(_is_number(cell) for cell in rows[0]):
        header, rows = [cell.strip() for cell in rows[0]], rows[1:]
    if not rows:
        raise ValueError(f"{file.name} has a header row and no data")
    width = len(header) if header else len(rows[0])
    for number, row in enumerate(rows, start=2 if header else 1):
        if len(row) != width:
            raise ValueError(f"{file.name}, line {number}: {len(row)} columns, but the first row has {width}")
        bad = next((cell for cell in row if not _is_number(cell)), None)
        if bad is not None:
            raise ValueError(f"{file.name}, line {number}: {bad.strip()!r} is not a number")
    return header, np.array([[float(cell) for cell in row] for row in rows], dtype=np.float64)


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _column_index(target_column: str, header: list[str] | None, width: int, source: str) -> int:
    if header and target_column in header:
        return header.index(target_column)
    try:
        index = int(target_column)
    except ValueError:
        known = f"its columns are {header}" if header else "it has no header row; give the column's index"
        raise ValueError(f"{source} has no column {target_column!r}: {known}") from None
    if not -width <= index < width:
        raise ValueError(f"{source} has {width} columns; column index {index} is outside [{-width}, {width - 1}]")
    return index % width


def _fit(array: np.ndarray, spec: TensorSpec, name: str, source: str, reshape: bool) -> np.ndarray:
    """``array`` cast to ``spec``'s dtype and shaped for it (see :func:`fit_to_inputs`)."""
    what = f"{source}: {name} (for input {spec.name!r}, {spec.describe()})"
    if array.ndim == 0:
        raise ValueError(f"{what} is a scalar; it needs one row per sample")
    variable = match.group(1) if (match := re.fullmatch(r"array '(\w+)'", name)) else "array"
    if _class_columns_for_labels(array, spec):
        raise ValueError(
            f"{what} has shape {list(array.shape)}: one column per class, one-hot labels or class probabilities, "
            f"where the input takes class indices; save {variable}.argmax(axis=-1) instead, or generate the "
            "artifacts with a loss that takes probabilities as targets"
        )
    return _reshape(_cast(array, spec.dtype, what), spec, what, variable, reshape)


def _class_columns_for_labels(array: np.ndarray, spec: TensorSpec) -> bool:
    """Whether float ``array`` given for integer labels has one more axis, of several columns: one per class."""
    return (
        spec.dtype.kind in "iu"
        and array.dtype.kind == "f"
        and spec.dims is not None
        and array.ndim == len(spec.dims) + 1
        and array.shape[-1] > 1
    )


def _cast(array: np.ndarray, dtype: np.dtype, what: str) -> np.ndarray:
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{what} holds {array.dtype} values, which cannot be cast to {dtype}")
    if array.dtype == dtype:
        return np.ascontiguousarray(array)
    if dtype.kind in "biu" and array.dtype.kind == "f":
        whole = np.isfinite(array) & (array == np.round(array))
        if not whole.all():
            bad = array[~whole].flat[0].item()
            raise TypeError(f"{what} holds {bad!r}, which is not a whole number, so it cannot be cast to {dtype}")
    if dtype.kind in "iu" and array.size:
        info = np.iinfo(dtype)
        low, high = array.min().item(), array.max().item()
        if low < info.min or high > info.max:
            raise TypeError(f"{what} holds values in [{low}, {high}], outside the range of {dtype}")
    return np.ascontiguousarray(array.astype(dtype))


def _reshape(array: np.ndarray, spec: TensorSpec, what: str, variable: str, reshape: bool) -> np.ndarray:
    """``array`` shaped ``[N, *spec's per-sample dims]``: axes of size 1 added or removed, flat rows only if asked."""
    dims = spec.dims
    if dims is None or not dims:
        return array
    rest = dims[1:]
    sample = tuple(array.shape[1:])
    if array.ndim == len(dims) and all(not isinstance(d, int) or n == d for n, d in zip(sample, rest, strict=True)):
        return array
    if all(isinstance(d, int) for d in rest):
        wanted = tuple(int(d) for d in rest if d is not None)
        unit_axes_only = [n for n in sample if n != 1] == [n for n in wanted if n != 1]
        if unit_axes_only or (reshape and array.ndim == 2 and math.prod(sample) == math.prod(wanted)):
            return array.reshape((len(array), *wanted))
    elif reshape and array.ndim == 2:
        filled = _filled(rest, sample[0])
        if filled is not None:
            return array.reshape((len(array), *filled))
    raise ValueError(_misfit(array, rest, what, variable, reshape))


def _filled(rest: Sequence[int | str | None], values: int) -> tuple[int, ...] | None:
    """The per-sample shape ``rest`` with its one symbolic axis sized so that it holds ``values`` (what numpy's
    ``-1`` gives); ``None`` where ``rest`` has several symbolic axes, or ``values`` is no multiple of the others."""
    unknown = [i for i, d in enumerate(rest) if not isinstance(d, int)]
    known = math.prod(int(d) for d in rest if isinstance(d, int))
    if len(unknown) != 1 or known <= 0 or values % known or not values:
        return None
    return tuple(d if isinstance(d, int) else values // known for d in rest)


def _misfit(array: np.ndarray, rest: Sequence[int | str | None], what: str, variable: str, reshape: bool) -> str:
    """Why ``array`` does not fit samples of shape ``rest``, and how to make it fit (``variable``: its name)."""
    sample = tuple(array.shape[1:])
    wanted = _shape(rest)
    said = f"{what}: shape {list(array.shape)}, which does not fit: the input takes {wanted} per sample"
    known = all(isinstance(d, int) for d in rest)
    order = axes_permutation(sample, tuple(int(d) for d in rest if d is not None)) if known else None
    if order is not None:
        axes = (0, *(axis + 1 for axis in order))
        return f"{said}; {layout_hint(axes)}: transpose it, numpy.transpose({variable}, {axes})"
    if known and array.ndim == 2:
        values, size = sample[0], math.prod(int(d) for d in rest if d is not None)
        if values != size:
            return f"{said}; each row holds {values:,} values per sample, but {wanted} holds {size:,}"
        if not reshape:
            return f"{said}; each row holds its {values:,} values: {_reshape_advice(wanted)}"
    unknown = [d for d in rest if not isinstance(d, int)]
    if array.ndim == 2 and len(unknown) > 1:
        return (
            f"{said}; --reshape fills at most one unknown per-sample dimension, and {wanted} has {len(unknown)} "
            f"({', '.join('?' if d is None else d for d in unknown)}): give the array shaped [N, {wanted[1:]} in "
            "an .npz"
        )
    if array.ndim == 2 and unknown:
        values, others = sample[0], math.prod(int(d) for d in rest if isinstance(d, int))
        filled, name = _filled(rest, values), "?" if unknown[0] is None else unknown[0]
        if filled is None:
            return (
                f"{said}; each row holds {values:,} values, which the input's other per-sample dimensions "
                f"({others:,} values for each {name}) do not divide"
            )
        if not reshape:
            advice = _reshape_advice(_shape(filled), f" ({name} = {values // others})")
            return f"{said}; each row holds its {values:,} values: {advice}"
    return f"{said}; give one row of the input per sample"


def _reshape_advice(shape: str, sized: str = "") -> str:
    """How to make rows of values fit the per-sample ``shape`` (written ``[2, 48]``; ``sized``: says how a symbolic
    dimension was sized, `` (time = 48)``)."""
    return (
        f"pass --reshape to reshape each row to {shape}{sized} in C order (row-major: the last axis varies fastest), "
        f"or give the array shaped [N, {shape[1:]}. Rows of flattened data of another layout (channels last, NHWC) "
        "must be reshaped to their own shape and transposed instead"
    )


def _shape(dims: Sequence[int | str | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


__all__ = [
    "FEATURE_NAMES",
    "TARGET_NAMES",
    "UnusedDataWarning",
    "fit_to_inputs",
    "load_data",
]
