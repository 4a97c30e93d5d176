"""The user inputs of a model, checked in one place before anything runs (:class:`UserInputs`).

Inputs come by position or by name, as NumPy arrays or OrtValues; each is
checked against the model's declared dtype and shape, symbolic dimensions
must agree across inputs, and STRING inputs are converted to what
onnxruntime reads. Errors name the input and list what the model takes.

An empty batch is refused: the *data input*, the first user input whose
shape is not fixed by the model (a symbolic or unknown dimension, or an
unknown rank; ``x`` before the labels), may not hold 0 values along such a
dimension (``x[300:332]`` of 256 rows). A step over no rows computes no loss:
onnxruntime's mean over none is 0 where torch's is nan, and a train step
would add zero gradients for the optimizer to step on, hiding the slice past
the end of the data. The check reads the shape only, on the path that checks
the inputs (a call with the last passed signature skips it). A dimension the
model fixes at 0 is the model's own, and the later inputs may be empty (the
boxes of an image without any, the edges of a graph without any).
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort

from onnxtrain.graph import dtypes
from onnxtrain.training.tensor_spec import TensorSpec, axes_permutation, layout_hint, shape_text
from onnxtrain.training.values import cast_hint, dtype_text


def _class_scores_for_labels(spec: TensorSpec, dtype: np.dtype, shape: Sequence[int]) -> bool:
    """Whether a float array of ``shape`` given for integer labels ``spec`` has one more (trailing) axis: one
    column per class, which ``.astype`` cannot turn into labels."""
    return (
        spec.dtype.kind in "iu"
        and dtype.kind == "f"
        and spec.dims is not None
        and len(shape) == len(spec.dims) + 1
        and shape[-1] > 1
    )


def _array_signature(args: Sequence[Any]) -> tuple[tuple[np.dtype, tuple[int, ...]], ...] | None:
    """``(dtype, shape)`` per argument when all are C-contiguous native ``numpy.ndarray``s (which the
    check passes through unchanged), else None."""
    signature = []
    for value in args:
        if value.__class__ is not np.ndarray:
            return None
        flags = value.flags
        if not flags.c_contiguous or not value.dtype.isnative:
            return None
        signature.append((value.dtype, value.shape))
    return tuple(signature)


def _dynamic(spec: TensorSpec) -> bool:
    """Whether ``spec``'s size is not fixed by the model: a symbolic or unknown dimension, or an unknown rank."""
    return spec.dims is None or any(d.__class__ is not int for d in spec.dims)


def _conversion_hint(value: Any) -> str:
    """How to pass ``value``, an array of another library or a list, as a NumPy array: ``""`` for anything else."""
    if hasattr(value, "__dlpack__") or hasattr(value, "__array__"):  # torch, jax, cupy, pandas...
        module = type(value).__module__.split(".")[0]
        if module == "torch":
            return ": pass tensor.numpy() (tensor.cpu().numpy() for a tensor on a GPU), which shares its memory"
        return ": convert it with numpy.asarray(value)"
    if isinstance(value, (list, tuple)):
        return ": convert it with numpy.asarray(value, dtype=...) of the input's type"
    return ""


def _string_array(value: np.ndarray, what: str) -> np.ndarray:
    """``value`` as the runtime feeds a STRING tensor: a C-contiguous object array of ``str``.

    ``<U`` arrays are converted; ``S`` arrays and ``bytes`` elements are decoded
    as UTF-8 (onnxruntime reads an ``S`` element that fills its width past its
    end, and feeds a ``bytes`` object as its repr). ``ValueError`` for bytes
    that are not UTF-8, ``TypeError`` for an element that is neither ``str``
    nor ``bytes``; ``what`` names the input.
    """
    kind = value.dtype.kind
    if kind == "U":
        return np.ascontiguousarray(value.astype(object))
    if kind == "S":
        try:
            return np.ascontiguousarray(np.char.decode(value, "utf-8").astype(object))
        except UnicodeDecodeError as error:
            raise ValueError(f"{what}: the bytes are not UTF-8 ({error}); decode them to str first") from None
    flat = value.ravel()
    if all([element.__class__ is str for element in flat]):  # a list: faster than a generator here
        return np.ascontiguousarray(value)
    converted = np.empty(flat.shape, object)
    for i, element in enumerate(flat):
        if isinstance(element, str):
            converted[i] = element
        elif isinstance(element, (bytes, np.bytes_)):
            try:
                converted[i] = bytes(element).decode("utf-8")
            except UnicodeDecodeError as error:
                at = [int(d) for d in np.unravel_index(i, value.shape)] if value.ndim else []
                raise ValueError(f"{what}: the bytes at {at} are not UTF-8 ({error}); decode them first") from None
        else:
            at = [int(d) for d in np.unravel_index(i, value.shape)] if value.ndim else []
            raise TypeError(
                f"{what} is a string tensor, so each element must be a str (or UTF-8 bytes); the element at {at} "
                f"is {type(element).__name__} ({element!r}): convert the array with .astype(str)"
            )
    return converted.reshape(value.shape)


