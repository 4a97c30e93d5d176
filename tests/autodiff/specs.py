"""The spec table: one or more :class:`Spec` per gradient rule, checked in ``test_rules.py``.

A spec says how to build a one-node model for an operator and what data it
accepts: the graph inputs (:class:`Arg`: value domain, differentiated or not,
fixed shape), a Hypothesis strategy of :class:`Case` (input shapes,
attributes, extra constant inputs such as axes), the opset and dtype, and the
kinks to stay away from (finite differences are meaningless across a kink).
float64 is the default; float32 where onnxruntime's CPU provider has no double
kernel for the operator.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

Shape = tuple[int, ...]

#: Value domains of inputs: ``(low, high)`` uniform ranges, or "real" (standard normal),
#: "real2" (normal with sd 2), "nonzero" (|x| in [0.5, 1.5], random sign), "sparse" (normal, about
#: 30% of the entries exactly 0), "bool", "int".
Domain = str | tuple[float, float]


@dataclass(frozen=True)
class Arg:
    """One graph input of a spec's model."""

    domain: Domain = "real"
    diff: bool = True
    shape: Shape | None = None  # a fixed shape; None: drawn with the case
    dtype: Any = None  # None: the spec's dtype; np.bool_ / np.int64 for non-float inputs


@dataclass(frozen=True)
class Extra:
    """An extra (integer) node input: an initializer, or a graph input when ``fed``.

    ``value`` may be nested tuples (an N-D tensor); ``dtype`` defaults to int64
    (``np.float32`` for float parameters such as Resize's scales). ``unknown``:
    the axes a fed input declares no size for (GatherND's index depth).
    """

    index: int
    value: tuple[Any, ...]
    fed: bool = False
    dtype: Any = None
    unknown: tuple[int, ...] = ()


@dataclass(frozen=True)
class Case:
    """One drawn configuration: a shape per non-fixed arg, attributes, extra inputs."""

    shapes: tuple[Shape, ...]
    attrs: tuple[tuple[str, Any], ...] = ()
    extras: tuple[Extra, ...] = ()
    used_outputs: tuple[int, ...] = (0,)
    n_outputs: int = 1


@dataclass(frozen=True)
class Spec:
    """How to check the gradient rule of ``op_type`` (see the module docstring).

    ``wiring[k]`` is the arg feeding node input ``k`` (``None``: omitted; a str: a value
    that ``before`` computes); by default arg ``k`` feeds input ``k``. ``kinks(attrs)``
    lists points the float inputs must stay away from; ``valid(arrays, attrs)`` rejects
    other bad draws.
    """

    op_type: str
    args: tuple[Arg, ...]
    cases: st.SearchStrategy[Case]
    opset: int = 17
    dtype: Any = np.float64
    domain: str = ""
    wiring: tuple[int | str | None, ...] | None = None
    kinks: Callable[[Mapping[str, Any]], Sequence[float]] = lambda attrs: ()
    valid: Callable[[Sequence[np.ndarray], Mapping[str, Any]], bool] | None = None
    variant: str = ""
    extra_opsets: tuple[tuple[str, int], ...] = field(default=())
    #: Nodes run before the operator (on the graph inputs ``x0``, ``x1``, ... and ``extra<k>``), for
    #: operands a graph input cannot give, such as sequences: ``before(case)``.
    before: Callable[[Case], Sequence[Any]] | None = None
    #: Nodes run after it, for outputs the loss cannot project (sequences): ``after(case, outputs)``
    #: returns ``(nodes, tensors to project)``; the loss then projects every one of those tensors.
    after: Callable[[Case, Sequence[str]], tuple[Sequence[Any], Sequence[str]]] | None = None

    @property
    def id(self) -> str:
        """A readable pytest id: ``Mul``, ``Mul-aliased``, ``ReduceSum-opset13``."""
        return f"{self.op_type}-{self.variant}" if self.variant else self.op_type


# ------------------------------------------------------------------ strategies


def _fixed(attrs: Mapping[str, Any] | None = None) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((attrs or {}).items()))


