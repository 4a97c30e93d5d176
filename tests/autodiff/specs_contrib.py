"""Finite-difference specs of the rules in ``onnxtrain/autodiff/rules/contrib.py`` (see ``specs.py``).

ONNX Runtime's CPU kernels of these operators are float32 only (FastGelu, QuickGelu and
FusedMatMul also have double ones, checked in float64; its LayerNormalization and
SimplifiedLayerNormalization compute a double input's statistics in float32, and 1.23's
fails with stash_type double): float32 specs use ``gradcheck``'s Richardson-extrapolated
differences and its float32 tolerance. Attention's mask and sequence layouts are drawn with the shapes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper
from onnx.reference.op_run import OpRun

from onnxtrain.graph import versions
from tests.autodiff.models import Erf
from tests.autodiff.specs import Arg, Case, Extra, Spec, _fixed, cases

_F32 = np.float32
MS = "com.microsoft"
_MS_OPSET = ((MS, 1),)


def _ms(
    op_type: str, args: tuple[Arg, ...], strategy: st.SearchStrategy[Case], spec_class: type[Spec] = Spec, **kw: Any
) -> Spec:
    """A spec of a ``com.microsoft`` operator (the model imports the domain)."""
    kw.setdefault("dtype", _F32)
    return spec_class(op_type, args, strategy, domain=MS, extra_opsets=_MS_OPSET, **kw)


class BiasSplitGelu(OpRun):  # onnx.reference finds it by its class name
    """``com.microsoft::BiasSplitGelu`` for ``onnx.reference``, from its definition (the fusion ONNX Runtime
    makes of ``u = X + bias``, two halves of the last axis, ``y = a * Gelu(b)``, Gelu with erf)."""

    op_domain = MS

    def _run(self, x: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray]:
        a, b = np.split(x + bias, 2, axis=-1)
        erf = np.vectorize(math.erf, otypes=[b.dtype])
        return (a * b * 0.5 * (1.0 + erf(b / math.sqrt(2.0))),)


class ReferenceContribSpec(Spec):
    """A spec of a ``com.microsoft`` operator with no onnxruntime CPU kernel, run in ``onnx.reference``
    with an implementation from the operator's definition (BiasSplitGelu: CUDA only)."""

    backend = "onnx.reference"
    reference_ops = (BiasSplitGelu, Erf)  # onnx.reference's own Erf computes in float32


# ------------------------------------------------------------ normalizations


