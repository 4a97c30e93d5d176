"""``graph.wire.load_light``: a model file read without the data of its large inline initializers.

The light model with its data loaded is the model ``onnx.load`` reads, field
for field, whatever the sizes around the threshold, the tensors' field
order, typed data, tensors already in data files, subgraphs and metadata;
generation from a path and the training runtime then read each weight from
the model file, and give what they gave from the loaded model.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import load_external_data_for_model, uses_external_data

from onnxtrain import artifacts
from onnxtrain.graph import external, wire
from onnxtrain.graph.io import load_base_model
from onnxtrain.lora import add_adapters

THRESHOLD = 64  # bytes: the tests' min_bytes


def _model(sizes: list[int], *, data_location_written: bool = False) -> onnx.ModelProto:
    """``y = x + w0 + w1 + ...`` with float32 weights of ``sizes`` elements (1-D), a typed-data weight, an If
    whose branch holds an initializer of its own, and metadata."""
    rng = np.random.default_rng(len(sizes))
    nodes, inits, current = [], [], "x"
    for i, n in enumerate(sizes):
        tensor = numpy_helper.from_array(rng.normal(size=n).astype(np.float32), f"w{i}")
        if data_location_written:  # explicitly DEFAULT, as some writers put it
            tensor.data_location = TensorProto.DEFAULT
        inits.append(tensor)
        nodes.append(helper.make_node("ReduceSum", [f"w{i}"], [f"s{i}"], keepdims=0))
        nodes.append(helper.make_node("Add", [current, f"s{i}"], [f"a{i}"]))
        current = f"a{i}"
    inits.append(helper.make_tensor("typed", TensorProto.FLOAT, [40], [float(v) for v in range(40)]))
    nodes.append(helper.make_node("ReduceSum", ["typed"], ["t"], keepdims=0))
    branch_weight = numpy_helper.from_array(np.arange(100, dtype=np.float32), "branch_w")
    branch = helper.make_graph(
        [helper.make_node("ReduceSum", ["branch_w"], ["b"], keepdims=0)],
        "branch",
        [],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, [])],
        [branch_weight],
    )
    nodes.append(helper.make_node("Greater", [current, "t"], ["cond"]))
    nodes.append(helper.make_node("If", ["cond"], ["branched"], then_branch=branch, else_branch=branch))
    nodes.append(helper.make_node("Add", [current, "branched"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="wire-test")
    helper.set_model_props(model, {"note": "kept"})
    return model


def _normalized(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every tensor's data as ``raw_data`` only, for comparing fields."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for tensor, _ in external.model_tensors(copy):
        array = numpy_helper.to_array(tensor)
        tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))
    return copy


@given(
    sizes=st.lists(st.sampled_from([1, THRESHOLD // 4 - 1, THRESHOLD // 4, THRESHOLD // 4 + 1, 5000]), max_size=5),
    written=st.booleans(),
)
def test_the_light_model_with_its_data_is_the_loaded_model(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], written: bool
) -> None:
    """Float32 weights of THRESHOLD/4 elements (THRESHOLD bytes) and more are left in the file; smaller stay."""
    folder = tmp_path_factory.mktemp("wire")
    path = folder / "model.onnx"
    onnx.save(_model(sizes, data_location_written=written), path)
    light = wire.load_light(path, THRESHOLD)
    left = sorted(t.name for t in light.graph.initializer if uses_external_data(t))
    assert left == sorted(f"w{i}" for i, n in enumerate(sizes) if 4 * n >= THRESHOLD)
    assert light.ByteSize() <= os.path.getsize(path)
    external.check_model_data(light, folder)
    load_external_data_for_model(light, os.fspath(folder))
    assert _normalized(light) == _normalized(onnx.load(path))


def test_a_tensor_in_a_data_file_stays_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    onnx.save(_model([5000, 7000]), path, save_as_external_data=True, location="weights.bin", size_threshold=0)
    light = wire.load_light(path, THRESHOLD)
    assert light == onnx.load(path, load_external_data=False)


def test_files_it_does_not_follow_fail_as_onnx_load_does(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x0b\xff\xff\xff")  # a group's wire type
    with pytest.raises(Exception) as by_onnx:
        onnx.load(garbage)
    with pytest.raises(type(by_onnx.value)):
        wire.load_light(garbage, THRESHOLD)
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    assert wire.load_light(empty) == onnx.load(empty)


def test_generation_from_a_path_reads_the_weights_from_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The artifacts generated from the path of a model with inline weights, read from the file a tensor at a
    time, are those generated from the loaded model: the same checkpoint bytes, the same models."""
    monkeypatch.setattr(wire, "LIGHT_BYTES", THRESHOLD)
    rng = np.random.default_rng(0)
    weights = [("W1", rng.normal(size=(8, 16))), ("b1", rng.normal(size=16)), ("W2", rng.normal(size=(16, 3)))]
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W1"], ["h"]),
            helper.make_node("Add", ["h", "b1"], ["hb"]),
            helper.make_node("Relu", ["hb"], ["a"]),
            helper.make_node("MatMul", ["a", "W2"], ["y"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(w.astype(np.float32), name) for name, w in weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "base.onnx"
    onnx.save(model, path)
    light, _ = load_base_model(path, in_file=True)
    assert {t.name for t in light.graph.initializer if uses_external_data(t)} == {"W1", "b1", "W2"}
    # a model handed to the user never refers to another model's file: by default the weights come inside
    whole, _ = load_base_model(path)
    assert not any(uses_external_data(t) for t in whole.graph.initializer)
    adapted, _ = add_adapters(path, targets=["W1"], rank=2, alpha=4)
    assert not any(uses_external_data(t) for t in adapted.graph.initializer)
    options = {"loss": artifacts.LossType.CrossEntropyLoss, "optimizer": artifacts.OptimType.AdamW}
    by_path = tmp_path / "by_path"
    from_proto = tmp_path / "from_proto"
    artifacts.generate_artifacts(path, requires_grad=["W1", "b1"], artifact_directory=by_path, **options)
    artifacts.generate_artifacts(model, requires_grad=["W1", "b1"], artifact_directory=from_proto, **options)
    assert (by_path / "checkpoint").read_bytes() == (from_proto / "checkpoint").read_bytes()
    for name in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx"):
        # a tensor read from a file says data_location=DEFAULT, as onnx's load_external_data leaves it
        assert _normalized(onnx.load(by_path / name)) == _normalized(onnx.load(from_proto / name)), name
