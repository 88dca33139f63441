"""Graded losses (000 §3.3, §5.4.1 Def 5.37, §7.1 Def 7.1; 001 §5), in the style of
``torch.nn.functional``, with ``nn.Module`` wrappers.

Every function takes ``(input, target, grades, *, reduction="mean")``; the last dimension of
``input`` holds the graded coordinates and all leading dimensions are batch (tokens, samples).
``grades`` is a tensor of length d, or a grading module (:class:`graded.LinearGrading`,
:class:`graded.ExponentialGrading`) whose **scales** (f(q) or λ^q) are then the weights, so that
gradients flow into learnable grades. Tensor grades are used as the weights q_i themselves and
must be finite and ≥ 0 (a negative weight makes a loss unbounded below). A grading's scales
that are beyond the input's dtype (a float32 scale above 65504 for a float16 input) weight the
terms in the wider dtype, so a term is finite wherever the weighted term is (``_weighted``;
λ^q of :func:`exponentially_graded_loss` is split into factors instead). These terms (the
elementwise base loss ℓ, the weights of the grades and their products) are
:mod:`graded.loss_terms`, which this module uses.

Reductions: the elementwise losses (graded MSE, linearly and exponentially graded losses) return
elementwise terms for ``"none"``, so ``"mean"``/``"sum"`` match ``torch.nn.functional`` for unit
weights; the per-vector losses (norm, homogeneous, max, cross-entropy) return one value per
vector for ``"none"`` and average or sum those. An empty batch reduces as ``torch.nn.functional``
does: ``"mean"`` of nothing is NaN, ``"sum"`` of nothing is 0 (the cross-entropy with class
indices all equal to ``ignore_index`` too, as ``F.cross_entropy``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from graded.algebra.space import power_norm
from graded.grading import ExponentialGrading, GradingMap, LinearGrading, as_grade_tensor
from graded.loss_terms import (
    BaseLoss,
    GradesArg,
    _elementwise,
    _exponential_factors,
    _scales,
    _weighted,
    _weights,
)

__all__ = [
    "ExponentiallyGradedLoss",
    "GradedCrossEntropyLoss",
    "GradedMSELoss",
    "GradedNormLoss",
    "HomogeneousLoss",
    "LinearlyGradedLoss",
    "MaxGradedLoss",
    "exponentially_graded_loss",
    "graded_cross_entropy",
    "graded_mse",
    "graded_norm_loss",
    "homogeneous_loss",
    "linearly_graded_loss",
    "max_graded_loss",
]

REDUCTIONS = ("mean", "sum", "none")


def _reduce(x: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return x.mean()
    if reduction == "sum":
        return x.sum()
    return x


def _check(input: Tensor, target: Tensor | None, reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if not isinstance(input, Tensor) or input.ndim == 0:
        raise ValueError("input must be a tensor with a last (graded) dimension")
    if not input.is_floating_point():  # the weights take input's dtype: 0.5 -> 0 in an integer one
        raise TypeError(f"input must be a floating-point tensor, got {input.dtype} "
                        f"(convert it with input.float())")
    if target is not None and not isinstance(target, Tensor):
        raise TypeError(f"target must be a tensor, got {type(target).__name__}")
    if target is not None and target.shape != input.shape:
        raise ValueError(f"input shape {tuple(input.shape)} and target shape "
                         f"{tuple(target.shape)} differ")


def graded_mse(input: Tensor, target: Tensor, grades: GradesArg, *,
               reduction: str = "mean") -> Tensor:
    """Graded MSE (000 Eq. 2): (1/n) Σ_i q_i (y_i − ŷ_i)² per vector; elementwise terms
    q_i (y_i − ŷ_i)² for ``"none"``, their mean (= mean of Eq. 2 over vectors) or sum."""
    _check(input, target, reduction)
    q = _weights(grades, input, what="graded_mse", own_dtype=True)
    return _reduce(_weighted(q, (input - target) ** 2), reduction)


def graded_norm_loss(input: Tensor, target: Tensor, grades: GradesArg, *,
                     reduction: str = "mean") -> Tensor:
    """Graded norm loss ‖y − ŷ‖_q² = Σ_i q_i |y_i − ŷ_i|² (000 Eq. 3), one value per vector."""
    _check(input, target, reduction)
    q = _weights(grades, input, what="graded_norm_loss", own_dtype=True)
    return _reduce(_weighted(q, (input - target) ** 2).sum(-1), reduction)


def homogeneous_loss(input: Tensor, target: Tensor, grades: GradesArg, *,
                     reduction: str = "mean") -> Tensor:
    """Homogeneous loss (000 §3.3): (Σ_{j=1}^r ‖e_{d_j}‖^{2(r−j+1)})^{1/r}, one value per vector.

    e = y − ŷ, d_1 < ... < d_r are the distinct grades and e_{d_j} the coordinates of grade d_j
    with their Euclidean norm. For V_(2,3): (‖e_2‖⁴ + ‖e_3‖²)^{1/2}. The grades only group the
    coordinates, so no gradient flows into them (for a grading module, its scales group, in
    their own dtype: two float32 scales that round to one bfloat16 value are two grades of a
    bfloat16 input).

    Computed as :func:`graded.algebra.space.power_norm` (the r-norm) of
    a_j = ‖e_{d_j}‖^{2(r−j+1)/r} ≤ max(‖e_{d_j}‖², 1), as
    :meth:`graded.algebra.GradedSpace.homogeneous_norm` is: the sum of powers itself overflows
    (float32: ‖e_{d_1}‖² = 10⁴ with r = 10 is 10⁴⁰) where the loss does not. A NaN error gives
    a NaN loss and an infinite one ∞.
    """
    _check(input, target, reduction)
    if isinstance(grades, GradingMap):
        q = _weights(grades, input, what="homogeneous_loss", own_dtype=True).detach()
    else:  # a list's grades are Python floats: grouped in float64, not rounded to float32
        given = (grades if isinstance(grades, Tensor)
                 else torch.as_tensor(grades, dtype=torch.float64))
        q = as_grade_tensor(given, dim=input.shape[-1], allow_heads=False).detach()
    distinct = sorted(set(q.cpu().tolist()))
    r = len(distinct)
    sq = (input - target) ** 2
    if r <= 1:  # one grade: ‖e‖²; no coordinates: the empty sum 0, as graded_norm_loss's
        return _reduce(sq.sum(-1), reduction)
    groups = [sq.index_select(-1, (q == d).nonzero().flatten().to(input.device)).sum(-1)
              for d in distinct]
    s = torch.stack(groups, -1)  # ‖e_{d_j}‖², (..., r)
    k = torch.arange(r, 0, -1, dtype=s.dtype, device=s.device)  # r − j + 1
    # the powers s^{k/r} with k/r < 1 and the r-th root, with finite gradients at a zero error
    zero = s == 0
    a = torch.where(zero, torch.zeros_like(s), torch.where(zero, torch.ones_like(s), s) ** (k / r))
    return _reduce(power_norm(a, r), reduction)


def graded_cross_entropy(input: Tensor, target: Tensor, grades: GradesArg, *,
                         from_logits: bool = True, ignore_index: int = -100,
                         reduction: str = "mean") -> Tensor:
    """Graded cross-entropy −Σ_i q_i y_i log ŷ_i (000 §3.3), one value per vector.

    A term with y_i = 0 or q_i = 0 is 0, also where ŷ_i = 0 (0·log 0 = 0); any other term with
    a NaN prediction ŷ_i is NaN, for probabilities as for logits.

    ``input`` (..., C) holds logits (``from_logits=True``; log-softmax is applied) or
    probabilities. ``target`` is (..., C) class probabilities or (...) class indices; index
    targets equal to ``ignore_index`` are left out of the sum and the mean. The mean is over
    samples; ``torch.nn.functional.cross_entropy(weight=...)`` instead divides by the sum of
    the weights of the targets, which would cancel a uniform grading. The mean of no sample (an
    empty batch, or every target ignored) is NaN with zero gradients, as
    ``F.cross_entropy``'s. A grading's scale beyond the input's dtype (10⁵ for float16) weights
    as in :func:`linearly_graded_loss`: q·y is formed in the wider dtype, so a zero target
    probability gives 0, not ∞·0 = NaN.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    _check(input, None, reduction)
    if not isinstance(target, Tensor):
        raise TypeError(f"target must be a tensor of class indices or probabilities, got "
                        f"{type(target).__name__}")
    q = _weights(grades, input, what="graded_cross_entropy", own_dtype=True)
    if torch.promote_types(q.dtype, input.dtype) == input.dtype:
        q = q.to(input.dtype)  # no scale can overflow the cast: cast once, as _weighted would
    if from_logits:
        logp = F.log_softmax(input, -1)
    else:
        # log p, -inf for p <= 0; a NaN probability stays NaN (read as p = 0 it gave ∞)
        pos = input > 0
        logp = torch.log(torch.where(pos, input, torch.ones_like(input)))
        logp = torch.where(pos, logp, torch.where(input.isnan(), input,
                                                  torch.full_like(input, -torch.inf)))
    keep = None
    if not target.is_floating_point():
        if target.dtype == torch.bool or target.is_complex():
            raise TypeError(f"target must hold class indices (an integer tensor) or class "
                            f"probabilities (a floating-point one), got {target.dtype}")
        if target.dtype != torch.int64:  # gather takes int64 (or int32) indices only
            target = target.long()
        if target.shape != input.shape[:-1]:
            raise ValueError(f"class-index target must have shape {tuple(input.shape[:-1])}, "
                             f"got {tuple(target.shape)}")
        keep = target != ignore_index
        idx = torch.where(keep, target, torch.zeros_like(target)).unsqueeze(-1)
        c = input.shape[-1]
        out_of_range = keep & ((target < 0) | (target >= c))
        if bool(out_of_range.any()):
            raise ValueError(f"class-index target out of range [0, {c}): got "
                             f"{target[out_of_range][:5].tolist()}")
        q_y = q.expand_as(logp).gather(-1, idx).squeeze(-1)
        q_y_narrow = (q_y if q.dtype == input.dtype
                      else q.to(input.dtype).expand_as(logp).gather(-1, idx).squeeze(-1))
        logp_y = logp.gather(-1, idx).squeeze(-1)
        # a left-out target or a zero weight contributes 0, also where log p = −inf (and no NaN
        # gradient reaches learnable weights through 0·(−inf))
        drop = ~keep | (q_y_narrow == 0)
        per = -_weighted(q_y, torch.where(drop, torch.zeros_like(logp_y), logp_y),
                         narrow=q_y_narrow)
    else:
        _check(input, target, reduction)
        drop = (target == 0) | (q.to(input.dtype) == 0)  # 0·log 0 = 0, as for a zero weight
        per = -(_weighted(q, target) * torch.where(drop, torch.zeros_like(logp), logp)).sum(-1)
    if reduction == "mean" and keep is not None:
        kept = keep.sum()
        # 0/0 would be NaN too, but with NaN gradients (inf·0) for learnable weights
        mean = per.sum() / kept.clamp(min=1)
        return torch.where(kept > 0, mean, torch.full_like(mean, math.nan))
    return _reduce(per, reduction)


