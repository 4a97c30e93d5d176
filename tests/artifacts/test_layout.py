"""Golden tests of the artifacts' files, inputs and outputs (docs/artifacts.md, "Artifacts layout")."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from onnxtrain import artifacts, checkpoint, optim
from onnxtrain.artifacts import LossType, OptimType
from onnxtrain.artifacts.generate import INITIAL_STATE_KEY, OPTIMIZER_KEY
from tests.artifacts.models import (
    BOOL,
    CONSTANT,
    FLOAT,
    FROZEN,
    INT64,
    REQUIRES_GRAD,
    batchnorm,
    dense,
    dense_values,
    flag,
    load,
    names,
    run,
    session,
    signature,
)
from tests.folders import leftovers, visible_files, visible_names
from tests.helpers import make_model

X = ("x", FLOAT, ("batch", 3))
W, S, B = ("W", FLOAT, (3, 4)), ("S", FLOAT, (4,)), ("B", FLOAT, (4,))
BUFFERS = [("W_grad.accumulation.buffer", FLOAT, (3, 4)), ("B_grad.accumulation.buffer", FLOAT, (4,))]
LAZY = ("lazy_reset_grad", BOOL, (1,))
ACCUMULATED = [("W_grad.accumulation.out", FLOAT, (3, 4)), ("B_grad.accumulation.out", FLOAT, (4,))]

#: The target (labels) input each built-in loss adds, for ``y: float[batch, 4]``.
TARGETS = {
    LossType.MSELoss: ("target", FLOAT, ("batch", 4)),
    LossType.CrossEntropyLoss: ("labels", INT64, ("batch",)),
    LossType.BCEWithLogitsLoss: ("target", FLOAT, ("batch", 4)),
    LossType.L1Loss: ("target", FLOAT, ("batch", 4)),
    LossType.HuberLoss: ("target", FLOAT, ("batch", 4)),
    LossType.SmoothL1Loss: ("target", FLOAT, ("batch", 4)),
    LossType.NLLLoss: ("target", INT64, ("batch",)),
    LossType.BCELoss: ("target", FLOAT, ("batch", 4)),
    LossType.KLDivLoss: ("target", FLOAT, ("batch", 4)),
}

#: State tensors per parameter of each built-in optimizer (default hyper-parameters).
STATES = {OptimType.AdamW: 2, OptimType.SGD: 0, OptimType.Adam: 2, OptimType.Adagrad: 1, OptimType.RMSprop: 1}


def test_the_tables_cover_every_member():
    assert set(TARGETS) == set(LossType)
    assert set(STATES) == set(OptimType)


def _loss_output(model: onnx.ModelProto) -> tuple[str, int, tuple]:
    name, elem_type, dims = signature(model.graph.output)[0]
    return name, elem_type, dims


@pytest.mark.parametrize("loss", list(LossType), ids=lambda loss: loss.name)
def test_training_and_eval_models_for_each_loss(tmp_path: Path, loss: LossType):
    paths = artifacts.generate_artifacts(
        dense(), requires_grad=REQUIRES_GRAD, frozen_params=FROZEN, loss=loss, artifact_directory=tmp_path
    )
    assert sorted(paths) == ["checkpoint", "eval_model", "training_model"]
    assert visible_names(tmp_path) == ["checkpoint", "eval_model.onnx", "training_model.onnx"]
    training, eval_model = load(paths["training_model"]), load(paths["eval_model"])
    target = TARGETS[loss]

    # user inputs (the loss's target added), every parameter in initializer order, buffers, flag
    assert signature(training.graph.input) == [X, target, W, S, B, *BUFFERS, LAZY]
    loss_name, loss_type, loss_dims = _loss_output(training)
    assert (loss_type, loss_dims) == (FLOAT, ())
    assert signature(training.graph.output) == [(loss_name, FLOAT, ()), *ACCUMULATED]
    assert signature(eval_model.graph.input) == [X, target, W, S, B]
    assert signature(eval_model.graph.output) == [(loss_name, FLOAT, ())]
    # parameters are inputs, not initializers; the other initializer stays a constant
    for model in (training, eval_model):
        assert [t.name for t in model.graph.initializer if t.name in "WSBC"] == [CONSTANT]

    state = checkpoint.load(paths["checkpoint"])
    values = dense_values()
    assert not state.is_nominal and state.optimizer is None and not state.properties
    assert sorted(state.trainable) == ["B", "W"] and list(state.frozen) == ["S"]
    for name, array in state.parameters.items():
        np.testing.assert_array_equal(array, values[name])


@pytest.mark.parametrize("optimizer", list(OptimType), ids=lambda o: o.name)
def test_optimizer_model_for_each_optimizer(tmp_path: Path, optimizer: OptimType):
    paths = artifacts.generate_artifacts(
        dense(), REQUIRES_GRAD, FROZEN, loss=LossType.MSELoss, optimizer=optimizer, artifact_directory=tmp_path
    )
    assert sorted(paths) == ["checkpoint", "eval_model", "optimizer_model", "training_model"]
    model = load(paths["optimizer_model"])
    k = STATES[optimizer]
    expected_inputs = [("learning_rate", FLOAT, (1,)), ("step", INT64, (1,))]
    expected_outputs = []
    for name, shape in (("W", (3, 4)), ("B", (4,))):  # trainable parameters, initializer order
        expected_inputs += [(name, FLOAT, shape), (f"{name}_grad", FLOAT, shape)]
        expected_inputs += [(f"{name}.momentum{i}", FLOAT, shape) for i in range(k)]
        expected_outputs += [(f"{name}.updated", FLOAT, shape)]
        expected_outputs += [(f"{name}.momentum{i}.updated", FLOAT, shape) for i in range(k)]
    assert signature(model.graph.input) == expected_inputs
    assert signature(model.graph.output) == expected_outputs
    meta = {entry.key: entry.value for entry in model.metadata_props}
    block = getattr(optim, optimizer.name)()
    assert meta[OPTIMIZER_KEY] == repr(block)
    assert json.loads(meta[INITIAL_STATE_KEY]) == [spec.initial_value for spec in block.state_specs()]
    assert len(json.loads(meta[INITIAL_STATE_KEY])) == k
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]  # the base model's opset


@pytest.mark.parametrize("optimizer", ["AdamW", "SGD"])
def test_optimizer_by_name_and_by_object(tmp_path: Path, optimizer: str):
    by_name = artifacts.generate_artifacts(
        dense(), REQUIRES_GRAD, loss="MSELoss", optimizer=optimizer, artifact_directory=tmp_path / "a"
    )
    block = getattr(optim, optimizer)(weight_decay=0.5)
    by_object = artifacts.generate_artifacts(
        dense(), REQUIRES_GRAD, loss="MSELoss", optimizer=block, artifact_directory=tmp_path / "b"
    )
    named, custom = load(by_name["optimizer_model"]), load(by_object["optimizer_model"])
    assert signature(named.graph.input) == signature(custom.graph.input)
    meta = {entry.key: entry.value for entry in custom.metadata_props}
    assert meta[OPTIMIZER_KEY] == repr(block) and "weight_decay=0.5" in meta[OPTIMIZER_KEY]


def test_initial_state_metadata_and_momentum_from_the_optimizer_object(tmp_path: Path):
    block = optim.Adagrad(initial_accumulator_value=0.25, clip_grad=optim.ClipGradNorm(1.0))
    paths = artifacts.generate_artifacts(
        dense(), REQUIRES_GRAD, loss="MSELoss", optimizer=block, artifact_directory=tmp_path / "adagrad"
    )
    meta = {entry.key: entry.value for entry in load(paths["optimizer_model"]).metadata_props}
    assert json.loads(meta[INITIAL_STATE_KEY]) == [0.25]
    assert "initial_accumulator_value=0.25" in meta[OPTIMIZER_KEY] and "ClipGradNorm" in meta[OPTIMIZER_KEY]
    paths = artifacts.generate_artifacts(
        dense(), REQUIRES_GRAD, loss="MSELoss", optimizer=optim.SGD(momentum=0.9), artifact_directory=tmp_path / "sgd"
    )
    model = load(paths["optimizer_model"])  # SGD with momentum: one state per parameter
    assert names(model.graph.input) == ["learning_rate", "step", "W", "W_grad", "W.momentum0",
                                        "B", "B_grad", "B.momentum0"]  # fmt: skip
    assert json.loads({e.key: e.value for e in model.metadata_props}[INITIAL_STATE_KEY]) == [0.0]


def _model_with_loss_output() -> onnx.ModelProto:
    """``dense`` with a first output ``loss = ReduceSum(y * y)`` (scalar), then ``y``."""
    model = dense()
    model.graph.node.extend([
        helper.make_node("Mul", ["y", "y"], ["y2"]),
        helper.make_node("ReduceSum", ["y2"], ["loss"], keepdims=0),
    ])  # fmt: skip
    outputs = [helper.make_tensor_value_info("loss", FLOAT, []), *model.graph.output]
    del model.graph.output[:]
    model.graph.output.extend(outputs)
    return model


def test_loss_none_takes_the_first_output_as_the_loss(tmp_path: Path):
    """The model's other outputs follow the loss, as ONNX Runtime's artifacts keep every output of the loss
    block (its ``PassThrough`` over all the model's outputs)."""
    paths = artifacts.generate_artifacts(_model_with_loss_output(), REQUIRES_GRAD, FROZEN, artifact_directory=tmp_path)
    training, eval_model = load(paths["training_model"]), load(paths["eval_model"])
    assert signature(training.graph.input) == [X, W, S, B, *BUFFERS, LAZY]  # no target input
    assert signature(training.graph.output) == [("loss", FLOAT, ()), ("y", FLOAT, ("batch", 4)), *ACCUMULATED]
    assert signature(eval_model.graph.input) == [X, W, S, B]
    assert signature(eval_model.graph.output) == [("loss", FLOAT, ()), ("y", FLOAT, ("batch", 4))]
    x = np.random.default_rng(3).normal(size=(5, 3)).astype(np.float32)
    params = {k: v for k, v in dense_values().items() if k != CONSTANT}
    y = 1 / (1 + np.exp(-((x @ params["W"]) * params["S"] + params["B"] + dense_values()["C"])))
    out = run(session(eval_model), {"x": x, **params})
    np.testing.assert_allclose(out["loss"], np.sum(y * y), rtol=1e-5)


def test_loss_input_names_and_additional_output_names(tmp_path: Path):
    model = dense()
    model.graph.output.append(helper.make_tensor_value_info("h", FLOAT, ["batch", 4]))  # outputs: y, h
    paths = artifacts.generate_artifacts(
        model,
        REQUIRES_GRAD,
        FROZEN,
        loss=LossType.L1Loss,
        loss_input_names=["h"],  # the loss on h only
        additional_output_names=["y", "xw"],  # a graph output and an intermediate value
        artifact_directory=tmp_path,
    )
    training, eval_model = load(paths["training_model"]), load(paths["eval_model"])
    target = ("target", FLOAT, ("batch", 4))
    loss_name = names(training.graph.output)[0]
    assert signature(training.graph.input) == [X, target, W, S, B, *BUFFERS, LAZY]
    extra = [("y", FLOAT, ("batch", 4)), ("xw", FLOAT, ("batch", 4))]
    assert signature(training.graph.output) == [(loss_name, FLOAT, ()), *extra, *ACCUMULATED]
    assert signature(eval_model.graph.output) == [(loss_name, FLOAT, ()), *extra]

    rng = np.random.default_rng(4)
    values = dense_values()
    x = rng.normal(size=(2, 3)).astype(np.float32)
    t = rng.normal(size=(2, 4)).astype(np.float32)
    xw = x @ values["W"]
    h = xw * values["S"] + values["B"] + values["C"]
    params = {k: values[k] for k in "WSB"}
    feeds = {"x": x, "target": t, **params}
    for out in (
        run(session(eval_model), feeds),
        run(session(training), {**feeds, **{f"{p}_grad.accumulation.buffer": 0 * values[p] for p in "WB"},
                                "lazy_reset_grad": flag(True)}),
    ):  # fmt: skip
        np.testing.assert_allclose(out[loss_name], np.mean(np.abs(h - t)), rtol=1e-5)
        np.testing.assert_allclose(out["y"], 1 / (1 + np.exp(-h)), rtol=1e-5)
        np.testing.assert_allclose(out["xw"], xw, rtol=1e-5)


def test_batchnorm_running_statistics_come_last(tmp_path: Path):
    paths = artifacts.generate_artifacts(
        batchnorm(), ["scale", "bias"], ["mean", "var"], loss="MSELoss", artifact_directory=tmp_path
    )
    training, eval_model = load(paths["training_model"]), load(paths["eval_model"])
    x, t = ("x", FLOAT, ("batch", 2, 3)), ("target", FLOAT, ("batch", 2, 3))
    params = [(name, FLOAT, (2,)) for name in ("scale", "bias", "mean", "var")]
    loss_name = names(training.graph.output)[0]
    assert signature(training.graph.input) == [
        x, t, *params,
        ("scale_grad.accumulation.buffer", FLOAT, (2,)), ("bias_grad.accumulation.buffer", FLOAT, (2,)), LAZY,
    ]  # fmt: skip
    assert signature(training.graph.output) == [
        (loss_name, FLOAT, ()),
        ("scale_grad.accumulation.out", FLOAT, (2,)), ("bias_grad.accumulation.out", FLOAT, (2,)),
        ("mean.updated", FLOAT, (2,)), ("var.updated", FLOAT, (2,)),
    ]  # fmt: skip
    assert signature(eval_model.graph.input) == [x, t, *params]
    assert signature(eval_model.graph.output) == [(loss_name, FLOAT, ())]
    (bn,) = [node for node in eval_model.graph.node if node.op_type == "BatchNormalization"]
    assert len(bn.output) == 1
    assert all(a.i == 0 for a in bn.attribute if a.name == "training_mode")

    # the updated statistics are torch's: momentum 0.9 keeps 90% of the old value
    rng = np.random.default_rng(5)
    xv = rng.normal(size=(4, 2, 3)).astype(np.float32)
    init = {t.name: onnx.numpy_helper.to_array(t) for t in batchnorm().graph.initializer}
    feeds = {"x": xv, "target": xv, **init, "lazy_reset_grad": flag(True)}
    feeds |= {f"{p}_grad.accumulation.buffer": np.zeros(2, np.float32) for p in ("scale", "bias")}
    out = run(session(training), feeds)
    np.testing.assert_allclose(out["mean.updated"], 0.9 * init["mean"] + 0.1 * xv.mean(axis=(0, 2)), rtol=1e-5)


def test_prefix_names_every_file(tmp_path: Path):
    paths = artifacts.generate_artifacts(
        dense(), REQUIRES_GRAD, FROZEN, loss="MSELoss", optimizer="AdamW", artifact_directory=tmp_path,
        prefix="run1.", nominal_checkpoint=True,
    )  # fmt: skip
    expected = {
        "training_model": "run1.training_model.onnx",
        "eval_model": "run1.eval_model.onnx",
        "optimizer_model": "run1.optimizer_model.onnx",
        "checkpoint": "run1.checkpoint",
        "nominal_checkpoint": "run1.nominal_checkpoint",
    }
    assert {key: path.name for key, path in paths.items()} == expected
    assert all(path.parent == tmp_path for path in paths.values())
    assert visible_names(tmp_path) == sorted(expected.values())


def test_nominal_checkpoint(tmp_path: Path):
    paths = artifacts.generate_artifacts(
        dense(), REQUIRES_GRAD, FROZEN, loss="MSELoss", artifact_directory=tmp_path, nominal_checkpoint=True
    )
    full, nominal = checkpoint.load(paths["checkpoint"]), checkpoint.load(paths["nominal_checkpoint"])
    assert not full.is_nominal and nominal.is_nominal
    assert nominal == full.nominal()
    for name, array in full.parameters.items():
        assert (nominal.parameters[name].dtype, nominal.parameters[name].shape) == (array.dtype, array.shape)
    assert paths["nominal_checkpoint"].stat().st_size < paths["checkpoint"].stat().st_size


def test_ort_format(tmp_path: Path):
    paths = artifacts.generate_artifacts(
        dense(), REQUIRES_GRAD, FROZEN, loss="MSELoss", optimizer="AdamW", artifact_directory=tmp_path, ort_format=True
    )
    models = ("training_model", "eval_model", "optimizer_model")
    for name in models:
        ort_path = paths[f"{name}_ort"]
        assert ort_path == tmp_path / f"{name}.ort" and ort_path.is_file()
        assert paths[name] == tmp_path / f"{name}.onnx" and paths[name].is_file()  # the .onnx stays too
    expected = {f"{name}.onnx" for name in models} | {f"{name}.ort" for name in models} | {"checkpoint"}
    assert set(visible_names(tmp_path)) == expected
    assert leftovers(tmp_path) == []  # no converter leftovers (config files, folders)
    assert sorted(os.listdir(tmp_path / os.readlink(tmp_path / ".onnxtrain.artifacts.current"))) == sorted(expected)

    # the .ort models load and compute what the .onnx models compute
    rng = np.random.default_rng(6)
    values = dense_values()
    feeds = {"x": rng.normal(size=(3, 3)).astype(np.float32), "target": rng.normal(size=(3, 4)).astype(np.float32)}
    feeds |= {k: values[k] for k in "WSB"}
    for name, extra in (("eval_model", {}), ("training_model", {
        "W_grad.accumulation.buffer": np.ones((3, 4), np.float32), "B_grad.accumulation.buffer": np.ones(4, np.float32),
        "lazy_reset_grad": flag(False)})):  # fmt: skip
        from_ort = run(session(paths[f"{name}_ort"]), {**feeds, **extra})
        from_onnx = run(session(paths[name]), {**feeds, **extra})
        assert list(from_ort) == list(from_onnx)
        for key in from_onnx:
            np.testing.assert_allclose(from_ort[key], from_onnx[key], rtol=1e-6, atol=1e-7)
    assert [o.name for o in session(paths["optimizer_model_ort"]).get_outputs()] == names(
        load(paths["optimizer_model"]).graph.output
    )
    # the training API trains the .onnx beside it, and says so to a caller given the .ort (onnx cannot parse it)
    from onnxtrain import api

    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    with pytest.raises(ValueError, match=r"is in ONNX Runtime's ORT format .* pass 'training_model\.onnx'"):
        api.Module(paths["training_model_ort"], state)


def _save_with_external_data(model: onnx.ModelProto, folder: Path) -> Path:
    folder.mkdir()
    path = folder / "model.onnx"
    onnx.save_model(model, path, save_as_external_data=True, location="weights.bin", size_threshold=0)
    return path


def _tree(folder: Path) -> dict[str, bytes]:
    """What a reader sees in ``folder``; the hidden version folders have random names."""
    assert leftovers(folder) == []
    return visible_files(folder)


def test_model_as_a_path_with_external_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    source = _save_with_external_data(dense(), tmp_path / "source")
    stored = onnx.load(source, load_external_data=False)
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in stored.graph.initializer)
    before = _tree(source.parent)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)

    paths = artifacts.generate_artifacts(
        str(source), REQUIRES_GRAD, FROZEN, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path / "out"
    )
    assert os.listdir(cwd) == []  # nothing written to the working directory
    assert _tree(source.parent) == before  # nor beside the base model
    state = checkpoint.load(paths["checkpoint"])
    values = dense_values()
    assert sorted(state.parameters) == ["B", "S", "W"]
    for name, array in state.parameters.items():
        np.testing.assert_array_equal(array, values[name])

    # the constant C, external in the base model, is inside the artifacts: they run from anywhere
    expected = artifacts.generate_artifacts(dense(), REQUIRES_GRAD, FROZEN, loss="MSELoss", artifact_directory=cwd)
    for name in ("training_model", "eval_model"):
        model = onnx.load(paths[name], load_external_data=False)
        assert all(t.data_location == onnx.TensorProto.DEFAULT for t in model.graph.initializer)
        assert onnx.printer.to_text(model) == onnx.printer.to_text(load(expected[name]))  # values included
    assert visible_names(tmp_path / "out") == sorted(p.name for p in paths.values())


