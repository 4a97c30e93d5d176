"""Holding recomputed nodes back until the backward needs them: a data dependency that changes no value.

onnxruntime runs, of the nodes whose inputs are ready, the one of lowest
index; the nodes its fusions make (``FastGelu``, ``FusedMatMul``...) are
numbered after every node of the model loaded. A copy that recomputes a
segment from a checkpoint is ready as soon as the forward makes that
checkpoint, so it runs whenever the next forward node is a fused one: in the
forward, where its outputs live until the backward reads them, which undoes
the saving of checkpointing. A *hold* makes the copy wait for a gradient:

    flat  = Reshape(g, [1, -1])                     # g: a gradient the backward makes before the copy's reader
    first = Reshape(Slice(flat, [0, 0], [1, 1]), [-1])  # one element, or none when g is empty
    one   = Gather(Concat(first, [1]), -1)          # 1 of g's type, whatever g holds, once g is made
    x'    = Mul(x, one)                             # x, bit for bit (x * 1 is x in IEEE arithmetic)

and the copy reads ``x'`` for ``x`` (a float ``x`` of another type than
``g``'s: ``one = Cast(cond)``, ``cond = Gather(Concat(Cast(first, BOOL),
[True]), -1)``). A product, not ``Where(cond, x, x)``: onnxruntime's CPU
``Where`` is a scalar loop (13 ms a step for a ``[16, 64, 4000]`` activation
of a 1-D convolutional net, 2 cores; a product of that size about 1 ms).
Integers (int32, int64, uint8) are held by ``Where(cond, x, x)``.
onnxruntime lacks both kernels for some types on the
CPU (bool, bfloat16, the 8- and 16-bit integers); a value of those, of rank
1 or more, is held by appending nothing to it along its first axis:

    none  = Cast(Slice(flat, [0], [0]), to=T)                   # no element, of x's type T, once g is made
    x'    = Concat(x, Reshape(none, [0, *Shape(x)[1:]]), axis=0)  # x, bit for bit

Each costs one pass over ``x``. An element-wise copy that reads a constant
of one element ``c`` (the ``3`` of ``Pow(x, 3)``, the ``0.5`` of
``Mul(x, 0.5)``) reads ``c`` held instead, which costs one element, not a
pass over ``x`` (GPT-2's GELU: two passes of 48 MiB per layer at 16 x 256):

    c' = Reshape(Gather(Concat(first, [c]), -1), Shape(c))   # c, once g is made (c of g's type)
    c' = Mul(c, one)                                          # (c of another float type)

``flat`` is a row, not a vector: onnx's
data propagation reads a 1-D ``Slice``'s input element by element, about
70 bytes each, which for the gradient of a batch of 10**7 is gigabytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, MutableMapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxtrain.graph.dtypes import is_float
from onnxtrain.graph.naming import first_free
from onnxtrain.graph.walk import constant_tensors

INT64_MAX = int(np.iinfo(np.int64).max)

#: The float types onnxruntime's ``Mul``, ``Concat``, ``Gather`` and ``Cast`` take on the CPU in every release we
#: support: values held by ``Mul(x, 1)``.
MULTIPLIED_TYPES = frozenset({TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16})
#: The integer types onnxruntime's ``Where`` takes on the CPU in every release we support: values held by ``Where``
#: (others, of rank 1 or more, by ``Concat``).
HELD_TYPES = frozenset({TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8})


def hold_copies(
    graph: onnx.GraphProto,
    backward: Sequence[onnx.NodeProto],
    placed: MutableMapping[int, list[onnx.NodeProto]],
    *,
    available: Collection[str],
    elem_type: Callable[[str], int | None],
    rank: Callable[[str], int | None],
    small: Callable[[str], bool],
    taken: set[str],
    opset: int,
    values_only: Callable[[onnx.NodeProto], bool] = lambda node: False,
) -> int:
    """Hold back each list of copies ``placed[p]`` (the copies to insert before ``backward[p]``, in an order
    they can run in) until a gradient ``backward[p]`` reads is made, in place; returns the number of holds.

    A copy that reads no held copy's output reads one of its inputs through
    a hold: one not in ``available`` (initializers, constants) whose element
    type is in :data:`MULTIPLIED_TYPES` (held by ``Mul``) or :data:`HELD_TYPES`
    (held by ``Where``) or is another tensor type of known ``rank`` of 1 or
    more, strings aside (held by ``Concat``);
    preferably not ``small`` (a shape held is a shape onnxruntime no longer
    knows before it runs), then preferably no graph input (a parameter: a
    copy of the weight each step), then the first in the copy's input order.
    A copy with no such input is not held (its inputs are constants); one
    whose inputs are parameters alone (a weight transposed or cast to a half
    type) holds a parameter. A copy that has such an input and reads its
    inputs as values only (``values_only``: an element-wise operator, whose
    output's shape no input's values decide) holds instead its first
    constant of one element of a type in :data:`MULTIPLIED_TYPES`, where it
    reads one. The gradient waited for: a float input of
    ``backward[p]`` made by an earlier backward node, else any input so
    made, else an output of ``backward[p - 1]``; copies placed before the
    first backward node are not held. Each hold goes right before its
    copy, the nodes making its condition before the first hold of the list;
    the constants they read are added to ``graph``'s initializers. ``opset``:
    the graph's ai.onnx opset.
    """

    def holdable(name: str) -> bool:
        kind = elem_type(name)
        if kind in HELD_TYPES or kind in MULTIPLIED_TYPES:
            return True
        return kind not in (None, TensorProto.UNDEFINED, TensorProto.STRING) and (rank(name) or 0) >= 1

    made_at = {name: index for index, node in enumerate(backward) for name in node.output if name}
    inputs = {value.name for value in graph.input}
    constants: dict[str, str] = {}
    scalars = _one_element_constants(graph)

    def constant(role: str) -> str:
        """The initializer of ``role`` (:func:`_constant`), added to ``graph`` on first use."""
        if role not in constants:
            constants[role] = first_free(f"hold.{role}", taken)
            graph.initializer.append(numpy_helper.from_array(_constant(role), constants[role]))
        return constants[role]

    held_outputs: set[str] = set()
    holds = 0
    for index in sorted(placed):
        gradient = _gradient_read(backward, index, made_at, elem_type)
        if gradient is None:
            continue
        signals = _Signals(graph, gradient, elem_type(gradient), constant, taken)
        held: dict[str, str] = {}
        nodes: list[onnx.NodeProto] = []
        for copy in placed[index]:
            if held_outputs.isdisjoint(copy.input):  # else it waits for a held copy already
                candidates = [name for name in copy.input if name and name not in available and holdable(name)]
                if not candidates:  # made from constants: it may run early
                    nodes.append(copy)
                    continue
                scalar = next((n for n in copy.input if n in scalars), None) if values_only(copy) else None
                name = scalar or min(candidates, key=lambda name: (small(name), name in inputs))
                if name not in held and name == scalar:
                    held[name] = first_free(f"{name}.held", taken)
                    nodes.extend(signals.constant(scalars[name], name, held[name], nodes))
                elif name not in held:
                    held[name] = first_free(f"{name}.held", taken)
                    kind = elem_type(name)
                    if kind in MULTIPLIED_TYPES:
                        assert kind is not None
                        one = signals.one(kind, nodes)
                        nodes.append(helper.make_node("Mul", [name, one], [held[name]], name=held[name]))
                    else:
                        condition, flat = signals.true(nodes), signals.flat(nodes)
                        nodes.extend(_hold(name, held[name], kind, condition, flat, constant, taken, opset))
                copy.input[:] = [held[name] if input_ == name else input_ for input_ in copy.input]
            held_outputs.update(copy.output)
            nodes.append(copy)
        placed[index][:] = nodes
        holds += len(held)
    return holds


def _gradient_read(
    backward: Sequence[onnx.NodeProto],
    index: int,
    made_at: Mapping[str, int],
    elem_type: Callable[[str], int | None],
) -> str | None:
    """The value copies placed before ``backward[index]`` wait for (see :func:`hold_copies`), or ``None``."""
    made_before = [name for name in backward[index].input if made_at.get(name, index) < index]
    floats = [name for name in made_before if is_float(elem_type(name) or 0)]
    if floats or made_before:
        return (floats or made_before)[0]
    earlier = [name for name in backward[index - 1].output if name] if index > 0 else []
    return earlier[0] if earlier else None


def _one_element_constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """``graph``'s constants of one element of a type in :data:`MULTIPLIED_TYPES`, by name, with their values."""
    found = {}
    for name, tensor in constant_tensors(graph).items():
        stored = tensor.data_location != TensorProto.EXTERNAL
        if stored and tensor.data_type in MULTIPLIED_TYPES and math.prod(tensor.dims) == 1:
            found[name] = numpy_helper.to_array(tensor)
    return found