def max_graded_loss(input: Tensor, target: Tensor, grades: GradesArg, *,
                    reduction: str = "mean") -> Tensor:
    """Max-graded loss (max_i q_i^{1/2}|y_i − ŷ_i|)² = max_i q_i (y_i − ŷ_i)² (000 §3.3).

    With no coordinates (last dimension 0) the loss is 0, as for the sums of the other losses.
    """
    _check(input, target, reduction)
    q = _weights(grades, input, what="max_graded_loss", own_dtype=True)
    terms = _weighted(q, (input - target) ** 2)
    if terms.shape[-1] == 0:  # amax has no identity; every term is >= 0, so the empty max is 0
        return _reduce(terms.new_zeros(terms.shape[:-1]), reduction)
    return _reduce(terms.amax(-1), reduction)


def linearly_graded_loss(input: Tensor, target: Tensor, grades: GradesArg, *,
                         base_loss: BaseLoss = "mse", reduction: str = "mean") -> Tensor:
    """Linearly graded loss Σ_i Σ_k q_k ℓ(ŷ_{i,k}, y_{i,k}) (000 Def 5.37, Eq. 63).

    ``reduction="sum"`` is Eq. 63 exactly. Tensor grades are the weights q_k = f(q_k) of the
    definition; a :class:`LinearGrading` contributes its scales f(q), in their own dtype where
    they are beyond the input's (1e5 · 1e-4 is 10 for a float16 input, not ∞). ``base_loss`` is
    one of mse, l1, smooth_l1, huber, bce (probabilities), bce_with_logits, or a callable
    returning elementwise losses.
    """
    _check(input, target, reduction)
    if isinstance(grades, ExponentialGrading):
        raise TypeError("linearly_graded_loss got an ExponentialGrading; use "
                        "exponentially_graded_loss for weights λ^q")
    q = _weights(grades, input, what="linearly_graded_loss", own_dtype=True)
    return _reduce(_weighted(q, _elementwise(base_loss, input, target)), reduction)


