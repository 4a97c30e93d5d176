"""The opset and IR-version policy: the lowest IR version, loadable by onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import onnxtrain.onnxblock as onnxblock
from onnxtrain import blocks
from onnxtrain.graph import versions
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


def test_ir_14_base_model_comes_out_loadable() -> None:
    """onnx 1.23 stamps IR 14, which onnxruntime 1.31 refuses; the built model loads."""
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
    if model.ir_version > 13:
        with pytest.raises(Exception, match=r"(?i)ir.?version|Unsupported model"):
            run_model(model, {"x": np.zeros((1, 4), np.float32)})
    built = _build(model)
    assert built.ir_version == 8
    assert model.ir_version == onnx.IR_VERSION  # the caller's model is untouched
    x = np.array([[1.0, -2.0, 3.0, 4.0]], np.float32)
    np.testing.assert_allclose(run_model(built, {"x": x})[0], [4.0], rtol=1e-6)


@pytest.mark.parametrize("opset", [7, 11, 12])
def test_old_opset_is_refused_with_a_hint(opset: int) -> None:
    """Opsets before 13 raise ValueError naming the opset and onnx.version_converter."""
    model = _relu_model(opset)
    pattern = rf"opset {opset}.*onnx\.version_converter\.convert_version"
    with pytest.raises(ValueError, match=pattern), onnxblock.base(model):
        pass


def test_model_without_ai_onnx_opset_is_refused() -> None:
    """A model importing no ai.onnx opset raises ValueError saying how to add one."""
    model = _relu_model(17)
    del model.opset_import[:]
    model.opset_import.append(helper.make_opsetid("ai.onnx.ml", 4))
    with pytest.raises(ValueError, match=r"imports no ai\.onnx opset"), onnxblock.base(model):
        pass


def test_ai_onnx_domain_alias_is_understood() -> None:
    """An opset imported under the explicit name 'ai.onnx' counts as the default domain."""
    model = _relu_model(17)
    model.opset_import[0].domain = "ai.onnx"
    with onnxblock.base(model) as b:
        assert b.opset == 17


def test_empty_base_default_and_explicit_opset() -> None:
    """empty_base() imports opset 21 (DEFAULT_OPSET); empty_base(opset_version=18) honours 18."""
    assert versions.DEFAULT_OPSET == 21
    with onnxblock.empty_base() as b:
        assert b.opset == 21
        assert [(o.domain, o.version) for o in b.model.opset_import] == [("", 21)]
    for opset in (13, 17, 18):
        block = Fn(lambda: blocks.ReduceSum([0], keepdims=False)(blocks.Constant(np.arange(6.0).reshape(3, 2))()))
        with onnxblock.empty_base(opset_version=opset) as b:
            assert b.opset == opset
            block()
        built = block.to_model_proto()
        assert [(o.domain, o.version) for o in built.opset_import] == [("", opset)]
        assert built.ir_version == LOWEST_IR[opset]
        np.testing.assert_allclose(run_model(built, {})[0], [6.0, 9.0], rtol=1e-12)
    with pytest.raises(ValueError, match="version_converter"), onnxblock.empty_base(opset_version=12):
        pass
