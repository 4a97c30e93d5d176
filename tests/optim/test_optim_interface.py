"""The optimizer model's interface: names and order of inputs and outputs, types, operators, opsets."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import onnxtrain.onnxblock as onnxblock
from onnxtrain.graph import versions
from onnxtrain.optim import SGD, Adagrad, Adam, AdamW, ClipGradNorm, Optimizer, RMSprop, StateSpec
from tests.helpers import FLOAT
from tests.optim.runner import (
    assert_trajectories_close,
    build,
    learning_rates,
    onnx_trajectory,
    random_problem,
    reference_trajectory,
    session,
    tensors,
)

PARAMS = {"w": np.zeros((2, 3), np.float32), "b": np.zeros((3,), np.float64)}

#: (optimizer, state roles): the golden number and meaning of the state tensors.
GOLDEN: list[tuple[Optimizer, list[str]]] = [
    (SGD(), []),
    (SGD(momentum=0.9), ["momentum_buffer"]),
    (Adam(), ["exp_avg", "exp_avg_sq"]),
    (Adam(amsgrad=True), ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"]),
    (AdamW(), ["exp_avg", "exp_avg_sq"]),
    (AdamW(amsgrad=True, clip_grad=ClipGradNorm(1.0)), ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"]),
    (Adagrad(), ["sum"]),
    (RMSprop(), ["square_avg"]),
    (RMSprop(momentum=0.9), ["square_avg", "momentum_buffer"]),
    (RMSprop(centered=True), ["square_avg", "grad_avg"]),
    (RMSprop(momentum=0.9, centered=True), ["square_avg", "momentum_buffer", "grad_avg"]),
]
IDS = [repr(case[0]) for case in GOLDEN]


def _signature(values: list[onnx.ValueInfoProto]) -> list[tuple[str, int, list[int]]]:
    return [(v.name, v.type.tensor_type.elem_type, [d.dim_value for d in v.type.tensor_type.shape.dim]) for v in values]


@pytest.mark.parametrize(("optimizer", "roles"), GOLDEN, ids=IDS)
def test_golden_inputs_and_outputs(optimizer: Optimizer, roles: list[str]) -> None:
    model = build(optimizer, PARAMS)
    w, b = (FLOAT, [2, 3]), (onnx.TensorProto.DOUBLE, [3])
    n = len(roles)
    expected_inputs = [("learning_rate", FLOAT, [1]), ("step", onnx.TensorProto.INT64, [1])]
    expected_outputs = []
    for name, (elem_type, shape) in (("w", w), ("b", b)):
        expected_inputs += [(name, elem_type, shape), (f"{name}_grad", elem_type, shape)]
        expected_inputs += [(f"{name}.momentum{i}", elem_type, shape) for i in range(n)]
        expected_outputs += [(f"{name}.updated", elem_type, shape)]
        expected_outputs += [(f"{name}.momentum{i}.updated", elem_type, shape) for i in range(n)]
    assert _signature(list(model.graph.input)) == expected_inputs
    assert _signature(list(model.graph.output)) == expected_outputs
    assert optimizer.model_input_names(["w", "b"]) == [name for name, _, _ in expected_inputs]
    assert optimizer.model_output_names(["w", "b"]) == [name for name, _, _ in expected_outputs]
    assert [spec.role for spec in optimizer.state_specs()] == roles
    assert [spec.name for spec in optimizer.state_specs()] == [f"momentum{i}" for i in range(n)]
    assert optimizer.num_states == n


@pytest.mark.parametrize(("optimizer", "roles"), GOLDEN, ids=IDS)
def test_standard_operators_only_and_loads_in_onnxruntime(optimizer: Optimizer, roles: list[str]) -> None:
    model = build(optimizer, PARAMS)
    assert {node.domain for node in model.graph.node} <= {""}
    assert [(o.domain, o.version) for o in model.opset_import] == [("", versions.DEFAULT_OPSET)]
    assert model.ir_version == 10  # what opset 21 needs, below onnxruntime 1.31's limit (13)
    onnx.checker.check_model(model, full_check=True)
    session(model)


def test_hyperparameters_are_constants_not_inputs() -> None:
    model = build(AdamW(weight_decay=0.01, clip_grad=ClipGradNorm(2.0)), {"w": PARAMS["w"]})
    assert [i.name for i in model.graph.input] == [
        "learning_rate", "step", "w", "w_grad", "w.momentum0", "w.momentum1",
    ]  # fmt: skip
    constants = {float(numpy_helper.to_array(t)) for t in model.graph.initializer if t.data_type == FLOAT}
    assert {0.01, 2.0} <= {round(c, 6) for c in constants}


@pytest.mark.parametrize("opset", [13, 17, 21])
def test_opset_follows_the_base_context(opset: int) -> None:
    optimizer = Adam(weight_decay=0.01, clip_grad=ClipGradNorm(0.5))
    model = build(optimizer, {"w": PARAMS["w"]}, opset=opset)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", opset)]
    params, grads = random_problem({"w": ((2, 3), np.dtype(np.float32))}, 3, seed=1)
    lrs = learning_rates(0.1, 3)
    assert_trajectories_close(
        onnx_trajectory(optimizer, params, grads, lrs), reference_trajectory(optimizer, params, grads, lrs),
        rtol=2e-5, atol=2e-6,
    )  # fmt: skip


def test_parameter_order_is_kept_and_frozen_parameters_are_ignored() -> None:
    trainable = tensors({"z": np.zeros(2, np.float32), "a": np.zeros(1, np.float32)})
    frozen = tensors({"f": np.zeros(3, np.float32)})
    optimizer = SGD()
    with onnxblock.empty_base():
        outputs = optimizer((trainable, frozen))
    assert outputs == ["z.updated", "a.updated"]
    assert [i.name for i in optimizer.to_model_proto().graph.input] == [
        "learning_rate",
        "step",
        "z",
        "z_grad",
        "a",
        "a_grad",
    ]
    with onnxblock.empty_base():  # a plain list of trainable parameters works too
        assert SGD()(trainable) == ["z.updated", "a.updated"]


def test_same_build_same_model() -> None:
    first = build(RMSprop(momentum=0.9, centered=True, clip_grad=ClipGradNorm(1.0)), PARAMS)
    second = build(RMSprop(momentum=0.9, centered=True, clip_grad=ClipGradNorm(1.0)), PARAMS)
    assert first.SerializeToString() == second.SerializeToString()


def test_initial_state() -> None:
    adagrad = Adagrad(initial_accumulator_value=0.25)
    assert adagrad.state_specs() == (StateSpec("momentum0", "sum", 0.25),)
    state = adagrad.initial_state(PARAMS)
    assert list(state) == ["w", "b"]
    assert state["w"][0].dtype == np.float32 and state["w"][0].shape == (2, 3)
    np.testing.assert_array_equal(state["b"][0], np.full(3, 0.25))
    from_tensors = Adam().initial_state(tensors(PARAMS))
    assert [[m.shape for m in moments] for moments in from_tensors.values()] == [[(2, 3), (2, 3)], [(3,), (3,)]]
    assert all(not m.any() for moments in from_tensors.values() for m in moments)
    assert SGD().initial_state(PARAMS) == {"w": [], "b": []}


def test_adagrad_starts_from_the_initial_accumulator() -> None:
    optimizer = Adagrad(initial_accumulator_value=0.5)
    params, grads = random_problem({"w": ((4,), np.dtype(np.float64))}, 1, seed=2)
    ((new, state),) = onnx_trajectory(optimizer, params, grads, [0.5])
    g = grads[0]["w"]
    np.testing.assert_allclose(state["w"][0], 0.5 + g * g)
    np.testing.assert_allclose(new["w"], params["w"] - 0.5 * g / (np.sqrt(0.5 + g * g) + 1e-10), rtol=1e-6)


def test_sgd_dampening_does_not_damp_the_first_step() -> None:
    optimizer = SGD(momentum=0.9, dampening=0.5)
    params, grads = random_problem({"w": ((3,), np.dtype(np.float64))}, 2, seed=4)
    states = {"w": [np.full(3, 100.0)]}  # ignored at step 1, as torch starts from the gradient itself
    (_, s1), (_, s2) = onnx_trajectory(optimizer, params, grads, [0.125, 0.125], states=states)
    np.testing.assert_array_equal(s1["w"][0], grads[0]["w"])
    np.testing.assert_allclose(s2["w"][0], 0.9 * grads[0]["w"] + 0.5 * grads[1]["w"])


def test_parameters_as_value_infos_with_symbolic_dims() -> None:
    """The data of the parameters is never read: value infos do, even with symbolic dims."""
    optimizer = Adam()
    with onnxblock.empty_base():
        optimizer([helper.make_tensor_value_info("sym", FLOAT, ["n", 3])])
    model = optimizer.to_model_proto()
    assert [o.type.tensor_type.shape.dim[0].dim_param for o in model.graph.output] == ["n", "n", "n"]
    params = {"sym": np.ones((4, 3), np.float32)}
    grads = {"sym": np.full((4, 3), 0.5, np.float32)}
    state = optimizer.initial_state(params)
    feeds = {"learning_rate": np.array([0.1], np.float32), "step": np.array([1], np.int64), "sym_grad": grads["sym"]}
    feeds |= {"sym": params["sym"], "sym.momentum0": state["sym"][0], "sym.momentum1": state["sym"][1]}
    new, _ = optimizer.reference_step(0.1, 1, params, grads, state)
    np.testing.assert_allclose(session(model).run(["sym.updated"], feeds)[0], new["sym"], rtol=1e-6)


def test_bfloat16_parameters_are_updated_in_float32() -> None:
    """(onnxruntime's Python API feeds no bfloat16 arrays; the float16 tests run the same path.)"""
    optimizer = Adam()
    with onnxblock.empty_base():
        optimizer([helper.make_tensor_value_info("bf", onnx.TensorProto.BFLOAT16, [2])])
    model = optimizer.to_model_proto()
    assert {o.type.tensor_type.elem_type for o in model.graph.output} == {onnx.TensorProto.BFLOAT16}
    casts = [n.attribute[0].i for n in model.graph.node if n.op_type == "Cast" and n.output[0].startswith("bf")]
    assert sorted(casts) == [FLOAT] * 4 + [onnx.TensorProto.BFLOAT16] * 3  # 4 inputs up, 3 outputs down
    session(model)
