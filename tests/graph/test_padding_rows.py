"""An embedding's padding row (torch's ``padding_idx``): which lookups have one, and their gradient without it.

The lookups are written by hand, with the FX node torch's dynamo exporter
records or with ``set_padding_idx``'s mark, so that the rules are checked
without torch; ``tests/transformers/test_padding_rows.py`` checks torch's own
exports against torch's gradients.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

from onnxtrain.autodiff import build_gradients
from onnxtrain.graph import GraphBuilder
from onnxtrain.graph.padding_rows import PADDING_IDX_KEY, padding_row, set_padding_idx
from onnxtrain.graph.torch_metadata import FX_NODE_KEY, embedding_padding_idx
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
    ("fx", "row"),
    [
        (_fx("%p_emb_weight, %ids, 0"), 0),
        (_fx("%p_emb_weight, %ids, 7"), 7),
        (_fx("%p_emb_weight, %ids"), None),  # no padding_idx
        (_fx("%p_emb_weight, %ids, -1"), None),  # aten's "none"
        (_fx("%p_emb_weight, %ids", "padding_idx: 3"), 3),
        (_fx("%p_emb_weight, %ids, 2, True"), 2),  # scale_grad_by_freq after it
        (_fx("%p_weight, %ids, 0", target="aten.index_select.default"), None),  # another call
    ],
)
def test_torchs_padding_idx_is_read_from_the_fx_node(fx: str, row: int | None) -> None:
    assert embedding_padding_idx(_gather(fx)) == row
    assert padding_row(_gather(fx)) == row


def test_only_a_gather_of_axis_0_has_a_padding_row() -> None:
    assert padding_row(_gather(_fx("%p_w, %ids, 0"), axis=1)) is None
    other = helper.make_node("GatherElements", ["table", "ids"], ["rows"])
    other.metadata_props.add(key=PADDING_IDX_KEY, value="0")
    assert padding_row(other) is None
    assert padding_row(_gather()) is None


def lookup_model(rows: int = 6, width: int = 3, *, reads: int = 1, axis: int = 0) -> onnx.ModelProto:
    table = np.arange(rows * width, dtype=np.float32).reshape(rows, width)
    nodes = [helper.make_node("Gather", ["table", "ids"], [f"r{i}"], axis=axis) for i in range(reads)]
    outputs = {f"r{i}": (FLOAT, None) for i in range(reads)}
    return make_model({"ids": (INT64, ["n"])}, nodes, outputs, [("table", table)])


def test_set_padding_idx_marks_every_lookup_of_the_table_and_overrides_torchs() -> None:
    model = lookup_model(reads=2)
    model.graph.node[0].metadata_props.add(key=FX_NODE_KEY, value=_fx("%p_table, %ids, 1"))
    assert set_padding_idx(model, "table", -1) == 2  # torch's nn.Embedding: -1 is the last row
    assert [padding_row(node) for node in model.graph.node] == [5, 5]
    assert set_padding_idx(model, "table", 2) == 2  # marked again: one entry each
    assert [[p.key for p in n.metadata_props].count(PADDING_IDX_KEY) for n in model.graph.node] == [1, 1]
    set_padding_idx(model, "table", None)  # none, whatever torch's metadata says
    assert [padding_row(node) for node in model.graph.node] == [None, None]


@pytest.mark.parametrize(
    ("weight", "padding_idx", "error", "match"),
    [
        ("nothing", 0, ValueError, "'nothing' is not an initializer"),
        ("table", 6, ValueError, "padding_idx 6 is not a row of 'table' \\(6 rows\\)"),
        ("table", -7, ValueError, "padding_idx -7 is not a row"),
        ("table", True, TypeError, "must be an int or None, not bool"),
        ("table", 1.0, TypeError, "must be an int or None, not float"),
    ],
)
def test_set_padding_idx_refuses_what_names_no_row(weight: str, padding_idx: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        set_padding_idx(lookup_model(), weight, padding_idx)  # type: ignore[arg-type]


def test_set_padding_idx_needs_a_lookup_of_the_table() -> None:
    with pytest.raises(ValueError, match="no Gather of axis 0 reads 'table'"):
        set_padding_idx(lookup_model(axis=1), "table", 0)


def _gradient(table: np.ndarray, ids: np.ndarray, seed: np.ndarray, padding_idx: int | None) -> np.ndarray:
    """d sum(Gather(table, ids) * seed) / d table, with the lookup's padding row ``padding_idx``."""
    width = table.shape[1]
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["rows"]),
        helper.make_node("Mul", ["rows", "seed"], ["weighted"]),
        helper.make_node("ReduceSum", ["weighted"], ["loss"], keepdims=0),
    ]
    inputs = {"table": (DOUBLE, [None, width]), "ids": (INT64, list(ids.shape)), "seed": (DOUBLE, list(seed.shape))}
    model = make_model(inputs, nodes, {"loss": (DOUBLE, [])})
    if padding_idx is not None:
        model.graph.node[0].metadata_props.add(key=PADDING_IDX_KEY, value=str(padding_idx))
    builder = GraphBuilder(model)
    grads = build_gradients(builder, "loss", ["table"])
    builder.model.graph.output.append(helper.make_tensor_value_info(grads["table"], onnx.TensorProto.DOUBLE, None))
    (grad,) = run_model(builder.model, {"table": table, "ids": ids, "seed": seed})[1:]
    return grad


@given(
    rows=st.integers(1, 6),
    shape=st.sampled_from([(5,), (2, 3), (2, 2, 2)]),
    padding=st.integers(-1, 5),
    seed=st.integers(0, 2**16),
)
def test_the_padding_row_gets_no_gradient_from_the_lookup(
    rows: int, shape: tuple[int, ...], padding: int, seed: int
) -> None:
    """Against torch's rule in NumPy: every position adds its seed to its row, but those whose index is the
    padding row; negative indices count as ``rows + index``. ``padding = -1``: no padding row."""
    rng = np.random.default_rng(seed)
    padding_idx = None if padding < 0 else padding % rows
    table = rng.normal(size=(rows, 3))
    ids = rng.integers(-rows, rows, size=shape)
    grad_seed = rng.normal(size=(*shape, 3))
    expected = np.zeros_like(table)
    for position in np.ndindex(shape):
        row = ids[position] % rows
        if row != padding_idx:
            expected[row] += grad_seed[position]
    np.testing.assert_allclose(_gradient(table, ids, grad_seed, padding_idx), expected, rtol=1e-12, atol=1e-12)
