"""What converters other than torch's leave in a model, said before it is trained: tf2onnx's merged parameters
and unconverted TensorFlow operations, skl2onnx's ai.onnx.ml operators. The models are built by hand (no
TensorFlow, no scikit-learn), named and shaped as the converters write them."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxtrain import artifacts
from onnxtrain.artifacts.exported_parameters import Tf2onnxExportWarning
from onnxtrain.graph.converted import check_known_operators, unknown_operators
from tests.helpers import FLOAT, INT64, make_model


def _two_layer_norms(scopes: tuple[str, str], producer: str = "tf2onnx") -> onnx.ModelProto:
    """Two layer normalizations, decomposed as tf2onnx writes Keras' (``x * gamma`` after the standardization is
    left out), whose scales, all ones in a fresh model, its ``merge_duplication`` stored once: one initializer
    ``gamma`` read by a ``mul`` node in each of ``scopes``."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"], name="functional_1/fc1_1/MatMul"),
        helper.make_node("Mul", ["h1", "gamma"], ["n1"], name=f"{scopes[0]}/mul"),
        helper.make_node("MatMul", ["n1", "w2"], ["h2"], name="functional_1/fc2_1/MatMul"),
        helper.make_node("Mul", ["h2", "gamma"], ["y"], name=f"{scopes[1]}/mul"),
    ]
    rng = np.random.default_rng(0)
    initializers = [
        ("w1", rng.normal(size=(4, 4)).astype(np.float32)),
        ("w2", rng.normal(size=(4, 4)).astype(np.float32)),
        ("gamma", np.ones(4, np.float32)),
    ]
    model = make_model({"x": (FLOAT, ["N", 4])}, nodes, {"y": (FLOAT, ["N", 4])}, initializers)
    model.producer_name = producer
    return model


def test_a_tf2onnx_parameter_read_by_two_layers_is_said_to_train_as_one():
    """tf2onnx's ``merge_duplication`` (on by default) stores the two LayerNormalization scales of a fresh Keras
    model, all ones, as one initializer: it trained tied, on the sum of both layers' gradients, without a word."""
    model = _two_layer_norms(("functional_1/ln1_1", "functional_1/ln2_1"))
    assert artifacts.trainable_parameters(model) == ["w1", "w2", "gamma"]
    with pytest.warns(Tf2onnxExportWarning, match=r"gamma \(read by functional_1/ln1_1, functional_1/ln2_1\)") as got:
        artifacts.build_artifacts(model, requires_grad=["w1", "w2", "gamma"], loss="MSELoss", optimizer="SGD")
    message = str(got[0].message)
    assert "one tensor" in message and "from_keras(..., optimizers=" in message and "'merge_duplication'" in message


@pytest.mark.parametrize(
    ("scopes", "producer", "trained"),
    [
        (("functional_1/ln1_1", "functional_1/ln1_1/moments"), "tf2onnx", ["gamma"]),  # one layer, a sub-scope
        (("functional_1/ln1_1", "functional_1/ln2_1"), "tf2onnx", ["w1"]),  # the shared tensor is not trained
        (("functional_1/ln1_1", "functional_1/ln2_1"), "skl2onnx", ["gamma"]),  # not tf2onnx's
    ],
    ids=["one layer", "not trained", "another converter"],
)
def test_a_tf2onnx_parameter_of_one_layer_or_left_frozen_is_not_said_to_be_merged(scopes, producer, trained):
    with warnings.catch_warnings():
        warnings.simplefilter("error", Tf2onnxExportWarning)
        artifacts.build_artifacts(_two_layer_norms(scopes, producer), requires_grad=trained, loss="MSELoss")


