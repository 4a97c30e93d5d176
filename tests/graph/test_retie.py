"""A tied weight whose transpose the exporter folded into a second initializer is trained as one weight.

torch's TorchScript exporter with constant folding (its default, and Hugging
Face Optimum's) stores a language model's head, the embedding transposed, as
a constant ``onnx::MatMul_N``. The promise: such a copy is found by value
(not two zero matrices, not two unrelated weights of transposed shapes),
read as ``Transpose(embedding)`` again, so that both uses train the
embedding as torch does; naming the copy in ``requires_grad`` is a clear
error; the model computes what it computed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnxtrain import api, artifacts
from onnxtrain.graph.external import TensorData
from onnxtrain.graph.passes.retie import tie_transposed_copies, transposed_copies
from tests.graph.inference_exports import assert_trains_as_torch, export_for_inference
from tests.helpers import FLOAT, INT64, make_model, run_model

VOCAB, WIDTH = 7, 5


def _tied(copy_name: str = "onnx::MatMul_9", zeros: bool = False) -> onnx.ModelProto:
    """``logits = Gather(embedding, ids) @ w @ u @ copy``, ``copy`` the embedding transposed; ``w`` and ``u``, a pair
    of transposed shapes that are not each other's transpose."""
    rng = np.random.default_rng(0)
    embedding = np.zeros((VOCAB, WIDTH), np.float32) if zeros else rng.normal(size=(VOCAB, WIDTH)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["embedding", "ids"], ["h"]),
        helper.make_node("MatMul", ["h", "w"], ["h1"]),
        helper.make_node("MatMul", ["h1", "u"], ["h2"]),
        helper.make_node("MatMul", ["h2", copy_name], ["logits"]),
    ]
    return make_model(
        {"ids": (INT64, ["n"])},
        nodes,
        {"logits": (FLOAT, ["n", VOCAB])},
        [
            ("embedding", embedding),
            ("w", rng.normal(size=(WIDTH, 3)).astype(np.float32)),
            ("u", rng.normal(size=(3, WIDTH)).astype(np.float32)),
            (copy_name, embedding.T.copy()),
        ],
    )


def test_the_folded_transpose_of_a_tied_weight_is_found_and_read_as_computed_again():
    model = _tied()
    assert transposed_copies(model) == {"onnx::MatMul_9": "embedding"}
    ids = np.array([0, 3, 6, 3])
    want = run_model(model, {"ids": ids})
    tied = tie_transposed_copies(onnx.load_from_string(model.SerializeToString()))
    assert "onnx::MatMul_9" not in {t.name for t in tied.graph.initializer}
    transpose = tied.graph.node[0]
    assert (transpose.op_type, list(transpose.input), list(transpose.output)) == (
        "Transpose", ["embedding"], ["onnx::MatMul_9"],
    )  # fmt: skip
    np.testing.assert_array_equal(run_model(tied, {"ids": ids})[0], want[0])
    assert artifacts.trainable_parameters(model) == ["embedding", "w", "u"]


def test_zero_matrices_and_weights_of_transposed_shapes_are_not_tied():
    assert transposed_copies(_tied(zeros=True)) == {}  # w and u: shapes [5, 3] and [3, 5], other values


def test_of_two_named_alike_the_later_is_the_copy():
    assert transposed_copies(_tied(copy_name="head.weight")) == {"head.weight": "embedding"}


def test_a_copy_in_a_file_is_found_by_reading_a_few_elements_and_naming_it_is_an_error(tmp_path: Path):
    path = tmp_path / "model.onnx"
    onnx.save(_tied(), str(path), save_as_external_data=True, all_tensors_to_one_file=True, size_threshold=0)
    light = onnx.load(str(path), load_external_data=False)
    assert transposed_copies(light, TensorData(base_dir=tmp_path)) == {"onnx::MatMul_9": "embedding"}
    assert artifacts.trainable_parameters(path) == ["embedding", "w", "u"]
    with pytest.raises(ValueError, match=r"transpose of \['embedding'\].*name \['embedding'\] instead"):
        artifacts.build_artifacts(path, requires_grad=["onnx::MatMul_9"], loss=artifacts.LossType.MSELoss)
    paths = artifacts.generate_artifacts(
        path, requires_grad=["embedding"], frozen_params=["w", "u"], loss=artifacts.LossType.MSELoss,
        optimizer="SGD", artifact_directory=tmp_path / "artifacts",
    )  # fmt: skip
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    assert {name for name, parameter in state.parameters if parameter.requires_grad} == {"embedding"}
    assert "onnx::MatMul_9" not in state.parameters


def test_a_tied_language_model_exported_with_constant_folding_trains_its_embedding_as_torch(tmp_path: Path):
    torch = pytest.importorskip("torch")

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = torch.nn.Embedding(VOCAB, WIDTH)
            self.mix = torch.nn.Linear(WIDTH, WIDTH)
            self.head = torch.nn.Linear(WIDTH, VOCAB, bias=False)
            self.head.weight = self.embedding.weight

        def forward(self, ids):
            return self.head(torch.tanh(self.mix(self.embedding(ids))))

    torch.manual_seed(0)
    module = Tied()
    model = export_for_inference(module, torch.tensor([1, 2]), ["ids"], ["logits"])
    folded = [t.name for t in model.graph.initializer if t.name.startswith("onnx::")]
    assert folded, "the exporter no longer folds the head's transpose: the test needs a folded copy"
    batch = {"ids": np.array([0, 3, 6, 3, 1]), "labels": np.array([2, 2, 5, 0, 6])}
    state = assert_trains_as_torch(  # the head is the embedding: one parameter, whose gradient holds both parts
        model, module, artifacts.LossType.CrossEntropyLoss, torch.nn.functional.cross_entropy, batch, tmp_path
    )
    embedding = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "embedding.weight"))
    np.testing.assert_array_equal(state.parameters["embedding.weight"].data, embedding)