def test_a_path_object_and_a_str_give_the_same_artifacts(tmp_path: Path):
    source = tmp_path / "model.onnx"
    onnx.save_model(dense(), source)
    a = artifacts.generate_artifacts(source, REQUIRES_GRAD, FROZEN, loss="MSELoss", artifact_directory=tmp_path / "a")
    b = artifacts.generate_artifacts(
        str(source), REQUIRES_GRAD, FROZEN, loss="MSELoss", artifact_directory=tmp_path / "b"
    )
    assert _tree(tmp_path / "a") == _tree(tmp_path / "b")
    assert sorted(a) == sorted(b)


def test_models_over_the_protobuf_limit_keep_their_tensors_beside_them(tmp_path: Path, monkeypatch):
    monkeypatch.setattr("onnxtrain.artifacts.generate.PROTOBUF_LIMIT", 0)  # every model counts as "over 2 GB"
    rng = np.random.default_rng(8)
    bias, kernel = rng.normal(size=4).astype(np.float32), rng.normal(size=(4, 300)).astype(np.float32)
    model = make_model(
        {"x": (FLOAT, ["batch", 4])},
        [helper.make_node("Add", ["x", "B"], ["xb"]), helper.make_node("MatMul", ["xb", "K"], ["y"])],
        {"y": (FLOAT, ["batch", 300])},
        [("B", bias), ("K", kernel)],  # K (4800 bytes, a constant) goes to the data files
    )
    paths = artifacts.generate_artifacts(model, ["B"], loss="MSELoss", artifact_directory=tmp_path)
    version = os.readlink(tmp_path / ".onnxtrain.artifacts.current")
    for name in ("training_model", "eval_model"):
        # inside the set's version folder, where the model (opened from the artifact directory) refers to it
        assert paths[f"{name}_data"] == tmp_path / version / f"{name}.onnx.data"
        assert paths[f"{name}_data"].stat().st_size >= kernel.nbytes
        loaded = onnx.load(paths[name])  # onnx's own loader accepts the location (no symlink on the data's path)
        np.testing.assert_array_equal(numpy_helper.to_array(next(t for t in loaded.graph.initializer if t.name == "K")),
                                      kernel)  # fmt: skip
    assert visible_names(tmp_path) == ["checkpoint", "eval_model.onnx", "training_model.onnx"]
    x, target = np.ones((2, 4), np.float32), np.zeros((2, 300), np.float32)
    out = run(session(paths["eval_model"]), {"x": x, "target": target, "B": bias})
    np.testing.assert_allclose(next(iter(out.values())), np.mean(((x + bias) @ kernel) ** 2), rtol=1e-5)


