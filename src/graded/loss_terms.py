"""The terms w_k·ℓ(ŷ_k, y_k) that the graded losses of :mod:`graded.losses` sum or average.

- **The base loss** ℓ, elementwise (:func:`_elementwise`): one of mse, l1, smooth_l1, huber,
  bce, bce_with_logits (:data:`BaseLoss`), or a callable returning elementwise losses.
- **The weights** w of the grades (:func:`_weights`): tensor grades are the weights q_i
  themselves and must be finite and ≥ 0 (a negative weight makes a loss unbounded below); a
  grading module (:class:`graded.LinearGrading`, :class:`graded.ExponentialGrading`) gives
  its **scales** (f(q) or λ^q, :func:`_scales`), so that gradients flow into learnable grades.
- **Their products** in the input's dtype, finite wherever the weighted term is: a grading's
  scale beyond the input's dtype (a float32 scale above 65504 for a float16 input) weights its
  terms in the wider dtype (:func:`_weighted`); λ^q of the exponentially graded loss is split
  into three factors, each finite in the input's dtype (:func:`_exponential_factors`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor
from torch.nn import functional as F

from graded.grading import GradingMap, as_grade_tensor

__all__ = ["BaseLoss", "GradesArg"]

#: The grades of a graded loss: the weights q_i themselves, or a grading module (its scales).
GradesArg = Tensor | GradingMap
#: ℓ of the linearly and exponentially graded losses: a name of ``_BASE_LOSSES`` or a callable
#: returning elementwise losses.
BaseLoss = str | Callable[[Tensor, Tensor], Tensor]
_BASE_LOSSES: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "mse": lambda i, t: F.mse_loss(i, t, reduction="none"),
    "l1": lambda i, t: F.l1_loss(i, t, reduction="none"),
    "smooth_l1": lambda i, t: F.smooth_l1_loss(i, t, reduction="none"),
    "huber": lambda i, t: F.huber_loss(i, t, reduction="none"),
    "bce": lambda i, t: F.binary_cross_entropy(i, t, reduction="none"),
    "bce_with_logits": lambda i, t: F.binary_cross_entropy_with_logits(i, t, reduction="none"),
}


def _scales(grading: GradingMap, input: Tensor, *, what: str) -> Tensor:
    """The scales (d,) of ``grading``, in its own dtype, for an input of d features."""
    d = input.shape[-1]
    if grading.grades.ndim != 1 or grading.dim != d:
        raise ValueError(f"{what}: the grading has grades of shape "
                         f"{tuple(grading.grades.shape)}, expected ({d},) for {d} features")
    return grading.scales()


def _weights(grades: GradesArg, input: Tensor, *, what: str, own_dtype: bool = False,
             dtype: torch.dtype | None = None) -> Tensor:
    """The weight vector (d,) of ``grades``: a tensor as given (in ``dtype``, default the
    input's), a grading module's scales(), cast to the input's dtype unless ``own_dtype``
    (then for :func:`_weighted`)."""
    d = input.shape[-1]
    if isinstance(grades, GradingMap):
        scales = _scales(grades, input, what=what)
        return scales if own_dtype else scales.to(input.dtype)
    dtype = input.dtype if dtype is None else dtype
    if not isinstance(grades, Tensor):
        grades = torch.as_tensor(grades, dtype=dtype, device=input.device)
    q = as_grade_tensor(grades, dim=d, dtype=dtype, device=input.device, allow_heads=False)
    if not torch.compiler.is_compiling():
        bad = q.detach() < 0
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise ValueError(f"{what} needs grades q >= 0 as weights, got {float(q[i])!r} "
                             f"at index {i}")
    return q


def _weighted(weights: Tensor, ell: Tensor, *, narrow: Tensor | None = None) -> Tensor:
    """The terms w_k·ℓ_k in ℓ's dtype, finite wherever the product is in that dtype.

    ``weights`` (d,), or any shape that broadcasts against ℓ, are a grading's scales in their
    own dtype (or tensor grades, already in ℓ's). A weight that fits ℓ's dtype is rounded to
    it and multiplies ℓ there: the terms of w·ℓ bit for bit. A weight beyond it (a float32
    scale above 65504 for a float16 ℓ, where the cast gave ∞, so ∞·0 = NaN for an exact
    prediction and ∞ for 10⁵·10⁻⁴) multiplies ℓ in the wider of the two dtypes, and the
    product is rounded to ℓ's. As for :func:`~graded.losses.exponentially_graded_loss`, the
    gradient with respect to ℓ is the weight (times the reduction's factor), rounded to ℓ's
    dtype: ∞ where that is beyond it. ``narrow``: the weights already rounded to ℓ's dtype
    (gathered from the rounded scales, as :func:`~graded.losses.graded_cross_entropy` gathers
    them, so that their gradients sum in that dtype)."""
    dtype = ell.dtype
    wide = torch.promote_types(weights.dtype, dtype)
    if narrow is None:
        narrow = weights.to(dtype)
    if wide == dtype:  # every weight is exact in ℓ's dtype (or tensor grades, already in it)
        return narrow * ell
    over = narrow.isinf() & weights.isfinite()  # the cast overflowed
    near = torch.where(over, torch.ones_like(narrow), narrow) * ell
    # ℓ is zeroed where the weight fits, so no ∞·0 reaches the weights' gradient there
    far_ell = torch.where(over, ell, torch.zeros_like(ell)).to(wide)
    far = (weights.to(wide) * far_ell).to(dtype)
    return torch.where(over, far, near)


def _base_loss(base_loss: BaseLoss) -> Callable[[Tensor, Tensor], Tensor]:
    if callable(base_loss):
        return base_loss
    if base_loss not in _BASE_LOSSES:
        raise ValueError(f"base_loss must be one of {tuple(_BASE_LOSSES)} or a callable "
                         f"returning elementwise losses, got {base_loss!r}")
    return _BASE_LOSSES[base_loss]


def _elementwise(base_loss: BaseLoss, input: Tensor, target: Tensor) -> Tensor:
    """ℓ(ŷ, y) elementwise; a callable that reduces (``F.mse_loss`` with its default
    ``reduction="mean"``) would otherwise be broadcast against the weights and weight nothing."""
    ell = _base_loss(base_loss)(input, target)
    if not isinstance(ell, Tensor) or ell.shape != input.shape:
        got = tuple(ell.shape) if isinstance(ell, Tensor) else type(ell).__name__
        raise ValueError(f"base_loss returned {got}; expected elementwise losses of the input's "
                         f"shape {tuple(input.shape)} (a torch.nn.functional loss needs "
                         "reduction='none')")
    return ell


def _exponential_factors(log_weights: Tensor, dtype: torch.dtype,
                         weights: Tensor | None = None) -> tuple[Tensor, ...]:
    """λ^q = exp(q·ln λ) as three factors exp(e_1)·exp(e_2)·exp(e_3), each finite in ``dtype``.

    e_1 = min(e, c), e_2 = min(e − e_1, c), e_3 = min(e − e_1 − e_2, c) with c = ln(max) − 1.
    Every factor is ≥ 1 and at most λ^q, so each partial product ((ℓ·w_1)·w_2)·w_3 is at most
    |λ^q·ℓ|: a term is finite wherever λ^q·ℓ is, though λ^q alone is not (float32:
    q·ln λ > 88.7, float16: > 11.1). Past 3c (float32: 263) the weight is held at exp(3c),
    where every ℓ ≠ 0 of the dtype (≥ its smallest subnormal) gives ±∞ as λ^q·ℓ does, and
    ℓ = 0 gives 0 rather than 0·∞ = NaN. Below c the factors are λ^q, 1, 1 (``weights``, the
    scales themselves where given, else exp(e)): the terms are those of λ^q·ℓ bit for bit. The
    factors are computed in the dtype of ``log_weights`` and then rounded to ``dtype``."""
    c = math.log(torch.finfo(dtype).max) - 1.0
    e1 = log_weights.clamp(max=c)
    e2 = (log_weights - e1).clamp(max=c)
    e3 = (log_weights - e1 - e2).clamp(max=c)
    w1 = torch.exp(e1)
    if weights is not None:
        w1 = torch.where(log_weights <= c, weights.to(w1.dtype), w1)
    return w1.to(dtype), torch.exp(e2).to(dtype), torch.exp(e3).to(dtype)

