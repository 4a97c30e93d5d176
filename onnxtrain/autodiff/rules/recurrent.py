"""Gradient rules of the recurrent layers ``RNN``, ``GRU`` and ``LSTM`` (forward, reverse, bidirectional).

Notation (time-major, one direction): ``x_t`` ``[B, I]`` the input at step
``t``, ``h_t``/``c_t`` the hidden/cell state ``[B, H]``, ``a_t = x_t W^T +
h_{t-1} R^T + Wb + Rb`` the gate pre-activations ``[B, G H]`` (``G`` = 1, 3, 4
gates), ``g`` the gradient flowing into a value, ``m_t`` ``[B, 1]`` the mask
``t < sequence_lens``. A step past a sequence's length carries the state
unchanged and outputs zeros (as onnxruntime does): ``h_t = m_t hnew_t + (1 -
m_t) h_{t-1}``, ``Y_t = m_t hnew_t``, so ``Y_h`` is the last carried state
(zero for a sequence of length 0, as in onnxruntime 1.32).

Each direction is reduced to a forward pass: the reverse one runs on
``ReverseSequence(x, sequence_lens)`` (each sequence reversed within its
length), and its gradients are reversed back. The gradient graph then

1. recomputes what the forward pass did not output, batched over time: the
   previous states ``h_{t-1}`` are ``Y`` shifted by one step (``Y`` is
   requested from the forward node), so every pre-activation comes from one
   MatMul over all steps; only LSTM's cell recurrence runs in a ``Scan``;
2. runs the recurrence backwards in a reverse ``Scan`` (so the number of steps
   may be known only at run time): per step, the state gradient from the next
   step plus ``g_Y`` gives the pre-activation gradient ``da_t`` (a scan output),
   and ``dh_{t-1} = da_t R + ...``; the carries start at ``g_{Y_h}`` (``g_{Y_c}``)
   and end as the gradients of ``initial_h`` (``initial_c``);
3. turns ``da`` into the parameter gradients with batched products:
   ``dX = da W``, ``dW = sum_t da_t^T x_t``, ``dR = sum_t da_t^T h_{t-1}``,
   ``dB = [sum da, sum da]`` (GRU's reset gate changes the ``R`` side).

Only the default activations are differentiated (RNN also Relu and Sigmoid);
with ``clip``, the activations see ``clip(a)`` and the derivatives are masked by
``|a| < clip``; LSTM's ``input_forget`` is refused with an error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import onnx
from onnx import helper

from onnxtrain.autodiff import dims
from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.registry import Grads, Result
from onnxtrain.autodiff.rules._builtin import registry

_INT64_MIN = -(2**63)
#: The activations of each operator's gates that the rules differentiate, per direction.
_DEFAULTS: dict[str, tuple[str, ...]] = {
    "RNN": ("tanh",),
    "GRU": ("sigmoid", "tanh"),
    "LSTM": ("sigmoid", "tanh", "tanh"),
}
_RNN_ACTIVATIONS = ("tanh", "relu", "sigmoid")


# ------------------------------------------------------------------ setup


@dataclass(frozen=True)
class _Setup:
    """The node's configuration, checked: directions, hidden size, layout, activations."""

    op: str
    hidden: int
    directions: tuple[bool, ...]  # per direction: whether it runs in reverse
    layout: int
    activations: tuple[str, ...]  # RNN: one per direction
    clip: float | None  # the bound of the activations' inputs


def _activations(ctx: RuleContext, op: str, n_directions: int) -> tuple[str, ...]:
    """The (lower-case) activations; ``ValueError`` for those the rules do not differentiate."""
    default = _DEFAULTS[op]
    given = ctx.attr("activations")
    names = [a.decode() if isinstance(a, bytes) else str(a) for a in given] if given else []
    shown = list(names)
    names = [n.lower() for n in names] or list(default) * n_directions
    if len(names) == len(default):
        names = names * n_directions
    allowed_rnn = op == "RNN" and all(n in _RNN_ACTIVATIONS for n in names)
    if len(names) != len(default) * n_directions or not (allowed_rnn or names == list(default) * n_directions):
        choices = f"{list(_RNN_ACTIVATIONS)}" if op == "RNN" else f"{[d.capitalize() for d in default]}"
        raise ValueError(
            f"the gradient of {op} node {ctx.node.name!r} supports activations {choices} (per direction), "
            f"not activations={shown!r}; use the default activations or write a custom rule"
        )
    return tuple(names)


