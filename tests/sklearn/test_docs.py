"""The examples of docs/sklearn.md, run as written there."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

#: The scikit-learn layer's documentation.
SKLEARN_DOCS = Path(__file__).resolve().parents[2] / "docs" / "sklearn.md"


def python_block(section: str) -> str:
    """The one ```python block of docs/sklearn.md's section ``section`` (its ``## `` heading's text)."""
    text = SKLEARN_DOCS.read_text(encoding="utf-8")
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```python\n(.*?)^```$", body, flags=re.M | re.S)
    assert len(blocks) == 1, f"docs/sklearn.md's section {section!r} has {len(blocks)} python blocks"
    return blocks[0]


def test_the_classifier_example_reaches_scikit_learns_accuracy() -> None:
    """A LogisticRegression alone and after a StandardScaler (converted as an ai.onnx.ml Scaler), trained anew:
    test accuracy within 0.02 of scikit-learn's (equal, at the time of writing)."""
    pytest.importorskip("skl2onnx")
    namespace: dict[str, object] = {"__name__": "docs_sklearn_example"}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="sklearn")
        exec(python_block("A classifier"), namespace)
    for name in ("iris_accuracy", "cancer_accuracy"):
        ours, theirs = namespace[name]  # type: ignore[misc]
        assert abs(ours - theirs) <= 0.02, (name, ours, theirs)
