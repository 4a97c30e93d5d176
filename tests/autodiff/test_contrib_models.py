"""Transformer blocks fused by ONNX Runtime's transformer optimizer, trained by onnxtrain, against torch autograd.

Two blocks, exported by torch's TorchScript exporter in training mode (opset 14) and
fused by ``onnxruntime.transformers.optimizer.optimize_model(..., opt_level=0)``
(only the Python fusions, the same on CPU as on GPU):

- a post-norm BERT layer (self-attention with a padding mask, residual LayerNorms, a
  GELU feed-forward), ``model_type="bert"``: ``com.microsoft`` Attention (packed QKV
  weights and bias, a ``[B]`` mask index; onnxruntime 1.32, not 1.23),
  SkipLayerNormalization, and BiasGelu (erf GELU) or FastGelu (tanh GELU);
- a pre-norm Llama-like layer (RMSNorms, SiLU), ``model_type="gpt2"``: ONNX Runtime's
  ai.onnx SimplifiedLayerNormalization and ``com.microsoft``
  SkipSimplifiedLayerNormalization, whose ``input_skip_bias_sum`` output carries the
  residual stream on.

The training model's gradients use standard ONNX operators only; every parameter's
gradient (the packed QKV ones as the concatenation of torch's) is compared with
torch's, rtol 1e-4.
"""

from __future__ import annotations

import collections
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from packaging.version import Version

from tests.autodiff import models
from tests.helpers import export_for_training

HIDDEN, HEADS, FEED_FORWARD, SEQ = 8, 2, 16, 5
EPSILON = 1e-5
#: The blocks: BERT with an erf or a tanh GELU, and the Llama-like one.
KINDS = ("bert-erf", "bert-tanh", "llama")
#: The first onnxruntime release seen to fuse the BERT block's attention (1.23's optimizer leaves it unfused).
ATTENTION_FUSED_SINCE = Version("1.32")


