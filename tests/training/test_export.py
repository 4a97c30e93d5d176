"""Export for inference: the exported model gives the eval model's outputs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.training.helpers import open_module, regression_batch


def test_exported_model_matches_the_eval_step_after_training(regression, rng, tmp_path):
    _state, module, optimizer = open_module(regression)
    optimizer.set_learning_rate(0.01)
    for _ in range(3):
        module(*regression_batch(rng))
        optimizer.step()
        module.lazy_reset_grad()
    path = tmp_path / "inference.onnx"
    module.export_model_for_inferencing(path, ["y"])
    exported = onnx.load(str(path))
    assert [i.name for i in exported.graph.input] == ["x"]  # parameters baked in, the target pruned
    assert [o.name for o in exported.graph.output] == ["y"]
    x, target = regression_batch(rng)
    (y,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    _, expected = module.eval()(x, target)
    np.testing.assert_array_equal(y, expected)


def test_export_needs_an_eval_model_and_known_outputs(regression, tmp_path):
    _state, module, _ = open_module(regression, optimizer=False)
    with pytest.raises(ValueError, match="nope"):
        module.export_model_for_inferencing(tmp_path / "a.onnx", ["nope"])
    from onnxtrain import api

    bare = api.Module(regression["training_model"], api.CheckpointState.load_checkpoint(regression["checkpoint"]))
    with pytest.raises(RuntimeError, match="eval_model_uri"):
        bare.export_model_for_inferencing(tmp_path / "b.onnx", ["y"])
    assert not (tmp_path / "a.onnx").exists() and not (tmp_path / "b.onnx").exists()