def _setup(ctx: RuleContext, op: str) -> _Setup:
    """Check the attributes the rules support and read the configuration."""
    name = ctx.node.name
    if ctx.attr("input_forget", 0):
        raise ValueError(
            f"the gradient of {op} node {name!r} does not support the attribute input_forget="
            f"{ctx.attr('input_forget')!r}; remove it from the node (train without it) or write a custom rule"
        )
    clip = ctx.attr("clip")
    if clip is not None and not clip > 0:
        raise ValueError(f"{op} node {name!r} has clip={clip!r}; give a positive threshold or omit the attribute")
    direction = ctx.attr("direction", "forward")
    reverse = {"forward": (False,), "reverse": (True,), "bidirectional": (False, True)}.get(direction)
    if reverse is None:
        raise ValueError(
            f"{op} node {name!r} has direction={direction!r}; choose 'forward', 'reverse' or 'bidirectional'"
        )
    hidden = ctx.attr("hidden_size")
    if hidden is None:
        shape = ctx.shape(ctx.inputs[2])
        hidden = shape[-1] if shape else None
        if not isinstance(hidden, int):
            raise ValueError(
                f"the gradient of {op} node {name!r} needs its hidden size: set the attribute hidden_size, "
                "or give R a static last dimension"
            )
    layout = int(ctx.attr("layout", 0))
    activations = _activations(ctx, op, len(reverse))
    return _Setup(op, int(hidden), reverse, layout, activations, None if clip is None else float(clip))


# ------------------------------------------------------------------ helpers


def _transpose(ctx: RuleContext, v: str, perm: Sequence[int], layout: int) -> str:
    """``Transpose(v, perm)`` for ``layout=1`` (batch-major), ``v`` itself for ``layout=0``."""
    return ctx.op("Transpose", v, perm=list(perm)) if layout else v


def _pick(ctx: RuleContext, v: str, d: int, n: int, axis: int) -> str:
    """Direction ``d`` of ``v`` (``n`` directions along ``axis``), that axis removed."""
    if n == 1:
        return ctx.op("Squeeze", v, ctx.int64s([axis]))
    return ctx.op("Gather", v, dims.int64_scalar(ctx, d), axis=axis)


def _stack(ctx: RuleContext, parts: Sequence[str]) -> str:
    """The per-direction gradients stacked on a new axis 0."""
    stacked = [ctx.op("Unsqueeze", p, ctx.int64s([0])) for p in parts]
    return stacked[0] if len(stacked) == 1 else ctx.op("Concat", *stacked, axis=0)


def _split(ctx: RuleContext, v: str, sizes: Sequence[int], axis: int = -1) -> list[str]:
    """``Split(v, sizes, axis)``: the gates of a ``[..., G H]`` tensor."""
    return ctx.op_n("Split", len(sizes), v, ctx.int64s(sizes), axis=axis)


def _reverse(ctx: RuleContext, v: str, lens: str | None) -> str:
    """``v`` ``[T, B, ...]`` with each sequence reversed within its length (all of ``T`` without lengths)."""
    if lens is not None:
        return ctx.op("ReverseSequence", v, lens, batch_axis=1, time_axis=0)
    starts, ends = ctx.int64s([-1]), ctx.int64s([_INT64_MIN])
    return ctx.op("Slice", v, starts, ends, ctx.int64s([0]), ctx.int64s([-1]))


def _shift(ctx: RuleContext, seq: str, first: str) -> str:
    """``[first, seq_0, ..., seq_{T-2}]``: the previous state of every step."""
    head = ctx.op("Unsqueeze", first, ctx.int64s([0]))
    body = ctx.op("Slice", seq, ctx.int64s([0]), ctx.int64s([-1]), ctx.int64s([0]))
    return ctx.op("Concat", head, body, axis=0)


def _outer(ctx: RuleContext, a: str, b: str) -> str:
    """``sum_t a_t^T b_t`` for ``a`` ``[T, B, M]`` and ``b`` ``[T, B, N]``: ``[M, N]``."""
    flat_a = ctx.op("Flatten", a, axis=2)
    return ctx.op("MatMul", ctx.op("Transpose", flat_a, perm=[1, 0]), ctx.op("Flatten", b, axis=2))


