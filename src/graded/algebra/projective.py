"""Weighted projective space P_q = (V_q ∖ {0}) / F^×: normal forms of its points.

The points are the orbits of the weighted action (000 §2.2): two non-zero vectors are the same
point when one is λ⋆x of the other. :func:`normal_form`
picks, in the orbit of x ≠ 0, the point with homogeneous norm N = 1 (:func:`normalize`) and, for
integer grades, a canonical sign; :func:`same_point` compares two normal forms within the
rounding of their dtype; :func:`normal_form_exact` does the same exactly for rational points:
integral, weighted gcd 1, canonical sign. Each is also a method of
:class:`~graded.algebra.space.GradedSpace` (``space.normal_form(x)``), which is how they are
usually called; the conventions (negative λ, the norm N_w) are those of
:mod:`graded.algebra.space`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from fractions import Fraction

import torch
from torch import Tensor

from graded.algebra.integers import weighted_gcd
from graded.algebra.space import GradedSpace
from graded.checks import check_bool

__all__ = ["normal_form", "normal_form_exact", "normalize", "same_point"]


def _support_gcd_grades(space: GradedSpace, x: Tensor) -> Tensor:
    """Per vector, grades divided by the gcd of the grades on the support of x."""
    q = torch.tensor([int(g) for g in space.grades], device=x.device)
    support = x != 0
    g = torch.zeros(x.shape[:-1], dtype=q.dtype, device=x.device)
    for i in range(space.dim):
        g = torch.gcd(g, torch.where(support[..., i], q[i], torch.zeros_like(g)))
    return q // g.clamp(min=1).unsqueeze(-1)


def normalize(space: GradedSpace, x: Tensor, w: float | None = None) -> Tensor:
    """(1/N(x))⋆x: the point of the ℝ_{>0}-orbit of x with homogeneous norm 1.

    Computed in log space, y_i = sgn(x_i)·exp(ln|x_i| − q_i ln N) with
    ln N = (1/w) logsumexp_i(w ln|x_i| / q_i), so that no intermediate leaves the dtype's
    range: the factor N^{−q_i} of (1/N)⋆x is ∞ in float32 already for N = 10^{−30},
    q_i = 2 (and ∞·0 made zero coordinates NaN), and N or |x_i|^{1/q_i} themselves can
    under- or overflow (q_i < 1) while y cannot, as |y_i| ≤ 1. At a zero coordinate x_i
    the slope ∂y_i/∂x_i is N^{−q_i} (capped at float64's largest value), as elsewhere.
    """
    space._check(x, floating="the weighted projective normalisation")
    w = space._norm_exponent(w)
    # in float64: y_i = exp(ln|x_i| − q_i ln N) cancels logarithms of size q_max·|ln λ|,
    # which in float32 put errors of 30 eps in the normal form of a λ⋆x with λ = e^{±3}
    # (float64: the error is the input's rounding, a few eps of the input's dtype)
    out_dtype, x = x.dtype, x.to(torch.float64)
    q = space.grade_tensor(x)
    zero = x == 0
    log_x = torch.log(torch.where(zero, torch.ones_like(x), x).abs())
    log_a = torch.where(zero, torch.full_like(x, -math.inf), log_x / q)
    if math.isinf(w):
        log_n = log_a.amax(-1, keepdim=True)
    else:
        log_n = torch.logsumexp(w * log_a, -1, keepdim=True) / w
    if bool(torch.isneginf(log_n).any()):
        raise ValueError("the zero vector is not a point of a weighted projective space")
    # the exponent of a zero coordinate is set to 0 before exp: ln 1 − q_i ln N was beyond
    # float64 for a small N (exp = ∞), and the unused ∞ made the backward pass NaN
    y = torch.sign(x) * torch.exp(torch.where(zero, torch.zeros_like(x), log_x - q * log_n))
    # a zero coordinate is x_i·N^{−q_i}: 0 in value, with the slope N^{−q_i} in x_i (a
    # constant 0 there gave the Jacobian a zero column); the exponent is capped so that
    # 0·N^{−q_i} is not 0·∞ = NaN where N^{−q_i} is beyond float64
    cap = math.log(torch.finfo(torch.float64).max)
    at_zero = (x + 0.0) * torch.exp((-q * log_n).clamp(max=cap))  # + 0.0: −0 gives +0
    return torch.where(zero, at_zero, y).to(out_dtype)


def normal_form(space: GradedSpace, x: Tensor, w: float | None = None, *,
                closure: bool = False) -> Tensor:
    """Canonical representative of the orbit of x ≠ 0 (a point of weighted projective space).

    First :func:`normalize` (N = 1). With integer grades the orbit also contains
    (−1)⋆y = ((−1)^{q_i} y_i); the representative is the one whose first non-zero
    coordinate of odd grade is positive (if there is none, (−1)⋆y = y).
    ``closure=True`` identifies real points over ℂ: λ ∈ ℂ^× with λ⋆x real. With g the gcd of
    the grades on the support of x, these are λ = r·e^{iπm/g}, so the sign group acts by
    (−1)^{q_i/g} and the parity test uses q_i/g. Two points are equal iff their normal forms
    are (up to rounding). ``closure`` takes True or False only.
    """
    closure = check_bool("closure", closure)
    y = normalize(space, x, w)
    if not space.integer_grades:
        if closure:
            space._require_integer("normal_form(closure=True)")
        return y
    if closure:
        e = _support_gcd_grades(space, x)
    else:
        e = space.grade_tensor(x).to(torch.int64).expand(x.shape)
    odd = (torch.remainder(e, 2) == 1) & (y != 0)
    has_odd = odd.any(-1, keepdim=True)
    first = odd.to(torch.int8).argmax(-1, keepdim=True)
    lead = y.gather(-1, first)
    flip = has_odd & (lead < 0)
    return torch.where(flip & odd, -y, y)


def same_point(space: GradedSpace, x: Tensor, y: Tensor, w: float | None = None, *,
               closure: bool = False, rtol: float | None = None,
               atol: float | None = None) -> Tensor:
    """Bool tensor (...,): x and y are the same point of weighted projective space.

    The normal forms are compared with ``torch.isclose``. By default
    rtol = max(1e-6, t) and atol = max(1e-9, t) with t = (1 + q_max/q_min)·eps, eps that
    of the narrower of the two dtypes: a representative λ⋆x rounded to its dtype has a
    normal form off by up to about (1 + q_max/q_min)·eps/2 (a relative error eps/2 in a
    coordinate of grade q_min moves ln N by eps/(2·q_min), and y_i by q_i times that). The
    former fixed 1e-6 called 0.3% of the float32 pairs (x, λ⋆x), λ ∈ [1/2, 2], on
    P(2, 4, 6, 10) different points, and 95% of the bfloat16 ones.
    """
    nx = normal_form(space, x, w, closure=closure)
    ny = normal_form(space, y, w, closure=closure)
    if rtol is None or atol is None:
        narrow = x.dtype if torch.finfo(x.dtype).eps >= torch.finfo(y.dtype).eps else y.dtype
        ratio = max(space.grades) / min(space.grades)  # normal_form checked q > 0
        t = (1.0 + ratio) * torch.finfo(narrow).eps
        rtol = max(1e-6, t) if rtol is None else rtol
        atol = max(1e-9, t) if atol is None else atol
    if nx.dtype != ny.dtype:
        dtype = torch.promote_types(nx.dtype, ny.dtype)
        nx, ny = nx.to(dtype), ny.to(dtype)
    return torch.isclose(nx, ny, rtol=rtol, atol=atol).all(-1)


def normal_form_exact(space: GradedSpace, x: Sequence[int | Fraction], *,
                      closure: bool = False) -> tuple[int, ...]:
    """Exact canonical representative of a rational point of P_q (positive integer grades).

    Over ℚ (λ ∈ ℚ^×): clear denominators with D⋆x (D the lcm of the denominators), divide by
    the weighted gcd, d^{-1}⋆x, and fix the sign as in :func:`normal_form`. If y = (a/b)⋆x
    (a/b reduced) are both integral with weighted gcd 1, then b^{q_i} | x_i for all i, so
    b | wgcd(x) = 1, and likewise a = ±1: the result is unique. ``closure=True`` uses λ ∈ ℚ̄^×
    with λ⋆x rational: then μ = λ^g ∈ ℚ^× (g the gcd of the grades on the support) and
    λ⋆x = μ⋆x for the grades q/g, so the same algorithm runs with those grades.
    ``closure`` takes True or False only.
    """
    closure = check_bool("closure", closure)
    space._require_positive("normal_form_exact")
    space._require_integer("normal_form_exact")
    if len(x) != space.dim:
        raise ValueError(f"x has {len(x)} coordinates, expected {space.dim}")
    vals = []
    for i, v in enumerate(x):
        if isinstance(v, bool) or not isinstance(v, numbers.Rational):
            raise TypeError(f"coordinate {v!r} at index {i} is not an int or Fraction")
        vals.append(Fraction(int(v)) if isinstance(v, numbers.Integral) else Fraction(v))
    if all(v == 0 for v in vals):
        raise ValueError("the zero vector is not a point of a weighted projective space")
    q = [int(g) for g in space.grades]
    if closure:
        g = 0
        for v, qi in zip(vals, q):
            if v != 0:
                g = math.gcd(g, qi)
        # the grades of the support divided by g; a zero coordinate stays 0 whatever acts
        # on it, so its grade is kept (q_i // g is 0 when q_i < g, a grade weighted_gcd
        # refuses: the point (0, 0, 0, 1) of P(2, 4, 6, 10) raised)
        q = [qi // g if v != 0 else qi for v, qi in zip(vals, q)]
    den = 1
    for v in vals:
        den = den * v.denominator // math.gcd(den, v.denominator)
    ints = [int(v * den**qi) for v, qi in zip(vals, q)]
    d = weighted_gcd(ints, q)
    ints = [v // d**qi for v, qi in zip(ints, q)]
    lead = next((v for v, qi in zip(ints, q) if v != 0 and qi % 2 == 1), 1)
    if lead < 0:
        ints = [-v if qi % 2 == 1 else v for v, qi in zip(ints, q)]
    return tuple(ints)