def _transpose_hint(spec: TensorSpec, shape: Sequence[int]) -> str:
    """How to transpose an array of ``shape`` whose samples have ``spec``'s fixed sizes in another order (images
    channels last for an input that takes them first); ``""`` where they do not."""
    if spec.dims is None or len(shape) != len(spec.dims) or len(shape) < 2:
        return ""
    rest = spec.dims[1:]
    if not all(isinstance(d, int) for d in rest):
        return ""
    order = axes_permutation(tuple(shape[1:]), tuple(int(d) for d in rest))  # type: ignore[arg-type]
    if order is None:
        return ""
    axes = (0, *(axis + 1 for axis in order))
    return f"; {layout_hint(axes)}: pass numpy.transpose(array, {axes})"


def _unit_axis_hint(spec: TensorSpec, shape: Sequence[int]) -> str:
    """How to drop or add the trailing axis of size 1 that is all an array of ``shape`` has more or less than
    ``spec`` (labels ``[N, 1]`` for an input ``[N]``, as ONNX Runtime's examples shape them); ``""`` otherwise."""
    if spec.dims is None:
        return ""
    if len(shape) == len(spec.dims) + 1 and shape[-1] == 1:
        return "; its last axis of size 1 is one the input does not have: pass array.squeeze(-1)"
    if len(shape) == len(spec.dims) - 1 and spec.dims[-1] == 1:
        return "; the input has a last axis of size 1 that the array does not: pass array[..., None]"
    return ""


_OPERATORS: dict[type, Callable[[int, int], int]] = {
    ast.Mult: operator.mul,
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.FloorDiv: operator.floordiv,
}


def _evaluate(expression: str, sizes: Mapping[str, int]) -> int | None:
    """The value of a dimension ``expression`` of named sizes and integers (``batch*seq``, ``2*seq + 1``);
    ``None`` where it is no such expression or names a size not in ``sizes``."""
    try:
        tree = ast.parse(expression, mode="eval").body
    except SyntaxError:
        return None

    def value(node: ast.AST) -> int | None:
        if isinstance(node, ast.Name):
            return sizes.get(node.id)
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = value(node.left), value(node.right)
            if left is None or right is None or (isinstance(node.op, ast.FloorDiv) and right == 0):
                return None
            return _OPERATORS[type(node.op)](left, right)
        return None

    return value(tree)


