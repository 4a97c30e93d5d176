"""Finite-difference specs of the rules in ``onnxtrain/autodiff/rules/control_flow.py`` (see ``specs.py``).

The subgraphs (``If`` branches, ``Scan`` and ``Loop`` bodies) read values of
the enclosing graph by name: graph inputs ``x<k>`` and values computed by the
spec's ``before`` nodes. Their inputs and outputs are declared with a rank and
unknown dimensions. Everything runs in float64 in onnxruntime.

- ``If``: each branch taken (a constant condition) and a drawn condition; two
  outputs, any non-empty subset in the loss; the else branch does not read
  ``x1`` (its gradient there is zeros); the then branch reads an intermediate.
- ``Scan``: two states (a vector and a scalar) and two scan inputs, a scan
  output; directions and axes (negative ones too) drawn; a weight read from
  the enclosing graph.
- ``Loop``: a dynamic trip count (a graph input, 0 to 4), a condition that stops
  it after a drawn number of iterations, float and integer states, a scan
  output, values read from outside (a weight and a sequence indexed by the
  iteration number); a loop that never starts; an ``If`` inside the body, and a ``Loop``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from tests.autodiff.specs import Arg, Case, Spec

_D = TensorProto.DOUBLE
_I64 = TensorProto.INT64
_BOOL = TensorProto.BOOL

Subgraphs = Callable[[Case, str], Mapping[str, onnx.GraphProto]]


@dataclass(frozen=True)
class SubgraphSpec(Spec):
    """A spec whose node has graph attributes, given by ``subgraphs(case, dim_mode)`` (see ``gradcheck``)."""

    subgraphs: Subgraphs | None = None


def _value(name: str, rank: int, elem_type: int = _D) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, [None] * rank)


def _node(op_type: str, inputs: list[str], output: str, **attrs: Any) -> onnx.NodeProto:
    return helper.make_node(op_type, inputs, [output], name=f"{output}_node", **attrs)


def _constant(name: str, value: Any) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=f"{name}_node", value=numpy_helper.from_array(value))


def _rank(case: Case, k: int = 0) -> int:
    return len(case.shapes[k])


# -------------------------------------------------------------------------- If


@st.composite
def if_cases(draw: st.DrawFn) -> Case:
    """One shape for x0 and x1; which of the two outputs the loss uses."""
    shape = tuple(draw(st.lists(st.integers(1, 3), max_size=3)))
    used = tuple(sorted(draw(st.sets(st.integers(0, 1), min_size=1))))
    return Case((shape, shape), used_outputs=used, n_outputs=2)


def if_branches(case: Case, mode: str) -> dict[str, onnx.GraphProto]:
    """then: (sin(x0 * x1) + x0, exp(h) * x0) with h = sin(x1) outside; else: (tanh(x0) * x0, -x0)."""
    rank = _rank(case)
    then = helper.make_graph(
        [
            _node("Mul", ["x0", "x1"], "then_mul"),
            _node("Sin", ["then_mul"], "then_sin"),
            _node("Add", ["then_sin", "x0"], "then_y0"),
            _node("Exp", ["h"], "then_exp"),
            _node("Mul", ["then_exp", "x0"], "then_y1"),
        ],
        "then",
        [],
        [_value("then_y0", rank), _value("then_y1", rank)],
    )
    otherwise = helper.make_graph(
        [
            _node("Tanh", ["x0"], "else_tanh"),
            _node("Mul", ["else_tanh", "x0"], "else_y0"),
            _node("Neg", ["x0"], "else_y1"),
        ],
        "else",
        [],
        [_value("else_y0", rank), _value("else_y1", rank)],
    )
    return {"then_branch": then, "else_branch": otherwise}


def _if_before(condition: bool | None) -> Callable[[Case], list[onnx.NodeProto]]:
    def before(case: Case) -> list[onnx.NodeProto]:
        nodes = [_node("Sin", ["x1"], "h")]
        if condition is not None:
            nodes.append(_constant("cond", np.array(condition)))
        return nodes

    return before


def _if_spec(condition: bool | None) -> SubgraphSpec:
    args = (Arg(), Arg())
    wiring: tuple[int | str | None, ...] = ("cond",)
    if condition is None:
        args += (Arg("bool", diff=False, shape=(), dtype=np.bool_),)
        wiring = (2,)
    variant = {True: "then", False: "else", None: "drawn-condition"}[condition]
    return SubgraphSpec(
        "If", args, if_cases(), wiring=wiring, before=_if_before(condition), variant=variant, subgraphs=if_branches
    )


# ------------------------------------------------------------------------ Scan


@st.composite
def scan_cases(draw: st.DrawFn) -> Case:
    """Steps, width, directions and axes (negative too); which outputs the loss uses."""
    steps, width = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    x_axis = draw(st.sampled_from([0, 1, -1, -2]))
    xs = (steps, width) if x_axis in (0, -2) else (width, steps)
    z_axis = draw(st.sampled_from([0, 1, -1]))
    attrs = {
        "num_scan_inputs": 2,
        "scan_input_directions": (draw(st.integers(0, 1)), draw(st.integers(0, 1))),
        "scan_input_axes": (x_axis, 0),
        "scan_output_directions": (draw(st.integers(0, 1)),),
        "scan_output_axes": (z_axis,),
    }
    used = tuple(sorted(draw(st.sets(st.integers(0, 2), min_size=1))))
    shapes = ((width,), (), xs, (steps,), (width,))
    return Case(shapes, tuple(sorted(attrs.items())), used_outputs=used, n_outputs=3)


def scan_body(case: Case, mode: str) -> dict[str, onnx.GraphProto]:
    """(s, p, x, u) -> (s' = tanh(s * w + x), p' = p + sum(s' * u), z = sin(s') * x); w = x4 outside."""
    body = helper.make_graph(
        [
            _node("Mul", ["s", "x4"], "scan_a"),
            _node("Add", ["scan_a", "x"], "scan_b"),
            _node("Tanh", ["scan_b"], "s_next"),
            _node("Mul", ["s_next", "u"], "scan_c"),
            _node("ReduceSum", ["scan_c"], "scan_r", keepdims=0),
            _node("Add", ["p", "scan_r"], "p_next"),
            _node("Sin", ["s_next"], "scan_sin"),
            _node("Mul", ["scan_sin", "x"], "z"),
        ],
        "scan_body",
        [_value("s", 1), _value("p", 0), _value("x", 1), _value("u", 0)],
        [_value("s_next", 1), _value("p_next", 0), _value("z", 1)],
    )
    return {"body": body}


# ------------------------------------------------------------------------ Loop


@st.composite
def loop_cases(draw: st.DrawFn) -> Case:
    """x1 (width,), x2 (), x4 (4, width), x5 (width,); the loss uses any of vf, pf and the scan output."""
    width = draw(st.integers(1, 3))
    used = tuple(sorted(draw(st.sets(st.sampled_from([0, 1, 3]), min_size=1))))
    return Case(((width,), (), (4, width), (width,)), used_outputs=used, n_outputs=4)


def _loop_step(nested: str) -> list[onnx.NodeProto]:
    """The nodes computing ``v_mid`` from ``v``: ``v * w + x_i``, an ``If`` on the parity of ``i``, or an
    inner ``Loop`` running ``u <- tanh(u * w + x_i)`` twice."""
    if nested == "loop":
        inner = helper.make_graph(
            [
                _node("Identity", ["inner_c"], "inner_c_next"),
                _node("Mul", ["u", "x5"], "inner_mul"),
                _node("Add", ["inner_mul", "xi"], "inner_add"),
                _node("Tanh", ["inner_add"], "u_next"),
            ],
            "inner_loop",
            [_value("j", 0, _I64), _value("inner_c", 0, _BOOL), _value("u", 1)],
            [_value("inner_c_next", 0, _BOOL), _value("u_next", 1)],
        )
        return [
            _node("Loop", ["two", "", "v"], "v_inner", body=inner),
            _node("Add", ["v_inner", "v"], "v_mid"),
        ]
    if nested != "if":
        return [_node("Mul", ["v", "x5"], "loop_a"), _node("Add", ["loop_a", "xi"], "v_mid")]
    then = helper.make_graph([_node("Mul", ["v", "x5"], "inner_then")], "inner_then", [], [_value("inner_then", 1)])
    otherwise = helper.make_graph(
        [_node("Add", ["v", "xi"], "inner_add"), _node("Sin", ["inner_add"], "inner_else")],
        "inner_else",
        [],
        [_value("inner_else", 1)],
    )
    return [
        _node("Mod", ["i", "two"], "parity"),
        _node("Equal", ["parity", "zero"], "even"),
        _node("If", ["even"], "v_if", then_branch=then, else_branch=otherwise),
        _node("Add", ["v_if", "xi"], "v_mid"),
    ]


def _loop_body(nested: str) -> Callable[[Case, str], dict[str, onnx.GraphProto]]:
    def subgraphs(case: Case, mode: str) -> dict[str, onnx.GraphProto]:
        """(i, c, v, p, n) -> (i + 1 < stop, tanh(v_mid), p + sum(v' * x_i), n + 1, sin(v')); x_i = xs[i]."""
        body = helper.make_graph(
            [
                _constant("one", np.array(1, np.int64)),
                _constant("two", np.array(2, np.int64)),
                _constant("zero", np.array(0, np.int64)),
                _node("Gather", ["x4", "i"], "xi", axis=0),
                *_loop_step(nested),
                _node("Tanh", ["v_mid"], "v_next"),
                _node("Mul", ["v_next", "xi"], "loop_c"),
                _node("ReduceSum", ["loop_c"], "loop_r", keepdims=0),
                _node("Add", ["p", "loop_r"], "p_next"),
                _node("Add", ["n", "one"], "n_next"),
                _node("Add", ["i", "one"], "i_next"),
                _node("Less", ["i_next", "x6"], "c_next"),
                _node("Sin", ["v_next"], "loop_z"),
            ],
            "loop_body",
            [_value("i", 0, _I64), _value("c", 0, _BOOL), _value("v", 1), _value("p", 0), _value("n", 0, _I64)],
            [
                _value("c_next", 0, _BOOL),
                _value("v_next", 1),
                _value("p_next", 0),
                _value("n_next", 0, _I64),
                _value("loop_z", 1),
            ],
        )
        return {"body": body}

    return subgraphs


def _loop_spec(started: bool = True, nested: str = "", opset: int = 17) -> SubgraphSpec:
    args = (
        Arg((0, 4), diff=False, shape=(), dtype=np.int64),  # x0: the trip count
        Arg(),  # x1: v
        Arg(),  # x2: p
        Arg((0, 3), diff=False, shape=(), dtype=np.int64),  # x3: n, an integer state
        Arg(),  # x4: xs, indexed by the iteration number
        Arg(),  # x5: w
        Arg((1, 4), diff=False, shape=(), dtype=np.int64),  # x6: stop after this many iterations
    )
    variant = f"nested-{nested}" if nested else "started" if started else "not-started"
    return SubgraphSpec(
        "Loop",
        args,
        loop_cases(),
        opset,
        wiring=(0, "cond", 1, 2, 3),
        before=lambda case: [_constant("cond", np.array(started))],
        variant=variant if opset == 17 else f"{variant}-opset{opset}",
        subgraphs=_loop_body(nested),
    )


SPECS: list[Spec] = [
    _if_spec(True),
    _if_spec(False),
    _if_spec(None),
    SubgraphSpec(
        "Scan",
        (Arg(), Arg(), Arg(), Arg(), Arg()),
        scan_cases(),
        wiring=(0, 1, 2, 3),
        subgraphs=scan_body,
    ),
    SubgraphSpec(
        "Scan",
        (Arg(), Arg(), Arg(), Arg(), Arg()),
        scan_cases(),
        13,
        wiring=(0, 1, 2, 3),
        subgraphs=scan_body,
        variant="opset13",
    ),
    _loop_spec(),
    _loop_spec(nested="if", opset=13),
    _loop_spec(started=False),
    _loop_spec(nested="if"),
    _loop_spec(nested="loop"),
]