def _bert(torch: Any, gelu: str) -> Any:
    """Post-norm BERT layer: LN(x + attention(x)), then LN(h + W2 gelu(W1 h))."""

    class Bert(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            nn = torch.nn
            self.q, self.k, self.v, self.o = (nn.Linear(HIDDEN, HIDDEN) for _ in range(4))
            self.ln1, self.ln2 = nn.LayerNorm(HIDDEN, eps=EPSILON), nn.LayerNorm(HIDDEN, eps=EPSILON)
            self.f1, self.f2 = nn.Linear(HIDDEN, FEED_FORWARD), nn.Linear(FEED_FORWARD, HIDDEN)

        def forward(self, x: Any, mask: Any) -> Any:
            batch, seq, _ = x.shape

            def heads(t: Any) -> Any:
                return t.view(batch, seq, HEADS, HIDDEN // HEADS).permute(0, 2, 1, 3)

            q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
            scores = torch.matmul(q, k.transpose(-1, -2)) / (HIDDEN // HEADS) ** 0.5
            padding = (1.0 - mask[:, None, None, :].to(x.dtype)) * -10000.0
            context = torch.matmul(torch.softmax(scores + padding, dim=-1), v)
            h = self.ln1(x + self.o(context.permute(0, 2, 1, 3).contiguous().view(batch, seq, HIDDEN)))
            f = torch.nn.functional.gelu(self.f1(h), approximate=gelu)
            return self.ln2(h + self.f2(f))

    return Bert()


def _llama(torch: Any) -> Any:
    """Pre-norm residual layers with RMSNorms: h = x + W1 n1(x), y = n3(h + W2 silu(n2(h)))."""
    nn = torch.nn

    class RMSNorm(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(HIDDEN))

        def forward(self, x: Any) -> Any:
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPSILON))

    class Llama(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.n1, self.n2, self.n3 = RMSNorm(), RMSNorm(), RMSNorm()
            self.f1, self.f2 = nn.Linear(HIDDEN, HIDDEN, bias=False), nn.Linear(HIDDEN, HIDDEN, bias=False)

        def forward(self, x: Any) -> Any:
            h = x + self.f1(self.n1(x))
            return self.n3(h + self.f2(torch.nn.functional.silu(self.n2(h))))

    return Llama()


def _block(kind: str) -> Any:
    """The torch module of block ``kind`` (seeded)."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    if kind == "llama":
        return _llama(torch)
    return _bert(torch, "none" if kind == "bert-erf" else "tanh")


def _export(module: Any, kind: str) -> onnx.ModelProto:
    torch = pytest.importorskip("torch")
    names = ["x"] if kind == "llama" else ["x", "mask"]
    args = (torch.zeros(2, SEQ, HIDDEN), torch.ones(2, SEQ, dtype=torch.int64))[: len(names)]
    axes = {**{name: {0: "batch"} for name in names}, "y": {0: "batch"}}
    return export_for_training(module, args, names, ["y"], opset=14, dynamic_axes=axes)


def _fuse(model: onnx.ModelProto, kind: str) -> onnx.ModelProto:
    """ONNX Runtime's optimizer, then its symbolic shape inference (onnx's cannot type com.microsoft outputs).

    The optimizer's in-memory model lacks the ``com.microsoft`` opset import that its
    ``save_model_to_file`` adds; it is added here the same way.
    """
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    from onnxruntime.transformers.optimizer import optimize_model

    model_type = "gpt2" if kind == "llama" else "bert"
    fused = optimize_model(
        model, model_type=model_type, num_heads=HEADS, hidden_size=HIDDEN, opt_level=0, use_gpu=False
    ).model
    if not any(opset.domain == "com.microsoft" for opset in fused.opset_import):
        fused.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    return SymbolicShapeInference.infer_shapes(fused, auto_merge=True)


@dataclass(frozen=True)
class Fused:
    module: Any
    state: dict[str, Any]
    model: onnx.ModelProto
    training: onnx.ModelProto
    runner: models.Runner
    params: dict[str, np.ndarray]


@functools.cache
def _fused(kind: str) -> Fused:
    module = _block(kind)
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    model = _fuse(_export(module, kind), kind)
    params = {
        t.name: numpy_helper.to_array(t) for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT
    }
    block = models.training_block(model, "mse", tuple(params))
    training = block.gradient_models.training
    return Fused(module, state, model, training, models.Runner(training), params)


def _ops(model: onnx.ModelProto) -> collections.Counter[str]:
    return collections.Counter(f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in model.graph.node)


#: What the optimizer writes for each block (``Attention`` apart: see ATTENTION_FUSED_SINCE).
FUSED_OPERATORS = {
    "bert-erf": {"com.microsoft::SkipLayerNormalization": 2, "com.microsoft::BiasGelu": 1},
    "bert-tanh": {"com.microsoft::SkipLayerNormalization": 2, "com.microsoft::FastGelu": 1},
    "llama": {"ai.onnx::SimplifiedLayerNormalization": 1, "com.microsoft::SkipSimplifiedLayerNormalization": 2},
}


@pytest.mark.parametrize("kind", KINDS)
def test_optimizer_writes_the_fused_operators(kind: str) -> None:
    """What the optimizer makes of the block; the training model adds standard operators only."""
    fused = _fused(kind)
    ops = _ops(fused.model)
    assert {op: ops[op] for op in FUSED_OPERATORS[kind]} == FUSED_OPERATORS[kind], ops
    if kind != "llama" and Version(ort.__version__) >= ATTENTION_FUSED_SINCE:
        assert ops["com.microsoft::Attention"] == 1, ops
    if kind == "llama":  # the residual stream leaves the first Skip node by its input_skip_bias_sum output
        skip = next(n for n in fused.model.graph.node if n.op_type == "SkipSimplifiedLayerNormalization")
        assert len(skip.output) == 4 and skip.output[3], list(skip.output)
    foreign = {k for k, v in (_ops(fused.training) - ops).items() if v and not k.startswith("ai.onnx::")}
    assert not foreign, f"non-standard operators in the gradient graph: {foreign}"


def _torch_gradients(fused: Fused, inputs: list[np.ndarray], target: np.ndarray) -> tuple[float, dict]:
    torch = pytest.importorskip("torch")
    module = fused.module
    module.load_state_dict(fused.state)
    module.zero_grad()
    loss = torch.nn.functional.mse_loss(module(*map(torch.from_numpy, inputs)), torch.from_numpy(target))
    loss.backward()
    return float(loss.detach()), {name: p.grad.numpy().copy() for name, p in module.named_parameters()}


def _expected(fused: Fused, grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """torch's gradients in the fused model's layout: Linear weights transposed ([in, out]), the packed
    QKV weight and bias the concatenations of the q, k and v ones."""
    expected = {}
    for attention in (n for n in fused.model.graph.node if n.op_type == "Attention"):
        weight, bias = attention.input[1], attention.input[2]
        expected[weight] = np.concatenate([grads[f"{p}.weight"].T for p in "qkv"], axis=1)
        expected[bias] = np.concatenate([grads[f"{p}.bias"] for p in "qkv"])
    for name, grad in grads.items():
        if name in fused.params:
            expected[name] = grad.T if grad.ndim == 2 else grad
    return expected


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("kind", KINDS)
def test_fused_block_gradients_match_torch_autograd(kind: str, batch: int) -> None:
    """Loss and every parameter's gradient of the fused model equal torch's (rtol 1e-4); BERT: right padding
    masked in the first sequence."""
    fused = _fused(kind)
    rng = np.random.default_rng(batch)
    x = rng.normal(size=(batch, SEQ, HIDDEN)).astype(np.float32)
    mask = np.ones((batch, SEQ), np.int64)
    mask[0, SEQ - 2 :] = 0
    inputs = [x] if kind == "llama" else [x, mask]
    target = rng.normal(size=(batch, SEQ, HIDDEN)).astype(np.float32)
    feeds = {"x": x, "mask": mask, "target": target, **fused.params}
    out = fused.runner({v.name: feeds[v.name] for v in fused.training.graph.input})
    want_loss, grads = _torch_gradients(fused, inputs, target)
    expected = _expected(fused, grads)
    assert set(expected) == set(fused.params), "every parameter of the fused model has a torch counterpart"
    np.testing.assert_allclose(out[fused.training.graph.output[0].name], want_loss, rtol=1e-5)
    for name, want in expected.items():
        got = out[f"{name}_grad"]
        assert got.shape == want.shape, f"{name}_grad: {got.shape}, torch {want.shape}"
        atol = 1e-6 * max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=atol, err_msg=name)


# ---------------------------------------------------------------- refusals


def _refused(
    node: onnx.NodeProto, inputs: dict[str, tuple[int, list[int]]], y_shape: list[int], wrt: str, output: int = 0
) -> str:
    """The error building the gradient of ``sum(y)``, ``y`` the node's output ``output`` (float32 ``y_shape``)."""
    from onnxtrain.autodiff import build_gradients
    from onnxtrain.graph import GraphBuilder
    from tests.helpers import FLOAT, make_model

    loss = helper.make_node("ReduceSum", [node.output[output]], ["loss"], keepdims=0)
    model = make_model(inputs, [node, loss], {"loss": (FLOAT, [])}, extra_opsets={"com.microsoft": 1})
    model.graph.value_info.append(helper.make_tensor_value_info(node.output[output], FLOAT, y_shape))
    with pytest.raises(ValueError) as error:
        build_gradients(GraphBuilder(model), "loss", [wrt])
    return str(error.value)


F32 = onnx.TensorProto.FLOAT
I32 = onnx.TensorProto.INT32


def _ms(op_type: str, inputs: list[str], outputs: list[str], **attrs: Any) -> onnx.NodeProto:
    return helper.make_node(op_type, inputs, outputs, domain="com.microsoft", name="n", **attrs)


def test_fused_matmul_batch_transposes_are_refused() -> None:
    node = _ms("FusedMatMul", ["a", "b"], ["y"], transBatchA=1)
    message = _refused(node, {"a": (F32, [2, 3, 4]), "b": (F32, [3, 4, 5])}, [3, 2, 5], "a")
    assert "transBatchA / transBatchB have no gradient rule" in message


def test_attention_with_a_key_value_cache_is_refused() -> None:
    node = _ms("Attention", ["x", "w", "b", "", "past"], ["y", "present"], num_heads=1)
    inputs = {"x": (F32, [1, 2, 3]), "w": (F32, [3, 6]), "b": (F32, [6]), "past": (F32, [2, 1, 1, 1, 2])}
    message = _refused(node, inputs, [1, 2, 2], "x")
    assert "past, past_sequence_length and present" in message and "without a key / value cache" in message


def test_attention_with_a_megatron_mask_is_refused() -> None:
    node = _ms("Attention", ["x", "w", "b", "mask"], ["y"], num_heads=1)
    inputs = {"x": (F32, [1, 2, 3]), "w": (F32, [3, 6]), "b": (F32, [6]), "mask": (I32, [1, 1, 2, 2])}
    assert "a mask of rank 4" in _refused(node, inputs, [1, 2, 2], "x")


def test_packed_multi_head_attention_is_refused() -> None:
    node = _ms("MultiHeadAttention", ["qkv"], ["y"], num_heads=1)
    message = _refused(node, {"qkv": (F32, [1, 2, 1, 3, 2])}, [1, 2, 2], "qkv")
    assert "only separate 3-D query, key and value" in message


def test_the_mean_output_of_the_rms_skip_normalization_is_refused() -> None:
    node = _ms("SkipSimplifiedLayerNormalization", ["x", "s", "g"], ["out", "mean"])
    inputs = {"x": (F32, [2, 3]), "s": (F32, [2, 3]), "g": (F32, [3])}
    assert "mean output (output 1)" in _refused(node, inputs, [2, 1], "x", output=1)


def test_packed_batching_rotary_embedding_is_refused() -> None:
    node = _ms("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], is_packed_batching=1)
    inputs = {
        "x": (F32, [1, 2, 4]),
        "pos": (onnx.TensorProto.INT64, [1]),
        "cos": (F32, [4, 2]),
        "sin": (F32, [4, 2]),
    }
    assert "is_packed_batching has no gradient rule" in _refused(node, inputs, [1, 2, 4], "x")


def test_a_chain_of_contrib_operators_gets_its_types_from_onnxtrain() -> None:
    """onnx types no com.microsoft output; onnxtrain types those that follow from the first input (GELUs,
    normalizations), so a chain of them needs no declared types, and its gradient is the chain rule's."""
    from onnxtrain.autodiff import build_gradients
    from onnxtrain.graph import GraphBuilder
    from tests.helpers import FLOAT, make_model, run_model

    nodes = [
        helper.make_node("FastGelu", ["x"], ["h"], domain="com.microsoft", name="first"),
        helper.make_node("FastGelu", ["h"], ["y"], domain="com.microsoft", name="second"),
        helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
    ]
    model = make_model({"x": (F32, [2, 3])}, nodes, {"loss": (FLOAT, [])}, extra_opsets={"com.microsoft": 1})
    builder = GraphBuilder(model)
    assert builder.shape("h") == [2, 3] and builder.elem_type("h") == F32
    grads = build_gradients(builder, "loss", ["x"])
    builder.set_outputs(["h", grads["x"]])
    x = np.linspace(-2.0, 2.0, 6, dtype=np.float32).reshape(2, 3)
    h, dx = run_model(builder.finalize(), {"x": x})

    def fast_gelu_slope(u: np.ndarray) -> np.ndarray:  # onnxruntime's constants
        a, b = 0.7978845608, 0.035677
        t = np.tanh(a * u + b * u**3)
        return (1 + t) / 2 + u * (1 - t**2) * (a + 3 * b * u**2) / 2

    np.testing.assert_allclose(dx, fast_gelu_slope(h) * fast_gelu_slope(x), rtol=1e-5, atol=1e-6)


def test_a_contrib_operator_after_an_untyped_one_gets_a_clear_error() -> None:
    """FusedMatMul's output shape depends on both inputs: onnxtrain leaves it untyped, and the rule of the
    FastGelu after it names the untyped value and the remedy."""
    from onnxtrain.autodiff import build_gradients
    from onnxtrain.graph import GraphBuilder
    from tests.helpers import FLOAT, make_model

    nodes = [
        _ms("FusedMatMul", ["x", "w"], ["h"]),
        _ms("FastGelu", ["h"], ["y"]),
        helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
    ]
    inputs = {"x": (F32, [2, 3]), "w": (F32, [3, 4])}
    model = make_model(inputs, nodes, {"loss": (FLOAT, [])}, extra_opsets={"com.microsoft": 1})
    model.graph.value_info.append(helper.make_tensor_value_info("y", FLOAT, [2, 4]))
    with pytest.raises(TypeError, match=r"FastGelu node 'n': the type of its input 'h' is unknown.*SymbolicShapeInf"):
        build_gradients(GraphBuilder(model), "loss", ["x"])


@pytest.mark.skipif(
    "CUDAExecutionProvider" not in ort.get_available_providers(),
    reason="BiasSplitGelu has a CUDA kernel only (its spec checks the rule against the definition on the CPU)",
)
def test_the_bias_split_gelu_definition_is_onnxruntimes_cuda_kernel() -> None:
    """The ``onnx.reference`` implementation that the BiasSplitGelu spec differentiates against computes
    what onnxruntime's CUDA kernel computes."""
    from onnx.reference import ReferenceEvaluator

    from tests.autodiff.specs_contrib import BiasSplitGelu
    from tests.helpers import make_model

    hidden = 2560  # the kernel takes 2560, 5120, 6144, 10240 or 12288 (the sizes of diffusion UNets)
    node = helper.make_node("BiasSplitGelu", ["x", "bias"], ["y"], domain="com.microsoft")
    model = make_model(
        {"x": (F32, [2, 3, hidden]), "bias": (F32, [hidden])},
        [node],
        {"y": (F32, [2, 3, hidden // 2])},
        extra_opsets={"com.microsoft": 1},
    )
    rng = np.random.default_rng(3)
    x, bias = rng.normal(size=(2, 3, hidden)), rng.normal(size=hidden)
    feeds = {"x": x.astype(np.float32), "bias": bias.astype(np.float32)}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
    (y,) = session.run(None, feeds)
    (expected,) = ReferenceEvaluator(model, new_ops=[BiasSplitGelu]).run(None, feeds)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
