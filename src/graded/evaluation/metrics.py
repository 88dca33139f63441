"""Metrics: accuracy, token accuracy, exact match, MSE, MAE and R² (003 §3.2 "how to tell").

Predictions are class ids (long) or logits/scores with one more trailing dimension than the
targets (then the argmax is taken); regression predictions have the targets' shape. A NaN among
the logits of a scored entry makes the score NaN, as a NaN prediction makes the regression
errors NaN (``argmax`` would take the NaN for the largest logit and count a guess); so does a
NaN among floating class ids, the mark :meth:`graded.kinds.TaskKind.prediction` leaves where
the logits held one. A NaN in the regression targets or predictions makes ``mse``, ``mae`` and
``r2`` NaN alike; so does an infinite target for ``r2``, whose spread about the mean is then
undefined.

Class targets are ids ≥ 0, or ``IGNORE_INDEX`` (-100) where nothing is scored: another negative
id (-1, the ignore value of some code bases) would count as a wrong guess, silently.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from graded.tasks.base import IGNORE_INDEX, TaskDataset


def as_labels(predictions: Tensor, targets: Tensor) -> Tensor:
    """Class ids from ids or from logits of shape (*targets.shape, C), C ≥ 2.

    Floating predictions of the targets' shape are taken as ids only when they are finite
    whole numbers or NaN (a NaN prediction, scored NaN by the metrics; its id here is 0):
    scores or probabilities there (one column per example) would otherwise be truncated to
    ids. One class column (C = 1) is refused for the same reason: its argmax is always 0."""
    if predictions.shape == targets.shape:
        if predictions.is_floating_point():
            nan = predictions.isnan()
            bad = ~nan & ((predictions != predictions.round()) | predictions.isinf())
            if bool(bad.any()):
                raise ValueError(f"predictions of the targets' shape {tuple(targets.shape)} are "
                                 f"{predictions.dtype} values that are not whole numbers (e.g. "
                                 f"{predictions[bad][0].item()}); expected class ids, or logits "
                                 "with one more trailing class dimension")
            return predictions.masked_fill(nan, 0).long()
        return predictions.long()
    if predictions.ndim == targets.ndim + 1 and predictions.shape[:-1] == targets.shape:
        if predictions.shape[-1] < 2:
            raise ValueError(f"logits of shape {tuple(predictions.shape)} have "
                             f"{predictions.shape[-1]} class column; expected at least 2 "
                             "(a binary task has 2 logits per example, or pass class ids)")
        return predictions.argmax(-1)
    raise ValueError(f"predictions of shape {tuple(predictions.shape)} do not match targets of "
                     f"shape {tuple(targets.shape)} (expected the same shape or one more "
                     "trailing class dimension)")


def _nan_logits(predictions: Tensor, targets: Tensor, keep: Tensor) -> bool:
    """Whether a kept entry's prediction holds NaN: its logits (one more trailing dimension
    than the targets) or its floating class id."""
    if not predictions.is_floating_point():
        return False
    nan = predictions.isnan()
    return bool(((nan.any(-1) if predictions.ndim == targets.ndim + 1 else nan) & keep).any())


def _mask(targets: Tensor, mask: Tensor | None) -> Tensor:
    """The kept entries: target != -100 and, with ``mask``, mask True.

    Float targets are class ids only when finite whole numbers (a NaN, ∞ or 0.5 would count as
    a wrong guess, silently), and a kept target is an id ≥ 0 (module docstring). The mask is
    boolean or holds only 0 and 1: ``bool()`` of a weight such as 0.5 would keep its entry, a
    weighted mean read as a plain one."""
    if targets.is_floating_point():
        bad = (targets != targets.round()) | ~targets.isfinite()
        if bool(bad.any()):
            raise ValueError(f"targets are {targets.dtype} values that are not whole numbers "
                             f"(e.g. {targets[bad][0].item()}); expected class ids")
    keep = targets != IGNORE_INDEX
    if mask is not None:
        if mask.shape != targets.shape:
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not match targets of "
                             f"shape {tuple(targets.shape)}")
        if mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
            bad = mask[(mask != 0) & (mask != 1)]
            raise ValueError(f"mask holds {bad[0].item()!r} ({mask.dtype}); expected a boolean "
                             "mask (True = scored) or one of only 0s and 1s")
        keep = keep & mask.bool()
    negative = keep & (targets < 0)
    if bool(negative.any()):
        raise ValueError(f"targets hold the class id {targets[negative][0].item()}; expected ids "
                         f">= 0, or {IGNORE_INDEX} (IGNORE_INDEX) where nothing is scored")
    return keep


def accuracy(predictions: Tensor, targets: Tensor, mask: Tensor | None = None) -> float:
    """Fraction of correct labels over the kept entries (mask True, target != -100)."""
    pred = as_labels(predictions, targets)
    keep = _mask(targets, mask)
    n = int(keep.sum())
    if n == 0:
        raise ValueError("accuracy over an empty set: no target is kept by the mask")
    if _nan_logits(predictions, targets, keep):
        return math.nan
    return float(((pred == targets) & keep).sum()) / n


def token_accuracy(predictions: Tensor, targets: Tensor, mask: Tensor | None = None) -> float:
    """Per-token accuracy of (N, T) sequence predictions (an alias of :func:`accuracy`)."""
    return accuracy(predictions, targets, mask)


def exact_match(predictions: Tensor, targets: Tensor, mask: Tensor | None = None) -> float:
    """Fraction of sequences (rows of (N, T)) whose every kept token is correct.

    Rows with no kept token are left out.
    """
    pred = as_labels(predictions, targets)
    if targets.ndim != 2:
        raise ValueError(f"exact_match needs (N, T) targets, got shape {tuple(targets.shape)}")
    keep = _mask(targets, mask)
    scored = keep.any(-1)
    if not bool(scored.any()):
        raise ValueError("exact_match over an empty set: no row has a kept target")
    if _nan_logits(predictions, targets, keep):
        return math.nan
    correct = ((pred == targets) | ~keep).all(-1)
    return float((correct & scored).sum()) / float(scored.sum())


def mse(predictions: Tensor, targets: Tensor) -> float:
    """Mean squared error over all entries."""
    _same_shape(predictions, targets, "mse")
    return float(((predictions.double() - targets.double()) ** 2).mean())


def mae(predictions: Tensor, targets: Tensor) -> float:
    """Mean absolute error over all entries."""
    _same_shape(predictions, targets, "mae")
    return float((predictions.double() - targets.double()).abs().mean())


def r2(predictions: Tensor, targets: Tensor) -> float:
    """Coefficient of determination 1 - SS_res/SS_tot, per output column, averaged.

    Follows scikit-learn's ``r2_score`` (uniform average): a constant column (all its targets
    equal, told from the values rather than from the rounded mean) scores 1 when predicted
    exactly and 0 otherwise. Predicting the test mean scores 0. A column whose
    SS_res or SS_tot is NaN (a NaN target or prediction, an infinite target) scores NaN, so
    the average is NaN, as ``mse`` is.
    """
    _same_shape(predictions, targets, "R²")
    n = targets.shape[0] if targets.ndim else 1  # a 0-d target is one example
    if n < 2:
        raise ValueError(f"R² needs at least 2 examples, got {n}")
    y = targets.double().reshape(n, -1)
    p = predictions.double().reshape(n, -1)
    ss_res = ((y - p) ** 2).sum(0)
    # a column of equal values has SS_tot = 0 exactly, although y - mean need not be 0 in
    # floating point (seven 0.1s average to 0.10000000000000002): 1 - SS_res/1e-33 is no score
    constant = (y == y[:1]).all(0) & y[0].isfinite()  # an infinite column stays NaN
    ss_tot = torch.where(constant, 0.0, ((y - y.mean(0)) ** 2).sum(0))
    col = torch.where(ss_tot > 0, 1 - ss_res / torch.where(ss_tot > 0, ss_tot, 1.0),
                      torch.where(ss_res == 0, 1.0, 0.0).double())
    col = torch.where(ss_res.isnan() | ss_tot.isnan(), math.nan, col)
    return float(col.mean())


def _same_shape(predictions: Tensor, targets: Tensor, metric: str) -> None:
    """Regression predictions and targets of one shape and real dtype (``double()`` of a
    complex value drops its imaginary part), with at least one entry (a mean over none is not
    a score)."""
    for what, t in (("predictions", predictions), ("targets", targets)):
        if t.is_complex():
            raise TypeError(f"{metric} of {what} of dtype {t.dtype}; expected real values")
    if predictions.shape != targets.shape:
        raise ValueError(f"predictions of shape {tuple(predictions.shape)} do not match "
                         f"targets of shape {tuple(targets.shape)}")
    if targets.numel() == 0:
        raise ValueError(f"{metric} over an empty set: targets of shape "
                         f"{tuple(targets.shape)} have no entry")


METRICS: dict[str, Callable[..., float]] = {
    "accuracy": accuracy,
    "token_accuracy": token_accuracy,
    "masked_token_accuracy": token_accuracy,
    "exact_match": exact_match,
    "mse": mse,
    "mae": mae,
    "r2": r2,
}
HIGHER_IS_BETTER = {"accuracy": True, "token_accuracy": True, "masked_token_accuracy": True,
                    "exact_match": True, "mse": False, "mae": False, "r2": True}


def compute_metric(name: str, predictions: Tensor,
                   data: TaskDataset | Mapping[str, Tensor]) -> float:
    """Metric ``name`` of predictions on a ``TaskDataset`` (or its dict of tensors), with the
    task's masks.

    ``token_accuracy``, ``exact_match`` and ``accuracy`` use ``loss_mask`` (the scored
    targets, as the trainer's evaluation does); ``masked_token_accuracy`` uses the dataset's
    ``metric_mask`` (e.g. Dyck: the closing brackets, whose answer is determined).
    """
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; available: {sorted(METRICS)}")
    tensors = data.tensors if isinstance(data, TaskDataset) else data
    if "targets" not in tensors:
        raise ValueError(f"{name} needs a 'targets' tensor; the data has {sorted(tensors)}")
    targets = tensors["targets"]
    if name in ("mse", "mae", "r2"):
        return METRICS[name](predictions, targets)
    mask = tensors.get("loss_mask")
    if name == "masked_token_accuracy":
        mask = tensors.get("metric_mask")
        if mask is None:
            raise ValueError(f"masked_token_accuracy needs a 'metric_mask' tensor; the dataset "
                             f"has {sorted(tensors)}")
    return METRICS[name](predictions, targets, mask)