def _total(ctx: RuleContext, a: str) -> str:
    """``sum_t sum_b a``: ``[M]`` for ``a`` ``[T, B, M]``."""
    return ctx.op("ReduceSum", a, ctx.int64s([0, 1]), keepdims=0)


def _linear(ctx: RuleContext, v: str, weight: str) -> str:
    """``v @ weight^T`` (``[T, B, K] x [N, K] -> [T, B, N]``)."""
    return ctx.op("MatMul", v, ctx.op("Transpose", weight, perm=[1, 0]))


def _zeros_state(ctx: RuleContext, seq: str) -> str:
    """Zeros ``[B, H]`` shaped like one step of ``seq`` ``[T, B, H]`` (``ctx.zeros_like`` of its first step)."""
    return ctx.zeros_like(ctx.op("Gather", seq, dims.int64_scalar(ctx, 0), axis=0))


@dataclass(frozen=True)
class _Masks:
    """What ``sequence_lens`` makes of the steps: int64 lengths ``[B]``, ``m`` ``[T, B, 1]`` (``t < lens``),
    ``1 - m``, and ``[B, 1]`` ``lens > 0`` (onnxruntime outputs zero final states for empty sequences)."""

    lens: str
    mask: str
    keep: str
    nonempty: str


def _masks(ctx: RuleContext, x: str) -> _Masks | None:
    """The masks of ``sequence_lens`` for ``x`` ``[T, B, I]``; ``None`` without lengths."""
    if not ctx.has_input(4):
        return None
    lens = ctx.cast(ctx.inputs[4], onnx.TensorProto.INT64)
    steps = ctx.op("Gather", ctx.op("Shape", x), dims.int64_scalar(ctx, 0))
    times = ctx.op("Unsqueeze", dims.int64_range(ctx, steps), ctx.int64s([1]))
    valid = ctx.compare("Less", times, ctx.op("Unsqueeze", lens, ctx.int64s([0])))
    mask = ctx.op("Unsqueeze", ctx.cast_like(valid, x), ctx.int64s([2]))
    nonempty = ctx.cast_like(
        ctx.compare("Greater", ctx.op("Unsqueeze", lens, ctx.int64s([1])), dims.int64_scalar(ctx, 0)), x
    )
    return _Masks(lens, mask, ctx.sub(1.0, mask), nonempty)


# ------------------------------------------------------------------ Scan bodies


class _Body:
    """The nodes of a ``Scan`` body, named fresh in the model being built (outer values may be read)."""

    def __init__(self, ctx: RuleContext, like: str) -> None:
        self._ctx = ctx
        self._elem = ctx.elem_type(like)
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []

    def input(self, hint: str) -> str:
        """A new body input: a state or one step of a scanned tensor, ``[B, K]``."""
        name = self._ctx.builder.names.fresh(hint)
        self.inputs.append(helper.make_tensor_value_info(name, self._elem, [None, None]))
        return name

    def op(self, op_type: str, *inputs: str, **attributes: object) -> str:
        """Append ``op_type(*inputs)`` to the body; return its output."""
        names = self._ctx.builder.names
        out = names.fresh(f"{op_type.lower()}_step")
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=names.fresh(op_type), **attributes))
        return out

    def add(self, a: str, b: str | None) -> str:
        """``a + b`` (``a`` when ``b`` is ``None``)."""
        return a if b is None else self.op("Add", a, b)

    def graph(self, outputs: Sequence[str]) -> onnx.GraphProto:
        """The body graph with ``outputs`` (states first, then step outputs)."""
        infos = [helper.make_tensor_value_info(o, self._elem, [None, None]) for o in outputs]
        return helper.make_graph(self.nodes, self._ctx.builder.names.fresh("scan_body"), self.inputs, infos)


#: A step function: (body, states, one step of each scanned input) -> (new states, step outputs).
StepFn = Callable[[_Body, list[str], list[str]], tuple[list[str], list[str]]]