def _with_operators(*operators: tuple[str, str]) -> onnx.ModelProto:
    """``x @ W`` then each ``(operator, domain)`` of ``operators`` in turn, as tf2onnx leaves a TensorFlow
    operation it cannot convert (default domain, named by TensorFlow's scope)."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h0"], name="functional_1/fc_1/MatMul")]
    for k, (op, domain) in enumerate(operators):
        nodes.append(helper.make_node(op, [f"h{k}"], [f"h{k + 1}"], name=f"functional_1/{op}_{k}", domain=domain))
    nodes.append(helper.make_node("Identity", [f"h{len(operators)}"], ["y"]))
    custom = {domain: 1 for _, domain in operators if domain not in ("", "ai.onnx")}
    model = make_model(
        {"x": (FLOAT, ["N", 4])}, nodes, {"y": (FLOAT, ["N", 4])}, [("W", np.eye(4, dtype=np.float32))],
        extra_opsets=custom,
    )  # fmt: skip
    model.producer_name, model.producer_version = "tf2onnx", "1.17.0 e1b4f1"
    return model


def test_operators_onnx_does_not_define_are_named_before_anything_is_built(tmp_path):
    """tf2onnx leaves ``Erfc`` and ``StatelessRandomUniformV2`` as they are; generation failed on its own output
    (``the built model is not valid ONNX: No Op registered for Erfc``), blaming onnxtrain."""
    model = _with_operators(("Erfc", ""), ("Relu", ""), ("StatelessRandomUniformV2", "ai.onnx"))
    out = tmp_path / "out"
    with pytest.raises(ValueError) as raised:
        artifacts.generate_artifacts(model, ["W"], loss="MSELoss", optimizer="SGD", artifact_directory=out)
    message = str(raised.value)
    assert message.startswith("the model is not valid ONNX: 'functional_1/Erfc_0' (Erfc), ")
    assert "'functional_1/StatelessRandomUniformV2_2' (StatelessRandomUniformV2)" in message
    assert "tf2onnx 1.17.0" in message and "convert them" in message and "Relu" not in message
    assert not out.exists()


def test_custom_domains_and_onnxruntimes_default_domain_operators_are_not_refused():
    """A custom domain is the user's (a custom operator library); ONNX Runtime runs its
    ``SimplifiedLayerNormalization`` and device copies in the default domain; a model's own function is defined
    by the model."""
    model = _with_operators(("Erfc", "com.example"), ("MemcpyToHost", ""))
    assert unknown_operators(model) == []
    local = helper.make_function(
        "", "MyGelu", ["a"], ["b"], [helper.make_node("Relu", ["a"], ["b"])], [helper.make_opsetid("", 17)]
    )
    model = _with_operators(("MyGelu", ""))
    model.functions.append(local)
    check_known_operators(model)
    model = _with_operators(("Erfc", ""))
    model.graph.node.insert(0, helper.make_node("Loop", ["trip", "", "x"], ["unused"], body=_body_with("Erfinv")))
    assert [node.op_type for node in unknown_operators(model)] == ["Erfinv", "Erfc"]  # in a subgraph too


def _body_with(op: str) -> onnx.GraphProto:
    """A loop body applying ``op``."""
    value = helper.make_tensor_value_info
    return helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node(op, ["v_in"], ["v_out"])],
        "body",
        [value("i", INT64, []), value("c_in", onnx.TensorProto.BOOL, []), value("v_in", FLOAT, ["N", 4])],
        [value("c_out", onnx.TensorProto.BOOL, []), value("v_out", FLOAT, ["N", 4])],
    )


def _linear_classifier() -> onnx.ModelProto:
    """A logistic regression as skl2onnx converts it without ``black_op``: its coefficients in the attributes of
    an ai.onnx.ml ``LinearClassifier``, no initializer at all."""
    node = helper.make_node(
        "LinearClassifier", ["x"], ["label", "probabilities"], domain="ai.onnx.ml",
        coefficients=list(np.arange(12, dtype=float) / 10), intercepts=[0.0, 0.1, 0.2],
        classlabels_ints=[0, 1, 2], multi_class=1, post_transform="SOFTMAX",
    )  # fmt: skip
    outputs = {"label": (INT64, ["N"]), "probabilities": (FLOAT, ["N", 3])}
    model = make_model({"x": (FLOAT, ["N", 4])}, [node], outputs, [], extra_opsets={"ai.onnx.ml": 1})
    model.producer_name = "skl2onnx"
    return model


def test_a_linear_classifier_of_skl2onnx_names_black_op_as_the_sklearn_optimizer_does():
    """``requires_grad=["coef"]`` on skl2onnx's default conversion said ``(the 0 known: ; ...)``, where
    ``OrtGradientOptimizer`` names ``LinearClassifier`` and the converter option that writes trainable
    initializers."""
    hint = r"LinearClassifier \(ai.onnx.ml\): to_onnx\(model, X, black_op=\{'LinearClassifier'\}"
    with pytest.raises(ValueError, match=r"'coef'.*no floating-point initializers to train.*" + hint):
        artifacts.build_artifacts(_linear_classifier(), requires_grad=["coef"], loss_input_names=["probabilities"])
    with pytest.raises(ValueError, match=r"an optimizer needs trainable parameters.*" + hint):
        artifacts.build_artifacts(_linear_classifier(), optimizer="SGD", loss_input_names=["probabilities"])
    # with the default loss inputs, the cross-entropy reached the int64 labels first, and advised a Cast
    with pytest.raises(ValueError, match=r"'coef'.*no floating-point initializers to train.*" + hint):
        artifacts.build_artifacts(_linear_classifier(), requires_grad=["coef"], loss="CrossEntropyLoss")


def test_a_type_the_operator_does_not_take_is_named_before_anything_is_built(tmp_path):
    """torch's TorchScript export of Falcon's alibi casts to complex128 and multiplies that: generation wrote
    the artifacts, and onnxruntime then refused the training model, as if onnxtrain had built it wrong."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Cast", ["h"], ["complex"], to=onnx.TensorProto.COMPLEX128, name="/m/transformer/Cast"),
        helper.make_node("Mul", ["complex", "complex"], ["squared"]),
        helper.make_node("Cast", ["squared"], ["y"], to=onnx.TensorProto.FLOAT),
    ]
    model = make_model({"x": (FLOAT, ["n", 2])}, nodes, {"y": (FLOAT, ["n", 2])}, [("w", np.ones((2, 2), np.float32))])
    with pytest.raises(ValueError, match=r"not valid ONNX: .*/m/transformer/Cast.*complex128.*export it again"):
        artifacts.generate_artifacts(model, requires_grad=["w"], loss="MSELoss", artifact_directory=tmp_path / "a")
    assert not (tmp_path / "a").exists()
