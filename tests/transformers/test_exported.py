"""Hugging Face transformers, exported by torch, train with torch's gradients.

Each model of :mod:`tests.transformers.models` (BERT, DistilBERT, GPT-2,
Llama) is exported with symbolic batch and sequence axes; ``generate_artifacts``
(``requires_grad``: every parameter, cross-entropy on the logits, AdamW)
writes its artifacts once per session, and ``onnxtrain.api`` runs train steps
at two sequence lengths. The loss and the gradient of *every* parameter must
equal torch autograd's on the same batch, and AdamW steps must move every
parameter and lower the loss. The same holds with activation checkpointing
(``activation_checkpoints="auto"``), which must keep the layer boundaries and
recompute the rest of each layer in the backward.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxtrain.artifacts import step_memory
from tests.transformers import models, train
from tests.transformers.models import LENGTHS, NAMES

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("transformers")


#: ``generate_artifacts``' ``activation_checkpoints``: every activation kept, and layer boundaries alone.
CHECKPOINTING = (None, "auto")


@functools.cache
def _artifacts(name: str, directory: Path, checkpoints: str | None = None) -> dict[str, Path]:
    ex = models.exported(name)
    return train.write_artifacts(
        models.save(ex.model, directory, name),
        ex.parameters,
        directory / f"artifacts-{checkpoints}",
        activation_checkpoints=checkpoints,
    )


def _trained(name: str, directory: Path, checkpoints: str | None = None) -> train.Trained:
    return train.load(_artifacts(name, directory / name, checkpoints))


@pytest.mark.parametrize("checkpoints", CHECKPOINTING)
@pytest.mark.parametrize("name", NAMES)
def test_every_gradient_matches_torch_at_two_sequence_lengths(
    name: str, checkpoints: str | None, directory: Path
) -> None:
    trained = _trained(name, directory, checkpoints)
    ex = models.exported(name)
    trainable = {p for p, parameter in trained.state.parameters if parameter.requires_grad}
    assert trainable == set(ex.parameters), f"{name}: trainable {sorted(trainable)}, torch {sorted(ex.parameters)}"
    ids = onnx.load(trained.paths["training_model"], load_external_data=False).graph.input[0]
    dims = [d.dim_param for d in ids.type.tensor_type.shape.dim]
    assert dims == ["batch", "seq"], f"{name}: {ids.name} is {dims}, not (batch, seq)"
    rng = np.random.default_rng(7)
    for length in LENGTHS:
        data = models.batch(name, rng, length)
        loss = train.step(trained, data)
        want = models.torch_reference(ex, data)
        np.testing.assert_allclose(loss, want.loss, rtol=1e-5, err_msg=f"{name}, length {length}: loss")
        got = train.gradients(trained, ex.parameters)
        for param in ex.parameters:
            models.assert_grad_close(got[param], want.grads[param], f"{name}, length {length}: d loss / d {param}")


@pytest.mark.parametrize("checkpoints", CHECKPOINTING)
@pytest.mark.parametrize("name", NAMES)
def test_adamw_steps_move_every_parameter_and_lower_the_loss(
    name: str, checkpoints: str | None, directory: Path
) -> None:
    trained = _trained(name, directory, checkpoints)
    parameters = models.exported(name).parameters
    data = models.batch(name, np.random.default_rng(3), LENGTHS[-1])
    before = {p: trained.state.parameters[p].data.copy() for p in parameters}
    first = train.step(trained, data)
    trained.optimizer.step()
    unchanged = [p for p, v in before.items() if np.array_equal(trained.state.parameters[p].data, v)]
    assert not unchanged, f"{name}: AdamW left {unchanged} unchanged"
    for _ in range(3):
        train.step(trained, data)
        trained.optimizer.step()
    assert train.step(trained, data) < first, f"{name}: four AdamW steps on one batch did not lower the loss"


@pytest.mark.parametrize("name", NAMES)
def test_checkpointing_keeps_a_fraction_of_the_activations(name: str, directory: Path) -> None:
    """The backward of the checkpointed model keeps under half of the activation bytes (layer boundaries, and
    the values after the last one, whose gradients run first: a large share of two layers), and recomputes
    the products before it."""
    kept = _artifacts(name, directory / name)
    checkpointed = _artifacts(name, directory / name, "auto")
    data = models.batch(name, np.random.default_rng(5), LENGTHS[-1])

    def memory(paths: dict[str, Path]) -> step_memory.LiveMemory:
        training = onnx.load(paths["training_model"], load_external_data=False)
        ids, labels = (value.name for value in training.graph.input[:2])
        shapes = {ids: data["ids"].shape, labels: data["labels"].shape}
        return step_memory.step_memory(training, None, shapes).reset

    everything, boundaries = memory(kept), memory(checkpointed)
    assert boundaries.kept_for_backward < everything.kept_for_backward / 2, (
        f"{name}: {boundaries.kept_for_backward} bytes kept with checkpoints, {everything.kept_for_backward} without"
    )
    assert boundaries.peak <= everything.peak
    copies = [
        node
        for node in onnx.load(checkpointed["training_model"], load_external_data=False).graph.node
        if node.name.endswith(".recomputed")
    ]
    assert any(node.op_type == "MatMul" for node in copies), f"{name}: no product recomputed"


@pytest.mark.parametrize("name", NAMES)
def test_the_update_packed_as_on_a_gpu_gives_the_same_bits(name: str, directory: Path) -> None:
    """The fused step as on a GPU (a session for the batch's shapes), with AdamW's per-parameter chains run once
    on the packed tensors, written back by a Slice per tensor or a Split per role, and without: after three fused
    steps, every parameter and moment is the same."""
    parameters = models.exported(name).parameters
    data = models.batch(name, np.random.default_rng(11), LENGTHS[-1])
    results = {}
    for variant in ("unpacked", "slices", "split"):
        trained = _trained(name, directory)
        fused = trained.optimizer.fused_step
        assert fused is not None
        fused.fold_every_shape, fused.pack_updates = True, variant != "unpacked"
        fused.split_unpack = variant == "split"
        for _ in range(4):  # the first step trains alone; each later one applies the last update, then trains
            train.step(trained, data)
            trained.optimizer.step()
        unpacking = {node.op_type for node in fused.step_model.proto.graph.node if ".unpack" in node.name}
        assert (fused.step_model is not fused.model) == (variant != "unpacked"), f"{name}: the update was not packed"
        expected = {"unpacked": set(), "slices": {"Slice"}, "split": {"Split"}}[variant]
        assert unpacking == expected, f"{name}, {variant}: written back by {unpacking}"
        moments = trained.state.store.optimizer.moments
        values = {p: trained.state.parameters[p].data for p in parameters}
        values.update({f"{p} moment {i}": m.numpy() for p in parameters for i, m in enumerate(moments[p])})
        results[variant] = values
    for variant in ("slices", "split"):
        for key, value in results[variant].items():
            np.testing.assert_array_equal(value, results["unpacked"][key], err_msg=f"{name}, {variant}: {key}")
