"""Weights stored other than as plain initializers: initializers also listed as graph inputs (IR 3; torch's
``keep_initializers_as_inputs=True``), and weights held in ``Constant`` nodes.

From IR 4 on an initializer listed as an input is a default a caller may
override; the gradients are built for the initializer's value (the rules
fold constants), so the artifacts take each as an initializer only: a
parameter where ``requires_grad`` names it, else a constant, and the training
model's inputs are the user's, then the parameters, as for any model. A
``Constant`` node's value named in ``requires_grad`` becomes an initializer,
trained as one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnxtrain import api, onnxblock
from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
from onnxtrain.graph.io import initializers_not_inputs
from tests.artifacts.models import FROZEN, PARAMETERS, REQUIRES_GRAD, TRAINABLE, dense, flag, run, session
from tests.helpers import FLOAT, MSETraining, export_for_training


def _listed(model: onnx.ModelProto, ir_version: int) -> onnx.ModelProto:
    """``model`` with every initializer also a graph input, at ``ir_version``."""
    listed = onnx.ModelProto()
    listed.CopyFrom(model)
    listed.ir_version = ir_version
    for tensor in model.graph.initializer:
        listed.graph.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    onnx.checker.check_model(listed)
    return listed


def _feeds(training: onnx.ModelProto, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A batch of 5 and the parameters' values for the training model of :func:`dense` with MSE."""
    values = {t.name: numpy_helper.to_array(t) for t in dense().graph.initializer}
    feeds = {
        "x": rng.normal(size=(5, 3)).astype(np.float32),
        "target": rng.uniform(size=(5, 4)).astype(np.float32),
        "lazy_reset_grad": flag(True),
    }
    for name in TRAINABLE:
        feeds[name] = values[name]
        feeds[f"{name}_grad.accumulation.buffer"] = np.full_like(values[name], np.nan)
    return feeds | {name: values[name] for name in FROZEN}


@pytest.mark.parametrize("ir_version", [3, 8])
def test_listed_initializers_give_the_same_inputs_loss_and_every_gradient(tmp_path: Path, ir_version: int) -> None:
    plain, listed = tmp_path / "plain", tmp_path / "listed"
    for model, folder in ((dense(), plain), (_listed(dense(opset=8 if ir_version == 3 else 17), ir_version), listed)):
        generate_artifacts(
            model, requires_grad=REQUIRES_GRAD, frozen_params=FROZEN, loss=LossType.MSELoss, artifact_directory=folder
        )
    expected, got = (onnx.load(folder / "training_model.onnx") for folder in (plain, listed))
    assert [i.name for i in got.graph.input] == [i.name for i in expected.graph.input]
    assert [i.name for i in got.graph.input][:2] == ["x", "target"]
    feeds = _feeds(expected, np.random.default_rng(ir_version))
    want, have = (run(session(folder / "training_model.onnx"), feeds) for folder in (plain, listed))
    assert set(have) == set(want) and len(want) == 1 + len(TRAINABLE)
    for name, value in want.items():  # the loss, then each parameter's gradient
        np.testing.assert_allclose(have[name], value, rtol=1e-6, atol=1e-7, err_msg=name)
    eval_inputs = [i.name for i in onnx.load(listed / "eval_model.onnx").graph.input]
    assert "C" not in eval_inputs and eval_inputs[:2] == ["x", "target"]


