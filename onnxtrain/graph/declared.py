"""A graph output's (or an intermediate value's) declared shape, checked against the graph that computes it.

Exporters can declare an output's shape wrongly. torch's TorchScript exporter
names each axis listed in ``dynamic_axes`` as told, so one name reused for two
meanings (``{"y": {0: "N", 1: "N"}}``) declares a flattened decoder output
``[N, N]`` whose second axis really is ``C * H * W``. A loss that copies the
output's shape into its target input (:func:`onnxtrain.losses._common.target_input`)
then ties the target's second axis to the batch size, and the first step fails.

:func:`check_output_shape` infers the output's shape from the graph alone (the
declarations of the graph outputs and ``value_info`` removed), twice:

1. **symbolic**: onnx shape inference over the graph inputs' own dimensions
   (names such as ``batch`` propagate; data propagation computes shape vectors);
2. **counterexample**: the same with every symbolic input dimension set to
   its own size (distinct primes from 17 on): a declaration is a claim for
   all input sizes, so one size assignment under which the graph computes
   another size disproves it, where the symbolic pass only knows "unknown"
   (e.g. ``Resize`` by scales, then ``Flatten``, of a symbolic height and width).
   An input dimension named by an expression of the others' names (torch's
   dynamo exporter's ``2*(((h - 1)//2)) + 1``, which a loss's ``InputLike``
   target copies from an output) is no size of its own: it takes the
   expression's value (unknown where it is not a whole positive number), and
   is not among the names a declaration is checked by (:func:`_derived`).

An axis is *contradicted* when either pass gives a size (or a graph-input
dimension name) other than the declared one, unless the symbolic pass
confirms the declaration; an unbound declared name (one no graph input uses)
claims nothing and is never contradicted. A contradicted axis
takes the symbolic pass's value (``None``, unknown, where it has none). Axes
that no pass can decide keep the declaration. A graph that clamps a size
(``Slice`` of a table shorter than the size given to its input) can show the
counterexample pass a contradiction that is none; the target then merely
loses that axis's name, and a warning says so.

:func:`correct_declared_shapes` applies the same check to every intermediate
``value_info`` (a contradicted one is dropped) and every graph output (its
contradicted axes corrected, with a warning) before gradients are built on
them: torch's dynamo exporter declares some at the example's size of an axis
exported as dynamic.
"""

from __future__ import annotations

import ast
import itertools
import math
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import onnx
from onnx import shape_inference

from onnxtrain import caller
from onnxtrain.graph import dtypes
from onnxtrain.graph.builder import Dim
from onnxtrain.graph.io import inferred_skeleton, skeleton

#: The prefix of the dimension names onnx's shape inference makes up for unknown sizes.
GENERATED_PREFIX = "unk__"
#: The smallest size given to a symbolic input dimension in the counterexample pass.
FIRST_SIZE = 17


class DeclaredShapeWarning(UserWarning):
    """A model output's declared shape contradicts the shape its graph computes."""


@dataclass(frozen=True)
class OutputShapeCheck:
    """A graph output's declared dimensions against those inferred from the graph.

    Attributes:
        output: the output's name.
        declared: its declared dimensions.
        inferred: the symbolic pass's dimensions (``None`` per unknown axis).
        sizes: the counterexample pass's size of each graph-input dimension name.
        at_sizes: the output's dimensions in the counterexample pass.
        contradicted: the axes whose declaration the graph contradicts.
        bound: the dimension names the graph inputs use.
    """

    output: str
    declared: tuple[Dim, ...]
    inferred: tuple[Dim, ...] | None
    sizes: Mapping[str, int]
    at_sizes: tuple[Dim, ...] | None
    contradicted: tuple[int, ...]
    bound: frozenset[str]

    def corrected(self, dims: Sequence[Dim]) -> list[Dim]:
        """``dims`` with each contradicted axis replaced by the symbolic pass's value."""
        inferred = self.inferred or (None,) * len(dims)
        return [inferred[axis] if axis in self.contradicted else d for axis, d in enumerate(dims)]

    def undecided(self) -> tuple[int, ...]:
        """The axes declared with a graph-input dimension name that neither pass could confirm or refute."""
        confirmed = {
            axis
            for axis, d in enumerate(self.declared)
            if (self.inferred is not None and self.inferred[axis] == d)
            or (self.at_sizes is not None and isinstance(d, str) and self.at_sizes[axis] == self.sizes.get(d))
        }
        return tuple(
            axis
            for axis, d in enumerate(self.declared)
            if isinstance(d, str) and d in self.bound and axis not in confirmed and axis not in self.contradicted
        )

    def message(self, elem_type: str = "") -> str:
        """What is wrong with the declaration, for a warning."""
        axes, at_sizes = [], False
        for axis in self.contradicted:
            declared = self.declared[axis]
            if self.inferred is not None and _contradicts(declared, self.inferred[axis], self.bound):
                axes.append(f"axis {axis} is {self.inferred[axis]}, not {declared}")
            else:
                at_sizes = True
                size = self.at_sizes[axis] if self.at_sizes is not None else None
                claimed = f"{declared} = {self.sizes[declared]}" if isinstance(declared, str) else str(declared)
                axes.append(f"axis {axis} is {size}, not {claimed}")
        where = " when " + ", ".join(f"{k} = {v}" for k, v in self.sizes.items()) if at_sizes else ""
        return (
            f"output {self.output!r} of the model is declared {_shape(elem_type, self.declared)}, but its graph "
            f"computes another shape{where}: {'; '.join(axes)}"
        )


