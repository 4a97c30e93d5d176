"""remove_gradient_accumulation: the training model as it runs from reset gradients."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from onnxtrain import checkpoint
from onnxtrain.artifacts.accumulation import (
    LAZY_RESET_GRAD,
    AccumulationFormError,
    accumulated_name,
    buffer_name,
    remove_gradient_accumulation,
)
from tests.artifacts.step_models import (
    CASES,
    constant_gradient_models,
    generate_case,
    run_model,
    trainable_of,
    user_feeds,
)


@pytest.mark.parametrize("case", list(CASES))
def test_the_model_gives_the_training_models_outputs_on_a_reset_step(tmp_path, case):
    paths = generate_case(tmp_path, case)
    training = onnx.load(paths["training_model"])
    trainable = trainable_of(training)
    reset = remove_gradient_accumulation(training, trainable)
    onnx.checker.check_model(reset.model, full_check=True)
    inputs = [value.name for value in reset.model.graph.input]
    assert LAZY_RESET_GRAD not in inputs and not any(name.endswith(buffer_name("")) for name in inputs)
    assert inputs == [v.name for v in training.graph.input if v.name != LAZY_RESET_GRAD and v.name not in
                      {buffer_name(p) for p in trainable}]  # fmt: skip
    assert not any(n.op_type == "Where" for n in reset.model.graph.node if n.output[0].endswith(".accumulation.out"))
    assert len(reset.model.graph.node) < len(training.graph.node)

    rng = np.random.default_rng(0)
    params = {name: np.asarray(value) for name, value in checkpoint.load(paths["checkpoint"]).parameters.items()}
    user = user_feeds(training, params, rng)
    buffers = {buffer_name(p): np.full_like(params[p], 7) for p in trainable}  # ignored on a reset step
    expected = run_model(training, {**params, **user, **buffers, LAZY_RESET_GRAD: np.array([True])})
    result = run_model(reset.model, {**params, **user})
    assert sorted(result) == sorted(
        reset.gradients[name[: -len(accumulated_name(""))]] if name.endswith(accumulated_name("")) else name
        for name in expected
    )
    for name, value in expected.items():
        if name.endswith(accumulated_name("")):
            name = reset.gradients[name[: -len(accumulated_name(""))]]
        np.testing.assert_array_equal(result[name], value, err_msg=name)


def test_a_gradient_no_node_computes_gets_an_identity_of_its_own():
    training, _ = constant_gradient_models()
    reset = remove_gradient_accumulation(training, ["w"])
    onnx.checker.check_model(reset.model, full_check=True)
    assert reset.gradients["w"] == "w_grad.reset0"  # the constant has the name
    out = run_model(reset.model, {"w": np.array([1.0, 2.0], np.float32)})
    np.testing.assert_array_equal(out["w_grad.reset0"], [1.0, 1.0])


def test_a_model_without_the_accumulation_pattern_is_refused(tmp_path):
    training = onnx.load(generate_case(tmp_path, "adamw, cross-entropy")["training_model"])
    trainable = trainable_of(training)
    before = training.SerializeToString()
    remove_gradient_accumulation(training, trainable)
    assert training.SerializeToString() == before  # not changed
    for node in training.graph.node:
        if node.op_type == "Where" and node.output[0].endswith(".accumulation.out"):
            node.op_type = "Max"
            del node.input[0]
    with pytest.raises(AccumulationFormError, match="is not the Where"):
        remove_gradient_accumulation(training, trainable)


def test_a_gradient_that_is_also_another_output_is_refused(tmp_path):
    training = onnx.load(generate_case(tmp_path, "sgd, additional output")["training_model"])
    trainable = trainable_of(training)
    where = next(n for n in training.graph.node if n.output[0] == accumulated_name(trainable[0]))
    extra = training.graph.output.add()
    extra.CopyFrom(training.graph.output[0])
    extra.name = where.input[1]  # the raw gradient, as an output of its own already
    with pytest.raises(AccumulationFormError, match="also another of its outputs"):
        remove_gradient_accumulation(training, trainable)
