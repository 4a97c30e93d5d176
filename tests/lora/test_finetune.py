"""Fine-tuning adapters with generate_artifacts + onnxtrain.api on a toy task, then merging them.

The task: memorise the next token of 4 random sequences of 8 tokens (vocabulary
12), full batch, AdamW at 1e-2, adapters of rank 4 (alpha 8, 880 trainable
values against the base's 2780 frozen ones) beside every projection of the
GPT-2-style block and the lm_head. From about 2.55, the loss (inference mode)
falls below 0.01 in 100 steps over the float base, the 4-bit MatMulNBits base
and the int8 DequantizeLinear base (0.0039, 0.0027 and 0.0040 measured), and
below 0.05 with the adapters' dropout at 0.1 (0.019; the Dropout nodes are
seeded). The merged model gives the trained adapted model's outputs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxtrain.api import CheckpointState
from onnxtrain.artifacts.training_model import set_inference_mode
from onnxtrain.lora import METADATA_KEY, add_adapters, merge_adapters
from tests.lora.helpers import (
    ALPHA,
    RANK,
    TARGETS,
    Base,
    BaseKind,
    fine_tune,
    generate,
    inference_op_types,
    run,
    trained_values,
    with_values,
)
from tests.lora.models import toy_task

STEPS = 100
#: The loss the fine-tuned adapters reach within STEPS steps, without and with dropout.
TARGET_LOSS = {0.0: 0.01, 0.1: 0.05}


@pytest.mark.parametrize(("kind", "dropout"), [("float", 0.0), ("float", 0.1), ("nbits", 0.0), ("dql", 0.0)])
def test_fine_tuning_memorises_and_merges(
    bases: dict[BaseKind, Base], kind: BaseKind, dropout: float, tmp_path: Path
) -> None:
    base = bases[kind]
    adapted, names = add_adapters(base.model, TARGETS, RANK, ALPHA, dropout=dropout)
    folder = generate(adapted, names, tmp_path)
    eval_model = onnx.load(folder / "eval_model.onnx")
    assert all(len(n.input) < 3 or not n.input[2] for n in eval_model.graph.node if n.op_type == "Dropout")
    ids, labels = toy_task()
    losses, state = fine_tune(folder, ids, labels, STEPS)
    assert losses[0] == pytest.approx(2.55, abs=0.1)
    trained = with_values(adapted, trained_values(state, names))
    set_inference_mode(trained)  # the adapters' Dropout off, as in the eval model
    (logits,) = run(trained, {"input_ids": ids}, optimized=kind != "dql")
    final = _cross_entropy(logits, labels)
    assert final < TARGET_LOSS[dropout], f"{kind} base, dropout {dropout}: loss {final:.4f} after {STEPS} steps"

    CheckpointState.save_checkpoint(state, folder / "trained")
    merged = merge_adapters(adapted, folder / "trained" if kind == "float" else state)
    assert METADATA_KEY not in {p.key for p in merged.metadata_props}
    assert not [t.name for t in merged.graph.initializer if ".lora_" in t.name]
    assert not [n.name for n in merged.graph.node if "lora" in n.name]
    produced = {name for node in merged.graph.node for name in node.output}
    assert {value.name for value in merged.graph.value_info} <= produced
    assert all(len(n.input) < 3 or not n.input[2] for n in merged.graph.node if n.op_type == "Dropout")
    onnx.checker.check_model(merged)
    (merged_logits,) = run(merged, {"input_ids": ids}, optimized=kind != "dql")
    np.testing.assert_allclose(merged_logits, logits, rtol=1e-4, atol=1e-4)
    if kind == "float":
        assert [n.op_type for n in merged.graph.node] == inference_op_types(base.model)
        assert [t.name for t in merged.graph.initializer] == [t.name for t in base.model.graph.initializer]
    else:  # the adapted quantized products became float ones
        assert not [n for n in merged.graph.node if n.op_type in ("MatMulNBits", "DequantizeLinear")]


def _cross_entropy(logits: np.ndarray, labels: np.ndarray) -> float:
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float(-log_probs[np.arange(len(labels)), labels].mean())
