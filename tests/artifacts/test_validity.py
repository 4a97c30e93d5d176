"""The artifacts are valid ONNX in standard operators, with the lowest IR version their opset needs."""

from __future__ import annotations

import itertools
from pathlib import Path

import onnx
import pytest
from onnx import helper

from onnxtrain import artifacts
from onnxtrain.artifacts import LossType, OptimType
from tests.artifacts.models import FROZEN, REQUIRES_GRAD, batchnorm, dense, session

MODELS = ("training_model", "eval_model", "optimizer_model")
PAIRS = list(itertools.product(LossType, OptimType))


def _check(model: onnx.ModelProto, opset: int) -> None:
    onnx.checker.check_model(model, full_check=True)  # strict shape inference included
    assert [(o.domain, o.version) for o in model.opset_import] == [("", opset)]
    domains = {node.domain for node in model.graph.node}
    assert domains <= {"", "ai.onnx"}, domains  # no com.microsoft kernels
    assert not model.functions
    assert model.ir_version == helper.find_min_ir_version_for(list(model.opset_import))


@pytest.mark.parametrize(("loss", "optimizer"), PAIRS, ids=[f"{loss.name}-{opt.name}" for loss, opt in PAIRS])
def test_every_loss_and_optimizer_gives_valid_standard_models(tmp_path: Path, loss: LossType, optimizer: OptimType):
    paths = artifacts.generate_artifacts(
        dense(), REQUIRES_GRAD, FROZEN, loss=loss, optimizer=optimizer, artifact_directory=tmp_path
    )
    for name in MODELS:
        model = onnx.load(paths[name])
        _check(model, 17)
        assert model.ir_version == 8
        session(paths[name])  # onnxruntime loads it


@pytest.mark.parametrize(("opset", "ir_version"), [(13, 7), (15, 8), (18, 8), (21, 10)])
def test_the_ir_version_is_the_lowest_for_the_base_models_opset(tmp_path: Path, opset: int, ir_version: int):
    base = dense(opset=opset, ir_version=11)  # a newer IR version than the opset needs
    paths = artifacts.generate_artifacts(
        base, REQUIRES_GRAD, FROZEN, loss="CrossEntropyLoss", optimizer="AdamW", artifact_directory=tmp_path
    )
    for name in MODELS:
        model = onnx.load(paths[name])
        _check(model, opset)
        assert model.ir_version == ir_version
        session(paths[name])


def test_training_mode_batchnorm_artifacts_are_valid(tmp_path: Path):
    paths = artifacts.generate_artifacts(
        batchnorm(), ["scale", "bias"], ["mean", "var"], loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path
    )
    for name in MODELS:
        _check(onnx.load(paths[name]), 15)
        session(paths[name])
