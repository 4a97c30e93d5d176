"""A base model with operators from a custom op library (onnxruntime-extensions) before its trainable layers.

``generate_artifacts(custom_op_library=...)`` checks the models load with the
library; ``Module(..., session_options=...)`` runs them. The gradients flow
from the loss to the parameters without crossing the custom operator, and
equal the closed form; a parameter behind a custom operator is refused
naming it; a module without the library says how to register it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxtrain import api, artifacts
from onnxtrain.autodiff import MissingGradientError

ortx = pytest.importorskip("onnxruntime_extensions", reason="onnxruntime-extensions is a test dependency")

CONTRIB = "ai.onnx.contrib"
W0 = np.array([[0.5, -0.25, 0.125]], np.float32)
B0 = np.array([0.1, 0.0, -0.1], np.float32)


def _string_length_model() -> onnx.ModelProto:
    """``y = StringLength(text)[:, None] @ W + b``: the custom operator reads the input, not a parameter."""
    graph = helper.make_graph(
        [
            helper.make_node("StringLength", ["text"], ["length"], domain=CONTRIB),
            helper.make_node("Cast", ["length"], ["length_f"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["length_f", "axes"], ["x"]),
            helper.make_node("MatMul", ["x", "W"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["y"]),
        ],
        "string_length_linear",
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["N"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [
            numpy_helper.from_array(W0, "W"),
            numpy_helper.from_array(B0, "b"),
            numpy_helper.from_array(np.array([1], np.int64), "axes"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(CONTRIB, 1)])


def _options() -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.register_custom_ops_library(ortx.get_library_path())
    return options


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("custom_ops")
    artifacts.generate_artifacts(
        _string_length_model(),
        requires_grad=["W", "b"],
        loss=artifacts.LossType.MSELoss,
        optimizer=artifacts.OptimType.SGD,
        artifact_directory=out,
        custom_op_library=ortx.get_library_path(),
    )
    return out


def test_a_model_with_custom_ops_trains_with_the_exact_gradients(generated, tmp_path):
    state = api.CheckpointState.load_checkpoint(generated / "checkpoint")
    module = api.Module(
        generated / "training_model.onnx", state, generated / "eval_model.onnx", session_options=_options()
    )
    optimizer = api.Optimizer(generated / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(0.01)
    text = np.array(["ab", "hello", "x", "onnx"])  # a <U5 array, as a user has it
    target = np.array([[1.0, 0.0, 2.0], [0.5, 1.0, 0.0], [0.0, 0.0, 1.0], [2.0, -1.0, 0.5]], np.float32)
    x = np.array([[2.0], [5.0], [1.0], [4.0]])
    weight, bias = W0.astype(np.float64), B0.astype(np.float64)
    for step in range(3):
        loss = module(text, target)
        residual = x @ weight + bias - target
        np.testing.assert_allclose(loss, np.mean(residual**2), rtol=1e-6, err_msg=f"loss, step {step}")
        upstream = 2 * residual / residual.size
        np.testing.assert_allclose(state.parameters["W"].grad, x.T @ upstream, rtol=1e-5, err_msg=f"W, step {step}")
        np.testing.assert_allclose(state.parameters["b"].grad, upstream.sum(0), rtol=1e-5, err_msg=f"b, step {step}")
        optimizer.step()
        module.lazy_reset_grad()
        weight, bias = weight - 0.01 * x.T @ upstream, bias - 0.01 * upstream.sum(0)
    np.testing.assert_allclose(state.parameters["W"].data, weight, rtol=1e-5)
    np.testing.assert_allclose(state.parameters["b"].data, bias, rtol=1e-5)
    module.eval()
    np.testing.assert_allclose(module(text, target), np.mean((x @ weight + bias - target) ** 2), rtol=1e-5)
    module.export_model_for_inferencing(tmp_path / "inference.onnx", ["y"])
    session = ort.InferenceSession(tmp_path / "inference.onnx", _options(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"text": text.astype(object)})[0], x @ weight + bias, rtol=1e-5)


def test_without_the_library_the_error_says_how_to_register_it(generated):
    state = api.CheckpointState.load_checkpoint(generated / "checkpoint")
    with pytest.raises(ValueError, match=r"domain\(s\) \['ai\.onnx\.contrib'\]: register the library") as raised:
        api.Module(generated / "training_model.onnx", state)
    assert "session_options=options" in str(raised.value)


def test_a_parameter_behind_a_custom_operator_is_refused_naming_it(tmp_path):
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "W"], ["xw"]),
            helper.make_node("Inverse", ["xw"], ["y"], domain=CONTRIB),
        ],
        "inverse",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
        [numpy_helper.from_array(np.eye(2, dtype=np.float32), "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(CONTRIB, 1)])
    with pytest.raises(
        MissingGradientError, match=r"no gradient rule for operator Inverse \(domain 'ai\.onnx\.contrib'"
    ):
        artifacts.generate_artifacts(
            model,
            requires_grad=["W"],
            loss=artifacts.LossType.MSELoss,
            artifact_directory=tmp_path / "out",
            custom_op_library=ortx.get_library_path(),
        )
    assert not (tmp_path / "out").exists()


def test_onnxruntime_trainings_own_artifacts_are_told_to_be_generated_again(tmp_path):
    """A training model with ONNX Runtime training's kernels (``com.microsoft`` ``...Grad``, as its
    ``generate_artifacts`` writes them): the error says to generate the artifacts again with onnxtrain."""
    from tests.training import models

    paths = models.generate(tmp_path, models.mlp((3, 4, 2), seed=0), requires_grad=["fc0.weight"], loss="MSELoss")
    training = onnx.load(paths["training_model"])
    first = training.graph.node[0].output[0]
    training.graph.node.append(helper.make_node("ReluGrad", [first, first], ["relu_grad"], domain="com.microsoft"))
    training.graph.output.append(helper.make_tensor_value_info("relu_grad", TensorProto.FLOAT, None))
    training.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    with pytest.raises(ValueError, match=r"ONNX Runtime's training build \(com\.microsoft \['ReluGrad'\]\)") as error:
        api.Module(training, state)
    assert "Generate them again from the forward model with onnxtrain.artifacts.generate_artifacts" in str(error.value)