def _shape(elem_type: str, dims: Sequence[Dim]) -> str:
    return f"{elem_type}[{', '.join('?' if d is None else str(d) for d in dims)}]"


def _at(declared: Dim, sizes: Mapping[str, int]) -> Dim:
    """The declared dimension under the counterexample sizes (``None``: it claims no size)."""
    if isinstance(declared, str):
        return sizes.get(declared)
    return declared


def _contradicts(declared: Dim, inferred: Dim, bound: frozenset[str]) -> bool:
    """Whether ``inferred`` (a size or a graph-input dimension name) refutes ``declared``."""
    if inferred is None or declared is None or declared == inferred:
        return False
    if isinstance(declared, str) and declared not in bound:
        return False  # a name of its own claims nothing
    if isinstance(inferred, int):
        return True
    return isinstance(declared, str)  # two graph-input names; a size declared for a name only refines it


def _dims_of(value: onnx.ValueInfoProto, *, keep_generated: bool = False) -> tuple[Dim, ...] | None:
    """The dimensions of a tensor value; onnx's made-up names count as unknown unless ``keep_generated``."""
    tensor = value.type.tensor_type
    if not value.type.HasField("tensor_type") or not tensor.HasField("shape"):
        return None
    dims: list[Dim] = []
    for dim in tensor.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(dim.dim_value)
        elif dim.HasField("dim_param") and (keep_generated or not dim.dim_param.startswith(GENERATED_PREFIX)):
            dims.append(dim.dim_param)
        else:
            dims.append(None)
    return tuple(dims)


def _primes(start: int) -> Iterator[int]:
    for n in itertools.count(start):
        if all(n % k for k in range(2, int(n**0.5) + 1)):
            yield n


def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    initializers = {tensor.name for tensor in model.graph.initializer}
    return [value for value in model.graph.input if value.name not in initializers]


def _undeclared(model: onnx.ModelProto) -> onnx.ModelProto:
    """A light copy of ``model`` without the shapes of its outputs and without ``value_info``."""
    light = skeleton(model)
    for value in light.graph.output:
        if value.type.HasField("tensor_type"):
            value.type.tensor_type.ClearField("shape")
    del light.graph.value_info[:]
    return light


def _inferred_dims(model: onnx.ModelProto) -> dict[str, tuple[Dim, ...] | None]:
    """The dimensions onnx's shape inference gives every value of ``model``'s top graph (empty where it fails)."""
    try:
        graph = inferred_skeleton(model).graph
    except (shape_inference.InferenceError, onnx.checker.ValidationError):
        return {}
    return {value.name: _dims_of(value) for value in (*graph.value_info, *graph.output)}


