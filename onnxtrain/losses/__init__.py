"""Loss blocks, composed from elementary blocks (also ``onnxtrain.onnxblock.loss``).

Each takes ``reduction`` in ``"mean" | "sum" | "none"`` and adds the target
or labels input it needs, with the right element type and shape.
"""

from __future__ import annotations

from onnxtrain.losses._common import REDUCTIONS, ComputedTargetWarning, Reduction
from onnxtrain.losses.classification import BCELoss, BCEWithLogitsLoss, ClassAxisWarning, CrossEntropyLoss, NLLLoss
from onnxtrain.losses.divergence import KLDivLoss
from onnxtrain.losses.regression import HuberLoss, L1Loss, MSELoss, SmoothL1Loss

__all__ = [
    "REDUCTIONS",
    "BCELoss",
    "BCEWithLogitsLoss",
    "ClassAxisWarning",
    "ComputedTargetWarning",
    "CrossEntropyLoss",
    "HuberLoss",
    "KLDivLoss",
    "L1Loss",
    "MSELoss",
    "NLLLoss",
    "Reduction",
    "SmoothL1Loss",
]