@functools.cache
def skip_norm_writes_statistics() -> bool:
    """Whether the installed onnxruntime's SkipLayerNormalization writes its optional mean and inv_std_var
    outputs (1.23 leaves them unwritten; then the specs declare the output y only)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])
    gamma = helper.make_tensor_value_info("gamma", TensorProto.FLOAT, [2])
    node = helper.make_node("SkipLayerNormalization", ["x", "x", "gamma"], ["y", "mean"], domain=MS)
    outputs = [helper.make_value_info(name, onnx.TypeProto()) for name in ("y", "mean")]
    graph = helper.make_graph([node], "probe", [x, gamma], outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    versions.stamp_ir_version(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"x": np.array([[0.0, 1.0]], np.float32), "gamma": np.ones(2, np.float32)}
    return session.run(["mean"], feeds)[0] is not None


@st.composite
def skip_norm_cases(draw: st.DrawFn, n_vectors: int, n_outputs: int) -> Case:
    """input ``[B, S, H]`` or ``[T, H]``, a skip of the same shape, ``[1, S, H]`` or ``[S, H]``, vectors ``[H]``;
    the loss projects any non-empty subset of the outputs."""
    hidden = draw(st.integers(2, 5))
    if draw(st.booleans()):
        batch, seq = draw(st.integers(1, 3)), draw(st.integers(1, 3))
        x = (batch, seq, hidden)
        skip = draw(st.sampled_from([x, (1, seq, hidden), (seq, hidden)]))
    else:
        x = skip = (draw(st.integers(1, 4)), hidden)
    if not skip_norm_writes_statistics():
        n_outputs = 1
    used = draw(st.lists(st.integers(0, n_outputs - 1), unique=True, min_size=1, max_size=n_outputs))
    attrs = {"epsilon": 1e-5} if draw(st.booleans()) else {}
    return Case(
        (x, skip, *[(hidden,)] * n_vectors), _fixed(attrs), used_outputs=tuple(sorted(used)), n_outputs=n_outputs
    )


@st.composite
def norm_cases(draw: st.DrawFn, n_vectors: int, n_outputs: int) -> Case:
    """x of rank 1-3 normalized from a drawn axis on; scale (and bias) of the normalized shape."""
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    shape = (*shape[:-1], max(shape[-1], 2))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    normalized = shape[axis % len(shape) :]
    used = draw(st.lists(st.integers(0, n_outputs - 1), unique=True, min_size=1, max_size=n_outputs))
    attrs: dict[str, Any] = {"axis": axis} if axis != -1 or draw(st.booleans()) else {}
    return Case(
        (shape, *[normalized] * n_vectors), _fixed(attrs), used_outputs=tuple(sorted(used)), n_outputs=n_outputs
    )


def _spread(bias_arg: int | None, rms: bool) -> Any:
    """``valid``: each row of ``s = input + skip (+ bias)`` has a variance (mean square) of at least 0.05;
    near 0, ``1 / sqrt(var + eps)`` is too steep for finite differences."""

    def valid(arrays: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> bool:
        s = arrays[0] + arrays[1] + (arrays[bias_arg] if bias_arg is not None else 0.0)
        spread = np.mean(np.square(s), axis=-1) if rms else np.var(s, axis=-1)
        return bool(np.all(spread > 0.05))

    return valid


def _normalized_spread(rms: bool) -> Any:
    """``valid`` of LayerNormalization / SimplifiedLayerNormalization: as :func:`_spread`, over the axes
    from ``axis`` on."""

    def valid(arrays: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> bool:
        x = arrays[0]
        axes = tuple(range(int(attrs.get("axis", -1)) % x.ndim, x.ndim))
        spread = np.mean(np.square(x), axis=axes) if rms else np.var(x, axis=axes)
        return bool(np.all(spread > 0.05))

    return valid


_SKIP_LN_WIRINGS = {
    "beta-bias": ((Arg(), Arg(), Arg(), Arg(), Arg()), None, 4),
    "bias-only": ((Arg(), Arg(), Arg(), Arg()), (0, 1, 2, None, 3), 3),
    "no-beta-no-bias": ((Arg(), Arg(), Arg()), None, None),
}

SPECS: list[Spec] = [
    *(
        _ms(
            "SkipLayerNormalization",
            args,
            skip_norm_cases(len(args) - 2, 4),
            wiring=wiring,
            valid=_spread(bias, rms=False),
            variant=name,
        )
        for name, (args, wiring, bias) in _SKIP_LN_WIRINGS.items()
    ),
    # output 1 (mean) of the RMS form is not a statistic of it: never projected
    _ms(
        "SkipSimplifiedLayerNormalization",
        (Arg(), Arg(), Arg(), Arg()),
        skip_norm_cases(2, 1),
        valid=_spread(3, rms=True),
        variant="bias-y",
    ),
    _ms(
        "SkipSimplifiedLayerNormalization",
        (Arg(), Arg(), Arg()),
        skip_norm_cases(1, 4).filter(lambda case: 1 not in case.used_outputs),
        valid=_spread(None, rms=True),
        variant="no-bias",
    ),
    Spec(
        "LayerNormalization",
        (Arg(), Arg(), Arg()),
        norm_cases(2, 3),
        dtype=_F32,
        opset=14,
        valid=_normalized_spread(rms=False),
        variant="onnxruntime-opset14",
    ),
    Spec(
        "LayerNormalization",
        (Arg(), Arg()),
        norm_cases(1, 3),
        dtype=_F32,
        opset=13,
        valid=_normalized_spread(rms=False),
        variant="onnxruntime-opset13-no-bias",
    ),
    Spec(
        "SimplifiedLayerNormalization",
        (Arg(), Arg()),
        norm_cases(1, 2),
        opset=17,
        dtype=_F32,
        valid=_normalized_spread(rms=True),
    ),
    Spec(
        "SimplifiedLayerNormalization",
        (Arg(), Arg()),
        norm_cases(1, 2),
        opset=13,
        dtype=_F32,
        valid=_normalized_spread(rms=True),
        variant="opset13",
    ),
    # GELUs
    _ms("Gelu", (Arg("real2"),), cases(1), variant="com.microsoft"),
    _ms(
        "BiasGelu",
        (Arg("real2"), Arg()),
        st.builds(lambda n, h: Case(((*n, h), (h,))), st.lists(st.integers(1, 3), max_size=2), st.integers(1, 4)),
    ),
    _ms(
        "BiasSplitGelu",
        (Arg("real2"), Arg()),
        st.builds(
            lambda n, h: Case(((*n, 2 * h), (2 * h,))),
            st.lists(st.integers(1, 3), min_size=1, max_size=2),
            st.integers(1, 3),
        ),
        spec_class=ReferenceContribSpec,
        dtype=np.float64,
    ),
    _ms("FastGelu", (Arg("real2"),), cases(1), dtype=np.float64, variant="no-bias"),
    _ms(
        "FastGelu",
        (Arg("real2"), Arg()),
        st.builds(lambda n, h: Case(((*n, h), (h,))), st.lists(st.integers(1, 3), max_size=2), st.integers(1, 4)),
        variant="bias",
    ),
    _ms(
        "QuickGelu",
        (Arg("real2"),),
        cases(1, st.fixed_dictionaries({}, optional={"alpha": st.sampled_from([1.0, 0.5])})),
    ),
    _ms("QuickGelu", (Arg("real2"),), cases(1), dtype=np.float64, variant="double"),
]


# ------------------------------------------------------------------ FusedMatMul


@st.composite
def fused_matmul_cases(draw: st.DrawFn) -> Case:
    """A ``[..., M, K]`` and B ``[..., K, N]`` with broadcast batch axes (or 1-D), stored transposed where
    transA / transB, and alpha."""
    m, k, n = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    batch = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=2, max_side=3)).input_shapes
    attrs: dict[str, Any] = {}
    shapes = []
    for (rows, cols), extra, flag in (((m, k), batch[0], "transA"), ((k, n), batch[1], "transB")):
        if draw(st.integers(0, 5)) == 0:  # a 1-D operand
            shapes.append((k,))
            continue
        if draw(st.booleans()):
            attrs[flag] = 1
            rows, cols = cols, rows
        shapes.append((*extra, rows, cols))
    if len(shapes[1]) == 1 and "transA" in attrs:  # onnxruntime 1.32 then ignores transA (a kernel bug)
        shapes[0] = shapes[0][:-2] + shapes[0][:-3:-1]
        del attrs["transA"]
    if draw(st.booleans()):
        attrs["alpha"] = draw(st.sampled_from([0.5, -2.0]))
    return Case(tuple(shapes), _fixed(attrs))


SPECS += [
    _ms("FusedMatMul", (Arg(), Arg()), fused_matmul_cases(), dtype=np.float64),
    _ms("FusedMatMul", (Arg(), Arg()), fused_matmul_cases(), variant="float32"),
]


# -------------------------------------------------------------------- attention


def _mask_extra(draw: st.DrawFn, kind: str, index: int, batch: int, seq: int, kv: int) -> tuple[Extra, ...]:
    """A mask as onnxruntime's kernels read it: raw 0 / 1 ``[B, T]`` or ``[B, S, T]``, ``[B]`` end positions,
    ``[2B]`` end and start positions (int32).

    Each row keeps key 0 (and ``start < end``): a row masked everywhere is ``softmax(z - 10000)``, which
    float32 rounds to steps of 1e-3 in ``z``, so that finite differences of the kernel say nothing there.
    """
    if kind == "none":
        return ()
    if kind in ("raw2", "raw3"):
        shape = (batch, kv) if kind == "raw2" else (batch, seq, kv)
        flat = draw(st.lists(st.integers(0, 1), min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
        value = np.asarray(flat).reshape(shape)
        value[..., 0] = 1
        nested = tuple(tuple(r) if kind == "raw2" else tuple(map(tuple, r)) for r in value.tolist())
        return (Extra(index, nested, dtype=np.int32),)
    ends = draw(st.lists(st.integers(1, kv), min_size=batch, max_size=batch))
    starts = [draw(st.integers(0, end - 1)) for end in ends] if kind == "ends-starts" else []
    return (Extra(index, tuple(ends + starts), dtype=np.int32),)


@st.composite
def attention_cases(draw: st.DrawFn, with_mask: bool) -> Case:
    """x ``[B, S, Hin]``, packed weights ``[Hin, Hq + Hk + Hv]`` (unequal sizes by qkv_hidden_sizes), a
    bias and unidirectional; ``with_mask``: a drawn mask kind, else an attention_bias ``[B or 1, N or 1, S, S]``.

    Always with a bias: onnxruntime 1.23's Attention crashes (SIGSEGV) without one."""
    batch, seq, heads = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 2))
    depth, v_depth, hidden_in = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 3))
    sizes = [heads * depth, heads * depth, heads * v_depth]
    attrs: dict[str, Any] = {"num_heads": heads}
    if sizes[0] != sizes[2] or draw(st.booleans()):
        attrs["qkv_hidden_sizes"] = tuple(sizes)
    if draw(st.booleans()):
        attrs["unidirectional"] = 1
    if draw(st.booleans()):
        attrs["scale"] = 0.7
    shapes: list[tuple[int, ...]] = [(batch, seq, hidden_in), (hidden_in, sum(sizes))]
    if with_mask:
        shapes.append((sum(sizes),))
        kinds = ["none", "raw2", "raw3", "ends"] + ([] if "unidirectional" in attrs else ["ends-starts"])
        kind = draw(st.sampled_from(kinds))  # left padding and causality mask the first rows everywhere
        extras = _mask_extra(draw, kind, 3, batch, seq, seq)
        if draw(st.booleans()):
            attrs["mask_filter_value"] = -1000.0
    else:
        shapes.append((sum(sizes),))
        shapes.append((draw(st.sampled_from([1, batch])), draw(st.sampled_from([1, heads])), seq, seq))
        extras = ()
    return Case(tuple(shapes), _fixed(attrs), extras)