def test_artifact_directory_is_created(tmp_path: Path):
    target = tmp_path / "a" / "b" / "c"
    paths = artifacts.generate_artifacts(dense(), REQUIRES_GRAD, FROZEN, loss="MSELoss", artifact_directory=target)
    assert target.is_dir()
    assert visible_names(target) == ["checkpoint", "eval_model.onnx", "training_model.onnx"]
    assert all(path.parent == target for path in paths.values())


def test_default_directory_is_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    paths = artifacts.generate_artifacts(dense(), REQUIRES_GRAD, FROZEN, loss="MSELoss", optimizer="AdamW")
    assert visible_names(tmp_path) == ["checkpoint", "eval_model.onnx", "optimizer_model.onnx",
                                            "training_model.onnx"]  # fmt: skip
    assert all(path.parent.resolve() == tmp_path.resolve() for path in paths.values())


def test_the_callers_model_is_not_changed_and_builds_are_deterministic(tmp_path: Path):
    model = dense()
    before = model.SerializeToString()
    kwargs = {"requires_grad": REQUIRES_GRAD, "frozen_params": FROZEN, "loss": "CrossEntropyLoss",
              "optimizer": "AdamW", "nominal_checkpoint": True}  # fmt: skip
    artifacts.generate_artifacts(model, artifact_directory=tmp_path / "a", **kwargs)
    artifacts.generate_artifacts(model, artifact_directory=tmp_path / "b", **kwargs)
    assert model.SerializeToString() == before
    assert _tree(tmp_path / "a") == _tree(tmp_path / "b")  # same names, same bytes


