"""An intermediate value declared at the export's size of a dynamic axis is not believed.

torch's dynamo exporter declares some intermediate values (``value_info``) with
the example's size on an axis exported as dynamic: an ``LSTM``'s output
``[batch, 5, 16]`` for a sequence axis exported at 5. Gradients built on that
declaration held the 5 (the gradient of ``y[:, -1]`` as zeros of 5 rows), and
a train step at another length failed in onnxruntime (``Reshape_57 ... Input
shape:{5,4,16}, requested shape:{7,4,2,8}``). Generation now drops each
declaration that the graph contradicts
(:func:`onnxtrain.graph.declared.correct_declared_shapes`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxtrain import api, artifacts
from onnxtrain.graph.declared import DeclaredShapeWarning, correct_declared_shapes
from tests.helpers import FLOAT, INT64, make_model

W = np.arange(12, dtype=np.float32).reshape(4, 3) / 10


def _last_step_model(declared: list[int | str], inputs: list[int | str] | None = None) -> onnx.ModelProto:
    """``y = (x @ w)[:, -1]`` for ``x: float[N, T, 4]``, the product declared ``float[declared]``."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Gather", ["h", "last"], ["y"], axis=1),
    ]
    last = helper.make_tensor("last", INT64, [], [-1])
    model = make_model({"x": (FLOAT, inputs or ["N", "T", 4])}, nodes, ["y"], initializers=[("w", W), last])
    model.graph.value_info.append(helper.make_tensor_value_info("h", FLOAT, declared))
    return model


@pytest.mark.parametrize(
    ("declared", "inputs", "dropped"),
    [
        (["N", 5, 3], None, ["h"]),  # the example's length on the dynamic axis
        ([7, "T", 3], None, ["h"]),  # the example's batch
        (["N", "T", 3], None, []),
        (["N", "T", 2], None, ["h"]),  # a wrong fixed size
        (["a", "b", 3], None, []),  # names of its own claim nothing
        ([2, 5, 3], [2, 5, 4], []),  # every input size fixed: the one shape the model runs
    ],
)
def test_a_declaration_the_graph_contradicts_is_dropped(
    declared: list[int | str], inputs: list[int | str] | None, dropped: list[str]
) -> None:
    model = _last_step_model(declared, inputs)
    assert correct_declared_shapes(model) == dropped
    assert [value.name for value in model.graph.value_info] == ([] if dropped else ["h"])


def _gradient(paths: dict[str, Path], x: np.ndarray, target: np.ndarray) -> tuple[float, np.ndarray]:
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state, paths["eval_model"])
    loss = float(module(x, target))
    return loss, np.asarray(state.parameters["w"].grad)


@pytest.mark.parametrize("length", [5, 7, 1])
def test_steps_at_another_length_than_the_declared_one_train_exactly(tmp_path: Path, length: int) -> None:
    """The mean squared error of ``(x @ w)[:, -1]``; its gradient ``2 / (N * 3) * x[:, -1]^T (y - t)``."""
    model = _last_step_model(["N", 5, 3])
    paths = artifacts.generate_artifacts(
        model, requires_grad=["w"], loss=artifacts.LossType.MSELoss, artifact_directory=tmp_path
    )
    rng = np.random.default_rng(0)
    x, target = rng.standard_normal((4, length, 4)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    loss, grad = _gradient(paths, x, target)
    y = x[:, -1] @ W
    np.testing.assert_allclose(loss, np.mean((y - target) ** 2), rtol=1e-6)
    np.testing.assert_allclose(grad, 2 / y.size * x[:, -1].T @ (y - target), rtol=1e-5, atol=1e-7)


def test_an_output_declared_at_the_example_length_is_corrected_with_a_warning(tmp_path: Path) -> None:
    """The model's output declared ``[N, 5, 3]`` (the LSTM tagger's logits as torch's dynamo exporter declares
    them): its steps at length 7 failed in the session for fixed shapes (``Mul ... Incompatible dimensions``)."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    model = make_model({"x": (FLOAT, ["N", "T", 4])}, nodes, {"y": (FLOAT, ["N", 5, 3])}, initializers=[("w", W)])
    with pytest.warns(
        DeclaredShapeWarning, match=r"output 'y' .* declared float\[N, 5, 3\].* read as float\[N, T, 3\]"
    ):
        paths = artifacts.generate_artifacts(
            model, requires_grad=["w"], loss=artifacts.LossType.MSELoss, optimizer=artifacts.OptimType.SGD,
            artifact_directory=tmp_path,
        )  # fmt: skip
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state, paths["eval_model"])
    optimizer = api.Optimizer(paths["optimizer_model"], module)
    rng = np.random.default_rng(1)
    for length in (5, 7, 7):  # the fused step's session for fixed shapes at 7
        x = rng.standard_normal((2, length, 4)).astype(np.float32)
        target = rng.standard_normal((2, length, 3)).astype(np.float32)
        expected = np.mean((x @ np.asarray(state.parameters["w"].data) - target) ** 2)
        np.testing.assert_allclose(float(module(x, target)), expected, rtol=1e-5)
        optimizer.step()
        module.lazy_reset_grad()


def test_a_dynamo_exported_lstm_trains_at_another_length_as_torch(tmp_path: Path) -> None:
    """A bidirectional LSTM's last step, exported by torch's default exporter at length 5 with a dynamic
    sequence axis: loss and every gradient at length 7 equal torch's."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")

    class LastStep(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = torch.nn.LSTM(6, 8, batch_first=True, bidirectional=True)
            self.fc = torch.nn.Linear(16, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.rnn(x)[0][:, -1])

    torch.manual_seed(0)
    net = LastStep()
    dims = {"x": {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}}
    exported = torch.onnx.export(
        net, (torch.randn(4, 5, 6),), dynamo=True, optimize=False, input_names=["x"], dynamic_shapes=dims
    )
    path = tmp_path / "lstm.onnx"
    exported.save(str(path))
    names = [name for name, _ in net.named_parameters()]
    paths = artifacts.generate_artifacts(
        str(path), requires_grad=names, loss=artifacts.LossType.CrossEntropyLoss, artifact_directory=tmp_path / "a"
    )
    x = torch.randn(4, 7, 6)
    labels = torch.tensor([0, 1, 2, 0])
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state, paths["eval_model"])
    loss = float(module(x.numpy(), labels.numpy()))
    expected = torch.nn.functional.cross_entropy(net(x), labels)
    expected.backward()
    np.testing.assert_allclose(loss, expected.item(), rtol=1e-5)
    for name, parameter in net.named_parameters():
        np.testing.assert_allclose(
            np.asarray(state.parameters[name].grad), parameter.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=name
        )
