"""The opset and IR-version policy: the lowest IR version, loadable by onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import onnxtrain.onnxblock as onnxblock
from onnxtrain import blocks
from tests.helpers import FLOAT, INT64, make_model, run_model

#: ai.onnx opset -> the lowest IR version that can hold it (onnx's own table).
LOWEST_IR = {13: 7, 14: 7, 15: 8, 17: 8, 18: 8, 19: 9, 20: 9, 21: 10, 22: 10, 23: 11}


class Fn(onnxblock.ForwardBlock):
    """A ForwardBlock whose build is a given function."""

    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def build(self, *args: str) -> object:
        return self.fn(*args)


def _relu_model(opset: int, ir_version: int | None = None) -> onnx.ModelProto:
    return make_model(
        {"x": (FLOAT, ["batch", 4])},
        [helper.make_node("Relu", ["x"], ["y"])],
        ["y"],
        opset=opset,
        ir_version=ir_version,
    )


def _build(model: onnx.ModelProto) -> onnx.ModelProto:
    """Mean over axis 1 and a squeeze: ops whose form changed across opsets."""
    block = Fn(lambda y: blocks.Squeeze([1])(blocks.ReduceMean([1])(blocks.Mul()(y, blocks.Constant(2.0)()))))
    with onnxblock.base(model):
        block("y")
    return block.to_model_proto()


@pytest.mark.parametrize("opset", sorted(LOWEST_IR))
def test_lowest_ir_version_for_opset_and_loadable(opset: int) -> None:
    """Each emitted model carries the lowest IR version for its opset and runs in onnxruntime."""
    built = _build(_relu_model(opset))
    assert built.opset_import[0].version == opset
    assert built.ir_version == LOWEST_IR[opset]
    assert built.ir_version == helper.find_min_ir_version_for(list(built.opset_import))
    x = np.array([[1.0, -2.0, 3.0, 4.0], [0.0, 0.5, -1.0, 2.0]], np.float32)
    (out,) = run_model(built, {"x": x})
    np.testing.assert_allclose(out, np.mean(2 * np.maximum(x, 0), axis=1), rtol=1e-6)


def test_empty_base_model_has_lowest_ir_version() -> None:
    """Models built from empty_base (default opset 21) carry IR 10."""
    block = Fn(lambda: blocks.Add()(blocks.Constant(1.0)(), blocks.Constant(2.0)()))
    with onnxblock.empty_base():
        block()
    built = block.to_model_proto()
    assert built.ir_version == 10
    np.testing.assert_allclose(run_model(built, {})[0], 3.0)


def test_ml_domain_raises_ir_version_to_what_it_needs() -> None:
    """A LabelEncoder imports ai.onnx.ml 4, which needs IR 9; the model still loads."""
    block = Fn(lambda y: blocks.LabelEncoder(keys_int64s=[0, 1], values_floats=[-1.0, 1.0])(blocks.Cast(INT64)(y)))
    with onnxblock.base(_relu_model(17)):
        block("y")
    built = block.to_model_proto()
    assert {o.domain: o.version for o in built.opset_import} == {"": 17, "ai.onnx.ml": 4}
    assert built.ir_version == 9
    (out,) = run_model(built, {"x": np.array([[1.0, -1.0, 0.0, 5.0]], np.float32)})
    np.testing.assert_allclose(out, [[1.0, -1.0, -1.0, 0.0]])


def test_local_functions_need_ir_8() -> None:
    """A base model with model-local functions on opset 13 comes out with IR 8, not 7."""
    function = helper.make_function(
        "local", "MyNeg", ["a"], ["b"], [helper.make_node("Neg", ["a"], ["b"])], [helper.make_opsetid("", 13)]
    )
    model = make_model(
        {"x": (FLOAT, [2])},
        [helper.make_node("MyNeg", ["x"], ["y"], domain="local")],
        {"y": (FLOAT, [2])},
        opset=13,
        ir_version=8,
        extra_opsets={"local": 1},
    )
    model.functions.append(function)
    block = Fn(lambda y: blocks.Relu()(y))
    with onnxblock.base(model):
        block("y")
    built = block.to_model_proto()
    assert built.ir_version == 8
    np.testing.assert_allclose(run_model(built, {"x": np.array([1.0, -1.0], np.float32)})[0], [0.0, 1.0])


def test_base_model_of_the_installed_onnx_comes_out_loadable() -> None:
    """A base model stamped with the installed onnx's default IR version (14 with onnx 1.23) comes out
    with the lowest IR version its opset needs, and the installed onnxruntime runs it.

    Whether onnxruntime loads the base model itself depends on its release (1.31 refuses IR 14, 1.32
    loads it); what onnxtrain promises is only that the models it writes load.
    """
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", FLOAT, ["batch", 4])],
            [helper.make_tensor_value_info("y", FLOAT, ["batch", 4])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    assert model.ir_version == onnx.IR_VERSION
    built = _build(model)
    assert built.ir_version == LOWEST_IR[17]
    x = np.array([[1.0, -2.0, 3.0, 4.0]], np.float32)
    np.testing.assert_allclose(run_model(built, {"x": x})[0], np.mean(2 * np.maximum(x, 0), axis=1), rtol=1e-6)