def test_no_trainable_parameter(tmp_path: Path):
    paths = artifacts.generate_artifacts(dense(), frozen_params=["W"], loss="MSELoss", artifact_directory=tmp_path)
    training = load(paths["training_model"])
    loss_name = names(training.graph.output)[0]
    assert signature(training.graph.input) == [X, ("target", FLOAT, ("batch", 4)), W, LAZY]
    assert signature(training.graph.output) == [(loss_name, FLOAT, ())]
    state = checkpoint.load(paths["checkpoint"])
    assert list(state.trainable) == [] and list(state.frozen) == ["W"]


# ---------------------------------------------------------------- property: parameter order

_SHAPES = {"p0": (4,), "p1": (), "p2": (1, 4), "p3": (4,), "p4": ()}


def _chain(order: list[str]) -> onnx.ModelProto:
    """``y = ((((x + p0) * p1) + p2) * p3) + p4`` with the initializers stored in ``order``."""
    rng = np.random.default_rng(7)
    nodes, current = [], "x"
    for k, name in enumerate(sorted(_SHAPES)):
        nodes.append(helper.make_node("Add" if k % 2 == 0 else "Mul", [current, name], [f"v{k}"]))
        current = f"v{k}"
    initializers = [(name, rng.normal(size=_SHAPES[name]).astype(np.float32)) for name in order]
    return make_model({"x": (FLOAT, ["n", 4])}, nodes, {current: (FLOAT, ["n", 4])}, initializers)


