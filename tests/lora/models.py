"""A GPT-2-style model for the LoRA tests, built in torch and exported with the TorchScript exporter.

transformers' own ``GPT2LMHeadModel`` does not export with torch 2.13's
TorchScript exporter (its mask creation calls ``aten::diff``), so this is a
hand-built GPT-2 block with GPT-2's names and layers: token and position
embeddings, pre-LayerNorm causal self-attention (fused ``c_attn``, ``c_proj``),
a tanh-GELU MLP (``c_fc``, ``c_proj``), a final LayerNorm and an ``lm_head``.
The projections export as the three products adapters go beside: ``MatMul``
(``c_attn``, ``c_fc``: a 3-D input), ``Gemm`` with ``transB=0`` (the two
``c_proj``, GPT-2's ``Conv1D`` as ``addmm``) and ``Gemm`` with ``transB=1``
(``lm_head``, a ``Linear``). Exported in training mode (dropout 0, kept as
Dropout nodes); the logits are ``[batch * seq, vocab]`` for the cross-entropy.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx

from tests.helpers import export_for_training

VOCAB, SEQ, EMBED, HEADS, HIDDEN = 12, 8, 16, 2, 32


def tiny_gpt(seed: int = 0) -> Any:
    """The torch module (torch imported here: callers skip without it)."""
    import torch
    from torch import nn

    class Conv1D(nn.Module):
        """GPT-2's projection: ``x @ W + b`` with ``W: [in, out]``; ``addmm`` (Gemm) on a 2-D view, or MatMul."""

        def __init__(self, fan_in: int, fan_out: int, gemm: bool) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(fan_in, fan_out) * 0.3)
            self.bias = nn.Parameter(torch.randn(fan_out) * 0.1)
            self.gemm = gemm

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.gemm:
                flat = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)
                return flat.reshape(*x.shape[:-1], -1)
            return x @ self.weight + self.bias

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c_attn = Conv1D(EMBED, 3 * EMBED, gemm=False)
            self.c_proj = Conv1D(EMBED, EMBED, gemm=True)
            self.register_buffer("mask", torch.triu(torch.full((SEQ, SEQ), -1e4), diagonal=1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            batch, seq, _ = x.shape
            q, k, v = self.c_attn(x).split(EMBED, dim=-1)
            heads = [t.reshape(batch, seq, HEADS, EMBED // HEADS).transpose(1, 2) for t in (q, k, v)]
            scores = heads[0] @ heads[1].transpose(-1, -2) / math.sqrt(EMBED // HEADS) + self.mask
            mixed = (scores.softmax(-1) @ heads[2]).transpose(1, 2).reshape(batch, seq, EMBED)
            return self.c_proj(mixed)

    class Mlp(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c_fc = Conv1D(EMBED, HIDDEN, gemm=False)
            self.c_proj = Conv1D(HIDDEN, EMBED, gemm=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c_proj(nn.functional.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1 = nn.LayerNorm(EMBED)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(EMBED)
            self.mlp = Mlp()
            self.dropout = nn.Dropout(0.0)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.dropout(self.attn(self.ln_1(x)))
            return x + self.dropout(self.mlp(self.ln_2(x)))

    class TinyGPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(VOCAB, EMBED)
            self.wpe = nn.Embedding(SEQ, EMBED)
            self.h0 = Block()
            self.ln_f = nn.LayerNorm(EMBED)
            self.lm_head = nn.Linear(EMBED, VOCAB)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            positions = torch.arange(ids.shape[1]).unsqueeze(0)
            x = self.ln_f(self.h0(self.wte(ids) + self.wpe(positions)))
            return self.lm_head(x.reshape(-1, EMBED))

    torch.manual_seed(seed)
    return TinyGPT().train()


def export(module: Any, batch: int) -> onnx.ModelProto:
    """``module`` exported for ``input_ids: int64[batch, SEQ]`` in training mode, opset 17."""
    import torch

    ids = torch.zeros((batch, SEQ), dtype=torch.int64)
    return export_for_training(module, (ids,), ["input_ids"], ["logits"], opset=17)


def toy_task(n: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` random sequences and their next tokens (cyclic): ``ids [n, SEQ]``, ``labels [n * SEQ]``."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, size=(n, SEQ)).astype(np.int64)
    return ids, np.roll(ids, -1, axis=1).reshape(-1)


def batch_norm_mlp(seed: int = 0) -> onnx.ModelProto:
    """``Linear(6, 8) -> BatchNorm1d(8) -> ReLU -> Linear(8, 3)`` exported in training mode for ``x: float[16, 6]``.

    Its products are Gemms with ``transB=1`` (``0.weight``, ``3.weight``); the BatchNormalization updates its
    running statistics ``1.running_mean`` and ``1.running_var`` at each train step.
    """
    import torch
    from torch import nn

    torch.manual_seed(seed)
    module = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3)).train()
    return export_for_training(module, (torch.zeros(16, 6),), ["x"], ["logits"], opset=17)