def shapes_of(n: int, max_dims: int = 3) -> st.SearchStrategy[tuple[Shape, ...]]:
    """``n`` mutually broadcastable shapes."""
    if n == 1:
        return hnp.array_shapes(min_dims=0, max_dims=max_dims, min_side=1, max_side=4).map(lambda s: (s,))
    return hnp.mutually_broadcastable_shapes(num_shapes=n, min_dims=0, max_dims=max_dims, max_side=4).map(
        lambda s: tuple(s.input_shapes)
    )


def cases(
    n_shapes: int, attrs: st.SearchStrategy[dict[str, Any]] | Mapping[str, Any] | None = None
) -> st.SearchStrategy[Case]:
    """Cases with ``n_shapes`` broadcastable shapes and (drawn or fixed) attributes."""
    attr_strategy = attrs if isinstance(attrs, st.SearchStrategy) else st.just(dict(attrs or {}))
    return st.builds(lambda shapes, a: Case(shapes, _fixed(a)), shapes_of(n_shapes), attr_strategy)


def unary(
    op_type: str,
    domain: Domain = "real",
    *,
    dtype: Any = np.float64,
    attrs: st.SearchStrategy[dict[str, Any]] | Mapping[str, Any] | None = None,
    kinks: Callable[[Mapping[str, Any]], Sequence[float]] | Sequence[float] = (),
    opset: int = 17,
    variant: str = "",
) -> Spec:
    """A spec for a one-input operator."""
    kink_fn = kinks if callable(kinks) else (lambda attrs, k=tuple(kinks): k)
    return Spec(op_type, (Arg(domain),), cases(1, attrs), opset, dtype, kinks=kink_fn, variant=variant)


def binary(op_type: str, a: Domain = "real", b: Domain = "real", *, dtype: Any = np.float64, **kw: Any) -> Spec:
    """A spec for a broadcasting two-input operator."""
    return Spec(op_type, (Arg(a), Arg(b)), cases(2), dtype=dtype, **kw)


def variadic(op_type: str, n: int, *, dtype: Any = np.float64, **kw: Any) -> Spec:
    """A spec for a broadcasting ``n``-input operator."""
    return Spec(op_type, tuple(Arg() for _ in range(n)), cases(n), dtype=dtype, variant=f"{n}-inputs", **kw)


def separated(arrays: Sequence[np.ndarray], attrs: Mapping[str, Any], gap: float = 1e-2) -> bool:
    """Whether the float inputs differ pairwise by more than ``gap`` everywhere (no ties)."""
    floats = [a for a in arrays if a.dtype.kind == "f"]
    if len(floats) < 2:
        return True
    stacked = np.stack(np.broadcast_arrays(*floats))
    ordered = np.sort(stacked, axis=0)
    return bool(np.all(np.diff(ordered, axis=0) > gap))


# ------------------------------------------------------------------ reductions


@st.composite
def reduce_cases(draw: st.DrawFn, op_type: str, opset: int) -> Case:
    """A shape, axes (as attribute, initializer or graph input, by opset), keepdims and noop."""
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
    rank = len(shape)
    axes_as_input = opset >= (13 if op_type == "ReduceSum" else 18)
    mode = draw(st.sampled_from(["none", "given"]))
    axes: list[int] = []
    if mode == "given":
        chosen = draw(st.lists(st.integers(0, rank - 1), unique=True, max_size=rank))
        axes = [a - rank if draw(st.booleans()) else a for a in chosen]
    attrs: dict[str, Any] = {"keepdims": draw(st.integers(0, 1))}
    extras: tuple[Extra, ...] = ()
    if axes_as_input:
        attrs["noop_with_empty_axes"] = draw(st.integers(0, 1))
        if mode == "given":
            extras = (Extra(1, tuple(axes), fed=draw(st.booleans())),)
    elif axes:
        attrs["axes"] = tuple(axes)
    return Case((shape,), _fixed(attrs), extras)


def reduction(op_type: str, opset: int, domain: Domain = "real", kinks: Sequence[float] = ()) -> Spec:
    """A spec for ``op_type`` at ``opset`` (axes attribute before 18, input from 18; ReduceSum: 13)."""
    return Spec(
        op_type,
        (Arg(domain),),
        reduce_cases(op_type, opset),
        opset,
        kinks=lambda attrs, k=tuple(kinks): k,
        valid=_no_reduction_ties if op_type in ("ReduceMax", "ReduceMin") else None,
        variant=f"opset{opset}",
    )