@settings(max_examples=20)
@given(
    order=st.permutations(sorted(_SHAPES)),
    roles=st.lists(st.sampled_from(["trainable", "frozen", "constant"]), min_size=5, max_size=5),
    listed=st.randoms(use_true_random=False),
)
def test_inputs_follow_initializer_order_whatever_the_lists_say(tmp_path_factory, order, roles, listed):
    role = dict(zip(sorted(_SHAPES), roles, strict=True))
    requires = [n for n in sorted(_SHAPES) if role[n] == "trainable"]
    frozen = [n for n in sorted(_SHAPES) if role[n] == "frozen"]
    listed.shuffle(requires)
    listed.shuffle(frozen)
    folder = tmp_path_factory.mktemp("chain")
    paths = artifacts.generate_artifacts(
        _chain(order), requires, frozen, loss="MSELoss", optimizer="AdamW" if requires else None,
        artifact_directory=folder,
    )  # fmt: skip
    params = [n for n in order if role[n] != "constant"]
    trainable = [n for n in order if role[n] == "trainable"]
    training, eval_model = load(paths["training_model"]), load(paths["eval_model"])
    assert names(training.graph.input) == [
        "x", "target", *params, *(f"{n}_grad.accumulation.buffer" for n in trainable), "lazy_reset_grad"
    ]  # fmt: skip
    assert names(training.graph.output)[1:] == [f"{n}_grad.accumulation.out" for n in trainable]
    assert names(eval_model.graph.input) == ["x", "target", *params]
    for model in (training, eval_model):
        assert sorted(t.name for t in model.graph.initializer if t.name in _SHAPES) == sorted(
            n for n in order if role[n] == "constant"
        )
    sig = dict((name, dims) for name, _, dims in signature(training.graph.input))
    assert all(sig[f"{n}_grad.accumulation.buffer"] == _SHAPES[n] for n in trainable)
    state = checkpoint.load(paths["checkpoint"])
    assert sorted(state.trainable) == sorted(trainable) and sorted(state.frozen) == sorted(frozen)
    if requires:
        optimizer = load(paths["optimizer_model"])
        assert [n for n in names(optimizer.graph.input) if n in _SHAPES] == trainable
    else:
        assert "optimizer_model" not in paths
