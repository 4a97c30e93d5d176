"""torch's ``nn.Embedding`` rules (``padding_idx``, ``scale_grad_by_freq``): which lookups follow them, and
their gradient.

The lookups are written by hand, with the FX node torch's dynamo exporter
records or with ``set_embedding``'s marks, so that the rules are checked
without torch; ``tests/transformers/test_embeddings.py`` checks torch's own
exports against torch's gradients.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

from onnxtrain import api
from onnxtrain.artifacts import LossType, generate_artifacts
from onnxtrain.autodiff import build_gradients
from onnxtrain.graph import GraphBuilder
from onnxtrain.graph.embeddings import (
    PADDING_IDX_KEY,
    SCALE_GRAD_BY_FREQ_KEY,
    EmbeddingRule,
    embedding_rule,
    set_embedding,
)
from onnxtrain.graph.torch_metadata import FX_NODE_KEY, embedding_arguments
from tests.helpers import DOUBLE, FLOAT, INT64, make_model, run_model


def _fx(args: str, kwargs: str = "", target: str = "aten.embedding.default") -> str:
    return (
        f"%embedding : [num_users=1] = call_function[target=torch.ops.{target}](args = ({args}), kwargs = {{{kwargs}}})"
    )


def _gather(fx: str | None = None, axis: int = 0) -> onnx.NodeProto:
    node = helper.make_node("Gather", ["table", "ids"], ["rows"], name="lookup", axis=axis)
    if fx is not None:
        node.metadata_props.add(key=FX_NODE_KEY, value=fx)
    return node


@pytest.mark.parametrize(
    ("fx", "arguments"),
    [
        (_fx("%p_emb_weight, %ids, 0"), (0, False)),
        (_fx("%p_emb_weight, %ids, 7"), (7, False)),
        (_fx("%p_emb_weight, %ids"), (None, False)),  # aten's defaults
        (_fx("%p_emb_weight, %ids, -1"), (None, False)),  # aten's "none"
        (_fx("%p_emb_weight, %ids", "padding_idx: 3"), (3, False)),
        (_fx("%p_emb_weight, %ids, 2, True"), (2, True)),
        (_fx("%p_emb_weight, %ids, -1, True"), (None, True)),
        (_fx("%p_emb_weight, %ids", "padding_idx: 1, scale_grad_by_freq: True"), (1, True)),
        (_fx("%p_weight, %ids, 0", target="aten.index_select.default"), None),  # another call
    ],
)
def test_torchs_arguments_are_read_from_the_fx_node(fx: str, arguments: tuple[int | None, bool] | None) -> None:
    assert embedding_arguments(_gather(fx)) == arguments
    assert embedding_rule(_gather(fx)) == (EmbeddingRule() if arguments is None else EmbeddingRule(*arguments))


def test_only_a_gather_of_axis_0_follows_a_rule() -> None:
    assert not embedding_rule(_gather(_fx("%p_w, %ids, 0, True"), axis=1))
    other = helper.make_node("GatherElements", ["table", "ids"], ["rows"])
    other.metadata_props.add(key=PADDING_IDX_KEY, value="0")
    assert not embedding_rule(other)
    assert not embedding_rule(_gather())


def lookup_model(rows: int = 6, width: int = 3, *, reads: int = 1, axis: int = 0) -> onnx.ModelProto:
    table = np.arange(rows * width, dtype=np.float32).reshape(rows, width)
    nodes = [helper.make_node("Gather", ["table", "ids"], [f"r{i}"], axis=axis) for i in range(reads)]
    outputs = {f"r{i}": (FLOAT, None) for i in range(reads)}
    return make_model({"ids": (INT64, ["n"])}, nodes, outputs, [("table", table)])


def test_set_embedding_marks_every_lookup_of_the_table_and_overrides_torchs() -> None:
    model = lookup_model(reads=2)
    model.graph.node[0].metadata_props.add(key=FX_NODE_KEY, value=_fx("%p_table, %ids, 1, True"))
    assert set_embedding(model, "table", padding_idx=-1) == 2  # torch's nn.Embedding: -1 is the last row
    assert [embedding_rule(node) for node in model.graph.node] == [EmbeddingRule(5, False)] * 2
    assert set_embedding(model, "table", padding_idx=2, scale_grad_by_freq=True) == 2  # marked again: once each
    assert [embedding_rule(node) for node in model.graph.node] == [EmbeddingRule(2, True)] * 2
    keys = [[p.key for p in n.metadata_props] for n in model.graph.node]
    assert [k.count(PADDING_IDX_KEY) + k.count(SCALE_GRAD_BY_FREQ_KEY) for k in keys] == [2, 2]
    set_embedding(model, "table")  # Gather's own gradient, whatever torch's metadata says
    assert not any(embedding_rule(node) for node in model.graph.node)
    assert EmbeddingRule(2, True).describe() == "padding row 2, gradient scaled by frequency"


@pytest.mark.parametrize(
    ("weight", "options", "error", "match"),
    [
        ("nothing", {"padding_idx": 0}, ValueError, "'nothing' is not an initializer.*lookups read: .*'table'"),
        ("tabel", {}, ValueError, "did you mean 'table'"),
        ("table", {"padding_idx": 6}, ValueError, "padding_idx 6 is not a row of 'table' \\(6 rows\\)"),
        ("table", {"padding_idx": -7}, ValueError, "padding_idx -7 is not a row"),
        ("table", {"padding_idx": True}, TypeError, "must be an int or None, not bool"),
        ("table", {"padding_idx": 1.0}, TypeError, "must be an int or None, not float"),
        ("table", {"scale_grad_by_freq": 1}, TypeError, "scale_grad_by_freq must be a bool, not int"),
    ],
)
def test_set_embedding_refuses_what_names_no_row(weight: str, options: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        set_embedding(lookup_model(), weight, **options)


def test_set_embedding_needs_a_lookup_of_the_table() -> None:
    with pytest.raises(ValueError, match="no Gather of axis 0 reads 'table'"):
        set_embedding(lookup_model(axis=1), "table", padding_idx=0)


def _gradient(table: np.ndarray, ids: np.ndarray, seed: np.ndarray, rule: EmbeddingRule, opset: int) -> np.ndarray:
    """d sum(Gather(table, ids) * seed) / d table, the lookup following ``rule``."""
    width = table.shape[1]
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["rows"]),
        helper.make_node("Mul", ["rows", "seed"], ["weighted"]),
        helper.make_node("ReduceSum", ["weighted"], ["loss"], keepdims=0),
    ]
    inputs = {"table": (DOUBLE, [None, width]), "ids": (INT64, list(ids.shape)), "seed": (DOUBLE, list(seed.shape))}
    model = make_model(inputs, nodes, {"loss": (DOUBLE, [])}, opset=opset)
    padding = -1 if rule.padding_idx is None else rule.padding_idx
    model.graph.node[0].metadata_props.add(key=PADDING_IDX_KEY, value=str(padding))
    model.graph.node[0].metadata_props.add(key=SCALE_GRAD_BY_FREQ_KEY, value="01"[rule.scale_grad_by_freq])
    builder = GraphBuilder(model)
    grads = build_gradients(builder, "loss", ["table"])
    builder.model.graph.output.append(helper.make_tensor_value_info(grads["table"], onnx.TensorProto.DOUBLE, None))
    (grad,) = run_model(builder.model, {"table": table, "ids": ids, "seed": seed})[1:]
    return grad


@given(
    rows=st.integers(1, 6),
    shape=st.sampled_from([(5,), (2, 3), (2, 2, 2)]),
    padding=st.integers(-1, 5),
    scale=st.booleans(),
    opset=st.sampled_from([13, 18]),  # below 16 scatters cannot add: the counts are summed by key
    seed=st.integers(0, 2**16),
)
def test_the_lookup_follows_torchs_rules(
    rows: int, shape: tuple[int, ...], padding: int, scale: bool, opset: int, seed: int
) -> None:
    """Against torch's rules in NumPy: each position adds its seed to its row, divided by the number of positions
    of that row (padding ones included) with ``scale_grad_by_freq``, and not at all where the row is the
    padding row; negative indices count as ``rows + index``. ``padding = -1``: no padding row."""
    rng = np.random.default_rng(seed)
    rule = EmbeddingRule(None if padding < 0 else padding % rows, scale)
    table = rng.normal(size=(rows, 3))
    ids = rng.integers(-rows, rows, size=shape)
    grad_seed = rng.normal(size=(*shape, 3))
    counts = np.bincount((ids % rows).ravel(), minlength=rows)
    expected = np.zeros_like(table)
    for position in np.ndindex(shape):
        row = ids[position] % rows
        if row != rule.padding_idx:
            expected[row] += grad_seed[position] / (counts[row] if scale else 1)
    np.testing.assert_allclose(_gradient(table, ids, grad_seed, rule, opset), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("opset", [11, 12, 13])
def test_set_embedding_outlives_the_conversion_of_an_older_opset(tmp_path: Path, opset: int) -> None:
    """onnx's version converter drops the nodes' ``metadata_props``; the lookup still leaves its padding row
    out once the model is converted to opset 13 (a named lookup, as torch names them, and an unnamed one)."""
    model = lookup_model(reads=2)
    model.opset_import[0].version = opset
    model.graph.node[0].name = "/embed/Gather"
    model.graph.node.append(helper.make_node("Add", ["r0", "r1"], ["y"]))
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("y", FLOAT, None))
    set_embedding(model, "table", padding_idx=2)
    generate_artifacts(model, requires_grad=["table"], loss=LossType.L1Loss, artifact_directory=tmp_path)
    training = onnx.load(tmp_path / "training_model.onnx")
    assert [n.name for n in training.graph.node if n.op_type == "Gather"][:2] == ["/embed/Gather", ""]
    state = api.CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = api.Module(tmp_path / "training_model.onnx", state)
    ids = np.array([2, 0, 2, 5])
    module(ids, np.full((4, 3), -1.0, np.float32))
    grad = state.parameters["table"].grad
    assert np.all(grad[2] == 0) and np.all(grad[[0, 5]] != 0)