def exponentially_graded_loss(input: Tensor, target: Tensor, grades: GradesArg, *,
                              base: float | None = None, base_loss: BaseLoss = "mse",
                              reduction: str = "mean") -> Tensor:
    """Exponentially graded loss Σ_i Σ_k λ^{q_k} ℓ(ŷ_{i,k}, y_{i,k}) (000 Def 7.1; 001 §5).

    Tensor grades are q (≥ 0) and ``base`` is λ (default 2.0; λ ≥ 1, λ = 1 being the start of
    the annealing schedule of 000 §7.2). An :class:`ExponentialGrading` contributes its scales
    λ^q and its own λ (then ``base`` must be left unset). ``base_loss`` as in
    :func:`linearly_graded_loss`. For tensor grades q·ln λ is formed in float32 at least, so
    a float16 or bfloat16 input is weighted by λ^q rounded once to its dtype.

    A term λ^q·ℓ is finite wherever it is in the input's dtype, also where the weight λ^q alone
    is not (:func:`_exponential_factors`: λ^q = 2^130 and ℓ = 2^-100 give 2^30 in float32), and
    a term with ℓ = 0 is 0. The gradient with respect to ℓ is λ^q (divided by the number of
    terms for ``"mean"``), so the input's gradient is ∞ or NaN where that is beyond the dtype,
    even where the chain rule's product λ^q·∂ℓ/∂ŷ is not. A grading's scales are its own,
    clamped at its ``max_log_scale``; they are split in their dtype (or the input's, if wider),
    so a float32 grading weights a float16 loss without overflow in the cast.
    """
    _check(input, target, reduction)
    if isinstance(grades, LinearGrading):
        raise TypeError("exponentially_graded_loss got a LinearGrading; use "
                        "linearly_graded_loss for weights f(q)")
    if isinstance(grades, ExponentialGrading):
        if base is not None:
            raise ValueError(f"base={base!r} given with an ExponentialGrading, which has its "
                             f"own base {float(grades.base)!r}")
        scales = _scales(grades, input, what="exponentially_graded_loss")
        # ln of the scales (≥ 1, finite) at the wider of the two precisions
        log_w = torch.log(scales.to(torch.promote_types(scales.dtype, input.dtype)))
    else:
        lam = 2.0 if base is None else float(base)
        if not 1.0 <= lam < math.inf:
            raise ValueError(f"exponentially_graded_loss needs a finite base λ >= 1, got "
                             f"base={base!r}")
        # q·ln λ at float32 at least: in float16 or bfloat16 ln 2 is rounded (bfloat16: 2^10
        # came out as 1000), so the weights are λ^q rounded once to the input's dtype
        wide = torch.promote_types(input.dtype, torch.float32)
        q = _weights(grades, input, what="exponentially_graded_loss", dtype=wide)
        scales = None
        log_w = q * torch.log(torch.tensor(lam, dtype=q.dtype, device=q.device))
    w1, w2, w3 = _exponential_factors(log_w, input.dtype, scales)
    ell = _elementwise(base_loss, input, target)
    return _reduce(ell * w1 * w2 * w3, reduction)


