"""External-data locations and declared sizes, checked by onnxtrain whatever the installed onnx does.

Every way a model comes in (a path or a ModelProto to ``generate_artifacts``,
``onnxblock.base``, ``checkpoint.from_tensors``, the runtime's ``Module``)
refuses a location that is absolute, climbs with ``..``, leads out of the
model's folder through a symlink, names no file, or holds another size than
the dims declare: a ``ValueError`` naming the tensor and the location, before
anything is read or written.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.external_data_helper import uses_external_data

import onnxtrain.onnxblock as onnxblock
from onnxtrain import api, artifacts, checkpoint
from onnxtrain.graph import external
from tests.artifacts.models import dense
from tests.helpers import FLOAT, make_model

WEIGHTS = np.arange(12, dtype=np.float32).reshape(3, 4)


def _model(location: str, *, length: int | None = None, constant: bool = False) -> onnx.ModelProto:
    """y = x @ W, W's data at ``location`` (an initializer, or a Constant node's value)."""
    tensor = onnx.TensorProto(name="W", data_type=onnx.TensorProto.FLOAT, dims=[3, 4])
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value=location)
    if length is not None:
        tensor.external_data.add(key="length", value=str(length))
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"])]
    if constant:
        nodes.insert(0, helper.make_node("Constant", [], ["W"], value=tensor))
    return make_model({"x": (FLOAT, ["batch", 3])}, nodes, {"y": (FLOAT, ["batch", 4])}, [] if constant else [tensor])


def _saved(folder: Path, location: str, **kwargs) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    onnx.save_model(_model(location, **kwargs), path)
    return path


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A file outside the model's folder, of exactly W's size: a leak would read it without complaint."""
    path = tmp_path / "secret.bin"
    path.write_bytes(WEIGHTS.tobytes())
    return path


def _refused(call, *fragments: str) -> None:
    with pytest.raises(ValueError) as raised:
        call()
    message = str(raised.value)
    assert "'W'" in message, message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


@pytest.mark.parametrize("constant", [False, True], ids=["initializer", "constant"])
@pytest.mark.parametrize(
    ("location", "fragment"),
    [
        ("../secret.bin", "'..'"),
        ("../../../../etc/passwd", "'..'"),
        ("sub/../../secret.bin", "'..'"),
        ("..\\secret.bin", "'..'"),
        ("/etc/passwd", "absolute"),
        ("C:\\secret.bin", "absolute"),
        ("", "empty"),
        ("missing.bin", "no such file"),
    ],
)
def test_a_location_that_may_not_be_followed_is_refused(tmp_path: Path, secret: Path, location, fragment, constant):
    path = _saved(tmp_path / "model", location, constant=constant)
    out = tmp_path / "out"
    _refused(lambda: artifacts.generate_artifacts(path, ["W"] if not constant else None, loss="MSELoss",
                                                  artifact_directory=out), repr(location), fragment)  # fmt: skip
    assert not out.exists()
    _refused(lambda: onnxblock.base(path).__enter__(), fragment)


def test_a_symlink_out_of_the_folder_is_refused_and_one_inside_is_followed(tmp_path: Path, secret: Path):
    folder = tmp_path / "model"
    path = _saved(folder, "weights.bin")
    (folder / "weights.bin").symlink_to(secret)
    _refused(lambda: artifacts.generate_artifacts(path, ["W"], loss="MSELoss", artifact_directory=tmp_path / "out"),
             "outside the model's folder", "symlink")  # fmt: skip
    (folder / "weights.bin").unlink()
    (folder / "data").mkdir()
    (folder / "data" / "w.bin").write_bytes(WEIGHTS.tobytes())
    (folder / "weights.bin").symlink_to("data/w.bin")
    paths = artifacts.generate_artifacts(path, ["W"], loss="MSELoss", artifact_directory=tmp_path / "out")
    np.testing.assert_array_equal(checkpoint.load(paths["checkpoint"]).trainable["W"], WEIGHTS)


def test_a_symlinked_folder_out_of_the_model_folder_is_refused(tmp_path: Path, secret: Path):
    folder = tmp_path / "model"
    path = _saved(folder, "data/secret.bin")
    (folder / "data").symlink_to(tmp_path, target_is_directory=True)
    _refused(lambda: artifacts.generate_artifacts(path, ["W"], loss="MSELoss", artifact_directory=tmp_path / "out"),
             "outside the model's folder")  # fmt: skip


def test_a_model_proto_with_external_data_is_told_to_pass_its_path(tmp_path: Path, secret: Path):
    model = _model("../../../../etc/passwd")
    _refused(lambda: artifacts.generate_artifacts(model, ["W"], loss="MSELoss", artifact_directory=tmp_path / "out"),
             "pass the path of the .onnx file")  # fmt: skip
    assert "base_dir" not in _message(lambda: artifacts.generate_artifacts(model, ["W"], loss="MSELoss"))
    assert not (tmp_path / "out").exists()


def _message(call) -> str:
    with pytest.raises(ValueError) as raised:
        call()
    return str(raised.value)


@pytest.mark.parametrize(("stored", "length"), [(40, None), (52, None), (48, 40), (48, 60)])
def test_data_of_another_size_than_declared_is_refused(tmp_path: Path, stored: int, length: int | None):
    folder = tmp_path / "model"
    path = _saved(folder, "weights.bin", length=length)
    (folder / "weights.bin").write_bytes(bytes(stored))
    _refused(lambda: artifacts.generate_artifacts(path, ["W"], loss="MSELoss", artifact_directory=tmp_path / "out"),
             "weights.bin")  # fmt: skip


