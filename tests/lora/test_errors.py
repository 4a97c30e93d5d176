"""Bad input to add_adapters and merge_adapters: clear errors, and the caller's model left as it was."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxtrain.checkpoint import CheckpointState
from onnxtrain.lora import adapters_of, add_adapters, merge_adapters
from tests.lora.helpers import small_model


def test_a_pattern_matching_nothing_names_the_weights() -> None:
    with pytest.raises(ValueError, match=re.escape("matches no initializer")) as error:
        add_adapters(small_model(), ["W1", "attn*"], 2, 4)
    assert "['W1', 'W2']" in str(error.value) and "'attn*'" in str(error.value)


@pytest.mark.parametrize(
    ("target", "reader"), [("E", "Gather node '#0' as input 0"), ("b", "Gemm node '#2' as input 2")]
)
def test_a_weight_that_is_not_the_second_input_of_a_product(target: str, reader: str) -> None:
    with pytest.raises(ValueError, match="not as the second input of a MatMul or Gemm") as error:
        add_adapters(small_model(), target, 2, 4)
    assert reader in str(error.value)


def test_a_weight_also_read_elsewhere_is_refused() -> None:
    model = small_model()
    model.graph.node.append(helper.make_node("Identity", ["W1"], ["w1_copy"]))
    model.graph.output.append(helper.make_tensor_value_info("w1_copy", TensorProto.FLOAT, [4, 3]))
    with pytest.raises(ValueError, match=re.escape("'W1': read by Identity node '#3' as input 0")) as error:
        add_adapters(model, "W1", 2, 4)
    assert "it is also the weight of MatMul node '#1' as input 1: an adapter there would leave its other readers" in (
        str(error.value)
    )


@pytest.mark.parametrize("rank", [0, -1, 1.5, True])
def test_rank_must_be_a_positive_integer(rank: object) -> None:
    with pytest.raises(ValueError, match="rank must be a positive integer"):
        add_adapters(small_model(), "W1", rank, 4)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"alpha": float("nan")}, "alpha must be a finite number"),
        ({"dropout": 1.0}, "dropout must be a probability"),
        ({"dropout": -0.1}, "dropout must be a probability"),
        ({"targets": []}, "targets must be a glob pattern"),
        ({"init": "xavier"}, "init must be 'kaiming' or 'gaussian'"),
    ],
)
def test_other_bad_arguments(kwargs: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {"targets": "W1", "rank": 2, "alpha": 4.0, **kwargs}
    with pytest.raises(ValueError, match=message):
        add_adapters(small_model(), **arguments)  # type: ignore[arg-type]


def test_adapters_twice_on_one_weight() -> None:
    adapted, _ = add_adapters(small_model(), "W1", 2, 4)
    with pytest.raises(ValueError, match=re.escape("weights ['W1'] have adapters already")):
        add_adapters(adapted, "W*", 2, 4)
    again, names = add_adapters(adapted, "W2", 2, 4)  # another weight: fine
    assert names == ["W2.lora_A", "W2.lora_B"]
    assert [adapter.weight for adapter in adapters_of(again)] == ["W1", "W2"]


def test_merge_needs_the_adapters_in_the_checkpoint(tmp_path: Path) -> None:
    model = small_model()
    adapted, names = add_adapters(model, ["W1", "W2"], 2, 4)
    before = adapted.SerializeToString()
    partial = CheckpointState(trainable={"W1.lora_A": np.zeros((4, 2), np.float32)})
    with pytest.raises(ValueError, match=re.escape("the checkpoint lacks the adapters ['W1.lora_B', 'W2.lora_A'")):
        merge_adapters(adapted, partial)
    assert adapted.SerializeToString() == before
    with pytest.raises(ValueError, match=re.escape("no onnxtrain.lora record")):
        merge_adapters(model, partial)
    with pytest.raises(ValueError, match="no checkpoint at"):
        merge_adapters(adapted, tmp_path / "missing")
    with pytest.raises(TypeError, match="checkpoint_state must be"):
        merge_adapters(adapted, {"W1.lora_A": 0})  # type: ignore[arg-type]
    wrong = CheckpointState(trainable={name: np.zeros((3, 3), np.float32) for name in names})
    with pytest.raises(ValueError, match="belongs to another adapted model"):
        merge_adapters(adapted, wrong)


def test_a_transposed_weight_read_elsewhere_is_refused() -> None:
    """``MatMul(x, Transpose(W))`` is a site only when the Transpose feeds that product alone."""
    model = small_model()
    model.graph.node[1].input[1] = "W1t"
    model.graph.node.insert(1, helper.make_node("Transpose", ["W1"], ["W1t"], name="/fc/Transpose"))
    model.graph.initializer[1].CopyFrom(onnx.numpy_helper.from_array(np.ones((3, 4), np.float32), "W1"))
    add_adapters(model, "W1", 2, 4)  # the product alone reads it: fine
    model.graph.node.append(helper.make_node("Identity", ["W1t"], ["w1t_copy"]))
    model.graph.output.append(helper.make_tensor_value_info("w1t_copy", TensorProto.FLOAT, [4, 3]))
    with pytest.raises(ValueError, match=re.escape("'W1': read by Transpose node '/fc/Transpose' as input 0, whose")):
        add_adapters(model, "fc", 2, 4)


def test_a_module_without_an_adaptable_weight_names_what_it_matched() -> None:
    model = small_model()
    for node, name in zip(model.graph.node, ["/emb/Gather", "/fc1/MatMul", "/fc2/Gemm"], strict=True):
        node.name = name
    with pytest.raises(ValueError, match=re.escape("'E': read by Gather node '/emb/Gather' as input 0")):
        add_adapters(model, "emb", 2, 4)
    with pytest.raises(ValueError, match=re.escape("['W1', 'W2'], in the modules ['fc1', 'fc2']")):
        add_adapters(model, "attn", 2, 4)


def test_merge_refuses_a_value_of_another_shape() -> None:
    adapted, names = add_adapters(small_model(), "W1", 2, 4)
    values = {
        name: np.zeros([*next(t.dims for t in adapted.graph.initializer if t.name == name)], np.float32)
        for name in names
    }
    wrong = CheckpointState(trainable=values, frozen={"b": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match=re.escape("the checkpoint's b is float32[3] and the model's float32[2]")):
        merge_adapters(adapted, wrong)


def test_a_weight_read_both_ways_round_is_refused() -> None:
    """``MatMul(x, W)`` reads ``W`` as ``[in, out]``, ``Gemm(x, W, transB=1)`` as ``[out, in]``: one adapter
    ``A B`` cannot be both updates."""
    weight = onnx.numpy_helper.from_array(np.eye(3, dtype=np.float32), "W")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["y1"], name="/a/MatMul"),
        helper.make_node("Gemm", ["x", "W"], ["y2"], name="/b/Gemm", transB=1),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    outputs = [helper.make_tensor_value_info(y, TensorProto.FLOAT, [2, 3]) for y in ("y1", "y2")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], outputs, [weight]))
    with pytest.raises(
        ValueError,
        match=re.escape("'W': read as [in, out] by MatMul node '/a/MatMul' as input 1 and as [out, in] by Gemm"),
    ):
        add_adapters(model, "W", 2, 4)


def test_a_pattern_matching_many_non_weights_names_the_matrix_first() -> None:
    """A pattern that matches a weight read the wrong way and its quantization's scalars: the weight's reason
    comes first, however the names sort, and the count of the others is said."""
    scalars = [f"proj.a{k}" for k in range(6)]  # sort before 'proj.weight'
    nodes = [helper.make_node("Transpose", ["proj.weight"], ["wt"]), helper.make_node("Mul", ["x", "wt"], ["y0"])]
    for k, name in enumerate(scalars):
        nodes.append(helper.make_node("Mul", [f"y{k}", name], [f"y{k + 1}"]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
        [helper.make_tensor_value_info(f"y{len(scalars)}", TensorProto.FLOAT, [3, 3])],
        [onnx.numpy_helper.from_array(np.ones((3, 3), np.float32), "proj.weight")]
        + [onnx.numpy_helper.from_array(np.float32(2.0), name) for name in scalars],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ValueError, match=r"it matches 'proj\.weight': .*\(and 2 more\)"):
        add_adapters(model, "proj.*", 2, 4)
