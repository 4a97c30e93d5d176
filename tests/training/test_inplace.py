"""unsafe_in_place: an output may overwrite an input's buffer only where no node can read the input afterwards."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from onnxtrain.training.inplace import unsafe_in_place
from tests.helpers import FLOAT, make_model


def _graph(nodes: list[onnx.NodeProto], outputs: list[str], inputs: tuple[str, ...] = ("p", "g")) -> onnx.GraphProto:
    model = make_model({name: (FLOAT, [3]) for name in inputs}, nodes, {name: (FLOAT, [3]) for name in outputs}, [])
    return model.graph


SGD = [helper.make_node("Mul", ["g", "lr"], ["step"]), helper.make_node("Sub", ["p", "step"], ["p.updated"])]


def test_an_update_whose_last_node_reads_the_input_is_safe():
    graph = _graph([helper.make_node("Constant", [], ["lr"], value_float=0.1), *SGD], ["p.updated"])
    assert unsafe_in_place(graph, {"p": "p.updated"}) == {}


def test_a_chain_whose_readers_all_come_before_the_writer_is_safe():
    nodes = [
        helper.make_node("Mul", ["p", "p"], ["p2"]),
        helper.make_node("Sqrt", ["p2"], ["root"]),
        helper.make_node("Add", ["root", "g"], ["p.updated"]),
    ]
    assert unsafe_in_place(_graph(nodes, ["p.updated"]), {"p": "p.updated"}) == {}


def test_a_reader_that_may_run_after_the_writer_is_unsafe():
    nodes = [
        helper.make_node("Neg", ["g"], ["p.updated"]),
        helper.make_node("Mul", ["p", "g"], ["other"]),  # nothing orders it before the writer
    ]
    why = unsafe_in_place(_graph(nodes, ["p.updated", "other"]), {"p": "p.updated"})
    assert "may read it after" in why["p"]


def test_a_writer_that_is_not_element_wise_is_unsafe():
    nodes = [helper.make_node("Transpose", ["p"], ["p.updated"], perm=[0])]
    why = unsafe_in_place(_graph(nodes, ["p.updated"]), {"p": "p.updated"})
    assert "not element-wise" in why["p"]


def test_an_input_that_is_also_an_output_or_a_missing_output_is_unsafe():
    nodes = [helper.make_node("Neg", ["p"], ["q"])]
    graph = _graph(nodes, ["q"])
    graph.output.append(helper.make_tensor_value_info("p", FLOAT, [3]))
    assert "also an output" in unsafe_in_place(graph, {"p": "q"})["p"]
    assert "is not an output" in unsafe_in_place(graph, {"p": "nothing"})["p"]
    assert "not an input" in unsafe_in_place(graph, {"q": "p"})["q"]


def test_two_inputs_into_one_output_are_unsafe():
    nodes = [helper.make_node("Add", ["p", "g"], ["s"])]
    why = unsafe_in_place(_graph(nodes, ["s"]), {"p": "s", "g": "s"})
    assert "two inputs" in why["g"]


def test_a_subgraph_reading_the_input_counts_as_a_reader():
    then = helper.make_graph(
        [helper.make_node("Identity", ["p"], ["t"])], "then", [], [helper.make_tensor_value_info("t", FLOAT, [3])]
    )
    nodes = [
        helper.make_node("Neg", ["g"], ["p.updated"]),
        helper.make_node("Constant", [], ["c"], value=onnx.numpy_helper.from_array(np.array(True))),
        helper.make_node("If", ["c"], ["branch"], then_branch=then, else_branch=then),
    ]
    why = unsafe_in_place(_graph(nodes, ["p.updated", "branch"]), {"p": "p.updated"})
    assert "may read it after" in why["p"]


@pytest.mark.parametrize("threads", [1, 2])
def test_onnxruntime_computes_a_safe_update_in_place(threads):
    """The premise: an element-wise kernel writing over its own input gives the values it gives elsewhere."""
    nodes = [
        helper.make_node("Mul", ["g", "g"], ["g2"]),
        helper.make_node("Mul", ["p", "g2"], ["scaled"]),
        helper.make_node("Sub", ["p", "scaled"], ["p.updated"]),
    ]
    model = make_model({"p": (FLOAT, [1 << 16]), "g": (FLOAT, [1 << 16])}, nodes, {"p.updated": (FLOAT, [1 << 16])}, [])
    assert unsafe_in_place(model.graph, {"p": "p.updated"}) == {}
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    p, g = rng.normal(size=1 << 16).astype(np.float32), rng.normal(size=1 << 16).astype(np.float32)
    expected = session.run(None, {"p": p, "g": g})[0]
    value = ort.OrtValue.ortvalue_from_numpy(p.copy())
    binding = session.io_binding()
    binding.bind_ortvalue_input("p", value)
    binding.bind_cpu_input("g", g)
    binding.bind_ortvalue_output("p.updated", value)
    session.run_with_iobinding(binding)
    np.testing.assert_array_equal(value.numpy(), expected)
