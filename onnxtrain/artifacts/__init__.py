"""Artifacts: ``generate_artifacts`` (``build_artifacts`` in memory), ``LossType``, ``OptimType``, and
``trainable_parameters`` (the weights of a model, for ``requires_grad``).

The names are ONNX Runtime's (``onnxruntime.training.artifacts``).
"""

from __future__ import annotations

from onnxtrain.artifacts.accumulation import (
    LAZY_RESET_GRAD,
    AccumulationFormError,
    ResetTrainingModel,
    accumulated_name,
    add_gradient_accumulation,
    buffer_name,
    remove_gradient_accumulation,
)
from onnxtrain.artifacts.export import export_model_for_inferencing
from onnxtrain.artifacts.exported_parameters import ScatterWarning, Tf2onnxExportWarning, TorchExportWarning
from onnxtrain.artifacts.fuse import FusedModel, FusionError, fuse_update_and_train
from onnxtrain.artifacts.generate import TARGETS, ArtifactSet, build_artifacts, generate_artifacts, write_artifacts
from onnxtrain.artifacts.kinds import LossType, OptimType
from onnxtrain.artifacts.training_model import RunningStatisticsWarning
from onnxtrain.graph.declared import DeclaredShapeWarning
from onnxtrain.graph.embeddings import set_embedding
from onnxtrain.graph.io import OpsetConversionWarning
from onnxtrain.graph.roles import Role, initializer_roles, trainable_parameters
from onnxtrain.losses._common import ComputedTargetWarning
from onnxtrain.losses.classification import ClassAxisWarning

__all__ = [
    "LAZY_RESET_GRAD",
    "TARGETS",
    "AccumulationFormError",
    "ArtifactSet",
    "ClassAxisWarning",
    "ComputedTargetWarning",
    "DeclaredShapeWarning",
    "FusedModel",
    "FusionError",
    "LossType",
    "OpsetConversionWarning",
    "OptimType",
    "ResetTrainingModel",
    "Role",
    "RunningStatisticsWarning",
    "ScatterWarning",
    "Tf2onnxExportWarning",
    "TorchExportWarning",
    "accumulated_name",
    "add_gradient_accumulation",
    "buffer_name",
    "build_artifacts",
    "export_model_for_inferencing",
    "fuse_update_and_train",
    "generate_artifacts",
    "initializer_roles",
    "remove_gradient_accumulation",
    "set_embedding",
    "trainable_parameters",
    "write_artifacts",
]
