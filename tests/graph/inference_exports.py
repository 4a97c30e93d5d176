"""torch modules exported for inference, as ``torch.onnx.export`` writes them by default, and one step of them
trained against torch (for :mod:`tests.graph.test_untie` and :mod:`tests.graph.test_retie`)."""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from onnxtrain import api, artifacts


def export_for_inference(module: Any, example: Any, inputs: Sequence[str], outputs: Sequence[str]) -> onnx.ModelProto:
    """``module`` exported by torch's TorchScript exporter with its defaults (evaluation mode, constant folding),
    as Hugging Face Optimum exports; the first axis of every input named ``batch``."""
    import torch

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(
            module, (example,), buffer, dynamo=False, input_names=list(inputs), output_names=list(outputs),
            dynamic_axes={name: {0: "batch"} for name in inputs},
        )  # fmt: skip
    return onnx.load_from_string(buffer.getvalue())


def assert_trains_as_torch(
    model: onnx.ModelProto,
    module: Any,
    loss: artifacts.LossType,
    torch_loss: Callable[..., Any],
    batch: Mapping[str, np.ndarray],
    directory: Path,
) -> api.CheckpointState:
    """Every parameter of ``module`` is listed by ``trainable_parameters(model)``; one step of the artifacts
    (``loss``, every parameter trained) on ``batch`` (the input, then the target) gives torch's loss
    (``torch_loss(output, target)``) and every parameter's gradient. The state after the step."""
    import torch

    names = dict(module.named_parameters())
    assert sorted(artifacts.trainable_parameters(model)) == sorted(names)
    paths = artifacts.generate_artifacts(
        model, requires_grad=list(names), loss=loss, optimizer="SGD", artifact_directory=directory
    )
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    trained = api.Module(paths["training_model"], state, paths["eval_model"])
    x, target = batch.values()
    got = float(np.asarray(trained(x, target)))
    want = torch_loss(module(torch.from_numpy(x)), torch.from_numpy(target))
    want.backward()
    np.testing.assert_allclose(got, float(want.detach()), rtol=1e-6)
    for name, parameter in names.items():
        np.testing.assert_allclose(state.parameters[name].grad, parameter.grad.numpy(), rtol=1e-5, atol=1e-7)
    return state
