"""Finite-difference specs of the rules in ``onnxtrain/autodiff/rules/recurrent.py`` (see ``specs.py``).

onnxruntime's CPU provider has float32 kernels only for RNN, GRU and LSTM, and
none for ``layout=1``: the time-major specs run in onnxruntime in float32, the
batch-major ones in ``onnx.reference`` in float64. ``onnx.reference`` ignores
``sequence_lens``, so the specs with sequence lengths run in onnxruntime only
(``tests/autodiff/test_recurrent_models.py`` checks them again without the
forward-fault excuse of ``test_rules.py``, which compares onnxruntime with
``onnx.reference``).

Each case draws the direction, the sizes (1 to 4 steps), GRU's
``linear_before_reset``, RNN's activations, a ``clip`` far above the
pre-activations (the clipping itself is checked against torch in
``test_recurrent_models.py``: finite differences cross its kinks), and which outputs the loss uses
(any non-empty subset of ``Y``, ``Y_h``, ``Y_c``). The batch has 2 or 3 rows: with
one row, ``gradcheck`` would probe a fully static ``Y_h`` with a shape of ones.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from hypothesis import strategies as st

from tests.autodiff.specs import Arg, Case, Extra, Spec

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
DIRECTIONS = ("forward", "reverse", "bidirectional")
#: Weights in a range that keeps the gates away from saturation, so finite differences stay informative.
WEIGHTS: tuple[float, float] = (-0.8, 0.8)


@dataclass(frozen=True)
class ReferenceSpec(Spec):
    """A spec run in ``onnx.reference`` (``gradcheck.backend_of``): onnxruntime has no kernel for it."""

    backend: str = "onnx.reference"


@st.composite
def recurrent_cases(draw: st.DrawFn, op: str, full: bool, lens: bool, layout: int, empty: bool = False) -> Case:
    """Shapes of X, W, R (and B, initial_h, initial_c, P when ``full``), attributes, lengths, used outputs.

    ``empty``: the first sequence has length 0 (its final states are zeros).
    """
    direction = draw(st.sampled_from(DIRECTIONS))
    n = 2 if direction == "bidirectional" else 1
    steps, batch = draw(st.integers(1, 4)), draw(st.integers(2, 3))
    size, hidden = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    gates = GATES[op] * hidden
    state = (batch, n, hidden) if layout else (n, batch, hidden)
    shapes: list[tuple[int, ...]] = [(batch, steps, size) if layout else (steps, batch, size), (n, gates, size)]
    shapes.append((n, gates, hidden))
    if full:
        shapes += [(n, 2 * gates), state]
        if op == "LSTM":
            shapes += [state, (n, 3 * hidden)]
    attrs: dict[str, Any] = {"hidden_size": hidden}
    if direction != "forward" or draw(st.booleans()):
        attrs["direction"] = direction
    if layout:
        attrs["layout"] = layout
    if op == "GRU":
        attrs["linear_before_reset"] = draw(st.integers(0, 1))
    if op == "RNN":
        choices = ["Tanh"] if layout else ["Tanh", "Sigmoid"]  # onnx.reference's RNN knows only Tanh
        activations = [draw(st.sampled_from(choices)) for _ in range(n)]
        if activations != ["Tanh"] * n or draw(st.booleans()):
            attrs["activations"] = tuple(activations)
    if draw(st.booleans()):  # a bound no pre-activation reaches: the Clip nodes, not their kinks
        attrs["clip"] = 50.0
    extras: tuple[Extra, ...] = ()
    if lens:
        lengths = tuple(0 if empty and b == 0 else draw(st.integers(1, steps)) for b in range(batch))
        extras = (Extra(4, lengths, fed=draw(st.booleans()), dtype=np.int32),)
    n_outputs = 3 if op == "LSTM" else 2
    used = draw(st.lists(st.integers(0, n_outputs - 1), unique=True, min_size=1, max_size=n_outputs))
    return Case(tuple(shapes), tuple(sorted(attrs.items())), extras, tuple(sorted(used)), n_outputs)


def _args(op: str, full: bool) -> tuple[Arg, ...]:
    """X, W, R (and B, initial_h, initial_c, P)."""
    weights = (Arg(WEIGHTS), Arg(WEIGHTS))
    if not full:
        return (Arg(), *weights)
    extra = (Arg(WEIGHTS), Arg(), Arg(), Arg(WEIGHTS)) if op == "LSTM" else (Arg(WEIGHTS), Arg())
    return (Arg(), *weights, *extra)


def _wiring(op: str, full: bool) -> tuple[int | None, ...] | None:
    """Node inputs: sequence_lens (input 4) comes from the case's extras."""
    if not full:
        return None
    return (0, 1, 2, 3, None, 4, 5, 6) if op == "LSTM" else (0, 1, 2, 3, None, 4)


def recurrent(op: str, *, full: bool, lens: bool = False, layout: int = 0, empty: bool = False) -> Spec:
    """A spec for ``op``: every input (``full``) or X, W, R only; with ``sequence_lens`` (one of them 0
    when ``empty``); in ``layout``."""
    parts = ["all-inputs" if full else "x-w-r", *(["sequence-lens"] if lens else []), f"layout{layout}"]
    parts += ["empty-sequence"] if empty else []
    kind = ReferenceSpec if layout else Spec
    return kind(
        op,
        _args(op, full),
        recurrent_cases(op, full, lens or empty, layout, empty),
        opset=14 if layout else 17,
        dtype=np.float64 if layout else np.float32,
        wiring=_wiring(op, full),
        variant="-".join(parts),
    )


SPECS: list[Spec] = [
    recurrent(op, full=full, lens=lens, layout=layout)
    for op in GATES
    for full in (True, False)
    for lens, layout in ((False, 0), (True, 0), (False, 1))
]
#: The oldest opset onnxtrain reads (the operators' version 7, without ``layout``) and the newest version.
SPECS += [
    replace(recurrent("LSTM", full=True), opset=13, variant="all-inputs-opset13"),
    replace(recurrent("GRU", full=True, lens=True), opset=22, variant="all-inputs-sequence-lens-opset22"),
]

#: Sequences of length 0: onnxruntime 1.32 gives them zero final states; older releases read memory
#: outside Y for RNN's (microsoft/onnxruntime#28052). Checked in ``test_recurrent_models.py`` only.
EMPTY_SEQUENCE_SPECS: list[Spec] = [recurrent(op, full=True, empty=True) for op in GATES]
