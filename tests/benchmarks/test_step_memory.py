"""The static memory of a step (onnxtrain.artifacts.step_memory) on small graphs, against counts made by hand.

Every expectation below is counted from the graph: bytes of float32 (4) and
int64 (8) tensors, the order onnxruntime gives the nodes, and which tensors
are alive at each position. The last tests run it on real artifacts of a
linear model (``generate_artifacts``), through ``onnxtrain inspect --memory``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from benchmarks.real_size.static import user_inputs
from onnxtrain.artifacts.step_memory import (
    execution_order,
    live_memory,
    parse_shapes,
    phases,
    step_memory,
    value_types,
)
from onnxtrain.cli import main as cli_main

FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64


def _model(nodes, inputs, outputs, initializers=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _input(name: str, dims, elem=FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, dims)


def _output(name: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, FLOAT, None)


def test_a_chain_lives_from_producer_to_last_reader():
    # x [1000] held (4000 B); a = Relu(x), b = Neg(a), y = Exp(b) (the output, alive to the end)
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"])]
    nodes.append(helper.make_node("Exp", ["b"], ["y"]))
    memory = live_memory(_model(nodes, [_input("x", [1000])], [_output("y")]), {}, order="graph")
    assert memory.held == {"inputs": 4000}
    assert list(memory.live) == [4000, 8000, 8000]  # a; a and b (Neg reads a); b and y (Exp reads b)
    assert (memory.peak, memory.peak_at) == (12000, 1) and memory.peak_node.startswith("Neg")
    assert [t.name for t in memory.at_peak] == ["a", "b"] and memory.kept_for_backward == 0
    assert memory.phase_peaks == {"forward": 8000}


def test_views_share_a_buffer_in_place_outputs_cost_nothing_held_outputs_are_held():
    shape = numpy_helper.from_array(np.array([6], np.int64), "s")
    nodes = [
        helper.make_node("Reshape", ["x", "s"], ["r"]),  # a view of the input x: no memory
        helper.make_node("Relu", ["r"], ["a"]),  # [6] float: 24 B, from position 1
        helper.make_node("Reshape", ["a", "s"], ["b"]),  # a view of a: a lives while b is read
        helper.make_node("Neg", ["b"], ["c"]),  # an output
        helper.make_node("Abs", ["a"], ["d"]),  # an output written into a held buffer
    ]
    model = _model(nodes, [_input("x", [2, 3])], [_output("c"), _output("d")], [shape])
    apart = live_memory(model, {}, order="graph", held_outputs={"d": "gradients"})
    assert apart.held == {"inputs": 24, "constants": 8, "gradients": 24}
    assert list(apart.live) == [0, 24, 24, 48, 48]  # a from 1 to 4 (Abs reads it last); c from 3 to the end
    assert apart.peak == 56 + 48 and apart.at_peak[0].views == 1  # a, seen through b
    in_place = live_memory(model, {}, order="graph", held_outputs={"d": "gradients"}, in_place={"c": "x"})
    assert list(in_place.live) == [0, 24, 24, 24, 24] and in_place.peak == 56 + 24


def test_shapes_computed_at_run_time_are_known_once_the_inputs_are_fixed():
    constant = [
        helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(v, np.int64), name))
        for name, v in (("zero", 0), ("one", 1))
    ]
    nodes = [
        *constant,
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["rows"]),
        helper.make_node("Range", ["zero", "rows", "one"], ["positions"]),  # [batch] int64
        helper.make_node(
            "ConstantOfShape", ["shape"], ["zeros"], value=numpy_helper.from_array(np.zeros(1, np.float32))
        ),
        helper.make_node("Add", ["x", "zeros"], ["y"]),
    ]
    model = _model(
        nodes, [_input("x", ["batch", 4])], [_output("y"), helper.make_tensor_value_info("positions", INT64, None)]
    )
    by_dimension = value_types(model, {"batch": [3]})
    assert by_dimension["positions"].dims == (3,) and by_dimension["zeros"].dims == (3, 4)
    by_input = value_types(model, {"x": [5, 4]})
    assert by_input["positions"].nbytes == 5 * 8 and by_input["y"].nbytes == 5 * 4 * 4
    # x [5, 4] 80 B held, the constants 16 B; zeros (80) until Add, then y (80) and positions (40) to the end
    memory = live_memory(model, {"x": [5, 4]}, order="graph")
    assert memory.held == {"inputs": 80, "constants": 16} and max(memory.live) == 80 + 80 + 40


def test_a_held_shape_keeps_its_value_and_onnxruntimes_default_domain_norm_its_input_type():
    """``Where(c, shape, shape)`` (a hold: activation checkpointing's) is ``shape`` whatever ``c``; onnxruntime's
    ``SimplifiedLayerNormalization``, which it registers in the default domain, has input 0's type."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Cast", ["flag"], ["c"], to=TensorProto.BOOL),
        helper.make_node("Where", ["c", "shape", "shape"], ["held"]),
        helper.make_node(
            "ConstantOfShape", ["held"], ["zeros"], value=numpy_helper.from_array(np.zeros(1, np.float32))
        ),
        helper.make_node("SimplifiedLayerNormalization", ["zeros", "scale"], ["y"], axis=-1, epsilon=1e-6),
    ]
    scale = numpy_helper.from_array(np.ones(4, np.float32), "scale")
    model = _model(nodes, [_input("x", ["batch", 4]), _input("flag", [])], [_output("y")], [scale])
    types = value_types(model, {"batch": [3]})
    assert types["zeros"].dims == (3, 4)
    assert types["y"] == types["zeros"]