#: The largest exponent a dimension expression may raise a size to (``h**2``).
_MAX_POWER = 8
#: The functions a dimension expression may call (sympy's and torch's spellings), on exact rationals.
_FUNCTIONS: dict[str, Callable[..., Fraction]] = {
    "Max": max,
    "Min": min,
    "max": max,
    "min": min,
    "floor": lambda x: Fraction(math.floor(x)),
    "ceiling": lambda x: Fraction(math.ceil(x)),
    "ceil": lambda x: Fraction(math.ceil(x)),
    "Abs": abs,
    "abs": abs,
    "Mod": lambda a, b: a % b,
    "FloorDiv": lambda a, b: a // b,
    "CeilDiv": lambda a, b: -(-a // b),
}
_OPERATORS: dict[type[ast.operator], Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def _derived(name: str, symbols: set[str]) -> ast.expr | None:
    """``name`` parsed, where it is an expression of other dimension names of ``symbols`` (an exporter's
    ``2*(((h - 1)//2)) + 1``, which a loss's target input copies from an output): such a name is no size of
    its own. ``None`` for a plain name, and for a name that is not such an expression (its own symbol)."""
    try:
        tree = ast.parse(name, mode="eval").body
    except (SyntaxError, ValueError):
        return None
    if isinstance(tree, ast.Name):
        return None
    used = [node.id for node in ast.walk(tree) if isinstance(node, ast.Name)]
    if not used or not all(_allowed(node) for node in ast.walk(tree)):
        return None
    called = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    return tree if all(u in symbols and u != name for u in set(used) - called) else None


def _allowed(node: ast.AST) -> bool:
    """Whether ``node`` may be part of a size expression: integers, names, arithmetic, :data:`_FUNCTIONS`."""
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS and not node.keywords
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int) and not isinstance(node.value, bool)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):  # a square, a cube: no exponent to blow up
        return isinstance(node.right, ast.Constant) and node.right.value in range(_MAX_POWER + 1)
    return isinstance(node, (ast.Name, ast.BinOp, ast.UnaryOp, ast.USub, ast.UAdd, ast.Load, *_OPERATORS))


def _evaluate(tree: ast.expr, sizes: Mapping[str, int]) -> int | None:
    """The size expression ``tree`` (:func:`_derived`) at ``sizes``; ``None`` where it is not a whole number."""

    def value(node: ast.expr) -> Fraction:
        if isinstance(node, ast.Constant):
            return Fraction(node.value)
        if isinstance(node, ast.Name):
            return Fraction(sizes[node.id])
        if isinstance(node, ast.UnaryOp):
            return -value(node.operand) if isinstance(node.op, ast.USub) else value(node.operand)
        if isinstance(node, ast.BinOp):
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        return Fraction(_FUNCTIONS[node.func.id](*(value(argument) for argument in node.args)))

    try:
        result = value(tree)
    except (ArithmeticError, KeyError, TypeError, ValueError):
        return None
    return int(result) if isinstance(result, Fraction) and result.denominator == 1 else None


@dataclass(frozen=True)
class _Passes:
    """The two passes of the module docstring over a model whose declarations are removed: the dimensions of
    each value by the graph inputs' names (``symbolic``) and at distinct sizes (``at_sizes``)."""

    symbolic: Mapping[str, tuple[Dim, ...] | None]
    at_sizes: Mapping[str, tuple[Dim, ...] | None]
    sizes: Mapping[str, int]
    bound: frozenset[str]

    @classmethod
    def of(cls, model: onnx.ModelProto) -> _Passes:
        light = _undeclared(model)
        inputs = _graph_inputs(light)
        names = {d.dim_param for value in inputs for d in value.type.tensor_type.shape.dim if d.dim_param}
        derived = {name: tree for name in names if (tree := _derived(name, names)) is not None}
        bound = frozenset(names - derived.keys())
        symbolic = _inferred_dims(light)
        sizes: dict[str, int] = {}
        at_sizes: dict[str, tuple[Dim, ...] | None] = {}
        if bound:
            sizes = dict(zip(sorted(bound), _primes(FIRST_SIZE), strict=False))
            derived_sizes = {name: _evaluate(tree, sizes) for name, tree in derived.items()}
            for value in inputs:
                for dim in value.type.tensor_type.shape.dim:
                    size = sizes.get(dim.dim_param) or derived_sizes.get(dim.dim_param)
                    if size is not None and size > 0:
                        dim.dim_value = size
                    elif dim.dim_param:
                        dim.Clear()  # an expression that cannot be evaluated: unknown in this pass
            at_sizes = _inferred_dims(light)
        return cls(symbolic, at_sizes, sizes, bound)

    def check(self, name: str, declared: tuple[Dim, ...]) -> OutputShapeCheck:
        """``declared``, the dimensions of value ``name``, against the passes."""
        inferred, at_sizes = self.symbolic.get(name), self.at_sizes.get(name)
        if inferred is not None and len(inferred) != len(declared):
            inferred = None
        if at_sizes is not None and len(at_sizes) != len(declared):
            at_sizes = None
        contradicted = []
        for axis, d in enumerate(declared):
            by_name = inferred is not None and _contradicts(d, inferred[axis], self.bound)
            confirmed = inferred is not None and inferred[axis] == d
            by_size = (
                not confirmed  # a size clamped by the graph (Slice of a table) must not outvote a proof by name
                and at_sizes is not None
                and at_sizes[axis] is not None
                and _at(d, self.sizes) is not None
                and at_sizes[axis] != _at(d, self.sizes)
            )
            if by_name or by_size:
                contradicted.append(axis)
        return OutputShapeCheck(name, declared, inferred, self.sizes, at_sizes, tuple(contradicted), self.bound)