def test_from_tensors_resolves_locations_the_same_way(tmp_path: Path, secret: Path):
    tensor = _model("../secret.bin").graph.initializer[0]
    (tmp_path / "model").mkdir()
    _refused(lambda: checkpoint.from_tensors([tensor], base_dir=tmp_path / "model"), "'..'")
    _refused(lambda: checkpoint.from_tensors([tensor]), "base_dir=")


def test_the_runtime_refuses_a_training_model_whose_data_leaves_its_folder(tmp_path: Path, secret: Path):
    folder = tmp_path / "run"
    paths = artifacts.generate_artifacts(dense(), ["W", "B"], loss="MSELoss", artifact_directory=folder)
    training = onnx.load(paths["training_model"])
    constant = next(t for t in training.graph.initializer if t.name == "C")
    constant.ClearField("raw_data")
    constant.ClearField("float_data")
    constant.data_location = onnx.TensorProto.EXTERNAL
    constant.external_data.add(key="location", value="../secret.bin")
    hostile = folder / "hostile.onnx"
    onnx.save_model(training, hostile)
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    with pytest.raises(ValueError, match=r"'C'.*'\.\.'"):
        api.Module(hostile, state, paths["eval_model"])
    with pytest.raises(ValueError, match=r"external data files.*pass the path"):
        api.Module(training, state, paths["eval_model"])


def test_generated_artifacts_refer_to_no_data_outside_their_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr("onnxtrain.artifacts.generate.PROTOBUF_LIMIT", 0)  # every model keeps its data in a file
    kernel = np.ones((3, 600), np.float32)  # a constant large enough to go to the data file
    model = make_model({"x": (FLOAT, ["batch", 3])}, [helper.make_node("MatMul", ["x", "W"], ["h"]),
                       helper.make_node("MatMul", ["h", "K"], ["y"])], {"y": (FLOAT, ["batch", 600])},
                       [("W", np.eye(3, dtype=np.float32)), ("K", kernel)])  # fmt: skip
    folder = tmp_path / "run"
    paths = artifacts.generate_artifacts(model, ["W"], loss="MSELoss", artifact_directory=folder)
    version = os.readlink(folder / ".onnxtrain.artifacts.current")
    for name in ("training_model", "eval_model"):
        stored = onnx.load(paths[name], load_external_data=False)
        locations = {entry.value for tensor, _ in external.model_tensors(stored) if uses_external_data(tensor)
                     for entry in tensor.external_data if entry.key == "location"}  # fmt: skip
        assert locations == {f"{version}/{name}.onnx.data"}  # inside the set's own version folder
        external.check_model_data(stored, folder)  # every location passes onnxtrain's own check


def test_a_huge_declared_tensor_is_refused_before_anything_allocates(tmp_path: Path):
    """A few bytes declaring 10**12 elements: refused from the sizes alone, not after shape inference."""
    huge = onnx.TensorProto(name="W", data_type=onnx.TensorProto.FLOAT, dims=[10**6, 10**6], raw_data=b"\0" * 4)
    model = make_model({"x": (FLOAT, ["batch", 10**6])}, [helper.make_node("MatMul", ["x", "W"], ["y"])],
                       {"y": (FLOAT, ["batch", 10**6])}, [huge])  # fmt: skip
    path = tmp_path / "huge.onnx"
    onnx.save_model(model, path)
    assert path.stat().st_size < 400
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for source in (model, path):
        with pytest.raises(ValueError, match=r"'W' float\[1000000, 1000000\] declares 4000000000000 bytes.*holds 4"):
            artifacts.generate_artifacts(source, ["W"], loss="MSELoss", artifact_directory=tmp_path / "out")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024  # KiB: no big allocation
    typed = onnx.TensorProto(name="W", data_type=onnx.TensorProto.FLOAT, dims=[2, 3], float_data=[1.0, 2.0])
    with pytest.raises(ValueError, match="declares 6 values but holds 2 in float_data"):
        external.check_inline(typed)


def test_an_empty_model_file_is_reported_as_empty(tmp_path: Path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty.onnx.*has no graph: it is empty or not an ONNX model"):
        artifacts.generate_artifacts(path, ["w1"], loss="MSELoss", artifact_directory=tmp_path / "out")


def test_an_opset_newer_than_onnx_knows_says_so(tmp_path: Path):
    newest = onnx.defs.onnx_opset_version()
    model = dense(opset=17)
    model.opset_import[0].version = newest + 5
    with pytest.raises(ValueError, match=rf"opset {newest + 5}, newer than the installed onnx .*\(up to {newest}\)"):
        artifacts.generate_artifacts(model, ["W"], loss="MSELoss", artifact_directory=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_numpy_helper_reads_what_read_external_reads(tmp_path: Path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "w.bin").write_bytes(b"xxxx" + WEIGHTS.tobytes())
    tensor = _model("w.bin").graph.initializer[0]
    tensor.external_data.add(key="offset", value="4")
    external.read_external(tensor, folder)
    np.testing.assert_array_equal(numpy_helper.to_array(tensor), WEIGHTS)
    assert not uses_external_data(tensor)