SPECS += [
    _ms("Attention", (Arg(), Arg(), Arg()), attention_cases(True), variant="bias-mask"),
    _ms(
        "Attention",
        (Arg(), Arg(), Arg(), Arg()),
        attention_cases(False),
        wiring=(0, 1, 2, None, None, 3),
        variant="attention-bias",
    ),
]


@st.composite
def multi_head_attention_cases(draw: st.DrawFn) -> Case:
    """query ``[B, S, N * Dq]``, key ``[B, L, N * Dq]``, value ``[B, L, N * Dv]``, a bias, a key padding mask
    and an attention_bias ``[B or 1, N or 1, S, L]``; unidirectional where ``S == L``."""
    batch, seq, kv, heads = (
        draw(st.integers(1, 2)),
        draw(st.integers(1, 3)),
        draw(st.integers(1, 3)),
        draw(st.integers(1, 2)),
    )
    depth, v_depth = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    attrs: dict[str, Any] = {"num_heads": heads}
    if seq == kv and draw(st.booleans()):
        attrs["unidirectional"] = 1
    if draw(st.booleans()):
        attrs["scale"] = 0.7
    shapes = (
        (batch, seq, heads * depth),
        (batch, kv, heads * depth),
        (batch, kv, heads * v_depth),
        (heads * (2 * depth + v_depth),),
        (draw(st.sampled_from([1, batch])), draw(st.sampled_from([1, heads])), seq, kv),
    )
    extras = _mask_extra(draw, draw(st.sampled_from(["none", "raw2", "raw3", "ends"])), 4, batch, seq, kv)
    return Case(shapes, _fixed(attrs), extras)


