"""Tiny Hugging Face transformers, their ONNX exports and torch's loss and gradients.

Four models, built from ``transformers`` configs with random weights (nothing
is downloaded), 2 layers, hidden size 32, 4 heads, vocabulary 100, every
dropout probability 0 (so torch in train mode and the exported graph agree):

- ``bert``: ``BertForSequenceClassification`` (3 classes, eager attention);
- ``distilbert``: ``DistilBertForSequenceClassification`` (3 classes);
- ``gpt2``: ``GPT2LMHeadModel`` (tied input and output embeddings);
- ``llama``: ``LlamaForCausalLM`` (RMSNorm, rotary embeddings, SwiGLU,
  grouped-query attention with 2 key-value heads).

transformers initialises biases to zero and normalization weights to one;
every parameter then gets Gaussian noise (standard deviation 0.05), so that no
two parameters are equal, which the comparison of fused initializers with
torch's parameters by value needs (:mod:`tests.transformers.fused`), and
no gradient is tested only at a zero bias.

Each is wrapped in a module ``ids -> logits`` whose logits put the classes on
axis 1, as cross-entropy wants: ``(batch, classes)`` for the classifiers,
``(batch, vocab, seq)`` for the language models. The wrapper passes an
all-ones attention mask: without one, transformers 5 looks for packed
sequences in the position ids with ``torch.diff``, which the TorchScript
exporter cannot export. The export is TorchScript's (``dynamo=False``), in
training mode, without constant folding, with symbolic ``batch`` and ``seq``.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
import pytest

from tests.helpers import export_for_training

NAMES = ("bert", "distilbert", "gpt2", "llama")
VOCAB, HIDDEN, HEADS, KV_HEADS, LAYERS, INTERMEDIATE, POSITIONS, CLASSES = 100, 32, 4, 2, 2, 64, 64, 3
#: The ``ai.onnx`` opset of the exports.
OPSET = 18
#: The sequence lengths every test runs with the same artifacts (the export traces with 5).
LENGTHS = (3, 11)
BATCH = 2

Kind = Literal["classifier", "lm"]
KINDS: dict[str, Kind] = {"bert": "classifier", "distilbert": "classifier", "gpt2": "lm", "llama": "lm"}


def _config(transformers: Any, name: str) -> Any:
    """The tiny config of model ``name``: eager attention, no dropout, no cache."""
    if name == "bert":
        return transformers.BertConfig(
            vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
            intermediate_size=INTERMEDIATE, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            max_position_embeddings=POSITIONS, num_labels=CLASSES, attn_implementation="eager",
        )  # fmt: skip
    if name == "distilbert":
        return transformers.DistilBertConfig(
            vocab_size=VOCAB, dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS, hidden_dim=INTERMEDIATE, dropout=0.0,
            attention_dropout=0.0, seq_classif_dropout=0.0, max_position_embeddings=POSITIONS, num_labels=CLASSES,
            attn_implementation="eager",
        )  # fmt: skip
    if name == "gpt2":
        return transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=POSITIONS, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, bos_token_id=0, eos_token_id=0,
            attn_implementation="eager",
        )  # fmt: skip
    if name == "llama":
        return transformers.LlamaConfig(
            vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=LAYERS,
            num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=POSITIONS,
            attention_dropout=0.0, use_cache=False, bos_token_id=0, eos_token_id=0, pad_token_id=0,
            attn_implementation="eager",
        )  # fmt: skip
    raise ValueError(f"no transformers model {name!r}; choose one of {list(NAMES)}")


def torch_module(name: str, seed: int = 0, *, distinct: bool = True) -> Any:
    """Model ``name`` as a torch module ``ids -> logits`` (classes on axis 1), in train mode; with ``distinct``
    every parameter gets noise, else it keeps transformers' initialisation (zero biases, unit norm weights)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    classes = {
        "bert": transformers.BertForSequenceClassification,
        "distilbert": transformers.DistilBertForSequenceClassification,
        "gpt2": transformers.GPT2LMHeadModel,
        "llama": transformers.LlamaForCausalLM,
    }
    lm = KINDS[name] == "lm"

    class Logits(torch.nn.Module):
        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids: Any) -> Any:
            logits = self.model(input_ids=ids, attention_mask=torch.ones_like(ids), return_dict=False)[0]
            return logits.transpose(1, 2) if lm else logits

    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = Logits(classes[name](_config(transformers, name)))
    if distinct:
        with torch.no_grad():  # transformers' init: zero biases, unit norm weights; make every value distinct
            for parameter in module.parameters():
                parameter.add_(0.05 * torch.randn_like(parameter))
    return module.train()