def test_a_cuda_session_s_copies_between_devices_keep_the_value_s_type():
    """onnxruntime's optimized model of a CUDA session holds ``MemcpyFromHost``/``MemcpyToHost`` nodes (default
    domain, no onnx schema): the sizes after them are known, not lost for the rest of the graph (the H200's
    first run lost 2,276 values after two such copies); ``BiasSoftmax`` has its input's type."""
    ms = "com.microsoft"
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("MemcpyFromHost", ["ids"], ["ids_CUDAExecutionProvider"]),
        helper.make_node("Gather", ["table", "ids_CUDAExecutionProvider"], ["rows"]),
        helper.make_node("BiasSoftmax", ["rows", "bias"], ["p"], domain=ms, axis=-1, is_inner_broadcast=0),
        helper.make_node("MemcpyToHost", ["p"], ["p_CPUExecutionProvider"]),
        helper.make_node("Reshape", ["p_CPUExecutionProvider", "shape"], ["y"]),
    ]
    table = numpy_helper.from_array(np.ones((10, 4), np.float32), "table")
    bias = numpy_helper.from_array(np.zeros(4, np.float32), "bias")
    model = _model(nodes, [_input("x", [6, 4]), _input("ids", ["batch", 3], INT64)], [_output("y")], [table, bias])
    model.opset_import.append(helper.make_opsetid(ms, 1))
    types = value_types(model, {"batch": [2]})
    assert types["ids_CUDAExecutionProvider"] == types["ids"] and types["ids"].dims == (2, 3)
    assert types["rows"].dims == types["p"].dims == types["p_CPUExecutionProvider"].dims == (2, 3, 4)
    assert types["y"].dims == (6, 4)
    assert live_memory(model, {"batch": [2]}, order="graph").unknown == []


def _diamond() -> list[onnx.NodeProto]:
    return [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Neg", ["x"], ["b"]),
        helper.make_node("Exp", ["a"], ["c"]),
        helper.make_node("Add", ["b", "c"], ["d"]),
    ]


def test_onnxruntime_orders_depth_first_by_default_and_by_index_with_shapes_first_by_priority():
    # default: back from the last node, its producers by ascending index, each visited depth first
    assert execution_order(_diamond(), "default") == [0, 2, 1, 3]
    assert execution_order(_diamond(), "priority") == [0, 1, 2, 3]  # the lowest index that is ready
    assert execution_order(_diamond(), "graph") == [0, 1, 2, 3]
    shapes_first = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Neg", ["x"], ["b"]),
        helper.make_node("Exp", ["b"], ["c"]),
        helper.make_node("Shape", ["a"], ["s"]),
        helper.make_node("Reshape", ["c", "s"], ["d"]),
    ]
    assert execution_order(shapes_first, "priority") == [0, 3, 1, 2, 4]  # Shape runs as soon as it is ready


