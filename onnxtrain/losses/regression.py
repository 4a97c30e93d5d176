"""Regression losses: MSE, L1, Huber and smooth L1, each ``reduce(f(input - target))``."""

from __future__ import annotations

from onnxtrain.blocks import Abs, Block, Div, Min, Mul, Sub
from onnxtrain.graph import ops
from onnxtrain.graph.builder import GraphBuilder
from onnxtrain.losses._common import Reduction, check_reduction, reduce_loss, require_float, target_input


class _PointwiseLoss(Block):
    """``reduce(f(input - target))``; subclasses give ``f`` in :meth:`pointwise`."""

    def __init__(self, reduction: Reduction = "mean") -> None:
        super().__init__()
        self._reduction = check_reduction(type(self).__name__, reduction)

    def pointwise(self, diff: str) -> str:
        raise NotImplementedError

    def build(self, loss_input_name: str, target_name: str = "target") -> str:
        """Add the loss of ``loss_input_name`` against ``target_name`` (a new input if needed)."""
        b = self.builder
        require_float(b, type(self).__name__, loss_input_name)
        target = target_input(b, type(self).__name__, target_name, loss_input_name)
        return reduce_loss(self.pointwise(Sub()(loss_input_name, target)), self._reduction)


class MSELoss(_PointwiseLoss):
    """``reduce((input - target)**2)``."""

    def pointwise(self, diff: str) -> str:
        return Mul()(diff, diff)


class L1Loss(_PointwiseLoss):
    """``reduce(|input - target|)``."""

    def pointwise(self, diff: str) -> str:
        return Abs()(diff)


def _huber(b: GraphBuilder, diff: str, delta: float) -> str:
    """``0.5 d**2`` if ``|d| < delta``, else ``delta (|d| - delta/2)``: ``m (|d| - m/2)``, ``m = min(|d|, delta)``."""
    magnitude = Abs()(diff)
    clipped = Min()(magnitude, ops.constant_like(b, delta, diff, "huber_delta"))
    half = Mul()(clipped, ops.constant_like(b, 0.5, diff, "half"))
    return Mul()(clipped, Sub()(magnitude, half))


class HuberLoss(_PointwiseLoss):
    """``reduce(huber_delta(input - target))`` as in ``torch.nn.HuberLoss``."""

    def __init__(self, reduction: Reduction = "mean", delta: float = 1.0) -> None:
        super().__init__(reduction)
        if not delta > 0:
            raise ValueError(f"HuberLoss needs delta > 0, got {delta}")
        self._delta = float(delta)

    def pointwise(self, diff: str) -> str:
        return _huber(self.builder, diff, self._delta)


class SmoothL1Loss(_PointwiseLoss):
    """``reduce(huber_beta(input - target) / beta)``; L1 when ``beta == 0`` (``torch.nn.SmoothL1Loss``)."""

    def __init__(self, reduction: Reduction = "mean", beta: float = 1.0) -> None:
        super().__init__(reduction)
        if not beta >= 0:
            raise ValueError(f"SmoothL1Loss needs beta >= 0, got {beta}")
        self._beta = float(beta)

    def pointwise(self, diff: str) -> str:
        if self._beta == 0.0:
            return Abs()(diff)
        return Div()(_huber(self.builder, diff, self._beta), ops.constant_like(self.builder, self._beta, diff, "beta"))
