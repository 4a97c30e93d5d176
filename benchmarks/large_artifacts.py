"""``python -m benchmarks.large_artifacts``: time and peak memory of ``generate_artifacts`` on real-size models.

Two models are written to disk with their weights in external data, one
tensor at a time (never the whole model in memory): GPT-2 medium's shapes
(24 pre-LayerNorm layers, width 1024, 16 heads, vocabulary 50257, 1024
positions, GELU MLP, ``lm_head`` tied to the token embedding: 355M
parameters, 1.42 GB in float32) and a Llama-style configuration of one
billion parameters (20 layers, width 2048, 32 heads over 8 key/value heads,
SwiGLU of 5632, RMSNorm, rotary embeddings, vocabulary 32000, untied
``lm_head``: 1.03B parameters, 4.14 GB). Their graphs are hand-built from
standard operators (``Gather``, ``LayerNormalization`` or its RMS
decomposition, ``MatMul``, ``Softmax``, ``Where``-free additive causal mask,
``Tanh``/``Sigmoid`` activations, ``Split``/``Concat`` rotations, ``Expand``
for grouped-query attention).

Each measurement runs in a fresh process, which reports its wall time and
peak RSS (``VmHWM``, :func:`benchmarks.measure.peak_rss_mib`):

- ``path``: ``generate_artifacts(model_path, every weight trainable, CrossEntropyLoss, AdamW)``;
- ``path-inline``: the same from a copy of the model with its weights inside the file (written once, streamed;
  GPT-2 medium only: the Llama model passes protobuf's 2 GiB limit);
- ``proto``: the same from ``onnx.load(model_path)`` (the weights in memory), with
  the RSS the loaded proto took before the call, so that what generation adds shows;
- ``lora``: ``add_adapters`` on the ``q_proj``/``v_proj`` products (rank 8),
  the adapted model saved beside the base, ``generate_artifacts`` with the
  adapters as ``requires_grad`` (the base weights stay constants of the graphs);
- ``lora-step``: one training step of those artifacts with ``onnxtrain.api``
  (``Module`` + ``Optimizer``, batch 1 of 16 tokens).

``--models gpt2-medium,llama-1b --measures path,proto,lora,lora-step``
chooses; ``--workdir`` keeps the files (default: a temporary folder, removed).
``--layers`` shrinks a model for a quick check.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks.measure import RESULT_PREFIX, parse_result, peak_rss_mib, rss_mib

MODEL_FILE = "model.onnx"
#: The same model with its weights inside the file (``path-inline``; models under 2 GB).
INLINE_FILE = "inline.onnx"
ADAPTED_FILE = "adapted.onnx"
MERGED_FILE = "merged.onnx"
#: The merged weights go into this file beside the base, one at a time; the merged model refers to it and to the
#: base's data file.
MERGED_DATA = MERGED_FILE + ".data"
#: Elements generated at once while a weight is written.
CHUNK_ELEMENTS = 1 << 22
OPSET = 18
#: A measurement may take this long (seconds).
TIMEOUT = 3600


@dataclass(frozen=True)
class Gpt2:
    """GPT-2's shapes; the defaults are GPT-2 medium's."""

    layers: int = 24
    width: int = 1024
    heads: int = 16
    vocab: int = 50257
    positions: int = 1024


@dataclass(frozen=True)
class Llama:
    """A Llama-style configuration; the defaults give 1.03 billion parameters."""

    layers: int = 20
    width: int = 2048
    heads: int = 32
    kv_heads: int = 8
    intermediate: int = 5632
    vocab: int = 32000
    positions: int = 2048
    rope_theta: float = 10000.0


MODELS: dict[str, Gpt2 | Llama] = {"gpt2-medium": Gpt2(), "llama-1b": Llama()}
MEASURES = ("path", "path-inline", "proto", "lora", "lora-step", "merge", "adapters-proto")


@dataclass(frozen=True)
class Weight:
    """A weight to write: its name, shape and how its values are drawn (``normal``, ``ones``, ``zeros``)."""

    name: str
    shape: tuple[int, ...]
    fill: str = "normal"


@dataclass
class Net:
    """A graph being written: nodes, the weights (written later, one at a time) and small constants."""

    nodes: list[Any] = field(default_factory=list)
    weights: list[Weight] = field(default_factory=list)
    constants: list[Any] = field(default_factory=list)
    names: set[str] = field(default_factory=set)
    count: int = 0

    def node(self, op: str, inputs: Sequence[str], scope: str, outputs: int = 1, **attributes: Any) -> Any:
        """Append ``op`` named ``scope/op`` (TorchScript's style, ``scope/op_<n>`` for the next ones of a scope);
        its output name, or names when ``outputs > 1``."""
        from onnx import helper

        self.count += 1
        names = [f"{scope}/{op}_{self.count}_{k}" for k in range(outputs)]
        name = f"{scope}/{op}"
        if name in self.names:
            name = f"{name}_{self.count}"
        self.names.add(name)
        self.nodes.append(helper.make_node(op, list(inputs), names, name=name, **attributes))
        return names[0] if outputs == 1 else names

    def weight(self, name: str, shape: Sequence[int], fill: str = "normal") -> str:
        self.weights.append(Weight(name, tuple(shape), fill))
        return name

    def constant(self, value: Any, name: str) -> str:
        import numpy as np
        from onnx import numpy_helper

        array = np.asarray(value, np.float32) if isinstance(value, float) else np.asarray(value)
        self.constants.append(numpy_helper.from_array(array, name))
        return name

    def parameters(self) -> int:
        return sum(math.prod(w.shape) for w in self.weights)


def _common(net: Net) -> tuple[str, str]:
    """The sequence length (``int64[1]``) and the additive causal mask ``[seq, seq]`` (0 or -1e4)."""
    seq = net.node("Shape", ["input_ids"], "/model", start=1, end=2)
    square = net.node("Concat", [seq, seq], "/model/mask", axis=0)
    from onnx import TensorProto, helper

    ones = net.node(
        "ConstantOfShape", [square], "/model/mask", value=helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    )
    lower = net.node("Trilu", [ones], "/model/mask", upper=0)
    outside = net.node("Sub", [lower, net.constant(1.0, "mask.one")], "/model/mask")
    return seq, net.node("Mul", [outside, net.constant(1e4, "mask.scale")], "/model/mask")


def _attention_scores(net: Net, q: str, k_t: str, v: str, mask: str, head_dim: int, scope: str) -> str:
    """``softmax(q k^T / sqrt(d) + mask) v``, heads back in the last axis."""
    scale = net.constant(1.0 / math.sqrt(head_dim), f"{scope}.scale".lstrip("/").replace("/", "."))
    scores = net.node("Add", [net.node("Mul", [net.node("MatMul", [q, k_t], scope), scale], scope), mask], scope)
    mixed = net.node("MatMul", [net.node("Softmax", [scores], scope, axis=-1), v], scope)
    return net.node("Transpose", [mixed], scope, perm=[0, 2, 1, 3])


def gpt2_net(config: Gpt2) -> Net:
    """GPT-2: token and position embeddings, pre-LayerNorm causal attention, tanh-GELU MLP, tied ``lm_head``."""
    net = Net()
    d, h = config.width, config.heads
    hd = d // h
    wte = net.weight("transformer.wte.weight", (config.vocab, d))
    wpe = net.weight("transformer.wpe.weight", (config.positions, d))
    seq, mask = _common(net)
    zero = net.constant([0], "position.start")
    axis0 = net.constant([0], "position.axis")
    tokens = net.node("Gather", [wte, "input_ids"], "/transformer/wte")
    positions = net.node("Slice", [wpe, zero, seq, axis0], "/transformer/wpe")
    x = net.node("Add", [tokens, positions], "/transformer")
    heads_shape = net.constant([0, 0, h, hd], "heads.shape")
    merged_shape = net.constant([0, 0, d], "merged.shape")

    def layer_norm(x: str, prefix: str) -> str:
        gamma = net.weight(f"{prefix}.weight", (d,), "ones")
        beta = net.weight(f"{prefix}.bias", (d,), "zeros")
        return net.node("LayerNormalization", [x, gamma, beta], "/" + prefix.replace(".", "/"), axis=-1, epsilon=1e-5)

    def linear(x: str, prefix: str, n_in: int, n_out: int) -> str:
        scope = "/" + prefix.replace(".", "/")
        product = net.node("MatMul", [x, net.weight(f"{prefix}.weight", (n_in, n_out))], scope)
        return net.node("Add", [product, net.weight(f"{prefix}.bias", (n_out,), "zeros")], scope)

    for layer in range(config.layers):
        p = f"transformer.h.{layer}"
        scope = f"/transformer/h.{layer}/attn"
        qkv = linear(layer_norm(x, f"{p}.ln_1"), f"{p}.attn.c_attn", d, 3 * d)
        q, k, v = net.node("Split", [qkv], scope, outputs=3, axis=2, num_outputs=3)
        q = net.node("Transpose", [net.node("Reshape", [q, heads_shape], scope)], scope, perm=[0, 2, 1, 3])
        k_t = net.node("Transpose", [net.node("Reshape", [k, heads_shape], scope)], scope, perm=[0, 2, 3, 1])
        v = net.node("Transpose", [net.node("Reshape", [v, heads_shape], scope)], scope, perm=[0, 2, 1, 3])
        attended = net.node("Reshape", [_attention_scores(net, q, k_t, v, mask, hd, scope), merged_shape], scope)
        x = net.node("Add", [x, linear(attended, f"{p}.attn.c_proj", d, d)], f"/transformer/h.{layer}")
        hidden = linear(layer_norm(x, f"{p}.ln_2"), f"{p}.mlp.c_fc", d, 4 * d)
        x = net.node("Add", [x, linear(_gelu(net, hidden, f"/{p}/mlp"), f"{p}.mlp.c_proj", 4 * d, d)], f"/{p}")
    final = layer_norm(x, "transformer.ln_f")
    logits = net.node("MatMul", [final, net.node("Transpose", [wte], "/lm_head", perm=[1, 0])], "/lm_head")
    net.node("Reshape", [logits, net.constant([-1, config.vocab], "logits.shape")], "/lm_head")
    return net


def _gelu(net: Net, x: str, scope: str) -> str:
    """GPT-2's tanh GELU: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``."""
    cube = net.node("Mul", [net.node("Mul", [x, x], scope), x], scope)
    inner = net.node("Add", [x, net.node("Mul", [cube, net.constant(0.044715, f"{scope}.gelu.c")], scope)], scope)
    scaled = net.node("Mul", [inner, net.constant(math.sqrt(2 / math.pi), f"{scope}.gelu.s")], scope)
    one_plus = net.node("Add", [net.node("Tanh", [scaled], scope), net.constant(1.0, f"{scope}.gelu.one")], scope)
    half = net.node("Mul", [x, net.constant(0.5, f"{scope}.gelu.half")], scope)
    return net.node("Mul", [half, one_plus], scope)


def llama_net(config: Llama) -> Net:
    """Llama: RMSNorm, rotary embeddings, grouped-query causal attention, SwiGLU, untied ``lm_head``."""
    import numpy as np

    net = Net()
    d, h, kv = config.width, config.heads, config.kv_heads
    hd = d // h
    embed = net.weight("model.embed_tokens.weight", (config.vocab, d))
    seq, mask = _common(net)
    inverse = 1.0 / config.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    angles = np.outer(np.arange(config.positions, dtype=np.float64), inverse)
    angles = np.concatenate([angles, angles], axis=1)
    zero, axis0 = net.constant([0], "rope.start"), net.constant([0], "rope.axis")
    cos = net.node("Slice", [net.constant(np.cos(angles).astype(np.float32), "rope.cos"), zero, seq, axis0], "/rope")
    sin = net.node("Slice", [net.constant(np.sin(angles).astype(np.float32), "rope.sin"), zero, seq, axis0], "/rope")
    x = net.node("Gather", [embed, "input_ids"], "/model/embed_tokens")
    q_shape = net.constant([0, 0, h, hd], "q.shape")
    kv_shape = net.constant([0, 0, kv, hd], "kv.shape")
    repeat = net.constant([1, 1, h // kv, 1, 1], "kv.repeat")
    grouped = net.constant([0, h, -1, hd], "kv.grouped")
    merged_shape = net.constant([0, 0, d], "merged.shape")
    two = net.constant([2], "kv.axis")

    def rms_norm(x: str, prefix: str) -> str:
        scope = "/" + prefix.replace(".", "/")
        mean = net.node("ReduceMean", [net.node("Mul", [x, x], scope), net.constant([-1], f"{prefix}.axes")], scope)
        root = net.node("Sqrt", [net.node("Add", [mean, net.constant(1e-5, f"{prefix}.eps")], scope)], scope)
        return net.node("Mul", [net.node("Div", [x, root], scope), net.weight(f"{prefix}.weight", (d,), "ones")], scope)

    def linear(x: str, prefix: str, n_in: int, n_out: int) -> str:
        return net.node("MatMul", [x, net.weight(f"{prefix}.weight", (n_in, n_out))], "/" + prefix.replace(".", "/"))

    def rotary(t: str, scope: str) -> str:
        first, second = net.node("Split", [t], scope, outputs=2, axis=-1, num_outputs=2)
        rotated = net.node("Concat", [net.node("Neg", [second], scope), first], scope, axis=-1)
        return net.node("Add", [net.node("Mul", [t, cos], scope), net.node("Mul", [rotated, sin], scope)], scope)

    def heads(t: str, shape: str, scope: str) -> str:
        return net.node("Transpose", [net.node("Reshape", [t, shape], scope)], scope, perm=[0, 2, 1, 3])

    def repeated(t: str, scope: str) -> str:
        expanded = net.node("Expand", [net.node("Unsqueeze", [t, two], scope), repeat], scope)
        return net.node("Reshape", [expanded, grouped], scope)

    for layer in range(config.layers):
        p = f"model.layers.{layer}"
        scope = f"/{p}/self_attn"
        normed = rms_norm(x, f"{p}.input_layernorm")
        q = rotary(heads(linear(normed, f"{p}.self_attn.q_proj", d, d), q_shape, scope), scope)
        k = rotary(heads(linear(normed, f"{p}.self_attn.k_proj", d, kv * hd), kv_shape, scope), scope)
        v = heads(linear(normed, f"{p}.self_attn.v_proj", d, kv * hd), kv_shape, scope)
        k_t = net.node("Transpose", [repeated(k, scope)], scope, perm=[0, 1, 3, 2])
        attended = _attention_scores(net, q, k_t, repeated(v, scope), mask, hd, scope)
        attended = net.node("Reshape", [attended, merged_shape], scope)
        x = net.node("Add", [x, linear(attended, f"{p}.self_attn.o_proj", d, d)], f"/{p}")
        normed = rms_norm(x, f"{p}.post_attention_layernorm")
        gate = linear(normed, f"{p}.mlp.gate_proj", d, config.intermediate)
        up = linear(normed, f"{p}.mlp.up_proj", d, config.intermediate)
        swish = net.node("Mul", [gate, net.node("Sigmoid", [gate], f"/{p}/mlp")], f"/{p}/mlp")
        down = linear(net.node("Mul", [swish, up], f"/{p}/mlp"), f"{p}.mlp.down_proj", config.intermediate, d)
        x = net.node("Add", [x, down], f"/{p}")
    logits = linear(rms_norm(x, "model.norm"), "lm_head", d, config.vocab)
    net.node("Reshape", [logits, net.constant([-1, config.vocab], "logits.shape")], "/lm_head")
    return net


def net_of(config: Gpt2 | Llama) -> Net:
    return gpt2_net(config) if isinstance(config, Gpt2) else llama_net(config)


def _chunks(weight: Weight, seed: int) -> Iterator[bytes]:
    """The weight's float32 values, little-endian, in chunks of at most :data:`CHUNK_ELEMENTS`."""
    import numpy as np

    rng = np.random.default_rng(seed)
    total = math.prod(weight.shape)
    for start in range(0, total, CHUNK_ELEMENTS):
        count = min(CHUNK_ELEMENTS, total - start)
        if weight.fill == "normal":
            values = rng.standard_normal(count, dtype=np.float32) * np.float32(0.02)
        else:
            values = np.full(count, 1.0 if weight.fill == "ones" else 0.0, np.float32)
        yield values.astype("<f4").tobytes()


def write_model(config: Gpt2 | Llama, folder: Path) -> Path:
    """Write the model of ``config`` to ``folder/model.onnx``, its weights one at a time to ``model.onnx.data``."""
    import onnx
    from onnx import TensorProto, helper

    net = net_of(config)
    data_name = MODEL_FILE + ".data"
    tensors = []
    with open(folder / data_name, "wb") as data:
        for seed, weight in enumerate(net.weights):
            offset = data.tell()
            for chunk in _chunks(weight, seed):
                data.write(chunk)
            tensor = TensorProto(name=weight.name, data_type=TensorProto.FLOAT, dims=weight.shape)
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (("location", data_name), ("offset", offset), ("length", data.tell() - offset)):
                tensor.external_data.add(key=key, value=str(value))
            tensors.append(tensor)
    output = net.nodes[-1].output[0]
    graph = helper.make_graph(
        net.nodes,
        type(config).__name__.lower(),
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, [None, config.vocab])],
        initializer=[*tensors, *net.constants],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="benchmark")
    model.ir_version = 8
    onnx.save(model, folder / MODEL_FILE)
    return folder / MODEL_FILE


def weight_names(config: Gpt2 | Llama) -> list[str]:
    return [w.name for w in net_of(config).weights]


# ----------------------------------------------------------------------------- the measured children


def _result(**values: Any) -> None:
    print(RESULT_PREFIX + json.dumps(values), flush=True)


def _generate(model: Any, requires_grad: list[str], out: Path) -> float:
    from onnxtrain import artifacts

    start = time.perf_counter()
    artifacts.generate_artifacts(
        model,
        requires_grad=requires_grad,
        frozen_params=[],
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=out,
    )
    return time.perf_counter() - start


def measure_path(config: Gpt2 | Llama, folder: Path) -> None:
    seconds = _generate(folder / MODEL_FILE, weight_names(config), folder / "artifacts-path")
    _result(seconds=seconds, peak_mib=peak_rss_mib())


def build_inline(config: Gpt2 | Llama, folder: Path) -> None:
    """Write :data:`INLINE_FILE`: the model with its weights inside the file (as an exporter writes a model under
    2 GB), streamed a piece of one tensor at a time from the data file."""
    from onnxtrain.artifacts.generate import PROTOBUF_LIMIT
    from onnxtrain.artifacts.streamed_model import streamed
    from onnxtrain.graph.io import load_light

    start = time.perf_counter()
    light, data = load_light(folder / MODEL_FILE)
    model = streamed(light, data)
    if model.size >= PROTOBUF_LIMIT:  # told before anything is written
        raise SystemExit(f"{MODEL_FILE}'s weights pass protobuf's 2 GiB limit: no inline copy")
    with open(folder / INLINE_FILE, "wb") as file:
        model.write(file)
    _result(seconds=time.perf_counter() - start, peak_mib=peak_rss_mib())


def measure_path_inline(config: Gpt2 | Llama, folder: Path) -> None:
    if not (folder / INLINE_FILE).exists():
        raise SystemExit("no inline copy (its weights pass protobuf's 2 GiB limit)")
    seconds = _generate(folder / INLINE_FILE, weight_names(config), folder / "artifacts-path-inline")
    _result(seconds=seconds, peak_mib=peak_rss_mib())


def measure_proto(config: Gpt2 | Llama, folder: Path) -> None:
    import onnx

    start = time.perf_counter()
    proto = onnx.load(os.fspath(folder / MODEL_FILE))
    loaded_seconds = time.perf_counter() - start
    before = rss_mib()
    seconds = _generate(proto, weight_names(config), folder / "artifacts-proto")
    _result(
        seconds=seconds,
        peak_mib=peak_rss_mib(),
        before_mib=before,
        proto_mib=_tensor_mib(proto),
        load_seconds=loaded_seconds,
    )


def measure_lora(config: Gpt2 | Llama, folder: Path) -> None:
    import onnx

    from onnxtrain.lora import add_adapters

    start = time.perf_counter()
    adapted, names = add_adapters(folder / MODEL_FILE, targets=_targets(config), rank=8, alpha=16)
    onnx.save(adapted, folder / ADAPTED_FILE)  # beside the base: it refers to the base's external data
    adapt_seconds = time.perf_counter() - start
    seconds = _generate(folder / ADAPTED_FILE, names, folder / "artifacts-lora")
    _result(seconds=seconds, adapt_seconds=adapt_seconds, peak_mib=peak_rss_mib(), adapters=len(names))


def _targets(config: Gpt2 | Llama) -> list[str]:
    return ["q_proj", "v_proj"] if isinstance(config, Llama) else ["c_attn"]


def measure_merge(config: Gpt2 | Llama, folder: Path) -> None:
    """``merge_adapters`` by path with the checkpoint ``lora`` wrote, its merged weights written beside the base."""
    import onnx

    from onnxtrain.lora import merge_adapters

    start = time.perf_counter()
    merged = merge_adapters(folder / ADAPTED_FILE, folder / "artifacts-lora" / "checkpoint", data_location=MERGED_DATA)
    onnx.save(merged, folder / MERGED_FILE)
    _result(seconds=time.perf_counter() - start, peak_mib=peak_rss_mib())


def _tensor_mib(proto: Any) -> float:
    """The MiB of the proto's initializers (``ByteSize`` fails over protobuf's 2 GiB)."""
    from onnxtrain.graph.external import declared_nbytes

    return sum(declared_nbytes(t) or 0 for t in proto.graph.initializer) / 2**20


def measure_adapters_proto(config: Gpt2 | Llama, folder: Path) -> None:
    """``add_adapters`` then ``merge_adapters`` on a loaded ``ModelProto``: what each adds to the proto's RSS."""
    import onnx

    from onnxtrain.lora import add_adapters, merge_adapters

    proto = onnx.load(os.fspath(folder / MODEL_FILE))
    before = rss_mib()
    start = time.perf_counter()
    adapted, _ = add_adapters(proto, targets=_targets(config), rank=8, alpha=16)
    del proto
    merged = merge_adapters(adapted, folder / "artifacts-lora" / "checkpoint")
    _result(
        seconds=time.perf_counter() - start,
        peak_mib=peak_rss_mib(),
        before_mib=before,
        proto_mib=_tensor_mib(merged),
    )


def measure_lora_step(config: Gpt2 | Llama, folder: Path) -> None:
    import numpy as np

    from onnxtrain.api import CheckpointState, Module, Optimizer

    directory = folder / "artifacts-lora"
    start = time.perf_counter()
    state = CheckpointState.load_checkpoint(os.fspath(directory / "checkpoint"))
    module = Module(os.fspath(directory / "training_model.onnx"), state, os.fspath(directory / "eval_model.onnx"))
    optimizer = Optimizer(os.fspath(directory / "optimizer_model.onnx"), module)
    setup = time.perf_counter() - start
    rng = np.random.default_rng(0)
    ids = rng.integers(0, config.vocab, size=(1, 16))
    labels = rng.integers(0, config.vocab, size=16)
    start = time.perf_counter()
    loss = module(ids, labels)
    optimizer.step()
    module.lazy_reset_grad()
    _result(
        seconds=time.perf_counter() - start,
        setup_seconds=setup,
        peak_mib=peak_rss_mib(),
        loss=float(np.asarray(loss)),
    )


def build(config: Gpt2 | Llama, folder: Path) -> None:
    start = time.perf_counter()
    write_model(config, folder)
    parameters = net_of(config).parameters()
    _result(seconds=time.perf_counter() - start, parameters=parameters, peak_mib=peak_rss_mib())


CHILDREN = {
    "build": build,
    "path": measure_path,
    "build-inline": build_inline,
    "path-inline": measure_path_inline,
    "proto": measure_proto,
    "lora": measure_lora,
    "lora-step": measure_lora_step,
    "merge": measure_merge,
    "adapters-proto": measure_adapters_proto,
}


# ----------------------------------------------------------------------------- the parent


def _config(name: str, layers: int | None) -> Gpt2 | Llama:
    config = MODELS[name]
    return config if layers is None else replace(config, layers=layers)


def _child(what: str, model: str, folder: Path, layers: int | None, max_rss_gib: float) -> dict[str, Any]:
    """Run one measurement in a fresh process; stop it when its RSS passes ``max_rss_gib`` (a shared machine)."""
    command = [sys.executable, "-m", "benchmarks.large_artifacts", "--child", what, "--models", model]
    command += ["--workdir", os.fspath(folder)] + ([] if layers is None else ["--layers", str(layers)])
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, text=True)
        deadline = time.monotonic() + TIMEOUT
        highest = 0.0
        while process.poll() is None:
            highest = max(highest, _rss_gib(process.pid))
            if highest > max_rss_gib or time.monotonic() > deadline:
                process.kill()
                process.wait()
                return {"error": f"stopped at {highest:.1f} GiB of RSS (limit {max_rss_gib} GiB) or {TIMEOUT} s"}
            time.sleep(0.2)
        out.seek(0)
        err.seek(0)
        if process.returncode != 0:
            return {"error": (err.read().strip().splitlines() or [f"exit status {process.returncode}"])[-1]}
        return parse_result(out.read()) or {"error": "no result printed"}