def _scan(
    ctx: RuleContext, step: StepFn, states: Sequence[str], scanned: Sequence[str], *, reverse: bool
) -> tuple[list[str], list[str]]:
    """``Scan`` over axis 0 of ``scanned``, last step first when ``reverse`` (outputs stay aligned with time).

    The reverse scan reverses its inputs and outputs with ``Slice`` rather than use ``Scan``'s
    directions, which ``onnx.reference`` does not implement.
    """
    body = _Body(ctx, states[0])
    state_in = [body.input("carry") for _ in states]
    step_in = [body.input("step") for _ in scanned]
    new_states, step_out = step(body, state_in, step_in)
    outputs: list[str] = []
    for o in (*new_states, *step_out):  # each body output its own value (onnxruntime needs distinct ones)
        outputs.append(body.op("Identity", o) if o in outputs or o in state_in or o in step_in else o)
    results = ctx.op_n(
        "Scan",
        len(states) + len(step_out),
        *states,
        *(_reverse(ctx, s, None) if reverse else s for s in scanned),
        body=body.graph(outputs),
        num_scan_inputs=len(scanned),
    )
    finals, outs = results[: len(states)], results[len(states) :]
    return finals, [_reverse(ctx, o, None) if reverse else o for o in outs]


def _present(values: Sequence[str | None]) -> list[str]:
    """The values that are not ``None``."""
    return [v for v in values if v is not None]


# ------------------------------------------------------------------ one direction


@dataclass(frozen=True)
class _Direction:
    """One direction's tensors in its processing order (time-major, the direction axis removed)."""

    x: str  # [T, B, I]
    y: str  # [T, B, H]: the forward's hidden outputs (zero past a sequence's length)
    h_prev: str  # [T, B, H]: the state before each step
    gy: str | None  # [T, B, H]: the gradient of Y, masked
    carry_h: str  # [B, H]: the gradient of Y_h, or zeros
    w: str  # [G H, I]
    r: str  # [G H, H]
    wb: str | None  # [G H]
    rb: str | None  # [G H]
    mask: str | None  # [T, B, 1]
    keep: str | None  # 1 - mask
    activation: str  # RNN's
    c0: str | None = None  # LSTM: [B, H], the initial cell state
    carry_c: str | None = None  # LSTM: [B, H], the gradient of Y_c
    p: str | None = None  # LSTM: [3 H], the peepholes


@dataclass(frozen=True)
class _Partial:
    """What a cell's backward pass gives: ``da`` for X, W and Wb, and the recurrent side."""

    da: str  # [T, B, G H]
    dr: str  # [G H, H]
    drb: str  # [G H]
    dh0: str  # [B, H]
    dc0: str | None = None
    dp: str | None = None


def _masked(ctx: RuleContext, v: str, mask: str | None) -> str:
    """``v * mask`` (``v`` without a mask)."""
    return v if mask is None else ctx.mul(v, mask)


def _clipped(ctx: RuleContext, pre: str, clip: float | None) -> tuple[str, str | None]:
    """``clip(pre)``, the activation's input, and ``|pre| < clip`` (its derivative); ``pre`` and ``None``
    without ``clip``."""
    if clip is None:
        return pre, None
    bounded = ctx.op("Clip", pre, ctx.const(-clip, pre), ctx.const(clip, pre))
    return bounded, ctx.cast_like(ctx.compare("Less", ctx.op("Abs", pre), clip), pre)


def _rnn_derivative(ctx: RuleContext, y: str, activation: str) -> str:
    """``f'(a)`` from ``y = f(a)``: ``1 - y^2`` (Tanh), ``y (1 - y)`` (Sigmoid), ``y > 0`` (Relu)."""
    if activation == "tanh":
        return ctx.sub(1.0, ctx.square(y))
    if activation == "sigmoid":
        return ctx.mul(y, ctx.sub(1.0, y))
    return ctx.cast_like(ctx.compare("Greater", y, 0.0), y)


def _rnn_cell(ctx: RuleContext, d: _Direction, setup: _Setup) -> _Partial:
    """``h_t = f(a_t)``: ``da_t = (dh_t + g_Y_t) f'(a_t)``, ``dh_{t-1} = da_t R`` (plus the carry past the length)."""
    k = _rnn_derivative(ctx, d.y, d.activation)
    if setup.clip is not None:  # the pre-activations, to know which were clipped
        a = ctx.add(_linear(ctx, d.x, d.w), _linear(ctx, d.h_prev, d.r))
        a = a if d.wb is None else ctx.add(a, ctx.add(d.wb, d.rb))
        k = _masked(ctx, k, _clipped(ctx, a, setup.clip)[1])
    k = _masked(ctx, k, d.mask)

    def step(body: _Body, states: list[str], xs: list[str]) -> tuple[list[str], list[str]]:
        (carry,) = states
        gy, k_t, keep = (xs.pop(0) if flag else None for flag in (d.gy is not None, True, d.keep is not None))
        total = body.add(carry, gy)
        da = body.op("Mul", total, k_t)
        back = body.op("MatMul", da, d.r)
        return [body.add(back, None if keep is None else body.op("Mul", keep, total))], [da]

    (dh0,), (da,) = _scan(ctx, step, [d.carry_h], _present([d.gy, k, d.keep]), reverse=True)
    return _Partial(da, _outer(ctx, da, d.h_prev), _total(ctx, da), dh0)


