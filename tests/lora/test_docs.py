"""docs/lora.md's Hugging Face example, run as written: DistilBERT's q_lin and v_lin adapted, trained, merged.

The merged model (the base's Dropout at 0.1, in inference mode once merged)
gives the outputs of the trained adapted model in inference mode, the same at
every run, and the eval model's loss for the trained checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from onnxtrain.artifacts.training_model import set_inference_mode
from tests.lora.helpers import run, trained_values, with_values
from tests.lora.test_finetune import _cross_entropy

DOCS = Path(__file__).resolve().parents[2] / "docs" / "lora.md"


def _snippet(heading: str) -> str:
    section = DOCS.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_hugging_face_example_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    exec(_snippet("Hugging Face models"), namespace)
    names = namespace["names"]
    assert isinstance(names, list) and len(names) == 8
    assert all(".attention.q_lin.weight.lora_" in n or ".attention.v_lin.weight.lora_" in n for n in names)
    adapted, state, logits = namespace["adapted"], namespace["state"], namespace["logits"]
    feeds = {"input_ids": namespace["input_ids"], "attention_mask": namespace["attention_mask"]}
    trained = with_values(adapted, trained_values(state, names))  # type: ignore[arg-type]
    set_inference_mode(trained)
    (expected,) = run(trained, feeds)
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)  # type: ignore[arg-type]
    for optimized in (True, False):  # onnxruntime's optimizations drop a Dropout whose flag is a Constant node
        (again,) = run(namespace["merged"], feeds, optimized=optimized)  # type: ignore[arg-type]
        np.testing.assert_allclose(again, logits, rtol=1e-5, atol=1e-6)  # type: ignore[arg-type]
    module = namespace["module"]
    module.eval()  # type: ignore[attr-defined]
    eval_loss = float(np.asarray(module(*feeds.values(), namespace["labels"])))  # type: ignore[operator]
    assert _cross_entropy(logits, namespace["labels"]) == pytest.approx(eval_loss, rel=1e-5)  # type: ignore[arg-type]