def _no_reduction_ties(arrays: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> bool:
    values = np.sort(arrays[0].reshape(-1))
    return bool(np.all(np.diff(values) > 1e-2)) if values.size > 1 else True


# ---------------------------------------------------------------------- split


@st.composite
def split_cases(draw: st.DrawFn, opset: int) -> Case:
    """A shape with a splittable axis, split into 2 or 3 parts; some outputs unused in the loss."""
    shape = list(draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4)))
    axis = draw(st.integers(0, len(shape) - 1))
    parts = draw(st.integers(2, 3))
    sizes = draw(st.lists(st.integers(1, 3), min_size=parts, max_size=parts))
    shape[axis] = sum(sizes)
    used = tuple(draw(st.lists(st.integers(0, parts - 1), unique=True, min_size=1, max_size=parts)))
    attrs: dict[str, Any] = {"axis": axis - len(shape) if draw(st.booleans()) else axis}
    if opset >= 18 and draw(st.booleans()):
        attrs["num_outputs"] = parts
        chunk = -(-shape[axis] // parts)
        if shape[axis] - chunk * (parts - 1) <= 0:
            sizes = [1] * parts
            shape[axis] = parts
        extras: tuple[Extra, ...] = ()
    else:
        extras = (Extra(1, tuple(sizes)),)
    return Case((tuple(shape),), _fixed(attrs), extras, used_outputs=tuple(sorted(used)), n_outputs=parts)


# ---------------------------------------------------------------------- PRelu


@st.composite
def prelu_cases(draw: st.DrawFn) -> Case:
    """``x`` and a slope that broadcasts to ``x``'s shape (unidirectionally)."""
    x = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4))
    tail = draw(st.integers(0, len(x)))
    slope = tuple(d if draw(st.booleans()) else 1 for d in x[len(x) - tail :])
    return Case((x, slope))


# ------------------------------------------------------------------ the table

_F32 = np.float32
_AWAY_FROM_ZERO = (0.0,)


def _hard_sigmoid_kinks(attrs: Mapping[str, Any]) -> tuple[float, float]:
    alpha, beta = attrs.get("alpha", 0.2), attrs.get("beta", 0.5)
    return (-beta / alpha, (1 - beta) / alpha)