def check_output_shape(model: onnx.ModelProto, output: str) -> OutputShapeCheck | None:
    """``output``'s declared shape against its graph (module docstring); ``None`` when it declares none."""
    declared_value = next((value for value in model.graph.output if value.name == output), None)
    declared = None if declared_value is None else _dims_of(declared_value, keep_generated=True)
    if declared is None:
        return None
    return _Passes.of(model).check(output, declared)


def correct_declared_shapes(model: onnx.ModelProto) -> list[str]:
    """Remove from ``model``'s ``value_info`` (its top graph's) each declaration the graph contradicts (module
    docstring), and correct each graph output's contradicted axes (the symbolic pass's value, or unknown) with a
    :class:`DeclaredShapeWarning` naming the output; return the names changed.

    torch's dynamo exporter declares some values with the example's size on a dynamic axis (an ``LSTM``'s
    output, ``[batch, 5, 16]`` for a sequence axis exported at 5, and the model's output after it): gradients
    built on that declaration would hold the 5 as a constant, and a step at another length would fail. Removed,
    the value's shape is inferred from the graph again, or read at run time.
    """
    declared = {value.name: _dims_of(value, keep_generated=True) for value in model.graph.value_info}
    outputs = {value.name: _dims_of(value, keep_generated=True) for value in model.graph.output}
    if not any(declared.values()) and not any(outputs.values()):
        return []
    passes = _Passes.of(model)
    if not passes.bound:
        return []  # every input size fixed: the declarations are the sizes of the one shape the model runs
    wrong = {name for name, dims in declared.items() if dims and passes.check(name, dims).contradicted}
    if wrong:
        kept = [value for value in model.graph.value_info if value.name not in wrong]
        del model.graph.value_info[:]
        model.graph.value_info.extend(kept)
    for value in model.graph.output:
        dims = outputs[value.name]
        check = passes.check(value.name, dims) if dims else None
        if check is None or not check.contradicted:
            continue
        corrected = check.corrected(dims)
        elem_type = dtypes.dtype_name(value.type.tensor_type.elem_type)
        caller.warn(
            DeclaredShapeWarning(
                f"{check.message(elem_type)}. It is read as {_shape(elem_type, corrected)} instead (a loss's target "
                "takes that shape); correct the output's shape in the model to silence this (torch.onnx.export's "
                "dynamic_axes: one name per meaning, a new name for an axis whose size is its own; its dynamo "
                "exporter declares some outputs at the example's sizes)"
            )
        )
        for dim, size in zip(value.type.tensor_type.shape.dim, corrected, strict=True):
            if size == _dims_of_dim(dim):
                continue
            dim.Clear()
            if isinstance(size, int):
                dim.dim_value = size
            elif isinstance(size, str):
                dim.dim_param = size
        wrong.add(value.name)
    return sorted(wrong)


def _dims_of_dim(dim: onnx.TensorShapeProto.Dimension) -> Dim:
    """One dimension as :func:`_dims_of` reads it (onnx's made-up names kept)."""
    if dim.HasField("dim_value"):
        return dim.dim_value
    return dim.dim_param or None
