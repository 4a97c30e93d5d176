"""Hugging Face transformers exported by torch's default exporter (dynamo) train as torch does, or are said not to.

A model fresh from transformers' initialisation has every norm weight all
ones and every bias all zeros. ``torch.onnx.export(..., dynamo=True)`` with
its default ``optimize=True`` merges initializers of equal values, drops the
zero biases and folds transposed weights into new constants: training that
graph ties some of torch's parameters and cannot train others, so
``generate_artifacts`` says so (``TorchExportWarning``) and names every
parameter concerned, and a missing parameter named in ``requires_grad`` is
explained in the error. With ``optimize=False`` nothing is said, every torch
parameter is an initializer under its own name, and the loss and the
gradient of each equal torch autograd's. Whatever ``optimize``, the exporter
writes BatchNorm in inference mode; a ResNet exported in ``.train()`` still
trains with its batch's statistics, as torch ran it.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

from onnxtrain import api, artifacts
from onnxtrain.artifacts import TorchExportWarning
from onnxtrain.graph.torch_metadata import parameter_changes
from tests.transformers import models, train
from tests.transformers.models import NAMES

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxscript")

#: The models whose fresh export the optimizer changes in each way (GPT-2: merged norms, dropped biases, the
#: tied head folded; Llama: merged RMSNorm weights, folded projections).
CHANGED = ("gpt2", "llama")


def _tied_names(module: Any) -> list[list[str]]:
    """torch's parameter names, those of one tensor (tied weights) together."""
    names: dict[int, list[str]] = {}
    for name, parameter in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), []).append(name)
    return list(names.values())


@pytest.mark.parametrize("name", CHANGED)
def test_the_optimized_export_of_a_fresh_model_is_said_to_change_its_parameters(name: str) -> None:
    model = models.dynamo_export(name, optimize=True)
    module = models.fresh_module(name)
    read = {name for node in model.graph.node for name in node.input}
    weights = artifacts.trainable_parameters(model)
    with pytest.warns(TorchExportWarning) as caught:
        artifacts.build_artifacts(model, requires_grad=weights, loss=artifacts.LossType.CrossEntropyLoss)
    message = str(caught[0].message)
    assert "optimize=False" in message and "Merged" in message, message
    initializers = {t.name for t in model.graph.initializer}
    # every parameter not read under its own name (merged into another, dropped, folded) is found
    lost = [names for names in _tied_names(module) if not any(n in initializers and n in read for n in names)]
    assert lost, f"{name}: the optimized export kept every parameter; the test needs one it changed"
    said = {parameter for change in parameter_changes(model) for parameter in change.parameters}
    unsaid = [names for names in lost if not said.intersection(names)]
    assert not unsaid, f"{name}: {unsaid} changed by the exporter, not found"
    assert any(n in message for n in lost[0]), f"{name}: {lost[0]} not named in {message!r}"
    missing = next(n for names in lost for n in names if n not in initializers)
    with pytest.raises(ValueError, match=r"torch\.onnx\.export's optimizer .* optimize=False"):
        artifacts.build_artifacts(model, requires_grad=[missing], loss=artifacts.LossType.CrossEntropyLoss)


def test_the_optimized_export_names_gpt2s_dropped_biases_and_merged_norms() -> None:
    model = models.dynamo_export("gpt2", optimize=True)
    with pytest.warns(TorchExportWarning) as caught:
        artifacts.build_artifacts(
            model, requires_grad=artifacts.trainable_parameters(model), loss=artifacts.LossType.CrossEntropyLoss
        )
    lines = str(caught[0].message).splitlines()
    dropped = next(line for line in lines if line.startswith("Dropped"))
    merged = next(line for line in lines if line.startswith("Merged"))
    assert "model.transformer.h.0.attn.c_attn.bias" in dropped
    assert "model.transformer.h.0.ln_2.weight" in merged and "read as model.transformer.h.0.ln_1.weight" in merged


