"""The models onnxtrain emits for the reference builds of tests/emitted_graphs.py are the recorded ones.

A restructuring of the code keeps every emitted model byte for byte. The
fingerprints depend on onnx's shape inference, so they are recorded per onnx
release (``python -m tests.emitted_graphs`` with each); another release skips.
"""

from __future__ import annotations

import json

import onnx
import pytest

from tests import emitted_graphs

RECORDED = json.loads(emitted_graphs.RECORD.read_text())


@pytest.mark.skipif(onnx.__version__ not in RECORDED, reason=f"no fingerprints recorded for onnx {onnx.__version__}")
@pytest.mark.parametrize("case", sorted(emitted_graphs.CASES))
def test_the_emitted_models_are_the_recorded_ones(case: str) -> None:
    expected = RECORDED[onnx.__version__][case]
    built = emitted_graphs.CASES[case]()
    assert {name: emitted_graphs.fingerprint(model) for name, model in built.items()} == expected


def test_a_changed_model_changes_its_fingerprint() -> None:
    """A test of the test: one attribute more is another fingerprint, the same model built twice the same."""
    first, second = (emitted_graphs.CASES["mlp-adamw"]()["training_model"] for _ in range(2))
    assert emitted_graphs.fingerprint(first) == emitted_graphs.fingerprint(second)
    second.graph.node[0].doc_string = "changed"
    assert emitted_graphs.fingerprint(first) != emitted_graphs.fingerprint(second)
