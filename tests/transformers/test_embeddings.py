"""torch's ``nn.Embedding`` rules in exported models: one step's loss and every gradient equal torch's.

BERT, DistilBERT and Llama embed their tokens with ``nn.Embedding(padding_idx=0)``
(``pad_token_id=0``), which torch's backward leaves out of row 0. torch's
dynamo exporter records ``padding_idx`` on the lookup's FX node, which
``generate_artifacts`` reads; TorchScript's loses it, and ``set_embedding``
puts it back. With token 0 in the batch, one step's loss and every
parameter's gradient must equal torch autograd's, row 0 included. The same
for a small model whose embedding also scales its gradient by the tokens'
counts (``scale_grad_by_freq=True``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from onnxtrain import api, artifacts
from tests.helpers import export_for_training
from tests.transformers import models, train

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

#: The models with a padding row, and the initializer of the table that has it.
TABLES = {
    "bert": "model.bert.embeddings.word_embeddings.weight",
    "distilbert": "model.distilbert.embeddings.word_embeddings.weight",
    "llama": "model.model.embed_tokens.weight",
}


def _padded_batch(name: str) -> dict[str, np.ndarray]:
    """The usual batch with the last three positions of each sequence the padding token 0."""
    data = models.batch(name, np.random.default_rng(7), models.LENGTHS[-1])
    data["ids"][:, -3:] = 0
    return data


def _trained_step(model: onnx.ModelProto, name: str, directory: Path) -> tuple[float, dict[str, np.ndarray]]:
    weights = artifacts.trainable_parameters(model)
    paths = train.write_artifacts(models.save(model, directory, name), weights, directory / "artifacts")
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state, paths["eval_model"], session_options=train.session_options())
    trained = train.Trained(paths, state, module, None)
    loss = train.step(trained, _padded_batch(name))
    return loss, train.gradients(trained, weights)


def _torch_step(module: Any, name: str) -> tuple[float, dict[str, np.ndarray]]:
    data = _padded_batch(name)
    module.zero_grad(set_to_none=True)
    logits = module(torch.from_numpy(data["ids"]))
    loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(data["labels"]))
    loss.backward()
    grads = {n: p.grad.detach().numpy().copy() for n, p in module.named_parameters(remove_duplicate=False)}
    return float(loss.item()), grads


def _assert_as_torch(name: str, got: tuple[float, dict[str, np.ndarray]], want: tuple[float, dict]) -> None:
    (loss, grads), (want_loss, want_grads) = got, want
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5, err_msg=f"{name}: loss")
    table = TABLES[name]
    assert not want_grads[table][0].any()  # torch's rule: the padding row has no gradient
    assert want_grads[table][1:].any()
    for weight, grad in grads.items():
        models.assert_grad_close(grad, want_grads[weight], f"{name}: d loss / d {weight}")


@pytest.mark.parametrize("name", list(TABLES))
def test_a_dynamo_export_keeps_torchs_padding_row(name: str, tmp_path: Path) -> None:
    pytest.importorskip("onnxscript")
    model = models.dynamo_export(name, optimize=False)
    _assert_as_torch(name, _trained_step(model, name, tmp_path), _torch_step(models.fresh_module(name), name))


def test_set_embedding_gives_a_torchscript_export_torchs_padding_row(tmp_path: Path) -> None:
    exported = models.exported("bert")
    model = onnx.ModelProto()
    model.CopyFrom(exported.model)
    assert artifacts.set_embedding(model, TABLES["bert"], padding_idx=0) == 1
    exported.module.load_state_dict(exported.state)
    _assert_as_torch("bert", _trained_step(model, "bert", tmp_path), _torch_step(exported.module, "bert"))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_an_embedding_scaled_by_frequency_trains_as_torchs(exporter: str, tmp_path: Path) -> None:
    """``nn.Embedding(20, 8, padding_idx=1, scale_grad_by_freq=True)``, mean-pooled, then a linear classifier;
    tokens repeated within the batch, padding ones included."""

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = torch.nn.Embedding(20, 8, padding_idx=1, scale_grad_by_freq=True)
            self.head = torch.nn.Linear(8, 3)

        def forward(self, ids: Any) -> Any:
            return self.head(self.embedding(ids).mean(dim=1))

    torch.manual_seed(0)
    module = Pooled().train()
    ids = np.array([[2, 5, 5, 1, 1], [5, 7, 2, 9, 1], [3, 3, 3, 1, 1]])
    labels = np.array([0, 2, 1])
    example = torch.from_numpy(ids[:2])
    path = tmp_path / "pooled.onnx"
    if exporter == "dynamo":
        pytest.importorskip("onnxscript")
        dims = {"ids": {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}}
        program = torch.onnx.export(module, (example,), dynamo=True, optimize=False, input_names=["ids"],
                                    output_names=["y"], dynamic_shapes=dims, verbose=False)  # fmt: skip
        model = program.model_proto
    else:  # TorchScript refuses to export scale_grad_by_freq in training mode: exported without, marked after
        module.embedding.scale_grad_by_freq = False
        model = export_for_training(module, (example,), ["ids"], ["y"], opset=models.OPSET,
                                    dynamic_axes={"ids": {0: "batch", 1: "seq"}, "y": {0: "batch"}})  # fmt: skip
        module.embedding.scale_grad_by_freq = True
        artifacts.set_embedding(model, "embedding.weight", padding_idx=1, scale_grad_by_freq=True)
    onnx.save(model, path)
    weights = artifacts.trainable_parameters(model)
    paths = train.write_artifacts(path, weights, tmp_path / "artifacts")
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    trained = train.Trained(paths, state, api.Module(paths["training_model"], state, paths["eval_model"]), None)
    loss = train.step(trained, {"ids": ids, "labels": labels})

    module.zero_grad(set_to_none=True)
    want = torch.nn.functional.cross_entropy(module(torch.from_numpy(ids)), torch.from_numpy(labels))
    want.backward()
    np.testing.assert_allclose(loss, float(want.item()), rtol=1e-5)
    expected = {n: p.grad.numpy() for n, p in module.named_parameters()}
    assert not expected["embedding.weight"][1].any() and expected["embedding.weight"][3].any()
    for weight, grad in train.gradients(trained, weights).items():
        models.assert_grad_close(grad, expected[weight], f"{exporter}: d loss / d {weight}")
