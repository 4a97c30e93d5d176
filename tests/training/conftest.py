"""Artifacts shared by the runtime tests, generated once per session."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from onnxtrain import losses, optim
from onnxtrain.artifacts import LossType, OptimType
from tests.training import models


@pytest.fixture(scope="session")
def regression(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """MLP 4-8-3, MSE with a sum reduction (accumulation adds up to the full batch), SGD."""
    return models.generate(
        tmp_path_factory.mktemp("regression"),
        models.mlp((4, 8, 3)),
        loss=losses.MSELoss(reduction="sum"),
        optimizer=OptimType.SGD,
        additional_output_names=["y"],
    )


@pytest.fixture(scope="session")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """MLP 6-16-4, cross-entropy, AdamW."""
    return models.generate(
        tmp_path_factory.mktemp("classifier"),
        models.mlp((6, 16, 4), seed=1),
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.AdamW,
    )


@pytest.fixture(scope="session")
def momentum(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """MLP 4-8-3 with the first layer frozen, MSE (mean), SGD with momentum (one state tensor)."""
    model = models.mlp((4, 8, 3), seed=2)
    return models.generate(
        tmp_path_factory.mktemp("momentum"),
        model,
        requires_grad=["fc1.weight", "fc1.bias"],
        frozen_params=["fc0.weight", "fc0.bias"],
        loss=LossType.MSELoss,
        optimizer=optim.SGD(momentum=0.9),
    )


@pytest.fixture(scope="session")
def batchnorm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """MatMul then training-mode BatchNormalization; running statistics frozen; MSE; AdamW."""
    return models.generate(
        tmp_path_factory.mktemp("batchnorm"),
        models.batchnorm_mlp(),
        requires_grad=["W", "bn.scale", "bn.bias"],
        frozen_params=["bn.mean", "bn.var"],
        loss=LossType.MSELoss,
        optimizer=OptimType.AdamW,
    )


@pytest.fixture(scope="session")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Parameters of two dtypes (float32 W, float64 b), MSE, Adam."""
    return models.generate(
        tmp_path_factory.mktemp("mixed"), models.mixed_dtypes(), loss=LossType.MSELoss, optimizer=OptimType.Adam
    )


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)
