"""``broadcast_parameters`` compares the ranks' states first: with another optimizer (moments) or another
shape on one rank, the ranks hung forever in the broadcasts or aborted with MPI's "message truncated"."""

from __future__ import annotations

import pytest

from onnxtrain.distributed.state import _first_difference

TENSORS = [("fc.weight", "float32", (4, 3)), ("fc.bias", "float32", (4,))]
MOMENTS = {"fc.bias": 2, "fc.weight": 2}


@pytest.mark.parametrize(
    ("theirs", "said"),
    [
        ((TENSORS, MOMENTS), ""),
        ((TENSORS[:1], {"fc.weight": 2}), "here only: ['fc.bias']"),
        (([("fc.weight", "float32", (4, 5)), TENSORS[1]], MOMENTS), "'fc.weight' is float32[4, 3] here, "),
        (([("fc.weight", "float64", (4, 3)), TENSORS[1]], MOMENTS), "float64[4, 3] on the root"),
        ((TENSORS, None), "an optimizer state is made here only"),
        ((TENSORS, {"fc.bias": 1, "fc.weight": 1}), "moments {'fc.bias': 2, 'fc.weight': 2} here"),
    ],
)
def test_the_first_difference_is_named(theirs: tuple, said: str) -> None:
    difference = _first_difference((TENSORS, MOMENTS), theirs)
    assert (said in difference) if said else difference == ""


def test_one_rank_agrees_with_itself(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The layout of a state with an AdamW: every parameter with its two moments; one rank broadcasts."""
    pytest.importorskip("mpi4py")
    import numpy as np
    from onnx import helper

    from onnxtrain import api, artifacts, distributed
    from onnxtrain.distributed.state import _layout
    from tests.helpers import FLOAT, make_model

    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    model = make_model({"x": (FLOAT, ["N", 3])}, nodes, ["y"], initializers=[("w", np.ones((3, 2), np.float32))])
    paths = artifacts.generate_artifacts(
        model, requires_grad=["w"], loss=artifacts.LossType.MSELoss, optimizer=artifacts.OptimType.AdamW,
        artifact_directory=tmp_path,
    )  # fmt: skip
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state)
    assert _layout(state) == ([("w", "float32", (3, 2))], None)
    api.Optimizer(paths["optimizer_model"], module)
    assert _layout(state) == ([("w", "float32", (3, 2))], {"w": 2})
    distributed.broadcast_parameters(state, root=0)