def _clip_valid(arrays: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> bool:
    x, *bounds = arrays
    return all(np.all(np.abs(x - b) > 5e-2) for b in bounds)


SPECS: list[Spec] = [
    # arithmetic
    binary("Add"),
    binary("Sub"),
    binary("Mul"),
    binary("Div", "real", "nonzero"),
    binary("Pow", (0.5, 2.0), (-2.0, 2.0)),
    Spec("Pow", (Arg("real"), Arg((0, 3), diff=False, dtype=np.int64)), cases(2), variant="int-exponent"),
    Spec("Pow", (Arg((0.5, 2.0)),), cases(1), wiring=(0, 0), variant="aliased"),
    Spec("Add", (Arg(),), cases(1), wiring=(0, 0), variant="aliased"),
    Spec("Sub", (Arg(),), cases(1), wiring=(0, 0), variant="aliased"),
    Spec("Mul", (Arg(),), cases(1), wiring=(0, 0), variant="aliased"),
    Spec("Div", (Arg("nonzero"),), cases(1), wiring=(0, 0), variant="aliased"),
    Spec("Mul", (Arg(), Arg(diff=False)), cases(2), variant="one-input-differentiated"),
    unary("Neg"),
    unary("Abs", kinks=_AWAY_FROM_ZERO),
    unary("Reciprocal", "nonzero"),
    unary("Sqrt", (0.2, 3.0)),
    unary("Exp"),
    unary("Log", (0.2, 3.0)),
    unary("Identity"),
    unary("Cast", attrs={"to": 11}, variant="double-to-double"),
    unary("Cast", dtype=_F32, attrs={"to": 11}, variant="float-to-double"),
    variadic("Sum", 1),
    variadic("Sum", 3),
    variadic("Mean", 2, dtype=_F32),
    variadic("Max", 1),
    variadic("Max", 2, valid=separated),
    variadic("Max", 3, valid=separated),
    variadic("Min", 2, valid=separated),
    Spec("Max", (Arg(),), cases(1), wiring=(0, 0), variant="aliased-tie"),
    Spec("Where", (Arg("bool", diff=False, dtype=np.bool_), Arg(), Arg()), cases(3)),
    Spec("Clip", (Arg("real2"), Arg((-1.0, -0.2), shape=()), Arg((0.2, 1.0), shape=())), cases(1), valid=_clip_valid),
    Spec(
        "Clip",
        (Arg("real2"), Arg((0.2, 1.0), shape=())),
        cases(1),
        wiring=(0, None, 1),
        valid=_clip_valid,
        variant="max-only",
    ),
    Spec("Clip", (Arg("real2"),), cases(1), variant="no-bounds"),
    # transcendental
    unary("Erf", dtype=_F32),
    unary("Sin"),
    unary("Cos"),
    unary("Tan", (-1.2, 1.2), dtype=_F32),
    unary("Asin", (-0.9, 0.9), dtype=_F32),
    unary("Acos", (-0.9, 0.9), dtype=_F32),
    unary("Atan", "real2", dtype=_F32),
    unary("Sinh", dtype=_F32),
    unary("Cosh", dtype=_F32),
    unary("Tanh"),
    unary("Asinh", "real2", dtype=_F32),
    unary("Acosh", (1.2, 3.0), dtype=_F32),
    unary("Atanh", (-0.9, 0.9), dtype=_F32),
    # activations
    unary("Sigmoid", "real2"),
    unary("Softplus", "real2", dtype=_F32),
    unary("Softsign", "real2", dtype=_F32, kinks=_AWAY_FROM_ZERO),
    unary("Relu", kinks=_AWAY_FROM_ZERO),
    unary(
        "LeakyRelu",
        # a slope in [0, 1] takes the product form, others Where
        attrs=st.fixed_dictionaries({}, optional={"alpha": st.sampled_from([0.01, 0.3, 0.0, 1.0, 1.5, -0.2])}),
        kinks=_AWAY_FROM_ZERO,
    ),
    unary(
        "ThresholdedRelu",
        "real2",
        dtype=_F32,
        attrs=st.fixed_dictionaries({}, optional={"alpha": st.just(0.5)}),
        kinks=lambda attrs: (attrs.get("alpha", 1.0),),
    ),
    Spec("PRelu", (Arg("real"), Arg("real")), prelu_cases(), kinks=lambda attrs: _AWAY_FROM_ZERO),
    unary(
        "Elu",
        dtype=_F32,
        # 1 (the default) and [0, 1) take the product forms, others Where
        attrs=st.fixed_dictionaries({}, optional={"alpha": st.sampled_from([0.5, 0.0, 1.5])}),
        kinks=_AWAY_FROM_ZERO,
    ),
    unary("Selu", dtype=_F32, kinks=_AWAY_FROM_ZERO),
    unary(
        "Celu",
        dtype=_F32,
        attrs=st.fixed_dictionaries({}, optional={"alpha": st.sampled_from([2.0, 0.4])}),
        kinks=_AWAY_FROM_ZERO,
    ),
    unary(
        "HardSigmoid",
        "real2",
        dtype=_F32,
        attrs=st.fixed_dictionaries({}, optional={"alpha": st.just(0.5), "beta": st.just(0.6)}),
        kinks=_hard_sigmoid_kinks,
    ),
    unary("HardSwish", (-4.5, 4.5), dtype=_F32, opset=17, kinks=(-3.0, 3.0)),
    unary("Mish", "real2", opset=18),
    unary(
        "Gelu",
        "real2",
        dtype=_F32,
        opset=20,
        attrs=st.fixed_dictionaries({}, optional={"approximate": st.sampled_from(["none", "tanh"])}),
    ),
    # reductions
    *(
        reduction(op, opset)
        for op in ("ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceLogSumExp")
        for opset in (13, 18)
    ),
    *(reduction(op, opset) for op in ("ReduceMax", "ReduceMin", "ReduceL2") for opset in (13, 18)),
    *(reduction("ReduceL1", opset, kinks=_AWAY_FROM_ZERO) for opset in (13, 18)),
    *(reduction("ReduceProd", opset, "nonzero") for opset in (13, 18)),
    *(reduction("ReduceLogSum", opset, (0.2, 3.0)) for opset in (13, 18)),
    # shape
    *(Spec("Split", (Arg(),), split_cases(opset), opset, variant=f"opset{opset}") for opset in (13, 18)),
]

#: The oldest opset onnxtrain reads, for rules whose emitted ops differ most across opsets
#: (onnxruntime has no double kernel for PRelu before opset 16).
SPECS += [
    replace(
        spec,
        opset=13,
        dtype=_F32 if spec.op_type == "PRelu" else spec.dtype,
        variant=f"{spec.variant}-opset13" if spec.variant else "opset13",
    )
    for spec in SPECS
    if spec.id in ("Add", "Mul", "Max-2-inputs", "Where", "Clip", "PRelu", "Relu")
]


# ------------------------------------------------------------------ casts, remainders, determinants, one-hot


def _mod_valid(arrays: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> bool:
    """a / b at least 1e-3 away from the non-zero integers, where trunc(a / b) jumps."""
    q = np.abs(arrays[0] / arrays[1])
    nearest = np.round(q)
    return bool(np.all((nearest == 0) | (np.abs(q - nearest) > 1e-3)))


@st.composite
def det_cases(draw: st.DrawFn) -> Case:
    """Square matrices of size 1 to 4, with 0 to 2 batch axes."""
    n = draw(st.integers(1, 4))
    batch = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=3))
    return Case(((*batch, n, n),))


