"""Export for inference: the exported model gives the eval model's outputs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxtrain import losses
from onnxtrain.artifacts import OptimType
from tests.training import models
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


def _trained(regression, rng):
    _state, module, optimizer = open_module(regression)
    optimizer.set_learning_rate(0.01)
    module(*regression_batch(rng))
    optimizer.step()
    return module


def test_a_failed_export_leaves_the_earlier_file_as_it_was(regression, rng, tmp_path, monkeypatch):
    """The model is written beside its path and renamed over it: a disk that fills halfway through leaves the
    earlier export whole, and no temporary file behind."""
    import errno

    module = _trained(regression, rng)
    path = tmp_path / "inference.onnx"
    module.export_model_for_inferencing(path, ["y"])
    before = path.read_bytes()
    module(*regression_batch(rng))  # new weights, which the failed export would have written

    def disk_full(model, target, *args, **kwargs):
        with open(target, "wb") as file:
            file.write(model.SerializeToString()[:100])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(onnx, "save_model", disk_full)
    with pytest.raises(OSError, match="No space left"):
        module.export_model_for_inferencing(path, ["y"])
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["inference.onnx"]


def test_an_export_over_protobufs_limit_writes_its_data_file_anew_each_time(regression, rng, tmp_path, monkeypatch):
    """onnx appends to an existing data file: exported again (after every epoch), the file would grow by the
    weights each time. It is written to a file of its own and renamed into place instead."""
    monkeypatch.setattr("onnxtrain.training.module.PROTOBUF_LIMIT", 0)  # every model counts as over 2 GiB
    wide = models.generate(tmp_path / "wide", models.mlp((4, 96, 3)), loss=losses.MSELoss(), optimizer=OptimType.SGD,
                           additional_output_names=["y"])  # fmt: skip
    module = _trained(wide, rng)  # 4x96 and 96x3 float weights: 1,536 and 1,152 bytes, kept in the data file
    path = tmp_path / "out" / "inference.onnx"
    path.parent.mkdir()
    sizes = []
    x, target = regression_batch(rng)
    for _ in range(3):
        module(x, target)
        module.export_model_for_inferencing(path, ["y"])
        sizes.append((path.parent / "inference.onnx.data").stat().st_size)
        (y,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
        np.testing.assert_array_equal(y, module.eval()(x, target)[1])
        module.train()
    assert sizes == [(4 * 96 + 96 * 3) * 4] * 3
    assert sorted(p.name for p in path.parent.iterdir()) == ["inference.onnx", "inference.onnx.data"]
    locations = {e.value for t in onnx.load(str(path), load_external_data=False).graph.initializer
                 for e in t.external_data if e.key == "location"}  # fmt: skip
    assert locations == {"inference.onnx.data"}


def test_an_export_to_a_missing_folder_or_a_folder_says_so(regression, rng, tmp_path):
    module = _trained(regression, rng)
    with pytest.raises(FileNotFoundError, match=r"the directory .*no_such_folder does not exist"):
        module.export_model_for_inferencing(tmp_path / "no_such_folder" / "m.onnx", ["y"])
    with pytest.raises(IsADirectoryError, match=r"is a directory; give the path of the \.onnx file"):
        module.export_model_for_inferencing(tmp_path, ["y"])
