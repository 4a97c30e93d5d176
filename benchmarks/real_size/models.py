"""The real-size models: GPT-2 small and a Llama-style model of 125M parameters, from ``transformers`` configs.

Both are built with random weights (``torch.manual_seed(0)``, transformers'
own initialisation; nothing is downloaded), every dropout probability 0, no
cache, and wrapped by :func:`flat_logits`: ``input_ids [batch, seq] ->
logits [batch * seq, vocab]``, the shape cross-entropy takes with labels
``[batch * seq]``. The wrapper passes an all-ones attention mask: without
one, transformers 5 looks for packed sequences with ``torch.diff``, which
torch's TorchScript exporter cannot export.

Attention: ``"eager"`` is transformers' matmul-softmax-matmul, the math the
ONNX export holds; ``"sdpa"`` is ``torch.nn.functional.scaled_dot_product_attention``,
transformers' default. The two build the same weights from the same seed.

The export (:func:`export`, :func:`benchmarks.prepare.export_for_training`)
is TorchScript's (``dynamo=False``) in training mode, unfolded, opset 17,
with symbolic ``batch`` and ``seq``: one model serves every batch shape, as
the runtime's general session does.
torch and transformers are imported inside the functions.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from benchmarks.prepare import export_for_training

if TYPE_CHECKING:
    import torch

Attention = Literal["eager", "sdpa"]
#: The trace's batch shape (the export's axes are symbolic).
TRACE_SHAPE = (2, 16)
#: Batches cycled through by the steps.
BATCHES = 2
#: AdamW as ONNX Runtime's ``OptimType.AdamW`` and onnxtrain's default build it (as benchmarks.workloads.ADAMW).
ADAMW = {"betas": (0.9, 0.999), "eps": 1e-6, "weight_decay": 0.0}
LEARNING_RATE = 1e-4


@dataclass(frozen=True)
class RealModel:
    """A model of real size: its transformers family and config."""

    name: str
    title: str
    family: Literal["gpt2", "llama"]
    vocab: int
    layers: int = 12
    hidden: int = 768
    heads: int = 12
    kv_heads: int = 12
    intermediate: int = 3072

    def config(self, attention: Attention) -> Any:
        """The transformers config, with ``attention`` as its attention implementation."""
        import transformers

        if self.family == "gpt2":
            return transformers.GPT2Config(
                vocab_size=self.vocab, n_embd=self.hidden, n_layer=self.layers, n_head=self.heads,
                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, attn_implementation=attention,
            )  # fmt: skip
        return transformers.LlamaConfig(
            vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.intermediate,
            num_hidden_layers=self.layers, num_attention_heads=self.heads, num_key_value_heads=self.kv_heads,
            max_position_embeddings=2048, attention_dropout=0.0, use_cache=False, tie_word_embeddings=False,
            attn_implementation=attention,
        )  # fmt: skip

    def build(self, attention: Attention = "eager", *, checkpointing: bool = False) -> torch.nn.Module:
        """The model in train mode, ``ids -> logits [batch * seq, vocab]``, with the seeded initial weights;
        ``checkpointing``: with transformers' activation checkpointing (each layer run again in the backward)."""
        import torch
        import transformers

        kind = transformers.GPT2LMHeadModel if self.family == "gpt2" else transformers.LlamaForCausalLM
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = kind(self.config(attention))
            if checkpointing:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            return flat_logits(model).train()

    def batches(self, batch: int, seq: int, count: int = BATCHES) -> tuple[np.ndarray, np.ndarray]:
        """``count`` batches of random token ids ``[count, batch, seq]`` and labels ``[count, batch * seq]``."""
        rng = np.random.default_rng(1234)
        ids = rng.integers(0, self.vocab, size=(count, batch, seq), dtype=np.int64)
        labels = rng.integers(0, self.vocab, size=(count, batch * seq), dtype=np.int64)
        return ids, labels


def flat_logits(model: Any) -> torch.nn.Module:
    """``model`` (a transformers causal LM) as ``input_ids -> logits [batch * seq, vocab]``."""
    import torch

    class _FlatLogits(torch.nn.Module):
        def __init__(self, lm: Any) -> None:
            super().__init__()
            self.model = lm

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            mask = torch.ones_like(input_ids)
            logits = self.model(input_ids=input_ids, attention_mask=mask, return_dict=False)[0]
            return logits.reshape(-1, logits.shape[-1])

    return _FlatLogits(model)


MODELS: dict[str, RealModel] = {
    m.name: m
    for m in (
        RealModel("gpt2-small", "GPT-2 small: GPT2LMHeadModel, GPT2Config() (124M, tied embeddings)", "gpt2", 50257),
        RealModel(
            "llama-125m",
            "Llama-style: LlamaForCausalLM, 12 layers, 768 wide, 12 heads, 4 key-value heads, SwiGLU 2048, "
            "vocabulary 32000, untied (125M)",
            "llama",
            32000,
            kv_heads=4,
            intermediate=2048,
        ),
        # the same code on models of a few thousand parameters, for the smoke tests
        RealModel("gpt2-tiny", "GPT-2 of 2 layers, 32 wide, 4 heads, vocabulary 100", "gpt2", 100, 2, 32, 4, 4, 64),
        RealModel(
            "llama-tiny", "Llama-style of 2 layers, 32 wide, 4 heads, 2 key-value heads", "llama", 100, 2, 32, 4, 2, 64
        ),
    )
}


def parameter_count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def export(model: RealModel, folder: Path) -> Path:
    """Write ``folder/model.onnx`` (the eager-attention model, see the module docstring) and ``spec.json``
    (the parameters' names and count); return the folder."""
    import onnx
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    module = model.build("eager")
    ids = torch.zeros(TRACE_SHAPE, dtype=torch.int64)
    path = folder / "model.onnx"
    axes = {"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "tokens"}}
    export_for_training(module, (ids,), path, ["input_ids"], ["logits"], axes)
    parameters = [name for name, _ in module.named_parameters()]
    initializers = {t.name for t in onnx.load(str(path), load_external_data=False).graph.initializer}
    missing = [name for name in parameters if name not in initializers]
    if missing:
        raise ValueError(f"{model.name}: the export lost the parameters {missing[:5]}")
    spec = {"name": model.name, "parameters": parameters, "parameter_count": parameter_count(module)}
    (folder / "spec.json").write_text(json.dumps(spec, indent=1))
    return folder
