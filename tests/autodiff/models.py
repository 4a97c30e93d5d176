"""The models of the whole-model gradient tests, hand-built and (optionally) in torch.

Four models, each in two forms with the same parameter names and layouts and
the same differentiable operators:

- ``mlp``: Gemm (``nn.Linear``), LayerNormalization, Gelu, Gemm; cross-entropy;
- ``cnn``: Conv, BatchNormalization in training mode, Relu, MaxPool,
  ReduceMean over H and W, Gemm; cross-entropy;
- ``transformer``: Gather embedding, a fused qkv MatMul Split in three,
  Reshape/Transpose into heads, scaled dot-product Softmax, output projection,
  residual, LayerNormalization, vocabulary head; cross-entropy per token;
- ``elementwise``: Softplus, Atan, Sin, Exp, Sigmoid, Tanh, Abs, Pow, Div,
  Sqrt, Erf, Log with broadcast parameters; mean squared error.

The hand-built form (:func:`build`, onnx.helper, float32 or float64) needs only
onnx; the torch form (:func:`torch_module`, exported by :func:`export_torch`)
is the reference where torch is importable. Every model has a symbolic batch
dimension named ``batch``.

Also here: the loss blocks that turn a model into a forward-plus-loss model or
a training model (the onnxblock API, as a user writes it), and :class:`Runner`,
which runs a model in onnxruntime, or in ``onnx.reference`` for float64 models
with operators onnxruntime's CPU provider has no float64 kernel for (Gelu, Erf,
Conv, Softplus, Atan). onnx.reference's ``Erf`` computes in float32 whatever its
input (``np.vectorize(math.erf, otypes=["f"])``, onnx 1.23), and so does its
Gelu, which runs Gelu's function body: that limits finite differences through
them to about 1e-3, so :class:`Erf` and :class:`Gelu` replace them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

import onnxtrain.onnxblock as onnxblock
from onnxtrain.graph import dtypes
from onnxtrain.sessions import inference_session
from tests.helpers import export_for_training

#: The ``ai.onnx`` opset of every test model (Gelu is an operator from opset 20 on).
OPSET = 20
#: The names of the test models, in the order of the docs table.
NAMES = ("relu_mlp", "mlp", "cnn", "transformer", "elementwise")

LossKind = Literal["cross_entropy", "mse"]

# Sizes: small, so that the whole test file runs in seconds.
MLP_IN, MLP_HIDDEN, MLP_CLASSES = 6, 8, 4
CNN_CHANNELS, CNN_FEATURES, CNN_SIZE, CNN_CLASSES = 2, 4, 6, 3
TF_VOCAB, TF_DIM, TF_HEADS, TF_TOKENS = 11, 8, 2, 5
EW_FEATURES = 5
BN_MOMENTUM = 0.9  # ONNX's momentum: torch's momentum=0.1
EPSILON = 1e-5


@dataclass(frozen=True)
class ModelCase:
    """A forward model, its loss, its parameters and how to make a batch of data.

    Attributes:
        name: one of :data:`NAMES`.
        model: the forward model; its one output ``y`` is what the loss reads.
        loss: ``cross_entropy`` (integer ``labels``) or ``mse`` (a float ``target``).
        params: every parameter's initial value, trainable and frozen.
        frozen: the parameters that take no gradient (BatchNormalization's running statistics).
        dtype: the float type of the model and its parameters.
    """

    name: str
    model: onnx.ModelProto
    loss: LossKind
    params: dict[str, np.ndarray]
    frozen: tuple[str, ...]
    dtype: np.dtype

    def data(self, rng: np.random.Generator, batch: int) -> dict[str, np.ndarray]:
        """A batch of inputs and loss target (see :func:`batch_data`)."""
        return batch_data(self.name, rng, batch, self.dtype)

    @property
    def trainable(self) -> tuple[str, ...]:
        return tuple(name for name in self.params if name not in self.frozen)


# ---------------------------------------------------------------- hand-built models


class _Graph:
    """A few lines of onnx.helper bookkeeping: parameters, constants and nodes."""

    def __init__(self, dtype: Any, rng: np.random.Generator) -> None:
        self.dtype = np.dtype(dtype)
        self.elem_type = dtypes.to_elem_type(self.dtype)
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[tuple[str, np.ndarray]] = []
        self.params: dict[str, np.ndarray] = {}
        self._count = 0

    def param(self, name: str, value: np.ndarray) -> str:
        array = np.asarray(value, dtype=self.dtype)
        self.params[name] = array
        self.initializers.append((name, array))
        return name

    def linear(self, name: str, fan_in: int, fan_out: int, bias: bool = True) -> tuple[str, str | None]:
        """``name.weight`` (fan_out, fan_in) and ``name.bias`` drawn like ``nn.Linear``."""
        bound = 1 / math.sqrt(fan_in)
        weight = self.param(f"{name}.weight", self.rng.uniform(-bound, bound, (fan_out, fan_in)))
        return weight, self.param(f"{name}.bias", self.rng.uniform(-bound, bound, fan_out)) if bias else None

    def const(self, value: Any, dtype: Any = None) -> str:
        self._count += 1
        name = f"const_{self._count}"
        self.initializers.append((name, np.asarray(value, dtype=self.dtype if dtype is None else dtype)))
        return name

    def __call__(self, op_type: str, *inputs: str, outputs: int = 1, **attributes: Any) -> Any:
        self._count += 1
        names = [f"{op_type.lower()}_{self._count}" + (f"_{k}" if outputs > 1 else "") for k in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=f"{op_type}_{self._count}", **attributes))
        return names[0] if outputs == 1 else names

    def model(self, inputs: Mapping[str, tuple[int, list[Any]]], y: str, y_shape: list[Any]) -> onnx.ModelProto:
        for node in self.nodes:  # the last value is the model's output "y"
            node.output[:] = ["y" if name == y else name for name in node.output]
        graph = helper.make_graph(
            self.nodes,
            "whole_model",
            [helper.make_tensor_value_info(name, elem, shape) for name, (elem, shape) in inputs.items()],
            [helper.make_tensor_value_info("y", self.elem_type, y_shape)],
            [numpy_helper.from_array(value, name) for name, value in self.initializers],
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="onnxtrain-tests"
        )
        model.ir_version = 9
        onnx.checker.check_model(model, full_check=True)
        return model


def batch_data(name: str, rng: np.random.Generator, batch: int, dtype: Any = np.float32) -> dict[str, np.ndarray]:
    """A batch for model ``name``: its input (``x`` in ``dtype``, or int64 token ``ids``), and int64
    ``labels`` (cross-entropy) or a ``target`` in ``dtype`` (mean squared error)."""
    if name in ("mlp", "relu_mlp"):
        return {"x": rng.normal(size=(batch, MLP_IN)).astype(dtype), "labels": _labels(rng, (batch,), MLP_CLASSES)}
    if name == "cnn":
        x = rng.normal(loc=0.5, size=(batch, CNN_CHANNELS, CNN_SIZE, CNN_SIZE)).astype(dtype)
        return {"x": x, "labels": _labels(rng, (batch,), CNN_CLASSES)}
    if name == "transformer":
        ids = rng.integers(0, TF_VOCAB, size=(batch, TF_TOKENS)).astype(np.int64)
        return {"ids": ids, "labels": _labels(rng, (batch, TF_TOKENS), TF_VOCAB)}
    if name == "elementwise":
        shape = (batch, EW_FEATURES)
        return {"x": rng.normal(size=shape).astype(dtype), "target": rng.normal(size=shape).astype(dtype)}
    raise ValueError(f"unknown model {name!r}; the models are {NAMES}")


def _labels(rng: np.random.Generator, shape: tuple[int, ...], classes: int) -> np.ndarray:
    return rng.integers(0, classes, size=shape).astype(np.int64)


def _relu_mlp(g: _Graph) -> ModelCase:
    """The classic MLP: Gemm, Relu, Gemm, Relu, Gemm (the shape of the benchmark's 784-512-512-10)."""
    w1, b1 = g.linear("fc1", MLP_IN, MLP_HIDDEN)
    w2, b2 = g.linear("fc2", MLP_HIDDEN, MLP_HIDDEN)
    w3, b3 = g.linear("fc3", MLP_HIDDEN, MLP_CLASSES)
    h = g("Relu", g("Gemm", "x", w1, b1, transB=1))
    h = g("Relu", g("Gemm", h, w2, b2, transB=1))
    y = g("Gemm", h, w3, b3, transB=1)
    model = g.model({"x": (g.elem_type, ["batch", MLP_IN])}, y, ["batch", MLP_CLASSES])
    return ModelCase("relu_mlp", model, "cross_entropy", g.params, (), g.dtype)


def _mlp(g: _Graph) -> ModelCase:
    w1, b1 = g.linear("fc1", MLP_IN, MLP_HIDDEN)
    gamma = g.param("ln.weight", 1 + 0.2 * g.rng.normal(size=MLP_HIDDEN))
    beta = g.param("ln.bias", 0.2 * g.rng.normal(size=MLP_HIDDEN))
    w2, b2 = g.linear("fc2", MLP_HIDDEN, MLP_CLASSES)
    h = g("Gemm", "x", w1, b1, transB=1)
    h = g("LayerNormalization", h, gamma, beta, axis=-1, epsilon=EPSILON)
    h = g("Gelu", h)
    y = g("Gemm", h, w2, b2, transB=1)
    model = g.model({"x": (g.elem_type, ["batch", MLP_IN])}, y, ["batch", MLP_CLASSES])
    return ModelCase("mlp", model, "cross_entropy", g.params, (), g.dtype)


def _cnn(g: _Graph) -> ModelCase:
    fan_in = CNN_CHANNELS * 9
    bound = 1 / math.sqrt(fan_in)
    weight = g.param("conv.weight", g.rng.uniform(-bound, bound, (CNN_FEATURES, CNN_CHANNELS, 3, 3)))
    bias = g.param("conv.bias", g.rng.uniform(-bound, bound, CNN_FEATURES))
    gamma = g.param("bn.weight", 1 + 0.2 * g.rng.normal(size=CNN_FEATURES))
    beta = g.param("bn.bias", 0.2 * g.rng.normal(size=CNN_FEATURES))
    mean = g.param("bn.running_mean", 0.1 * g.rng.normal(size=CNN_FEATURES))
    var = g.param("bn.running_var", 1 + 0.1 * g.rng.random(size=CNN_FEATURES))
    w, b = g.linear("fc", CNN_FEATURES, CNN_CLASSES)
    h = g("Conv", "x", weight, bias, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    h, _, _ = g(
        "BatchNormalization", h, gamma, beta, mean, var, outputs=3,
        epsilon=EPSILON, momentum=BN_MOMENTUM, training_mode=1,
    )  # fmt: skip
    h = g("Relu", h)
    h = g("MaxPool", h, kernel_shape=[2, 2], strides=[2, 2])
    h = g("ReduceMean", h, g.const([2, 3], np.int64), keepdims=0)
    y = g("Gemm", h, w, b, transB=1)
    model = g.model({"x": (g.elem_type, ["batch", CNN_CHANNELS, CNN_SIZE, CNN_SIZE])}, y, ["batch", CNN_CLASSES])
    return ModelCase("cnn", model, "cross_entropy", g.params, ("bn.running_mean", "bn.running_var"), g.dtype)


def _transformer(g: _Graph) -> ModelCase:
    d, heads = TF_DIM, TF_HEADS
    dh = d // heads
    emb = g.param("emb.weight", g.rng.normal(size=(TF_VOCAB, d)))
    qkv, _ = g.linear("qkv", d, 3 * d, bias=False)
    proj_w, proj_b = g.linear("proj", d, d)
    gamma = g.param("ln.weight", 1 + 0.2 * g.rng.normal(size=d))
    beta = g.param("ln.bias", 0.2 * g.rng.normal(size=d))
    head_w, head_b = g.linear("head", d, TF_VOCAB)
    h = g("Gather", emb, "ids")  # (B, T, D)
    fused = g("MatMul", h, g("Transpose", qkv, perm=[1, 0]))  # (B, T, 3D)
    q, k, v = g("Split", fused, g.const([d, d, d], np.int64), outputs=3, axis=-1)
    split_heads = g.const([0, 0, heads, dh], np.int64)
    q = g("Transpose", g("Reshape", q, split_heads), perm=[0, 2, 1, 3])  # (B, H, T, dh)
    k = g("Transpose", g("Reshape", k, split_heads), perm=[0, 2, 3, 1])  # (B, H, dh, T)
    v = g("Transpose", g("Reshape", v, split_heads), perm=[0, 2, 1, 3])
    scores = g("Div", g("MatMul", q, k), g.const(math.sqrt(dh)))
    attention = g("Softmax", scores, axis=-1)
    o = g("Transpose", g("MatMul", attention, v), perm=[0, 2, 1, 3])  # (B, T, H, dh)
    o = g("Reshape", o, g.const([0, 0, d], np.int64))
    o = g("Add", proj_b, g("MatMul", o, g("Transpose", proj_w, perm=[1, 0])))
    h = g("LayerNormalization", g("Add", h, o), gamma, beta, axis=-1, epsilon=EPSILON)
    logits = g("Add", head_b, g("MatMul", h, g("Transpose", head_w, perm=[1, 0])))  # (B, T, V)
    y = g("Transpose", logits, perm=[0, 2, 1])  # (B, V, T): classes on axis 1
    model = g.model({"ids": (onnx.TensorProto.INT64, ["batch", TF_TOKENS])}, y, ["batch", TF_VOCAB, TF_TOKENS])
    return ModelCase("transformer", model, "cross_entropy", g.params, (), g.dtype)


def _elementwise(g: _Graph) -> ModelCase:
    n = EW_FEATURES
    w1 = g.param("w1", g.rng.normal(size=n))
    b1 = g.param("b1", 0.5 * g.rng.normal(size=n))
    w2 = g.param("w2", g.rng.normal(size=n))
    w3 = g.param("w3", g.rng.normal(size=n))
    w4 = g.param("w4", g.rng.normal(size=n))
    s = g.param("s", 0.7)  # a scalar: its gradient sums over every axis
    p = g.param("p", g.rng.uniform(0.5, 2.0, size=n))
    h = g("Add", g("Mul", "x", w1), b1)
    a = g("Softplus", h)  # > 0
    b = g("Atan", h)
    c = g("Sin", g("Mul", "x", w2))
    d = g("Exp", g("Mul", g("Tanh", h), s))
    e = g("Sigmoid", g("Mul", g("Abs", h), w3))
    f = g("Pow", g("Add", a, g.const(0.5)), p)
    q = g("Div", b, g("Add", g("Sqrt", a), g.const(1.0)))
    k = g("Erf", g("Mul", c, w4))
    r = g("Log", g("Add", a, g.const(1.0)))
    y = g("Add", g("Add", f, q), g("Add", k, g("Add", g("Mul", d, e), r)))
    model = g.model({"x": (g.elem_type, ["batch", n])}, y, ["batch", n])
    return ModelCase("elementwise", model, "mse", g.params, (), g.dtype)


_BUILDERS = {"relu_mlp": _relu_mlp, "mlp": _mlp, "cnn": _cnn, "transformer": _transformer, "elementwise": _elementwise}


def build(name: str, dtype: Any = np.float32, seed: int = 0) -> ModelCase:
    """The hand-built model ``name`` in ``dtype``; the same ``seed`` gives the same parameters in any dtype."""
    return _BUILDERS[name](_Graph(dtype, np.random.default_rng(seed)))


# ---------------------------------------------------------------- losses and training models


def loss_block(kind: LossKind) -> onnxblock.Block:
    """The loss: ``CrossEntropyLoss()`` (int64 ``labels``) or ``MSELoss()`` (a float ``target``)."""
    return onnxblock.loss.CrossEntropyLoss() if kind == "cross_entropy" else onnxblock.loss.MSELoss()


class WithLoss(onnxblock.TrainingBlock):
    """The training block of the tests: the loss on the model's output, nothing else."""

    def __init__(self, kind: LossKind) -> None:
        super().__init__()
        self.loss = loss_block(kind)

    def build(self, output: str) -> str:
        return self.loss(output)


class ForwardWithLoss(onnxblock.ForwardBlock):
    """The forward-plus-loss model: what the training model differentiates."""

    def __init__(self, kind: LossKind) -> None:
        super().__init__()
        self.loss = loss_block(kind)

    def build(self, output: str) -> str:
        return self.loss(output)


def training_block(
    model: onnx.ModelProto, kind: LossKind, trainable: tuple[str, ...], frozen: tuple[str, ...] = (), output: str = "y"
) -> WithLoss:
    """A built :class:`WithLoss` on ``model``: ``trainable`` require gradients, ``frozen`` do not."""
    block = WithLoss(kind)
    for name in trainable:
        block.requires_grad(name)
    for name in frozen:
        block.requires_grad(name, False)
    with onnxblock.base(model):
        block(output)
    return block


def forward_with_loss(model: onnx.ModelProto, kind: LossKind, output: str = "y") -> onnx.ModelProto:
    """The forward-plus-loss model of ``model`` (the ForwardBlock output)."""
    block = ForwardWithLoss(kind)
    with onnxblock.base(model):
        block(output)
    return block.to_model_proto()


# ---------------------------------------------------------------- running


def _session_options() -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[x.dtype])(x)


class Erf(OpRun):
    """``Erf`` in the input's precision: onnx.reference's own computes in float32 (``otypes=["f"]``)."""

    def _run(self, x: np.ndarray) -> tuple[np.ndarray]:
        return (_erf(x),)


class Gelu(OpRun):
    """``Gelu`` in the input's precision (onnx.reference runs its function body, whose Erf is float32)."""

    def _run(self, x: np.ndarray, approximate: str = "none") -> tuple[np.ndarray]:
        if approximate == "tanh":
            inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)
            return ((0.5 * x * (1 + np.tanh(inner))).astype(x.dtype),)
        return ((0.5 * x * (1 + _erf(x / math.sqrt(2)))).astype(x.dtype),)


class Runner:
    """Runs a model: in onnxruntime; for a float64 model it has no kernels for, in ``onnx.reference``.

    Attributes:
        backend: ``"onnxruntime"`` or ``"onnx.reference"``.
        outputs: the model's output names.
    """

    def __init__(self, model: onnx.ModelProto, *, allow_reference: bool = False) -> None:
        self.outputs = [value.name for value in model.graph.output]
        self._session: ort.InferenceSession | None = None
        self._reference: ReferenceEvaluator | None = None
        try:
            self._session = inference_session(model.SerializeToString(), _session_options())
            self.backend = "onnxruntime"
        except Exception as error:  # onnxruntime's NotImplemented: no kernel for an operator and type
            if not allow_reference or "NOT_IMPLEMENTED" not in str(error):
                raise
            self._reference = ReferenceEvaluator(model, new_ops=[Erf, Gelu])
            self.backend = "onnx.reference"

    def __call__(self, feeds: Mapping[str, np.ndarray], names: list[str] | None = None) -> dict[str, np.ndarray]:
        names = self.outputs if names is None else names
        if self._session is not None:
            values = self._session.run(names, dict(feeds))
        else:
            assert self._reference is not None
            values = self._reference.run(names, dict(feeds))
        return dict(zip(names, (np.asarray(v) for v in values), strict=True))


# ---------------------------------------------------------------- torch


def torch_module(name: str, seed: int = 0) -> Any:
    """The torch form of model ``name`` (same parameter names and operators as :func:`build`)."""
    import torch
    import torch.nn.functional as F

    nn = torch.nn

    class ReluMLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(MLP_IN, MLP_HIDDEN)
            self.fc2 = nn.Linear(MLP_HIDDEN, MLP_HIDDEN)
            self.fc3 = nn.Linear(MLP_HIDDEN, MLP_CLASSES)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(MLP_IN, MLP_HIDDEN)
            self.ln = nn.LayerNorm(MLP_HIDDEN, eps=EPSILON)
            self.fc2 = nn.Linear(MLP_HIDDEN, MLP_CLASSES)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(F.gelu(self.ln(self.fc1(x))))

    class CNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(CNN_CHANNELS, CNN_FEATURES, 3, padding=1)
            self.bn = nn.BatchNorm2d(CNN_FEATURES, eps=EPSILON, momentum=1 - BN_MOMENTUM)
            self.fc = nn.Linear(CNN_FEATURES, CNN_CLASSES)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = F.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
            return self.fc(h.mean(dim=(2, 3)))

    class Transformer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(TF_VOCAB, TF_DIM)
            self.qkv = nn.Linear(TF_DIM, 3 * TF_DIM, bias=False)
            self.proj = nn.Linear(TF_DIM, TF_DIM)
            self.ln = nn.LayerNorm(TF_DIM, eps=EPSILON)
            self.head = nn.Linear(TF_DIM, TF_VOCAB)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            h = self.emb(ids)
            batch, tokens, dim = h.shape
            dh = dim // TF_HEADS
            q, k, v = self.qkv(h).split(dim, dim=-1)
            q, k, v = (t.reshape(batch, tokens, TF_HEADS, dh).transpose(1, 2) for t in (q, k, v))
            attention = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(dh), dim=-1)
            o = (attention @ v).transpose(1, 2).reshape(batch, tokens, dim)
            h = self.ln(h + self.proj(o))
            return self.head(h).transpose(1, 2)  # (B, V, T): classes on axis 1

    class Elementwise(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            n = EW_FEATURES
            self.w1, self.b1, self.w2 = (
                nn.Parameter(torch.randn(n)),
                nn.Parameter(0.5 * torch.randn(n)),
                nn.Parameter(torch.randn(n)),
            )
            self.w3, self.w4 = nn.Parameter(torch.randn(n)), nn.Parameter(torch.randn(n))
            self.s, self.p = nn.Parameter(torch.tensor(0.7)), nn.Parameter(0.5 + 1.5 * torch.rand(n))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = x * self.w1 + self.b1
            a = F.softplus(h)
            f = torch.pow(a + 0.5, self.p)
            q = torch.atan(h) / (torch.sqrt(a) + 1.0)
            k = torch.erf(torch.sin(x * self.w2) * self.w4)
            d = torch.exp(torch.tanh(h) * self.s)
            e = torch.sigmoid(torch.abs(h) * self.w3)
            return (f + q) + (k + (d * e + torch.log(a + 1.0)))

    torch.manual_seed(seed)
    return {"relu_mlp": ReluMLP, "mlp": MLP, "cnn": CNN, "transformer": Transformer, "elementwise": Elementwise}[name]()


def export_torch(module: Any, name: str) -> onnx.ModelProto:
    """``module`` exported in training mode, without constant folding, with a symbolic batch dimension.

    The TorchScript exporter (``dynamo=False``): it honours
    ``training=TrainingMode.TRAINING`` (BatchNormalization with
    ``training_mode=1`` and its running statistics as outputs) and keeps every
    parameter an initializer named as in ``named_parameters()``. The dynamo
    exporter of torch 2.13 ignores ``training`` (it exports BatchNormalization in
    inference mode, and its optimizer folds it into the Conv) and needs
    ``onnxscript``.
    """
    import torch

    example = batch_data(name, np.random.default_rng(0), 3, np.float32)
    input_name = "ids" if name == "transformer" else "x"
    args = (torch.from_numpy(example[input_name]),)
    module.train()
    state = {k: v.clone() for k, v in module.state_dict().items()}  # tracing runs forward: BatchNorm updates its stats
    axes = {input_name: {0: "batch"}, "y": {0: "batch"}}
    model = export_for_training(module, args, [input_name], ["y"], opset=OPSET, dynamic_axes=axes)
    module.load_state_dict(state)
    return model
