"""``LossType`` and ``OptimType``: the built-in losses and optimizers by name (ONNX Runtime's enums)."""

from __future__ import annotations

from enum import Enum
from typing import Any

from onnxtrain import losses, optim
from onnxtrain.blocks.block import Block


class LossType(Enum):
    """Losses ``generate_artifacts`` can add by name (ONNX Runtime's values first)."""

    MSELoss = 1
    CrossEntropyLoss = 2
    BCEWithLogitsLoss = 3
    L1Loss = 4
    HuberLoss = 5
    SmoothL1Loss = 6
    NLLLoss = 7
    BCELoss = 8
    KLDivLoss = 9


class OptimType(Enum):
    """Optimizers ``generate_artifacts`` can add by name (ONNX Runtime's values first)."""

    AdamW = 1
    SGD = 2
    Adam = 3
    Adagrad = 4
    RMSprop = 5


def _member(enum: type[Enum], value: Any, argument: str) -> Enum:
    if isinstance(value, enum):
        return value
    if isinstance(value, str) and value in enum.__members__:
        return enum[value]
    raise ValueError(
        f"{argument}={value!r} is not in {enum.__name__}; choose one of {list(enum.__members__)} "
        f"(as {enum.__name__}.X or its name), or pass a block"
    )


def loss_block(loss: LossType | str | Block) -> Block:
    """A new loss block for ``loss`` (a ``LossType``, its name, or a block, returned as it is)."""
    if isinstance(loss, Block):
        return loss
    member = _member(LossType, loss, "loss")
    return getattr(losses, member.name)()


def optimizer_block(optimizer: OptimType | str | optim.Optimizer) -> optim.Optimizer:
    """A new optimizer block for ``optimizer`` (an ``OptimType``, its name, or an optimizer)."""
    if isinstance(optimizer, optim.Optimizer):
        return optimizer
    if isinstance(optimizer, Block):
        raise TypeError(
            f"optimizer={type(optimizer).__name__}(...) is a block but not an onnxtrain optimizer; "
            "pass an OptimType or an instance of an onnxtrain.optim class"
        )
    member = _member(OptimType, optimizer, "optimizer")
    return getattr(optim, member.name)()