def _gru_cell(ctx: RuleContext, d: _Direction, setup: _Setup) -> _Partial:
    """``h = (1 - z) hh + z h_prev``: ``da_z = dh (h_prev - hh) z (1 - z)``, ``da_h = dh (1 - z) (1 - hh^2)``, ``da_r``
    through ``r h_prev`` (or ``r (h_prev Rh^T + Rbh)`` with ``linear_before_reset``)."""
    hidden = setup.hidden
    before_reset = bool(ctx.attr("linear_before_reset", 0))
    ax = _linear(ctx, d.x, d.w)
    if d.wb is not None:
        ax = ctx.add(ax, d.wb)
    ax_zr, ax_h = _split(ctx, ax, [2 * hidden, hidden])
    r_zr, r_h = _split(ctx, d.r, [2 * hidden, hidden], axis=0)
    rb_zr, rb_h = _split(ctx, d.rb, [2 * hidden, hidden], axis=0) if d.rb is not None else (None, None)
    a_zr = ctx.add(ax_zr, _linear(ctx, d.h_prev, r_zr))
    if rb_zr is not None:
        a_zr = ctx.add(a_zr, rb_zr)
    a_zr, inside_zr = _clipped(ctx, a_zr, setup.clip)
    z, r = _split(ctx, ctx.op("Sigmoid", a_zr), [hidden, hidden])
    inside_z, inside_r = _split(ctx, inside_zr, [hidden, hidden]) if inside_zr is not None else (None, None)
    if before_reset:
        q = _linear(ctx, d.h_prev, r_h)
        q = q if rb_h is None else ctx.add(q, rb_h)
        a_h = ctx.add(ax_h, ctx.mul(r, q))
        kr = ctx.mul(q, ctx.mul(r, ctx.sub(1.0, r)))
    else:
        rh = ctx.mul(r, d.h_prev)
        a_h = ctx.add(ax_h, _linear(ctx, rh, r_h))
        a_h = a_h if rb_h is None else ctx.add(a_h, rb_h)
        kr = ctx.mul(d.h_prev, ctx.mul(r, ctx.sub(1.0, r)))
    a_h, inside_h = _clipped(ctx, a_h, setup.clip)
    hh = ctx.op("Tanh", a_h)
    kr = _masked(ctx, kr, inside_r)
    kz = ctx.mul(ctx.sub(d.h_prev, hh), ctx.mul(z, ctx.sub(1.0, z)))
    kz = _masked(ctx, _masked(ctx, kz, inside_z), d.mask)
    kh = ctx.mul(ctx.sub(1.0, z), ctx.sub(1.0, ctx.square(hh)))
    kh = _masked(ctx, _masked(ctx, kh, inside_h), d.mask)
    kz_direct = z if d.mask is None else ctx.add(ctx.mul(z, d.mask), d.keep)  # dh_{t-1} += dh * kz_direct

    def step(body: _Body, states: list[str], xs: list[str]) -> tuple[list[str], list[str]]:
        (carry,) = states
        gy = xs.pop(0) if d.gy is not None else None
        kz_t, kh_t, kr_t, direct_t, r_t = xs
        total = body.add(carry, gy)
        da_z, da_h = body.op("Mul", total, kz_t), body.op("Mul", total, kh_t)
        direct = body.op("Mul", total, direct_t)
        if before_reset:
            dq = body.op("Mul", da_h, r_t)
            da_r = body.op("Mul", da_h, kr_t)
            da_rec = body.op("Concat", da_z, da_r, dq, axis=-1)
            back = body.op("MatMul", da_rec, d.r)
            return [body.op("Add", direct, back)], [body.op("Concat", da_z, da_r, da_h, axis=-1), da_rec]
        drh = body.op("MatMul", da_h, r_h)
        da_r = body.op("Mul", drh, kr_t)
        back = body.op("MatMul", body.op("Concat", da_z, da_r, axis=-1), r_zr)
        dh = body.op("Add", body.op("Add", direct, back), body.op("Mul", drh, r_t))
        return [dh], [body.op("Concat", da_z, da_r, da_h, axis=-1)]

    (dh0,), outs = _scan(ctx, step, [d.carry_h], _present([d.gy, kz, kh, kr, kz_direct, r]), reverse=True)
    da = outs[0]
    if before_reset:
        return _Partial(da, _outer(ctx, outs[1], d.h_prev), _total(ctx, outs[1]), dh0)
    da_zr, da_h = _split(ctx, da, [2 * hidden, hidden])
    dr = ctx.op("Concat", _outer(ctx, da_zr, d.h_prev), _outer(ctx, da_h, rh), axis=0)
    return _Partial(da, dr, _total(ctx, da), dh0)