class _GradedLoss(nn.Module):
    """Holds the grades: a grading module as a submodule (its parameters train with the model's
    optimiser when it is shared), a tensor as a buffer."""

    def __init__(self, grades: GradesArg, reduction: str = "mean") -> None:
        super().__init__()
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        self.reduction = reduction
        if isinstance(grades, GradingMap):
            self.grading = grades
        else:
            self.grading = None
            self.register_buffer("grades", as_grade_tensor(grades, allow_heads=False).detach())

    def _grades(self) -> GradesArg:
        return self.grading if self.grading is not None else self.grades


class GradedMSELoss(_GradedLoss):
    """Module form of :func:`graded_mse`."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return graded_mse(input, target, self._grades(), reduction=self.reduction)


class GradedNormLoss(_GradedLoss):
    """Module form of :func:`graded_norm_loss`."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return graded_norm_loss(input, target, self._grades(), reduction=self.reduction)


class HomogeneousLoss(_GradedLoss):
    """Module form of :func:`homogeneous_loss`."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return homogeneous_loss(input, target, self._grades(), reduction=self.reduction)


class MaxGradedLoss(_GradedLoss):
    """Module form of :func:`max_graded_loss`."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return max_graded_loss(input, target, self._grades(), reduction=self.reduction)


class GradedCrossEntropyLoss(_GradedLoss):
    """Module form of :func:`graded_cross_entropy`."""

    def __init__(self, grades: GradesArg, *, from_logits: bool = True, ignore_index: int = -100,
                 reduction: str = "mean") -> None:
        super().__init__(grades, reduction)
        self.from_logits, self.ignore_index = from_logits, ignore_index

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return graded_cross_entropy(input, target, self._grades(), from_logits=self.from_logits,
                                    ignore_index=self.ignore_index, reduction=self.reduction)


class LinearlyGradedLoss(_GradedLoss):
    """Module form of :func:`linearly_graded_loss`."""

    def __init__(self, grades: GradesArg, *, base_loss: BaseLoss = "mse",
                 reduction: str = "mean") -> None:
        super().__init__(grades, reduction)
        self.base_loss = base_loss

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return linearly_graded_loss(input, target, self._grades(), base_loss=self.base_loss,
                                    reduction=self.reduction)


class ExponentiallyGradedLoss(_GradedLoss):
    """Module form of :func:`exponentially_graded_loss`."""

    def __init__(self, grades: GradesArg, *, base: float | None = None,
                 base_loss: BaseLoss = "mse", reduction: str = "mean") -> None:
        super().__init__(grades, reduction)
        self.base, self.base_loss = base, base_loss

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return exponentially_graded_loss(input, target, self._grades(), base=self.base,
                                         base_loss=self.base_loss, reduction=self.reduction)