def _rss_gib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


#: Figures a measurement reports besides its time and peak, shown in the last column.
NOTES = {
    "load_seconds": "onnx.load {:.1f} s",
    "adapt_seconds": "add_adapters {:.1f} s",
    "setup_seconds": "Module + Optimizer {:.1f} s",
    "loss": "loss {:.3f}",
}


def _row(model: str, what: str, result: dict[str, Any]) -> str:
    if "error" in result:
        return f"| {model} | {what} | failed: {result['error']} | | | |"
    added = ""
    if "before_mib" in result:
        added = f"{result['peak_mib'] - result['before_mib']:.0f} (proto {result['proto_mib']:.0f})"
    notes = ", ".join(text.format(result[key]) for key, text in NOTES.items() if key in result)
    return f"| {model} | {what} | {result['seconds']:.1f} | {result['peak_mib']:.0f} | {added} | {notes} |"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--measures", default="path,proto")
    parser.add_argument("--workdir", type=Path, help="where the models and artifacts go (kept); default: a temp folder")
    parser.add_argument("--layers", type=int, help="fewer layers than the model has (a quick check)")
    parser.add_argument("--max-rss-gib", type=float, default=16.0, help="stop a measurement whose RSS passes this")
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {list(MODELS)}")
    if args.child:
        (model,) = models
        CHILDREN[args.child](_config(model, args.layers), args.workdir / model)
        return 0
    measures = [m for m in args.measures.split(",") if m]
    if set(measures) - set(MEASURES):
        parser.error(f"unknown measures {sorted(set(measures) - set(MEASURES))}; choose from {list(MEASURES)}")
    root = args.workdir or Path(tempfile.mkdtemp(prefix="large-artifacts-"))
    print("| model | measure | seconds | peak RSS (MiB) | added to the loaded proto (MiB) | notes |")
    print("|---|---|---|---|---|---|")
    try:
        for model in models:
            folder = root / model
            if not (folder / MODEL_FILE).exists():
                folder.mkdir(parents=True, exist_ok=True)
                built = _child("build", model, root, args.layers, args.max_rss_gib)
                print(f"<!-- {model}: {built} -->", flush=True)
            if "path-inline" in measures and not (folder / INLINE_FILE).exists():
                built = _child("build-inline", model, root, args.layers, args.max_rss_gib)
                print(f"<!-- {model} inline: {built} -->", flush=True)
            for what in measures:
                print(_row(model, what, _child(what, model, root, args.layers, args.max_rss_gib)), flush=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