def _lstm_cell(ctx: RuleContext, d: _Direction, setup: _Setup) -> _Partial:
    """``c = f c_prev + i g``, ``h = o tanh(c)`` (gates ``i, o, f`` see ``c_prev, c, c_prev`` through ``P``):
    ``dc = dc_next + dh o (1 - tanh^2 c) + da_o P_o``, ``da_i = dc g i (1 - i)``, ``da_f = dc c_prev f (1 - f)``,
    ``da_g = dc i (1 - g^2)``, ``da_o = dh tanh(c) o (1 - o)``, ``dc_prev = dc f + da_i P_i + da_f P_f``."""
    hidden = setup.hidden
    a = ctx.add(_linear(ctx, d.x, d.w), _linear(ctx, d.h_prev, d.r))
    if d.wb is not None:
        a = ctx.add(a, ctx.add(d.wb, d.rb))
    a_i, a_o, a_f, a_g = _split(ctx, a, [hidden] * 4)
    p_i, p_o, p_f = _split(ctx, d.p, [hidden] * 3, axis=0) if d.p is not None else (None, None, None)
    c_init = d.c0 if d.c0 is not None else _zeros_state(ctx, d.y)
    a_g, inside_g = _clipped(ctx, a_g, setup.clip)
    g = ctx.op("Tanh", a_g)
    bounds = None if setup.clip is None else (ctx.const(-setup.clip, a), ctx.const(setup.clip, a))

    def forward(body: _Body, states: list[str], xs: list[str]) -> tuple[list[str], list[str]]:
        (c,) = states
        ai_t, af_t, g_t, *m_t = xs
        pre_i = body.add(ai_t, None if p_i is None else body.op("Mul", p_i, c))
        pre_f = body.add(af_t, None if p_f is None else body.op("Mul", p_f, c))
        if bounds is not None:
            pre_i, pre_f = (body.op("Clip", pre, *bounds) for pre in (pre_i, pre_f))
        i, f = body.op("Sigmoid", pre_i), body.op("Sigmoid", pre_f)
        new = body.op("Add", body.op("Mul", f, c), body.op("Mul", i, g_t))
        if m_t:  # c + m (new - c): the state is carried past the sequence's length
            new = body.op("Add", c, body.op("Mul", m_t[0], body.op("Sub", new, c)))
        return [new], [new]

    _, (cells,) = _scan(ctx, forward, [c_init], _present([a_i, a_f, g, d.mask]), reverse=False)
    c_prev = _shift(ctx, cells, c_init)

    def gate(pre: str, weight: str | None, state: str) -> tuple[str, str | None]:
        """The gate ``sigmoid(clip(pre + weight state))`` and where its input is not clipped."""
        bounded, inside = _clipped(ctx, pre if weight is None else ctx.add(pre, ctx.mul(weight, state)), setup.clip)
        return ctx.op("Sigmoid", bounded), inside

    (i, inside_i), (f, inside_f), (o, inside_o) = (
        gate(a_i, p_i, c_prev),
        gate(a_f, p_f, c_prev),
        gate(a_o, p_o, cells),
    )
    tc = ctx.op("Tanh", cells)
    ko = _masked(ctx, ctx.mul(tc, ctx.mul(o, ctx.sub(1.0, o))), inside_o)
    kc = ctx.mul(o, ctx.sub(1.0, ctx.square(tc)))
    ki = _masked(ctx, ctx.mul(g, ctx.mul(i, ctx.sub(1.0, i))), inside_i)
    kf = _masked(ctx, ctx.mul(c_prev, ctx.mul(f, ctx.sub(1.0, f))), inside_f)
    kg = _masked(ctx, ctx.mul(i, ctx.sub(1.0, ctx.square(g))), inside_g)

    def backward(body: _Body, states: list[str], xs: list[str]) -> tuple[list[str], list[str]]:
        carry_h, carry_c = states
        gy = xs.pop(0) if d.gy is not None else None
        ko_t, kc_t, ki_t, kf_t, kg_t, f_t, *masks = xs
        total = body.add(carry_h, gy)
        da_o = body.op("Mul", total, ko_t)
        dc = body.add(
            body.add(carry_c, body.op("Mul", total, kc_t)), None if p_o is None else body.op("Mul", da_o, p_o)
        )
        if masks:
            m_t, keep_t = masks
            dc, da_o = body.op("Mul", dc, m_t), body.op("Mul", da_o, m_t)
        da_i, da_f, da_g = (body.op("Mul", dc, k) for k in (ki_t, kf_t, kg_t))
        da = body.op("Concat", da_i, da_o, da_f, da_g, axis=-1)
        dh = body.op("MatMul", da, d.r)
        dc_prev = body.op("Mul", dc, f_t)
        if p_i is not None and p_f is not None:
            dc_prev = body.add(body.add(dc_prev, body.op("Mul", da_i, p_i)), body.op("Mul", da_f, p_f))
        if masks:
            dh = body.op("Add", dh, body.op("Mul", keep_t, total))
            dc_prev = body.op("Add", dc_prev, body.op("Mul", keep_t, carry_c))
        return [dh, dc_prev], [da]

    carry_c = d.carry_c if d.carry_c is not None else _zeros_state(ctx, d.y)
    scanned = _present([d.gy, ko, kc, ki, kf, kg, f, d.mask, d.keep])
    (dh0, dc0), (da,) = _scan(ctx, backward, [d.carry_h, carry_c], scanned, reverse=True)
    dp = None
    if d.p is not None:
        da_i, da_o, da_f, _ = _split(ctx, da, [hidden] * 4)
        sums = [_total(ctx, ctx.mul(dg, state)) for dg, state in ((da_i, c_prev), (da_o, cells), (da_f, c_prev))]
        dp = ctx.op("Concat", *sums, axis=0)
    return _Partial(da, _outer(ctx, da, d.h_prev), _total(ctx, da), dh0, dc0, dp)


