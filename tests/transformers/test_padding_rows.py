"""Batches with padding tokens: the padding row of an embedding gets no gradient from its lookup, as in torch.

BERT, DistilBERT and Llama embed their tokens with ``nn.Embedding(padding_idx=0)``
(``pad_token_id=0``), which torch's backward leaves out of row 0. torch's
dynamo exporter records ``padding_idx`` on the lookup's FX node, which
``generate_artifacts`` reads; TorchScript's loses it, and
``set_padding_idx`` puts it back. With token 0 in the batch, one step's loss
and every parameter's gradient must equal torch autograd's, row 0 included.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from onnxtrain import api, artifacts
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


def test_set_padding_idx_gives_a_torchscript_export_torchs_padding_row(tmp_path: Path) -> None:
    exported = models.exported("bert")
    model = onnx.ModelProto()
    model.CopyFrom(exported.model)
    assert artifacts.set_padding_idx(model, TABLES["bert"], 0) == 1
    exported.module.load_state_dict(exported.state)
    _assert_as_torch("bert", _trained_step(model, "bert", tmp_path), _torch_step(exported.module, "bert"))
