"""Check a gradient graph against central finite differences, both run in onnxruntime.

For a spec and a drawn case: build the one-node model, add
``loss = sum_u ReduceSum(y_u * c_u)`` for random projections ``c_u``, append
our gradient graph, and compare ``sum_i <t_i, dloss/dx_i>`` with the
directional derivative ``(f(x + h t) - f(x - h t)) / 2h`` along a random
direction ``t`` (Richardson-extrapolated in float32). One onnxruntime session
computes the loss, the outputs and the gradients, and is reused for the
finite-difference evaluations.

A spec with ``backend = "onnx.reference"`` (an attribute of a :class:`Spec`
subclass; plain specs run in onnxruntime) runs in ``onnx.reference`` instead:
for operators onnxruntime has no kernel for at the spec's opset. A spec with a
``subgraphs(case, mode)`` attribute gives the node graph attributes (``If``
branches, ``Loop`` and ``Scan`` bodies), which a hashable :class:`Case` cannot hold.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import note, reject
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnxtrain.autodiff import build_gradients
from onnxtrain.autodiff.registry import GradientRegistry
from onnxtrain.graph import GraphBuilder, dtypes, versions
from onnxtrain.sessions import inference_session
from tests.autodiff.specs import Arg, Case, Spec

#: How input dimensions are declared: sizes, names (``n4``; 1 stays 1), or unknown.
DimMode = Literal["static", "named", "unknown"]
DIM_MODES: tuple[DimMode, ...] = ("static", "named", "unknown")


#: Where a spec's model runs: onnxruntime's CPU provider, or onnx's reference evaluator.
Backend = Literal["onnxruntime", "onnx.reference"]


def backend_of(spec: Spec) -> Backend:
    """The spec's ``backend`` attribute, ``"onnxruntime"`` when it has none."""
    backend = getattr(spec, "backend", "onnxruntime")
    if backend not in ("onnxruntime", "onnx.reference"):
        raise ValueError(f"spec {spec.id}: backend={backend!r}; choose 'onnxruntime' or 'onnx.reference'")
    return backend  # type: ignore[no-any-return]


@dataclass(frozen=True)
class _Output:
    name: str


def reference_ops(spec: Spec) -> tuple[type, ...]:
    """The spec's ``reference_ops``: ``onnx.reference`` implementations of operators onnx lacks (a
    ``com.microsoft`` operator with no onnxruntime CPU kernel, checked against its definition)."""
    return tuple(getattr(spec, "reference_ops", ()))