def batch(name: str, rng: np.random.Generator, length: int, size: int = BATCH) -> dict[str, np.ndarray]:
    """Token ids ``(size, length)`` and int64 labels: ``(size,)`` classes or ``(size, length)`` next tokens.

    The ids avoid the padding token 0: torch's ``nn.Embedding(padding_idx=0)`` gives its row no
    gradient, a rule TorchScript's export does not carry (``test_embeddings.py`` tests batches with it).
    """
    ids = rng.integers(1, VOCAB, size=(size, length), dtype=np.int64)
    shape = (size,) if KINDS[name] == "classifier" else (size, length)
    labels = rng.integers(0, CLASSES if KINDS[name] == "classifier" else VOCAB, size=shape, dtype=np.int64)
    return {"ids": ids, "labels": labels}


def export(module: Any, name: str) -> onnx.ModelProto:
    """``module`` exported by TorchScript in training mode, unfolded, with symbolic ``batch`` and ``seq``."""
    torch = pytest.importorskip("torch")
    ids = torch.from_numpy(batch(name, np.random.default_rng(0), 5)["ids"])
    seq_axis = 1 if KINDS[name] == "classifier" else 2
    y_axes = {0: "batch"} if KINDS[name] == "classifier" else {0: "batch", seq_axis: "seq"}
    axes = {"ids": {0: "batch", 1: "seq"}, "y": y_axes}
    return export_for_training(module, (ids,), ["ids"], ["y"], opset=OPSET, dynamic_axes=axes)


@functools.cache
def fresh_module(name: str) -> Any:
    """Model ``name`` as transformers initialises it, in train mode (once per session)."""
    return torch_module(name, distinct=False)


@functools.cache
def dynamo_export(name: str, optimize: bool) -> onnx.ModelProto:
    """:func:`fresh_module` exported by torch's dynamo exporter (``optimize`` as given), with symbolic batch and
    sequence axes (once per session)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    ids = torch.from_numpy(batch(name, np.random.default_rng(0), 5)["ids"])
    axes = {"ids": {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            fresh_module(name), (ids,), dynamo=True, optimize=optimize, input_names=["ids"], output_names=["y"],
            dynamic_shapes=axes, verbose=False,
        )  # fmt: skip
    return program.model_proto


@dataclass(frozen=True)
class Exported:
    """A torch module, its state at export, and its export."""

    name: str
    module: Any
    state: dict[str, Any]
    model: onnx.ModelProto

    @property
    def parameters(self) -> tuple[str, ...]:
        """Torch's parameter names (tied parameters once), which the export keeps as initializer names."""
        return tuple(k for k, _ in self.module.named_parameters())


@functools.cache
def exported(name: str) -> Exported:
    """Model ``name`` and its export, once per session."""
    module = torch_module(name)
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    model = export(module, name)
    initializers = {t.name for t in model.graph.initializer}
    missing = [p for p in (k for k, _ in module.named_parameters()) if p not in initializers]
    assert not missing, f"{name}: the export lost parameters {missing}"
    return Exported(name, module, state, model)


@dataclass(frozen=True)
class Reference:
    """torch's loss and the gradient of every parameter, by torch's name."""

    loss: float
    grads: dict[str, np.ndarray]


def torch_reference(ex: Exported, data: Mapping[str, np.ndarray]) -> Reference:
    """Cross-entropy of ``ex.module``'s logits against the labels, and its backward pass, from the export state."""
    torch = pytest.importorskip("torch")
    module = ex.module
    module.load_state_dict(ex.state)
    module.train()
    module.zero_grad(set_to_none=True)
    logits = module(torch.from_numpy(data["ids"]))
    loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(data["labels"]))
    loss.backward()
    grads = {k: p.grad.detach().numpy().copy() for k, p in module.named_parameters()}
    return Reference(float(loss.item()), grads)


def assert_grad_close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """``rtol=1e-4`` and an absolute tolerance of ``1e-5`` times the gradient's largest magnitude."""
    assert got.shape == want.shape, f"{what}: shape {got.shape}, torch {want.shape}"
    atol = 1e-5 * max(1e-3, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=atol, err_msg=what)


def save(model: onnx.ModelProto, directory: Path, name: str) -> Path:
    """``model`` written to ``directory / name.onnx``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.onnx"
    onnx.save(model, path)
    return path