SPECS += [
    _ms(
        "MultiHeadAttention", tuple(Arg() for _ in range(5)), multi_head_attention_cases(), wiring=(0, 1, 2, 3, None, 4)
    ),
]


# ------------------------------------------------------------------ RotaryEmbedding


@st.composite
def rotary_cases(draw: st.DrawFn) -> Case:
    """Input ``[B, S, N * D]`` or ``[B, N, S, D]``, caches ``[M, R/2]`` (R = D, or rotary_embedding_dim with
    num_heads), position ids ``[B, S]`` or a ``[1]`` start, interleaved or not."""
    batch, seq, heads, half = (
        draw(st.integers(1, 2)),
        draw(st.integers(1, 3)),
        draw(st.integers(1, 2)),
        draw(st.integers(1, 2)),
    )
    extra = draw(st.sampled_from([0, 0, 2]))
    depth = 2 * half + extra
    attrs: dict[str, Any] = {}
    if draw(st.booleans()):
        attrs["interleaved"] = 1
    transposed = draw(st.booleans())
    if extra or not transposed:
        attrs["num_heads"] = heads
    if extra:
        attrs["rotary_embedding_dim"] = 2 * half
    x = (batch, heads, seq, depth) if transposed else (batch, seq, heads * depth)
    longest = seq + 2
    if draw(st.booleans()):
        positions = Extra(1, (draw(st.integers(0, longest - seq)),))
    else:
        ids = draw(st.lists(st.integers(0, longest - 1), min_size=batch * seq, max_size=batch * seq))
        positions = Extra(1, tuple(tuple(ids[b * seq : (b + 1) * seq]) for b in range(batch)))
    return Case((x, (longest, half), (longest, half)), _fixed(attrs), (positions,))