def test_an_overridable_exponent_is_the_constant_its_gradient_is_built_for(tmp_path: Path) -> None:
    # y = (x @ W) ** E with E = 3 a default the model lets a caller override: d/dW uses E - 1 = 2, folded
    rng = np.random.default_rng(0)
    w = rng.normal(size=(3, 3)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Pow", ["h", "E"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "pow",
        [helper.make_tensor_value_info("x", FLOAT, ["n", 3]), helper.make_tensor_value_info("E", FLOAT, [])],
        [helper.make_tensor_value_info("y", FLOAT, ["n", 3])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array(3.0, np.float32), "E")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    generate_artifacts(
        model, requires_grad=["W"], loss=LossType.MSELoss, optimizer=OptimType.AdamW, artifact_directory=tmp_path
    )
    state = api.CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    module = api.Module(str(tmp_path / "training_model.onnx"), state, str(tmp_path / "eval_model.onnx"))
    assert module.input_names() == ["x", "target"]
    x = rng.normal(size=(4, 3)).astype(np.float32)
    target = rng.normal(size=(4, 3)).astype(np.float32)
    feeds = {"x": x, "target": target, "W": w, "lazy_reset_grad": flag(True)}
    feeds["W_grad.accumulation.buffer"] = np.zeros_like(w)
    out = run(session(tmp_path / "training_model.onnx"), feeds)
    h = x.astype(np.float64) @ w
    dy = 2.0 * (h**3 - target) / target.size  # d mean((y - t)^2) / dy
    np.testing.assert_allclose(out["W_grad.accumulation.out"], x.T @ (dy * 3.0 * h**2), rtol=1e-4, atol=1e-6)
    loss = module(x, target)
    np.testing.assert_allclose(loss, np.mean((h**3 - target) ** 2), rtol=1e-5)


def test_onnxblock_base_takes_listed_initializers_as_initializers() -> None:
    listed = _listed(dense(), 8)
    with onnxblock.base(listed) as builder:
        assert [i.name for i in builder.model.graph.input] == ["x"]
    assert [i.name for i in listed.graph.input] == ["x", *PARAMETERS]  # the caller's model is not changed


def test_initializers_not_inputs_keeps_other_inputs_and_raises_ir_3() -> None:
    listed = _listed(dense(opset=8), 3)
    assert initializers_not_inputs(listed) == list(PARAMETERS)
    assert [i.name for i in listed.graph.input] == ["x"] and listed.ir_version == 4
    onnx.checker.check_model(listed)
    assert initializers_not_inputs(listed) == []


def test_a_torch_export_keeping_initializers_as_inputs_trains_with_torchs_gradients(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.LayerNorm(7), torch.nn.GELU(), torch.nn.Linear(7, 3))
    dynamic = {"x": {0: "n"}, "y": {0: "n"}}
    model = export_for_training(
        net, (torch.zeros(2, 5),), ["x"], ["y"], opset=17, dynamic_axes=dynamic, keep_initializers_as_inputs=True
    )
    names = [name for name, _ in net.named_parameters()]
    assert {i.name for i in model.graph.input} >= set(names)  # the export lists them as inputs
    generate_artifacts(model, requires_grad=names, loss=LossType.MSELoss, artifact_directory=tmp_path)
    rng = np.random.default_rng(1)
    x, target = (rng.normal(size=shape).astype(np.float32) for shape in ((6, 5), (6, 3)))
    values = {name: p.detach().numpy() for name, p in net.named_parameters()}
    feeds = {"x": x, "target": target, "lazy_reset_grad": flag(True)}
    feeds |= values | {f"{n}_grad.accumulation.buffer": np.zeros_like(v) for n, v in values.items()}
    out = run(session(tmp_path / "training_model.onnx"), feeds)
    loss = torch.nn.functional.mse_loss(net(torch.from_numpy(x)), torch.from_numpy(target))
    loss.backward()
    assert [i.name for i in onnx.load(tmp_path / "training_model.onnx").graph.input][:2] == ["x", "target"]
    np.testing.assert_allclose(next(iter(out.values())), loss.item(), rtol=1e-6)
    for name, p in net.named_parameters():  # every parameter's gradient
        np.testing.assert_allclose(out[f"{name}_grad.accumulation.out"], p.grad.numpy(), rtol=1e-5, atol=1e-6)


def _gemm(in_constant_node: bool) -> onnx.ModelProto:
    """``y = x @ W^T + B``, ``W`` an initializer or a ``Constant`` node's value (as some converters write weights)."""
    rng = np.random.default_rng(3)
    w, b = rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=4).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "W", "B"], ["y"], transB=1)]
    initializers = [numpy_helper.from_array(b, "B")]
    if in_constant_node:
        nodes.insert(0, helper.make_node("Constant", [], ["W"], value=numpy_helper.from_array(w)))
    else:
        initializers.insert(0, numpy_helper.from_array(w, "W"))
    graph = helper.make_graph(
        nodes,
        "gemm",
        [helper.make_tensor_value_info("x", FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("y", FLOAT, ["n", 4])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("path", ["generate_artifacts", "onnxblock"])
def test_a_weight_held_in_a_constant_node_trains_when_named(tmp_path: Path, path: str) -> None:
    trainings = []
    for in_constant_node in (False, True):
        model = _gemm(in_constant_node)
        if path == "generate_artifacts":
            folder = tmp_path / str(in_constant_node)
            generate_artifacts(model, requires_grad=["W", "B"], loss=LossType.MSELoss, artifact_directory=folder)
            trainings.append(onnx.load(folder / "training_model.onnx"))
        else:
            block = MSETraining()
            with onnxblock.base(model):
                block.requires_grad("W")
                block.requires_grad("B")
                block("y")
            trainings.append(block.to_model_proto()[0])
    expected, got = trainings
    assert sorted(i.name for i in got.graph.input) == sorted(i.name for i in expected.graph.input)
    assert not any(node.op_type == "Constant" and node.output[0] == "W" for node in got.graph.node)
    rng = np.random.default_rng(4)
    feeds = {"x": rng.normal(size=(5, 3)).astype(np.float32), "target": rng.normal(size=(5, 4)).astype(np.float32)}
    feeds["lazy_reset_grad"] = flag(True)
    for tensor in _gemm(False).graph.initializer:
        feeds[tensor.name] = numpy_helper.to_array(tensor)
        feeds[f"{tensor.name}_grad.accumulation.buffer"] = np.zeros_like(feeds[tensor.name])
    want, have = (run(session(model), feeds) for model in (expected, got))
    assert len(want) == 3  # the loss and both gradients
    for name, value in want.items():
        np.testing.assert_array_equal(have[name], value, err_msg=name)