class ReferenceSession:
    """``onnx.reference.ReferenceEvaluator`` behind the two methods of an InferenceSession used here."""

    def __init__(self, model: onnx.ModelProto, new_ops: Sequence[type] = ()) -> None:
        self._evaluator = ReferenceEvaluator(model, new_ops=list(new_ops) or None)
        self._outputs = [_Output(value.name) for value in model.graph.output]

    def get_outputs(self) -> list[_Output]:
        return list(self._outputs)

    def run(self, names: Sequence[str] | None, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return [np.asarray(v) for v in self._evaluator.run(None if names is None else list(names), dict(feeds))]


def _session(
    model: onnx.ModelProto, backend: Backend, new_ops: Sequence[type] = ()
) -> ort.InferenceSession | ReferenceSession:
    if backend == "onnx.reference":
        return ReferenceSession(model, new_ops)
    return inference_session(model.SerializeToString(), _session_options())


@dataclass
class Compiled:
    """A spec's training model, ready to run."""

    session: ort.InferenceSession | ReferenceSession | None  # None: not made (build_model)
    model: onnx.ModelProto
    args: list[tuple[str, Arg, tuple[int, ...], Any]]  # name, arg, shape, numpy dtype
    extras: dict[str, np.ndarray]  # fed extra inputs
    projections: list[tuple[str, int, Any]]  # input name, output index, numpy dtype
    wrt: list[str]
    n_outputs: int


def _declared(shape: Sequence[int], mode: DimMode) -> list[int | str | None]:
    if mode == "static":
        return list(shape)
    if mode == "named":
        return [d if d == 1 else f"n{d}" for d in shape]
    return [None] * len(shape)


def _arg_dtype(spec: Spec, arg: Arg) -> Any:
    return np.dtype(arg.dtype if arg.dtype is not None else spec.dtype)


@dataclass
class Forward:
    """A spec's one-operator model before the loss: what :func:`build` and :func:`forward_fault` start from."""

    model: onnx.ModelProto  # no graph outputs yet
    args: list[tuple[str, Arg, tuple[int, ...], Any]]
    extras: dict[str, np.ndarray]
    projected: list[str]  # the tensors the loss may project
    used: tuple[int, ...]  # the indices of those it projects


def forward_model(spec: Spec, case: Case, mode: DimMode) -> Forward:
    """The op (with the spec's ``before`` and ``after`` nodes) on graph inputs, without loss or gradients."""
    shapes = iter(case.shapes)
    args = []
    inputs = []
    for k, arg in enumerate(spec.args):
        shape = arg.shape if arg.shape is not None else next(shapes)
        dtype = _arg_dtype(spec, arg)
        name = f"x{k}"
        args.append((name, arg, tuple(shape), dtype))
        inputs.append(helper.make_tensor_value_info(name, dtypes.to_elem_type(dtype), _declared(shape, mode)))
    wiring = spec.wiring if spec.wiring is not None else tuple(range(len(spec.args)))
    node_inputs = ["" if w is None else w if isinstance(w, str) else args[w][0] for w in wiring]
    initializers = []
    extras: dict[str, np.ndarray] = {}
    for extra in case.extras:
        name = f"extra{extra.index}"
        value = np.asarray(extra.value, dtype=extra.dtype if extra.dtype is not None else np.int64)
        while len(node_inputs) <= extra.index:
            node_inputs.append("")
        node_inputs[extra.index] = name
        if extra.fed:
            extras[name] = value
            unknown = {axis % value.ndim for axis in extra.unknown}
            declared = [None if axis in unknown else size for axis, size in enumerate(value.shape)]
            inputs.append(helper.make_tensor_value_info(name, dtypes.to_elem_type(value.dtype), declared))
        else:
            initializers.append(numpy_helper.from_array(value, name))
    outputs = [f"y{u}" for u in range(case.n_outputs)]
    attributes = dict(case.attrs)
    subgraphs = getattr(spec, "subgraphs", None)  # graph attributes (If branches, loop bodies): not hashable
    if subgraphs is not None:
        attributes.update(subgraphs(case, mode))
    node = helper.make_node(spec.op_type, node_inputs, outputs, name="op", domain=spec.domain, **attributes)
    opsets = [helper.make_opsetid("", spec.opset)] + [helper.make_opsetid(d, v) for d, v in spec.extra_opsets]
    nodes = [*(spec.before(case) if spec.before is not None else ()), node]
    projected, used = outputs, case.used_outputs
    if spec.after is not None:  # the loss projects what `after` makes of the outputs
        after, projected = spec.after(case, outputs)
        nodes += after
        projected, used = list(projected), tuple(range(len(projected)))
    graph = helper.make_graph(nodes, "spec", inputs, [], initializers)
    model = helper.make_model(graph, opset_imports=opsets)
    return Forward(model, args, extras, list(projected), tuple(used))


def build(spec: Spec, case: Case, mode: DimMode, registry: GradientRegistry | None = None) -> Compiled:
    """The model for ``spec`` and ``case``: the op, the projected loss and our gradients."""
    compiled = build_model(spec, case, mode, registry)
    compiled.session = session_for(spec, compiled.model)
    return compiled


def build_model(spec: Spec, case: Case, mode: DimMode, registry: GradientRegistry | None = None) -> Compiled:
    """:func:`build` without its session (``session`` is ``None``)."""
    forward = forward_model(spec, case, mode)
    model, args, extras, projected, used = forward.model, forward.args, forward.extras, forward.projected, forward.used
    _declare_uninferred(model, args, case, mode, backend_of(spec), reference_ops(spec))
    builder = GraphBuilder(model)
    projections = []
    terms = []
    for u in used:
        y = projected[u]
        elem = builder.elem_type(y)
        dims = builder.shape(y)
        known = dims if dims is not None and all(isinstance(d, int) for d in dims) else None
        declared = known if known is not None else (None if dims is None else [None] * len(dims))
        c = builder.add_input(f"c{u}", helper.make_tensor_type_proto(elem, declared))
        projections.append((c, u, dtypes.to_numpy_dtype(elem)))
        terms.append(builder.add_node1("ReduceSum", [builder.add_node1("Mul", [y, c])], keepdims=0))
    loss = terms[0] if len(terms) == 1 else builder.add_node1("Sum", terms)
    wrt = [name for name, arg, _, _ in args if arg.diff]
    grads = build_gradients(builder, loss, wrt, registry=registry)
    builder.set_outputs([loss, *projected, *(grads[name] for name in wrt)])
    final = builder.finalize()
    return Compiled(None, final, args, extras, projections, wrt, len(projected))


def session_for(spec: Spec, model: onnx.ModelProto) -> ort.InferenceSession | ReferenceSession:
    """A session for a model built from ``spec``, on the spec's backend."""
    return _session(model, backend_of(spec), reference_ops(spec))


def _declare_uninferred(
    model: onnx.ModelProto,
    args: list[tuple[str, Arg, tuple[int, ...], Any]],
    case: Case,
    mode: DimMode,
    backend: Backend = "onnxruntime",
    new_ops: Sequence[type] = (),
) -> None:
    """Declare in ``value_info`` the outputs onnx's shape inference cannot type (operators defined
    by a function, such as GroupNormalization; BatchNormalization's training outputs before
    opset 14), from one onnxruntime run on zeros."""
    inferred = onnx.shape_inference.infer_shapes(model).graph
    values = (*inferred.value_info, *inferred.output)
    kinds = ("sequence_type", "optional_type")
    known = {v.name for v in values if v.type.tensor_type.elem_type or v.type.WhichOneof("value") in kinds}
    op = next(node for node in model.graph.node if node.name == "op")
    missing = [name for name in op.output if name and name not in known]
    if not missing:
        return
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(helper.make_value_info(name, onnx.TypeProto()) for name in missing)
    versions.stamp_ir_version(probe)
    session = _session(probe, backend, new_ops)
    feeds = {name: np.zeros(shape, dtype) for name, _, shape, dtype in args}
    feeds.update({f"extra{e.index}": np.asarray(e.value, e.dtype or np.int64) for e in case.extras if e.fed})
    for name, value in zip(missing, session.run(missing, feeds), strict=True):
        elem = dtypes.to_elem_type(value.dtype)
        model.graph.value_info.append(helper.make_tensor_value_info(name, elem, _declared(value.shape, mode)))


def _session_options() -> ort.SessionOptions:
    """One thread, no spinning: many small sessions live side by side in the cache."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


@functools.lru_cache(maxsize=64)
def build_cached(spec: Spec, case: Case, mode: DimMode) -> Compiled:
    """:func:`build` for the built-in registry, cached (Hypothesis repeats shapes)."""
    return build(spec, case, mode)


def sample(rng: np.random.Generator, arg: Arg, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """Data for ``arg`` from its domain."""
    return np.asarray(_sample(rng, arg, shape, dtype), dtype=dtype)


def _sample(rng: np.random.Generator, arg: Arg, shape: tuple[int, ...], dtype: Any) -> Any:
    domain = arg.domain
    if domain == "bool":
        return rng.random(shape) < 0.5
    if isinstance(domain, tuple):
        low, high = domain
        if np.dtype(dtype).kind in "iu":
            return rng.integers(int(low), int(high) + 1, size=shape).astype(dtype)
        return rng.uniform(low, high, size=shape).astype(dtype)
    if domain == "real":
        return rng.normal(size=shape).astype(dtype)
    if domain == "real2":
        return (2.0 * rng.normal(size=shape)).astype(dtype)
    if domain == "sparse":
        return np.where(rng.random(shape) < 0.3, 0.0, rng.normal(size=shape)).astype(dtype)
    if domain == "nonzero":
        return (rng.choice([-1.0, 1.0], size=shape) * rng.uniform(0.5, 1.5, size=shape)).astype(dtype)
    raise ValueError(f"unknown domain {domain!r}")


def away_from(x: np.ndarray, kinks: Sequence[float], gap: float, rng: np.random.Generator) -> np.ndarray:
    """``x`` with values closer than ``gap`` to a kink moved to between ``gap`` and ``2 gap`` away."""
    x = np.array(x, copy=True)
    for kink in kinks:
        close = np.abs(x - kink) < gap
        side = np.where(x >= kink, 1.0, -1.0)
        x = np.asarray(np.where(close, kink + side * gap * (1.0 + rng.random(x.shape)), x), dtype=x.dtype)
    return x


def draw_values(
    spec: Spec, case: Case, args: list[tuple[str, Arg, tuple[int, ...], Any]], rng: np.random.Generator
) -> dict[str, np.ndarray] | None:
    """The inputs of a check, away from the kinks; ``None`` when the spec finds them invalid."""
    attrs: Mapping[str, Any] = dict(case.attrs)
    gap = 5e-2 if np.dtype(spec.dtype) != np.float64 else 1e-3
    values = {}
    for name, arg, shape, dtype in args:
        value = sample(rng, arg, shape, dtype)
        if value.dtype.kind == "f":
            value = away_from(value, spec.kinks(attrs), gap, rng)
        values[name] = value
    if spec.valid is not None and not spec.valid(list(values.values()), attrs):
        return None
    return values


@dataclass
class Result:
    """The two sides of the check and the tolerance used."""

    analytic: float
    numeric: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return bool(np.isfinite(self.analytic) and abs(self.analytic - self.numeric) <= self.tolerance)


def check(spec: Spec, case: Case, mode: DimMode, seed: int, compiled: Compiled | None = None) -> Result | None:
    """Run the check; ``None`` when the drawn data is invalid for the spec (reject the example)."""
    compiled = compiled or build_cached(spec, case, mode)
    rng = np.random.default_rng(seed)
    low_precision = np.dtype(spec.dtype) != np.float64
    values = draw_values(spec, case, compiled.args, rng)
    if values is None:
        return None
    feeds: dict[str, np.ndarray] = {**values, **compiled.extras}
    shapes = projection_shapes_at(compiled, feeds)
    for (c, _, dtype), shape in zip(compiled.projections, shapes, strict=True):
        feeds[c] = np.asarray(rng.normal(size=shape), dtype=dtype)
    out = compiled.session.run(None, feeds)
    loss0 = float(out[0])
    grads = out[1 + compiled.n_outputs :]
    directions = {}
    analytic = 0.0
    scale = 0.0
    for name, grad in zip(compiled.wrt, grads, strict=True):
        value = values[name]
        assert grad.shape == value.shape, f"d/d{name} has shape {grad.shape}, the input {value.shape}"
        assert grad.dtype == value.dtype, f"d/d{name} has dtype {grad.dtype}, the input {value.dtype}"
        t = np.asarray(rng.normal(size=value.shape), dtype=value.dtype)
        directions[name] = t
        analytic += float(np.sum(t.astype(np.float64) * grad.astype(np.float64)))
        scale += float(np.sum(np.abs(t.astype(np.float64) * grad.astype(np.float64))))

    def f(step: float) -> float:
        moved = dict(feeds)
        for name, t in directions.items():
            moved[name] = np.asarray(values[name].astype(np.float64) + step * t.astype(np.float64), values[name].dtype)
        return float(compiled.session.run([compiled.session.get_outputs()[0].name], moved)[0])

    if low_precision:
        h = 1e-2
        d1 = (f(h) - f(-h)) / (2 * h)
        d2 = (f(h / 2) - f(-h / 2)) / h
        numeric = (4 * d2 - d1) / 3
        tolerance = 2e-3 * (abs(analytic) + scale) + 2e-4 * (1 + abs(loss0))
    else:
        h = 1e-6
        numeric = (f(h) - f(-h)) / (2 * h)
        tolerance = 1e-6 * (abs(analytic) + scale) + 1e-8 * (1 + abs(loss0))
    return Result(analytic, numeric, tolerance)


def projection_shapes_at(compiled: Compiled, feeds: Mapping[str, np.ndarray]) -> list[tuple[int, ...]]:
    """The shape of each projection input for the inputs ``feeds``: declared, or from a run with probes."""
    shapes = _projection_shapes(compiled)
    if all(shape is not None for shape in shapes):
        return shapes  # type: ignore[return-value]
    probe = {
        c: np.ones([1] * len(compiled.model.graph.output[1 + u].type.tensor_type.shape.dim), dtype)
        for c, u, dtype in compiled.projections
    }
    ys = compiled.session.run(None, {**feeds, **probe})[1 : 1 + compiled.n_outputs]
    return [ys[u].shape for _, u, _ in compiled.projections]


def _projection_shapes(compiled: Compiled) -> list[tuple[int, ...] | None]:
    """The declared shape of each projection input, ``None`` where not fully known."""
    declared = {v.name: v.type.tensor_type for v in compiled.model.graph.input}
    shapes: list[tuple[int, ...] | None] = []
    for c, _, _ in compiled.projections:
        tensor = declared[c]
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
        known = tensor.HasField("shape") and all(d is not None for d in dims)
        shapes.append(tuple(dims) if known else None)  # type: ignore[arg-type]
    return shapes


def forward_fault(spec: Spec, case: Case, mode: DimMode, seed: int) -> tuple[str, bool] | None:
    """Why the backend's own kernel for the operator under test cannot be trusted here, or ``None``.

    Asked after a check failed. The operator alone (no loss, no gradient) is
    run on the check's inputs: the installed onnx does not accept it as the
    spec builds it, the backend cannot load it (no kernel at the opset or for
    the type), cannot run it on these inputs, or (onnxruntime) computes
    something else than ``onnx.reference``. Then the finite differences
    themselves are wrong or impossible, and no gradient can be checked against
    them. The flag says whether it fails whatever the input (the model does
    not load). ``None`` when the operator runs and agrees: the failure is the
    gradient's.
    """
    backend = backend_of(spec)
    forward = forward_model(spec, case, mode)
    model = forward.model
    what = f"{spec.op_type} (opset {spec.opset}, {', '.join(f'{k}={v!r}' for k, v in case.attrs) or 'no attributes'})"
    try:
        onnx.checker.check_model(model)  # still without outputs, which have no type yet
    except onnx.checker.ValidationError as error:
        return f"onnx {onnx.__version__} does not accept {what}: {error}", True
    outputs = [forward.projected[u] for u in forward.used]
    model.graph.output.extend(helper.make_value_info(name, onnx.TypeProto()) for name in outputs)
    versions.stamp_ir_version(model)
    try:
        session = _session(model, backend, reference_ops(spec))
    except Exception as error:
        return f"{_runs_on(backend)} cannot load {what}: {error}", True
    values = draw_values(spec, case, forward.args, np.random.default_rng(seed))
    if values is None:
        return None
    feeds = {**values, **forward.extras}
    try:
        got = session.run(outputs, feeds)
    except Exception as error:
        return f"{_runs_on(backend)} fails to run {what} on these inputs: {error}", False
    if backend != "onnxruntime":
        return None
    try:
        expected = ReferenceEvaluator(model).run(outputs, feeds)
    except Exception:
        return None  # nothing to compare with
    # and in the model of the check, where a kernel that leaves outputs unwritten shows other memory
    try:
        compiled = build_cached(spec, case, mode)
        shapes = {u: np.shape(y) for u, y in zip(forward.used, expected, strict=True)}
        ones = {c: np.ones(shapes[u], dtype) for c, u, dtype in compiled.projections}
        in_check = compiled.session.run(
            [compiled.model.graph.output[1 + u].name for u in forward.used], {**feeds, **ones}
        )
    except Exception:
        in_check = got
    for ours in (got, in_check):
        for name, a, b in zip(outputs, ours, expected, strict=True):
            a, b = np.asarray(a), np.asarray(b)
            same = a.shape == b.shape and np.allclose(
                a.astype(np.float64), b.astype(np.float64), rtol=1e-3, atol=1e-5, equal_nan=True
            )
            if not same:
                return (
                    f"{_runs_on(backend)} computes {name} of {what} otherwise than onnx.reference on these inputs "
                    f"(shape {a.shape} against {b.shape})",
                    False,
                )
    return None


def _runs_on(backend: Backend) -> str:
    return f"onnxruntime {ort.__version__}" if backend == "onnxruntime" else f"onnx.reference {onnx.__version__}"


#: Examples of one spec rejected for a fault of the operator's own kernel before its tests skip instead
#: (Hypothesis fails a test that rejects most of its examples).
MAX_FORWARD_FAULTS = 10
_forward_faults: dict[str, int] = {}


def excuse_forward_fault(spec: Spec, case: Case, mode: DimMode, seed: int) -> None:
    """After a failed check: skip the test when the operator under test does not load on the installed
    releases, reject the example when it does not run right on these inputs (:func:`forward_fault`),
    and skip once that happened :data:`MAX_FORWARD_FAULTS` times for the spec; else return, and the
    failure stands."""
    fault = forward_fault(spec, case, mode, seed)
    if fault is None:
        return
    reason, always = fault
    _forward_faults[spec.id] = _forward_faults.get(spec.id, 0) + 1
    if always or _forward_faults[spec.id] > MAX_FORWARD_FAULTS:
        pytest.skip(reason)
    note(reason)
    reject()
