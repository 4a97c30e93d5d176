"""NumPy reference implementations of the loss blocks, with PyTorch's semantics.

Every oracle computes in float64 whatever its inputs' dtype, and returns a
float64 array: a scalar for ``"mean"``/``"sum"`` (and ``"batchmean"``), the
element-wise loss for ``"none"``. The formulas follow ``torch.nn.functional``
(and ATen's kernels where the docs leave a detail open):

- ``nll_loss``: ``-w[y] x[y]``; labels equal to ``ignore_index`` count for
  nothing; ``"mean"`` divides by the summed ``w[y]`` of the counted labels
  (``nan`` when none counts, as in PyTorch).
- ``cross_entropy``: ``(1 - eps) nll(log_softmax(x)) + eps / C * smooth`` where
  ``smooth`` is ``-sum_c w_c log p_c`` per counted label, reduced like ``nll``
  (``"mean"``: divided by the same summed ``w[y]``, or by the number of
  counted labels without weights).
- ``binary_cross_entropy``: ``-w (t max(log p, -100) + (1 - t) max(log(1 - p), -100))``.
- ``binary_cross_entropy_with_logits``: ``w ((1 - t) x + (1 + (pw - 1) t) softplus(-x))``,
  ``pos_weight`` broadcast on the last axis.
- ``kl_div``: ``xlogy(t, t) - t x`` (``0 log 0 = 0``) or, with ``log_target``,
  ``exp(t) (t - x)``; ``"batchmean"`` is the sum divided by ``N``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

ArrayLike = Any


def _f64(value: ArrayLike) -> np.ndarray:
    return np.asarray(value, dtype=np.float64)


def reduce(pointwise: np.ndarray, reduction: str) -> np.ndarray:
    """``"mean"``/``"sum"`` over all elements, or the elements themselves for ``"none"``."""
    if reduction == "none":
        return pointwise
    if reduction == "sum":
        return np.asarray(pointwise.sum())
    if reduction == "mean":
        return np.asarray(pointwise.mean())
    raise ValueError(f"unknown reduction {reduction!r}")


# ------------------------------------------------------------------ regression


def mse_loss(x: ArrayLike, t: ArrayLike, reduction: str = "mean") -> np.ndarray:
    """``reduce((x - t)**2)``."""
    return reduce((_f64(x) - _f64(t)) ** 2, reduction)


def l1_loss(x: ArrayLike, t: ArrayLike, reduction: str = "mean") -> np.ndarray:
    """``reduce(|x - t|)``."""
    return reduce(np.abs(_f64(x) - _f64(t)), reduction)


def huber_loss(x: ArrayLike, t: ArrayLike, reduction: str = "mean", delta: float = 1.0) -> np.ndarray:
    """``0.5 d**2`` where ``|d| < delta``, else ``delta (|d| - 0.5 delta)``."""
    d = np.abs(_f64(x) - _f64(t))
    return reduce(np.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta)), reduction)


def smooth_l1_loss(x: ArrayLike, t: ArrayLike, reduction: str = "mean", beta: float = 1.0) -> np.ndarray:
    """``0.5 d**2 / beta`` where ``|d| < beta``, else ``|d| - 0.5 beta``; plain L1 when ``beta == 0``."""
    d = np.abs(_f64(x) - _f64(t))
    if beta == 0.0:
        return reduce(d, reduction)
    return reduce(np.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta), reduction)


# -------------------------------------------------------------- classification


def log_softmax(x: ArrayLike, axis: int = 1) -> np.ndarray:
    """``x - logsumexp(x)`` along ``axis``, computed stably."""
    x = _f64(x)
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def _counted(labels: np.ndarray, ignore_index: int | None) -> np.ndarray:
    return np.ones(labels.shape, dtype=bool) if ignore_index is None else labels != ignore_index


def _label_weights(labels: np.ndarray, weight: ArrayLike | None, counted: np.ndarray) -> np.ndarray:
    """``w[y]`` per label (``1`` without weights), ``0`` where the label does not count."""
    safe = np.where(counted, labels, 0)
    per_label = np.ones(labels.shape) if weight is None else _f64(weight)[safe]
    return np.where(counted, per_label, 0.0)


def nll_loss(
    log_probs: ArrayLike,
    labels: ArrayLike,
    weight: ArrayLike | None = None,
    reduction: str = "mean",
    ignore_index: int | None = -100,
) -> np.ndarray:
    """``-w[y] x[y]`` over inputs ``(N, C, d...)`` and labels ``(N, d...)``."""
    x = _f64(log_probs)
    y = np.asarray(labels).astype(np.int64)
    counted = _counted(y, ignore_index)
    safe = np.where(counted, y, 0)
    picked = np.take_along_axis(x, np.expand_dims(safe, 1), axis=1).squeeze(1)
    w = _label_weights(y, weight, counted)
    losses = np.where(counted, -w * picked, 0.0)
    if reduction == "mean":
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.asarray(losses.sum() / w.sum())
    return reduce(losses, reduction)


def cross_entropy(
    scores: ArrayLike,
    labels: ArrayLike,
    weight: ArrayLike | None = None,
    reduction: str = "mean",
    ignore_index: int | None = -100,
    label_smoothing: float = 0.0,
) -> np.ndarray:
    """``(1 - eps) nll(log_softmax(x)) + eps / C * smooth`` (``torch.nn.functional.cross_entropy``)."""
    log_probs = log_softmax(scores, axis=1)
    nll = nll_loss(log_probs, labels, weight, reduction, ignore_index)
    if label_smoothing == 0.0:
        return nll
    n_classes = log_probs.shape[1]
    y = np.asarray(labels).astype(np.int64)
    counted = _counted(y, ignore_index)
    if weight is None:
        smooth = -log_probs.sum(axis=1)
    else:
        class_shape = [1, n_classes] + [1] * (log_probs.ndim - 2)
        smooth = -(log_probs * _f64(weight).reshape(class_shape)).sum(axis=1)
    smooth = np.where(counted, smooth, 0.0)
    if reduction == "mean":
        denominator = _label_weights(y, weight, counted).sum()
        with np.errstate(invalid="ignore", divide="ignore"):
            smooth_reduced = np.asarray(smooth.sum() / denominator)
    else:
        smooth_reduced = reduce(smooth, reduction)
    return (1.0 - label_smoothing) * nll + label_smoothing / n_classes * smooth_reduced


def cross_entropy_with_probabilities(
    scores: ArrayLike,
    targets: ArrayLike,
    weight: ArrayLike | None = None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> np.ndarray:
    """``-sum_c w_c t'_c log_softmax(x)_c`` per sample, ``t' = (1 - eps) t + eps / C``, the mean over the samples
    (``torch.nn.functional.cross_entropy`` with a float target)."""
    log_probs = log_softmax(scores, axis=1)
    n_classes = log_probs.shape[1]
    t = (1.0 - label_smoothing) * _f64(targets) + label_smoothing / n_classes
    if weight is not None:
        t = t * _f64(weight).reshape([1, n_classes] + [1] * (log_probs.ndim - 2))
    return reduce(-(t * log_probs).sum(axis=1), reduction)


def binary_cross_entropy(
    p: ArrayLike, t: ArrayLike, weight: ArrayLike | None = None, reduction: str = "mean"
) -> np.ndarray:
    """``-w (t max(log p, -100) + (1 - t) max(log(1 - p), -100))``."""
    p, t = _f64(p), _f64(t)
    with np.errstate(divide="ignore"):
        log_p = np.maximum(np.log(p), -100.0)
        log_1mp = np.maximum(np.log1p(-p), -100.0)
    loss = -(t * log_p + (1.0 - t) * log_1mp)
    if weight is not None:
        loss = _f64(weight) * loss
    return reduce(loss, reduction)


def _bce_with_logits_terms(
    x: ArrayLike, t: ArrayLike, weight: ArrayLike | None, pos_weight: ArrayLike | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | float]:
    """``((1 - t) x, (1 + (pw - 1) t) softplus(-x), w)``: the two terms of the loss and its weight."""
    x, t = _f64(x), _f64(t)
    softplus = np.maximum(-x, 0.0) + np.log1p(np.exp(-np.abs(x)))
    log_weight = 1.0 if pos_weight is None else 1.0 + (_f64(pos_weight) - 1.0) * t
    return (1.0 - t) * x, log_weight * softplus, 1.0 if weight is None else _f64(weight)


def binary_cross_entropy_with_logits(
    x: ArrayLike,
    t: ArrayLike,
    weight: ArrayLike | None = None,
    reduction: str = "mean",
    pos_weight: ArrayLike | None = None,
) -> np.ndarray:
    """``w ((1 - t) x + (1 + (pw - 1) t) softplus(-x))``, ``softplus(z) = max(z, 0) + log1p(exp(-|z|))``."""
    linear, soft, w = _bce_with_logits_terms(x, t, weight, pos_weight)
    return reduce(w * (linear + soft), reduction)


def binary_cross_entropy_with_logits_magnitude(
    x: ArrayLike,
    t: ArrayLike,
    weight: ArrayLike | None = None,
    reduction: str = "mean",
    pos_weight: ArrayLike | None = None,
) -> np.ndarray:
    """The loss with every term made positive: ``w (|(1 - t) x| + |(1 + (pw - 1) t) softplus(-x)|)``.

    A bound for the rounding error of the mixed-sign sum (``rtol *`` this).
    """
    linear, soft, w = _bce_with_logits_terms(x, t, weight, pos_weight)
    return reduce(np.abs(w) * (np.abs(linear) + np.abs(soft)), reduction)


# ------------------------------------------------------------------ divergence


def kl_div_pointwise(x: ArrayLike, t: ArrayLike, log_target: bool = False) -> np.ndarray:
    """``xlogy(t, t) - t x`` (``0`` where ``t == 0``), or ``exp(t) (t - x)`` for log targets."""
    x, t = _f64(x), _f64(t)
    if log_target:
        return np.exp(t) * (t - x)
    with np.errstate(divide="ignore", invalid="ignore"):
        t_log_t = np.where(t == 0.0, 0.0, t * np.log(np.where(t == 0.0, 1.0, t)))
    return t_log_t - t * x


def kl_div(x: ArrayLike, t: ArrayLike, reduction: str = "mean", log_target: bool = False) -> np.ndarray:
    """``torch.nn.functional.kl_div``: ``"batchmean"`` is the sum over ``N`` (the size of axis 0)."""
    pointwise = kl_div_pointwise(x, t, log_target)
    if reduction == "batchmean":
        return np.asarray(pointwise.sum() / pointwise.shape[0])
    return reduce(pointwise, reduction)


def kl_div_magnitude(x: ArrayLike, t: ArrayLike, reduction: str = "mean", log_target: bool = False) -> np.ndarray:
    """``kl_div`` with every term made positive: a bound for its rounding error (``rtol *`` this)."""
    x, t = _f64(x), _f64(t)
    if log_target:
        terms = np.exp(t) * (np.abs(t) + np.abs(x))
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            t_log_t = np.where(t == 0.0, 0.0, t * np.log(np.where(t == 0.0, 1.0, t)))
        terms = np.abs(t_log_t) + np.abs(t * x)
    if reduction == "batchmean":
        return np.asarray(terms.sum() / terms.shape[0])
    return reduce(terms, reduction)