@pytest.mark.parametrize("name", NAMES)
def test_the_unoptimized_export_trains_every_parameter_as_torch(name: str, tmp_path: Any) -> None:
    model = models.dynamo_export(name, optimize=False)
    module = models.fresh_module(name)
    weights = artifacts.trainable_parameters(model)
    tied = _tied_names(module)
    untrained = [names for names in tied if not set(names) & set(weights)]
    assert not untrained, f"{name}: {untrained} are not trainable initializers of the export"
    with warnings.catch_warnings():
        warnings.simplefilter("error", TorchExportWarning)
        paths = train.write_artifacts(models.save(model, tmp_path, name), weights, tmp_path / "artifacts")
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    trained = train.Trained(
        paths,
        state,
        api.Module(paths["training_model"], state, paths["eval_model"], session_options=train.session_options()),
        None,
    )
    data = models.batch(name, np.random.default_rng(7), models.LENGTHS[-1])
    loss = train.step(trained, data)

    module.zero_grad(set_to_none=True)
    logits = module(torch.from_numpy(data["ids"]))
    want = torch.nn.functional.cross_entropy(logits, torch.from_numpy(data["labels"]))
    want.backward()
    np.testing.assert_allclose(loss, float(want.item()), rtol=1e-5, err_msg=f"{name}: loss")
    parameters = dict(module.named_parameters(remove_duplicate=False))
    got = train.gradients(trained, weights)
    for weight in weights:
        expected = parameters[weight].grad.detach().numpy()
        models.assert_grad_close(got[weight], expected, f"{name}: d loss / d {weight}")


def test_a_resnet_in_training_mode_normalizes_with_its_batch_and_updates_its_statistics_as_torch(
    tmp_path: Any,
) -> None:
    """The exporter writes every BatchNorm of a ResNet exported in ``.train()`` in inference mode; trained as the
    FX nodes say torch ran them, the loss, every gradient and the running statistics equal torch's (the
    variances updated with the unbiased batch variance, as torch does: onnxtrain.artifacts.running_variance)."""
    import transformers

    config = transformers.ResNetConfig(
        num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="bottleneck", num_labels=3
    )
    torch.manual_seed(0)

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = transformers.ResNetForImageClassification(config)

        def forward(self, pixels: Any) -> Any:
            return self.model(pixel_values=pixels, return_dict=False)[0]

    module = Logits().train()
    state_before = {k: v.detach().clone() for k, v in module.state_dict().items()}
    rng = np.random.default_rng(7)
    pixels, labels = rng.standard_normal((3, 3, 16, 16)).astype(np.float32), rng.integers(0, 3, (3,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = torch.onnx.export(
            module, (torch.from_numpy(pixels),), dynamo=True, optimize=False, input_names=["ids"],
            output_names=["logits"], dynamic_shapes={"pixels": {0: torch.export.Dim("batch")}}, verbose=False,
        ).model_proto  # fmt: skip
    module.load_state_dict(state_before)  # the export ran the module once, in training mode
    weights = artifacts.trainable_parameters(model)
    assert sorted(weights) == sorted(name for name, _ in module.named_parameters())
    paths = train.write_artifacts(models.save(model, tmp_path, "resnet"), weights, tmp_path / "artifacts")
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module_ = api.Module(paths["training_model"], state, paths["eval_model"], session_options=train.session_options())
    loss = train.step(train.Trained(paths, state, module_, None), {"ids": pixels, "labels": labels})

    module.zero_grad(set_to_none=True)
    want = torch.nn.functional.cross_entropy(module(torch.from_numpy(pixels)), torch.from_numpy(labels))
    want.backward()
    np.testing.assert_allclose(loss, float(want.item()), rtol=1e-5, err_msg="loss")
    parameters = dict(module.named_parameters())
    for weight in weights:
        models.assert_grad_close(state.parameters[weight].grad, parameters[weight].grad.numpy(), f"d loss / d {weight}")
    statistics = [name for name in state_before if name.endswith(("running_mean", "running_var"))]
    assert statistics
    for name in statistics:
        np.testing.assert_allclose(state.parameters[name].data, module.state_dict()[name].numpy(), rtol=1e-5, atol=1e-6)