class UserInputs:
    """The user inputs of a model: checks what the caller passes, in one place, before anything runs."""

    def __init__(self, specs: Sequence[TensorSpec], model: str) -> None:
        self.specs = tuple(specs)
        self.names = tuple(spec.name for spec in self.specs)
        self._model = model
        self._index = {name: i for i, name in enumerate(self.names)}
        # per input, its symbolic dimensions as (axis, name): sizes must agree across inputs
        self._symbolic = tuple(
            tuple((axis, d) for axis, d in enumerate(spec.dims or ()) if isinstance(d, str)) for spec in self.specs
        )
        # (dtype, shape) per input of the last positional call whose inputs were all plain C-contiguous
        # native NumPy arrays and passed the check: the same signature again skips the check (never for a
        # model with string inputs: their arrays are converted, and their elements checked, on every call)
        self._passed: tuple[tuple[np.dtype, tuple[int, ...]], ...] | None = None
        #: Whether some input is a STRING tensor; onnxruntime's IOBinding cannot bind those.
        self.strings = any(spec.is_string for spec in self.specs)
        #: The data input: the first whose shape the model does not fix, refused empty (see the module docstring).
        self.data_index = next((i for i, spec in enumerate(self.specs) if _dynamic(spec)), None)

    def signature(self) -> str:
        return ", ".join(f"{spec.name}: {spec.describe()}" for spec in self.specs) or "no inputs"

    def collect(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[np.ndarray | ort.OrtValue]:
        """The inputs in model order, from positional and keyword arguments, each checked.

        Inputs with the dtypes and shapes of the last call that passed (all
        plain C-contiguous NumPy arrays, by position) are not checked again.
        """
        if not kwargs and len(args) == len(self.specs):
            signature = _array_signature(args)
            if signature is not None and signature == self._passed:
                return list(args)
            values = args
        else:
            signature, values = None, self._arrange(args, kwargs)
        sizes: dict[str, tuple[int, str]] = {}
        checked = [self._check(i, value, sizes) for i, value in enumerate(values)]
        self._check_expressions(sizes)
        if signature is not None and not self.strings:
            self._passed = signature
        return checked

    def _check_expressions(self, sizes: Mapping[str, tuple[int, str]]) -> None:
        """``ValueError`` where a dimension named by an expression of others (torch's ``batch*seq`` for a
        flattened output's labels) has another size than the expression gives with the others' sizes."""
        for dim, (size, name) in sizes.items():
            if dim.isidentifier():
                continue
            expected = _evaluate(dim, {d: known for d, (known, _) in sizes.items() if d.isidentifier()})
            if expected is not None and expected != size:
                given = ", ".join(
                    f"{d} = {known} (input {where!r})" for d, (known, where) in sizes.items() if d.isidentifier()
                )
                raise ValueError(
                    f"input {name!r} of the {self._model} has {dim} = {size}, but {given} make it {expected} "
                    f"({self.signature()})"
                )

    def _arrange(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Any]:
        if len(args) > len(self.specs):
            raise TypeError(
                f"the {self._model} takes {len(self.specs)} user input(s) ({self.signature()}); got {len(args)}"
            )
        values: list[Any] = list(args) + [None] * (len(self.specs) - len(args))
        given = [True] * len(args) + [False] * (len(self.specs) - len(args))
        for name, value in kwargs.items():
            index = self._index.get(name)
            if index is None:
                raise TypeError(
                    f"the {self._model} has no input {name!r}; its user inputs are {list(self.names)} "
                    f"({self.signature()})"
                )
            if given[index]:
                raise TypeError(f"input {name!r} of the {self._model} is given twice (by position and by name)")
            values[index], given[index] = value, True
        missing = [self.specs[i] for i, ok in enumerate(given) if not ok]
        if missing:
            listed = ", ".join(f"{spec.name!r} ({spec.describe()})" for spec in missing)
            raise TypeError(f"missing input {listed} of the {self._model}; it takes {self.signature()}")
        return values

    def _check(self, index: int, value: Any, sizes: dict[str, tuple[int, str]]) -> np.ndarray | ort.OrtValue:
        spec = self.specs[index]
        if value.__class__ is np.ndarray and value.flags.c_contiguous and value.dtype.isnative:
            dtype, shape = value.dtype, value.shape
        elif isinstance(value, ort.OrtValue):
            if not value.is_tensor():
                raise TypeError(f"input {spec.name!r} of the {self._model} must be a tensor OrtValue")
            dtype, shape = dtypes.to_numpy_dtype(value.element_type()), tuple(value.shape())
        elif isinstance(value, (np.ndarray, np.generic)):
            value = np.ascontiguousarray(value)
            if not value.dtype.isnative:
                value = value.astype(value.dtype.newbyteorder("="))
            dtype, shape = value.dtype, value.shape
        else:
            raise TypeError(
                f"input {spec.name!r} of the {self._model} must be a numpy.ndarray or an onnxruntime.OrtValue "
                f"({spec.describe()}), not {type(value).__name__}{_conversion_hint(value)}"
            )
        if spec.is_string and not isinstance(value, ort.OrtValue) and dtype.kind in "USO":
            value = _string_array(value, f"input {spec.name!r} of the {self._model}")
            dtype = value.dtype
        if not spec.fits(dtype, shape):
            if spec.is_string:
                hint = ": cast it with .astype(str) (arrays of str or bytes, and object arrays of str, are taken)"
            elif _class_scores_for_labels(spec, dtype, shape):
                hint = (
                    ": these look like one-hot labels or class probabilities (one more axis than the labels); "
                    f"pass the class indices, labels.argmax(axis=-1).astype({cast_hint(spec.dtype)}), or train "
                    "with a loss that takes probabilities as targets"
                )
            else:
                hint = f": cast it with .astype({cast_hint(spec.dtype)})"
            hint = hint if dtype != spec.dtype else _transpose_hint(spec, shape) or _unit_axis_hint(spec, shape)
            raise (TypeError if dtype != spec.dtype else ValueError)(
                f"input {spec.name!r} of the {self._model} is {spec.describe()}; got "
                f"{dtype_text(dtype)}{shape_text(shape)}{hint}"
            )
        if index == self.data_index and 0 in shape:
            self._refuse_empty(spec, shape)
        for axis, dim in self._symbolic[index]:
            size = shape[axis]
            seen = sizes.setdefault(dim, (size, spec.name))
            if seen[0] != size:
                notes = "".join(
                    f"; {s.name!r}: {s.note}" for s in self.specs if s.name in (spec.name, seen[1]) and s.note
                )
                raise ValueError(
                    f"input {spec.name!r} of the {self._model} has {dim} = {size}, but input {seen[1]!r} has "
                    f"{dim} = {seen[0]} ({self.signature()}){notes}"
                )
        return value

    def _refuse_empty(self, spec: TensorSpec, shape: Sequence[int]) -> None:
        """``ValueError`` where the data input ``spec`` of ``shape`` holds no values along a dimension that the
        model does not fix (a dimension fixed at 0 is the model's own)."""
        dims = spec.dims
        axis = next((k for k, n in enumerate(shape) if n == 0 and (dims is None or not isinstance(dims[k], int))), None)
        if axis is None:
            return
        dim = None if dims is None else dims[axis]
        named = f"{dim} = 0" if isinstance(dim, str) else f"axis {axis} is 0"
        if axis == 0:
            where = f"holds 0 rows ({named}): a slice past the end of the data?"
        else:
            at = f", axis {axis}" if isinstance(dim, str) else ""
            where = f"holds no values (shape {shape_text(shape)}: {named}{at}): an empty slice of the data?"
        raise ValueError(
            f"input {spec.name!r} of the {self._model} {where} A step over an empty batch computes no loss "
            "(onnxruntime's mean over none is 0, torch's nan), and a train step would give the optimizer zero "
            f"gradients: pass at least one row ({self.signature()})"
        )


__all__ = ["UserInputs"]
