"""Divergences between distributions: Kullback-Leibler."""

from __future__ import annotations

from typing import Literal

from onnxtrain.blocks import Block, Div, Exp, Mul, Sub
from onnxtrain.graph import ops
from onnxtrain.losses._common import REDUCTIONS, check_reduction, dim_size, reduce_loss, require_float, target_input


class KLDivLoss(Block):
    """``KL(target || input)`` with ``input`` given as log-probabilities (``torch.nn.KLDivLoss``).

    Point-wise ``t (log t - x)`` (``0`` where ``t == 0``), or with
    ``log_target=True`` ``exp(t) (t - x)``. ``"batchmean"`` divides the sum by
    the size of axis 0, the true KL divergence per sample.
    """

    def __init__(
        self, reduction: Literal["mean", "batchmean", "sum", "none"] = "mean", log_target: bool = False
    ) -> None:
        super().__init__()
        self._reduction = check_reduction("KLDivLoss", reduction, (*REDUCTIONS, "batchmean"))
        self._log_target = bool(log_target)

    def build(self, loss_input_name: str, target_name: str = "target") -> str:
        b = self.builder
        x = loss_input_name
        require_float(b, "KLDivLoss", x)
        t = target_input(b, "KLDivLoss", target_name, x)
        if self._log_target:
            pointwise = Mul()(Exp()(t), Sub()(t, x))
        else:
            zero = ops.constant_like(b, 0.0, x, "zero")
            positive = b.add_node1("Greater", [t, zero])
            t_log_t = b.add_node1("Where", [positive, Mul()(t, b.add_node1("Log", [t])), zero])
            pointwise = Sub()(t_log_t, Mul()(t, x))
        if self._reduction != "batchmean":
            return reduce_loss(pointwise, self._reduction)
        total = reduce_loss(pointwise, "sum")
        return Div()(total, dim_size(b, x, 0))