@st.composite
def one_hot_cases(draw: st.DrawFn) -> Case:
    """Indices of rank 1-2 (onnxruntime wants >= 1; negative and out-of-range ones included), depth 1-4, any axis."""
    depth = draw(st.integers(1, 4))
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=3))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    indices = rng.integers(-depth - 1, depth + 1, size=shape)
    nested = (
        indices.item() if indices.ndim == 0 else tuple(map(tuple, indices)) if indices.ndim == 2 else tuple(indices)
    )
    axis = draw(st.integers(-len(shape) - 1, len(shape)))
    fed = draw(st.booleans())
    attrs = {"axis": axis} if axis != -1 or draw(st.booleans()) else {}
    return Case((), _fixed(attrs), (Extra(0, nested, fed), Extra(1, depth, fed)))


SPECS += [
    Spec("CastLike", (Arg(), Arg(diff=False, shape=())), cases(1), opset=21, variant="double-like-double"),
    Spec(
        "CastLike",
        (Arg(), Arg(diff=False, shape=(), dtype=np.float64)),
        cases(1),
        opset=21,
        dtype=_F32,
        variant="float-like-double",
    ),
    Spec("CastLike", (Arg(), Arg(diff=False, shape=(2,))), cases(1), opset=15, variant="opset15"),
    unary(
        "Shrink",
        "real2",
        dtype=_F32,  # onnxruntime's double Shrink rounds through float
        attrs=st.fixed_dictionaries(
            {}, optional={"lambd": st.sampled_from([0.0, 0.3, 1.0]), "bias": st.sampled_from([0.0, 0.5])}
        ),
        kinks=lambda attrs: (-attrs.get("lambd", 0.5), attrs.get("lambd", 0.5)),
    ),
    unary("Swish", "real2", opset=24, attrs=st.fixed_dictionaries({}, optional={"alpha": st.sampled_from([0.5, 2.0])})),
    Spec("Mod", (Arg("real2"), Arg("nonzero")), cases(2, {"fmod": 1}), valid=_mod_valid),
    Spec("Mod", (Arg("real2"), Arg("nonzero")), cases(2, {"fmod": 1}), opset=13, valid=_mod_valid, variant="opset13"),
    # onnxruntime has float kernels only for Det and OneHot
    Spec("Det", (Arg(),), det_cases(), dtype=_F32),
    Spec("Det", (Arg(),), det_cases(), opset=22, dtype=_F32, variant="opset22"),
    Spec("OneHot", (Arg(shape=(2,)),), one_hot_cases(), dtype=_F32, wiring=(None, None, 0)),
]