class _Signals:
    """The values one list of holds reads, made from ``gradient`` on first use (see the module docstring): the
    gradient flattened to a row, its first element (none where it is empty), ``True``, and 1 of each float type.
    Each method appends the nodes it makes to ``nodes``; the constants they read go to ``graph``'s
    initializers."""

    def __init__(
        self, graph: onnx.GraphProto, gradient: str, gradient_type: int | None, constant: Callable[[str], str],
        taken: set[str],
    ) -> None:  # fmt: skip
        self._gradient, self._type, self._constant, self._taken = gradient, gradient_type, constant, taken
        self._initializers = graph.initializer
        self._made: dict[str, str] = {}

    def _out(self, role: str) -> str:
        return first_free(f"{self._gradient}.hold_{role}", self._taken)

    def flat(self, nodes: list[onnx.NodeProto]) -> str:
        """``gradient`` as a row ``[1, -1]``."""
        if "flat" not in self._made:
            flat = self._made["flat"] = self._out("flat")
            nodes.append(helper.make_node("Reshape", [self._gradient, self._constant("row")], [flat], name=flat))
        return self._made["flat"]

    def first(self, nodes: list[onnx.NodeProto]) -> str:
        """The gradient's first element as a vector (of no element where the gradient is empty)."""
        if "first" not in self._made:
            flat, corner, first = self.flat(nodes), self._out("corner"), self._out("first")
            nodes += [
                helper.make_node(
                    "Slice", [flat, self._constant("origin"), self._constant("corner")], [corner], name=corner
                ),
                helper.make_node("Reshape", [corner, self._constant("flat")], [first], name=first),
            ]
            self._made["first"] = first
        return self._made["first"]

    def true(self, nodes: list[onnx.NodeProto]) -> str:
        """``Gather(Concat(Cast(first, BOOL), [True]), -1)``: ``True``, whatever the gradient holds."""
        if "true" not in self._made:
            first, some, pair, condition = (
                self.first(nodes),
                self._out("some"),
                self._out("pair"),
                self._out("condition"),
            )
            nodes += [
                helper.make_node("Cast", [first], [some], name=some, to=TensorProto.BOOL),
                helper.make_node("Concat", [some, self._constant("true")], [pair], name=pair, axis=0),
                helper.make_node("Gather", [pair, self._constant("index")], [condition], name=condition, axis=0),
            ]
            self._made["true"] = condition
        return self._made["true"]

    def one(self, elem_type: int, nodes: list[onnx.NodeProto]) -> str:
        """A scalar 1 of ``elem_type``: ``Gather(Concat(first, [1]), -1)`` in the gradient's own type, else
        ``True`` cast (no constant onnxruntime could fold: it waits for the gradient)."""
        role = f"one_{elem_type}"
        if role not in self._made:
            one = self._made[role] = self._out(f"one_{TensorProto.DataType.Name(elem_type).lower()}")
            if elem_type == self._type:
                pair = self._out("ones")
                nodes += [
                    helper.make_node("Concat", [self.first(nodes), self._constant(role)], [pair], name=pair, axis=0),
                    helper.make_node("Gather", [pair, self._constant("index")], [one], name=one, axis=0),
                ]
            else:
                nodes.append(helper.make_node("Cast", [self.true(nodes)], [one], name=one, to=elem_type))
        return self._made[role]

    def constant(self, value: np.ndarray, name: str, held: str, nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
        """The nodes making ``held``: the constant ``name`` of one element ``value``, once the gradient is made
        (see the module docstring); the signals they read are appended to ``nodes`` first."""
        elem_type = helper.np_dtype_to_tensor_dtype(value.dtype)
        if elem_type != self._type:
            return [helper.make_node("Mul", [name, self.one(elem_type, nodes)], [held], name=held)]
        row, dims = self._out("row"), self._out("dims")
        pair, scalar = self._out("pair"), held if value.ndim == 0 else self._out("scalar")
        self._initializers.append(numpy_helper.from_array(value.reshape(1), row))
        made = [
            helper.make_node("Concat", [self.first(nodes), row], [pair], name=pair, axis=0),
            helper.make_node("Gather", [pair, self._constant("index")], [scalar], name=scalar, axis=0),
        ]
        if value.ndim:
            self._initializers.append(numpy_helper.from_array(np.array(value.shape, np.int64), dims))
            made.append(helper.make_node("Reshape", [scalar, dims], [held], name=held))
        return made


def _hold(
    value: str,
    held: str,
    elem_type: int | None,
    condition: str,
    flat: str,
    constant: Callable[[str], str],
    taken: set[str],
    opset: int,
) -> list[onnx.NodeProto]:
    """The nodes making ``held``, ``value`` once ``condition`` is made: ``Where`` for the types of
    :data:`HELD_TYPES`, else no element of ``flat`` appended along the first axis (see the module docstring)."""
    if elem_type in HELD_TYPES:
        return [helper.make_node("Where", [condition, value, value], [held], name=held)]

    def out(role: str) -> str:
        return first_free(f"{value}.hold_{role}", taken)

    empty, none, shape, dims, target, nothing = (
        out(r) for r in ("empty", "none", "shape", "dims", "target", "nothing")
    )
    reshape = {"allowzero": 1} if opset >= 14 else {}  # a 0 in the target is a size, not "as the input"
    return [
        helper.make_node("Slice", [flat, constant("zero"), constant("zero")], [empty], name=empty),
        helper.make_node("Cast", [empty], [none], name=none, to=elem_type or TensorProto.UNDEFINED),
        helper.make_node("Shape", [value], [shape], name=shape),
        helper.make_node("Slice", [shape, constant("one"), constant("end")], [dims], name=dims),
        helper.make_node("Concat", [constant("zero"), dims], [target], name=target, axis=0),
        helper.make_node("Reshape", [none, target], [nothing], name=nothing, **reshape),
        helper.make_node("Concat", [value, nothing], [held], name=held, axis=0),
    ]


def _constant(role: str) -> np.ndarray:
    """The constant a hold reads in ``role``."""
    if role == "true":
        return np.array([True])
    if role.startswith("one_"):  # one_<ONNX element type>
        return np.array([1], dtype=helper.tensor_dtype_to_np_dtype(int(role[len("one_") :])))
    values = {"row": [1, -1], "origin": [0, 0], "corner": [1, 1], "flat": [-1], "zero": [0], "one": [1]}
    return np.array({**values, "index": -1, "end": [INT64_MAX]}[role], dtype=np.int64)


__all__ = ["HELD_TYPES", "MULTIPLIED_TYPES", "hold_copies"]