def test_forward_tensors_a_backward_node_reads_are_kept_for_the_backward():
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("ReduceSum", ["r"], ["loss"], keepdims=0),
        helper.make_node("Mul", ["h", "x"], ["g"]),  # not needed by the loss: backward; reads h (kept) and x (held)
    ]
    model = _model(nodes, [_input("x", [4]), _input("w", [4])], [_output("loss"), _output("g")])
    memory = live_memory(model, {}, order="graph", categories={"w": "parameters"})
    assert memory.held == {"inputs": 16, "parameters": 16}
    assert memory.kept_for_backward == 16 and memory.forward_end == 2
    # the loss (4 B, an output) lives to the end: h, r and the loss at ReduceSum; h, the loss and g at the last Mul
    assert memory.phase_peaks == {"forward": 16 + 16 + 4, "backward": 16 + 4 + 16}


def test_a_backward_shape_read_keeps_nothing_for_the_backward():
    """A gradient rule's ``Shape`` of a forward value (read right after it is made) reads no data: the value is not
    kept, and lives only to that read."""
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["h"]),
        helper.make_node("Shape", ["h"], ["shape"]),  # backward: only the gradient reads it
        helper.make_node("ReduceSum", ["h"], ["loss"], keepdims=0),
        helper.make_node("ConstantOfShape", ["shape"], ["g"]),
    ]
    model = _model(nodes, [_input("x", [4]), _input("w", [4])], [_output("loss"), _output("g")])
    memory = live_memory(model, {}, order="graph", categories={"w": "parameters"})
    assert phases(model, "loss")[1] == "backward"
    assert memory.kept_for_backward == 0 and memory.kept == []
    size_op = helper.make_node("Size", ["h"], ["count"])
    model = _model([*nodes[:3], size_op], [_input("x", [4]), _input("w", [4])], [_output("loss"), _output("count")])
    assert live_memory(model, {}, order="graph").kept_for_backward == 0


def test_the_fused_step_holds_parameters_gradients_and_moments_and_writes_them_in_place(linear_artifacts: Path):
    training, optimizer = linear_artifacts / "training_model.onnx", linear_artifacts / "optimizer_model.onnx"
    assert user_inputs(onnx.load(str(training))) == ["input", "target"]
    result = step_memory(training, optimizer, {"input": (32, 10), "target": (32, 1)})
    assert (
        result.fused is not None and result.fused.order == "priority" and result.reset.order == "priority"
    )  # as the runtime runs them
    fused, reset = result.fused, result.reset
    assert (fused.held["parameters"], fused.held["gradients"], fused.held["moments"]) == (44, 44, 88)
    assert fused.held["inputs"] == 32 * 10 * 4 + 32 * 4  # the batch
    assert (reset.held["parameters"], reset.held["gradients"]) == (44, 44) and "moments" not in reset.held
    assert fused.nodes == reset.nodes + len(onnx.load(str(optimizer)).graph.node)
    assert not any(t.name.endswith(".updated") for t in fused.at_peak)  # written over the inputs
    assert {"update", "forward", "backward"} <= set(fused.phase_peaks)
    assert fused.kept_for_backward > 0 and fused.unknown == [] and reset.unknown == []


def test_onnxtrain_inspect_memory(capsys, linear_artifacts: Path):
    argv = [
        "inspect",
        str(linear_artifacts),
        "--memory",
        "--shapes",
        "batch=32",
    ]  # input [batch, 10], target [batch, 1]
    assert cli_main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "fused step (the optimizer's update, then a train step" in out and "first step (from reset" in out
    assert "held throughout: parameters 44 B, gradients 44 B, moments 88 B, inputs 1.4 KiB" in out
    assert cli_main(["inspect", str(linear_artifacts), "--memory"]) == 1
    assert "give the shapes of input [batch, 10], target [batch, 1]" in capsys.readouterr().err


def test_shapes_are_name_equals_dimensions():
    assert parse_shapes(["input_ids=4x128", "labels=512", "batch=4"]) == {
        "input_ids": (4, 128),
        "labels": (512,),
        "batch": (4,),
    }
    for bad in ("input_ids", "input_ids=4xb", "=4"):
        with pytest.raises(ValueError, match="is not NAME=DxD"):
            parse_shapes([bad])