# ------------------------------------------------------------------ the rules

#: A cell's backward pass over one direction.
CellFn = Callable[[RuleContext, _Direction, _Setup], _Partial]
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _grad_of(grads: Grads, index: int) -> str | None:
    """The gradient of output ``index`` (``None`` for an output the node does not list)."""
    return grads[index] if index < len(grads) else None


def _differentiate(ctx: RuleContext, grads: Grads, op: str, cell: CellFn) -> Result:
    """The gradients of every input, each direction reduced to a forward pass (see the module docstring)."""
    setup = _setup(ctx, op)
    n, layout, gates = len(setup.directions), setup.layout, _GATES[op]
    x = _transpose(ctx, ctx.inputs[0], [1, 0, 2], layout)  # [T, B, I]
    y = _transpose(ctx, ctx.ensure_output(0, f"{op.lower()}_y"), [1, 2, 0, 3], layout)  # [T, D, B, H]
    g_y, g_h, g_c = (_grad_of(grads, k) for k in range(3))
    g_y = None if g_y is None else _transpose(ctx, g_y, [1, 2, 0, 3], layout)
    g_h, g_c = (None if g is None else _transpose(ctx, g, [1, 0, 2], layout) for g in (g_h, g_c))
    h0, c0 = (_transpose(ctx, ctx.inputs[k], [1, 0, 2], layout) if ctx.has_input(k) else None for k in (5, 6))
    c0 = c0 if op == "LSTM" else None
    masks = _masks(ctx, x)
    lens, mask, keep = (None, None, None) if masks is None else (masks.lens, masks.mask, masks.keep)
    nonempty = None if masks is None else masks.nonempty
    size = gates * setup.hidden
    dx, dw, dr, db, dh0, dc0, dp = ([] for _ in range(7))
    for k, reverse in enumerate(setup.directions):

        def order(v: str, reverse: bool = reverse) -> str:
            return _reverse(ctx, v, lens) if reverse else v

        x_d = order(x)
        y_d = order(_pick(ctx, y, k, n, 1))
        h0_d = _pick(ctx, h0, k, n, 0) if h0 is not None else _zeros_state(ctx, y_d)
        bias = _split(ctx, _pick(ctx, ctx.inputs[3], k, n, 0), [size, size], axis=0) if ctx.has_input(3) else None
        w_d = _pick(ctx, ctx.inputs[1], k, n, 0)
        direction = _Direction(
            x=x_d,
            y=y_d,
            h_prev=_shift(ctx, y_d, h0_d),
            gy=None if g_y is None else _masked(ctx, order(_pick(ctx, g_y, k, n, 1)), mask),
            carry_h=_masked(ctx, _pick(ctx, g_h, k, n, 0), nonempty) if g_h is not None else _zeros_state(ctx, y_d),
            w=w_d,
            r=_pick(ctx, ctx.inputs[2], k, n, 0),
            wb=None if bias is None else bias[0],
            rb=None if bias is None else bias[1],
            mask=mask,
            keep=keep,
            activation=setup.activations[k] if op == "RNN" else "",
            c0=None if c0 is None else _pick(ctx, c0, k, n, 0),
            carry_c=None if g_c is None else _masked(ctx, _pick(ctx, g_c, k, n, 0), nonempty),
            p=_pick(ctx, ctx.inputs[7], k, n, 0) if op == "LSTM" and ctx.has_input(7) else None,
        )
        part = cell(ctx, direction, setup)
        dx.append(order(ctx.op("MatMul", part.da, w_d)))
        dw.append(_outer(ctx, part.da, x_d))
        dr.append(part.dr)
        db.append(ctx.op("Concat", _total(ctx, part.da), part.drb, axis=0))
        dh0.append(part.dh0)
        dc0.append(part.dc0)
        dp.append(part.dp)
    total_dx = dx[0] if n == 1 else ctx.add(dx[0], dx[1])
    result: Result = [
        _transpose(ctx, total_dx, [1, 0, 2], layout),
        _stack(ctx, dw),
        _stack(ctx, dr),
        _stack(ctx, db) if ctx.has_input(3) else None,
        None,
        _transpose(ctx, _stack(ctx, dh0), [1, 0, 2], layout) if h0 is not None else None,
    ]
    if op == "LSTM":
        result.append(_transpose(ctx, _stack(ctx, _present(dc0)), [1, 0, 2], layout) if c0 is not None else None)
        result.append(_stack(ctx, _present(dp)) if ctx.has_input(7) else None)
    result = result[: len(ctx.inputs)]
    return [g if ctx.needs(i) else None for i, g in enumerate(result)]