SPECS += [
    _ms(
        "RotaryEmbedding",
        (Arg(), Arg((-1.0, 1.0), diff=False), Arg((-1.0, 1.0), diff=False)),
        rotary_cases(),
        wiring=(0, None, 1, 2),
        variant="com.microsoft",
    ),
]


# ------------------------------------------------------------ EmbedLayerNormalization

_VOCAB, _LONGEST = 3, 5  # the table sizes: id args draw from their rows


class StaticSpec(Spec):
    """A spec whose inputs are declared with their sizes only: onnxruntime's shape inference of the
    operator wants static table shapes (they are initializers in a real model)."""

    dim_modes = ("static",)


@st.composite
def embed_cases(draw: st.DrawFn, segments: bool, positions: bool) -> Case:
    """ids ``[B, S]`` (repeats likely: 3 words), tables ``[3, H]`` / ``[5, H]`` (/ ``[2, H]`` segments),
    gamma and beta ``[H]``, position ids ``[B, S]`` or ``[1, S]``; the loss projects y and / or embedding_sum."""
    batch, seq, hidden = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(2, 4))
    ids = (batch, seq)
    tables = [(_VOCAB, hidden), (_LONGEST, hidden), *([(2, hidden)] if segments else [])]
    shapes = [ids, *([ids] if segments else []), *tables, (hidden,), (hidden,)]
    if positions:
        shapes.append((draw(st.sampled_from([1, batch])), seq))
    attrs = {"epsilon": 1e-5} if draw(st.booleans()) else {}
    return Case(tuple(shapes), _fixed(attrs), used_outputs=draw(st.sampled_from([(0,), (2,), (0, 2)])), n_outputs=3)


def _embedding_spread(segments: bool, positions: bool) -> Any:
    """``valid``: every embedding sum has a variance of at least 0.05 over H (see :func:`_spread`)."""

    def valid(arrays: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> bool:
        ids, *rest = arrays
        seg = rest.pop(0) if segments else None
        words, places = rest[0], rest[1]
        at = rest[-1] if positions else np.arange(ids.shape[1])[None, :]
        e = words[ids] + places[at] + (rest[2][seg] if segments else 0.0)
        return bool(np.all(np.var(e, axis=-1) > 0.05))

    return valid


_IDS = Arg((0, _VOCAB - 1), diff=False, dtype=np.int32)
_SEGMENT_IDS = Arg((0, 1), diff=False, dtype=np.int32)
_POSITION_IDS = Arg((0, _LONGEST - 1), diff=False, dtype=np.int32)

SPECS += [
    StaticSpec(
        "EmbedLayerNormalization",
        (_IDS, _SEGMENT_IDS, Arg(), Arg(), Arg(), Arg(), Arg(), _POSITION_IDS),
        embed_cases(True, True),
        dtype=_F32,
        domain=MS,
        extra_opsets=_MS_OPSET,
        wiring=(0, 1, 2, 3, 4, 5, 6, None, 7),
        valid=_embedding_spread(True, True),
        variant="segments-positions",
    ),
    StaticSpec(
        "EmbedLayerNormalization",
        (_IDS, Arg(), Arg(), Arg(), Arg()),
        embed_cases(False, False),
        dtype=_F32,
        domain=MS,
        extra_opsets=_MS_OPSET,
        wiring=(0, None, 1, 2, None, 3, 4),
        valid=_embedding_spread(False, False),
        variant="words-only",
    ),
]