@registry.rule("RNN", inputs=(0, 1, 2, 3, 5))
def rnn(ctx: RuleContext, grads: Grads) -> Result:
    """h_t = f(a_t): da_t = (dh_t + g_Y_t) f'(a_t), dh_{t-1} = da_t R (reverse Scan); dX = da W, dW = sum da_t^T x_t, dR = sum da_t^T h_{t-1}, dB = [sum da, sum da]"""  # noqa: E501
    return _differentiate(ctx, grads, "RNN", _rnn_cell)


@registry.rule("GRU", inputs=(0, 1, 2, 3, 5))
def gru(ctx: RuleContext, grads: Grads) -> Result:
    """h_t = (1 - z) hh + z h_{t-1}: da_z = dh (h_{t-1} - hh) z (1 - z), da_h = dh (1 - z) (1 - hh^2), da_r through r h_{t-1} or r (h_{t-1} Rh^T + Rbh) (reverse Scan); dX = da W, dW = sum da_t^T x_t"""  # noqa: E501
    return _differentiate(ctx, grads, "GRU", _gru_cell)


@registry.rule("LSTM", inputs=(0, 1, 2, 3, 5, 6, 7))
def lstm(ctx: RuleContext, grads: Grads) -> Result:
    """c_t = f c_{t-1} + i g, h_t = o tanh(c_t): dc = dc_next + dh o (1 - tanh^2 c) + da_o P_o, da_[i,f,g] = dc [g i (1 - i), c_{t-1} f (1 - f), i (1 - g^2)], da_o = dh tanh(c) o (1 - o) (cells recomputed by a Scan, reverse Scan); dX = da W, dW = sum da_t^T x_t, dP = sums of da c"""  # noqa: E501
    return _differentiate(ctx, grads, "LSTM", _lstm_cell)
