"""Student's t and the Beta distribution, computed here because scipy is not a dependency, and
the intervals they give.

- Student t: :func:`t_quantile` (bisection on the regularised incomplete beta function, which
  :func:`_incomplete_beta` evaluates by its continued fraction, Lentz's method, Numerical
  Recipes §6.4) and :func:`t_interval`; :func:`_t_two_sided_tail` is the two-sided tail that
  the paired t-test (:func:`graded.study.significance.paired_t_p_value`) reads.
- Accuracies over a known number of independent trials: :func:`binomial_interval`, the exact
  (Clopper–Pearson 1934) interval from the Beta quantiles (:func:`_beta_quantile`), which
  :func:`graded.study.statistics.mean_interval` joins to its hull when given ``trials``:
  replicates that all score 1 (or 0) have no spread, and the bootstrap and t intervals then
  shrink to the point, as if the accuracy were known exactly.
"""

from __future__ import annotations

import math

import numpy as np

from graded.checks import check_int

__all__ = ["binomial_interval", "t_interval", "t_quantile"]


def _check_level(level: float, caller: str, example: float = 0.95) -> None:
    """A ``level`` (an interval's coverage, a test's size) lies strictly between 0 and 1."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"{caller} needs a level strictly between 0 and 1 (e.g. {example}), "
                         f"got level={level!r}")


def t_quantile(p: float, nu: float) -> float:
    """The ``p`` quantile of Student's t with ``nu`` degrees of freedom: the root of
    F(t) = p, F(t) = 1 − ½·I_{ν/(ν+t²)}(ν/2, ½) for t ≥ 0 (and symmetric), by bisection."""
    if not 0.0 < p < 1.0 or not 0.0 < nu < math.inf:
        raise ValueError(f"t_quantile needs 0 < p < 1 and finite nu > 0, got p={p}, nu={nu}")
    if p < 0.5:
        return -t_quantile(1.0 - p, nu)
    if p == 0.5:
        return 0.0
    tail = 2.0 * (1.0 - p)  # the two-sided tail mass beyond the quantile

    def two_sided(t: float) -> float:
        return _t_two_sided_tail(t, nu)

    low, high = 0.0, 1.0
    while two_sided(high) > tail:
        high *= 2.0
    for _ in range(200):
        mid = (low + high) / 2.0
        if two_sided(mid) > tail:
            low = mid
        else:
            high = mid
        if high - low <= 1e-13 * high:
            break
    return (low + high) / 2.0


def t_interval(values, *, level: float = 0.95) -> tuple[float, float, float]:
    """Mean of ``values`` and its Student t interval mean ± t_{(1+level)/2, n−1}·s/√n (s with
    n − 1 in the denominator).

    One value has no t interval: with n − 1 = 0 degrees of freedom there is no spread to
    estimate and t_{(1+level)/2, 0} is infinite, so the bounds are (−∞, +∞), which every verdict
    of the study (:func:`graded.study.core.verdict`) reads as inconclusive. The point
    (mean, mean) would claim certainty from one sample."""
    _check_level(level, "t_interval")
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0:
        raise ValueError("t_interval needs at least one value")
    mean = float(x.mean())
    if x.size == 1:
        return mean, -math.inf, math.inf
    half = t_quantile((1.0 + level) / 2.0, x.size - 1.0) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return mean, mean - half, mean + half


def _beta_quantile(p: float, a: float, b: float) -> float:
    """The ``p`` quantile of the Beta(a, b) distribution: the root of I_x(a, b) = p, by
    bisection on :func:`_incomplete_beta`."""
    low, high = 0.0, 1.0
    for _ in range(200):
        mid = (low + high) / 2.0
        if _incomplete_beta(a, b, mid) < p:
            low = mid
        else:
            high = mid
        if high - low <= 1e-15:
            break
    return (low + high) / 2.0


def binomial_interval(successes: float, trials: int, *,
                      level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper–Pearson) interval of a success probability from ``successes`` of
    ``trials`` independent trials: [B⁻¹(α/2; x, n − x + 1), B⁻¹(1 − α/2; x + 1, n − x)] with
    α = 1 − level, the lower end 0 at x = 0 and the upper end 1 at x = n (closed forms there:
    (α/2)^(1/n) and 1 − (α/2)^(1/n)). Each end covers the probability with at least level's
    confidence, whatever it is. ``successes`` may be fractional (a mean accuracy times the
    trials, where several runs answered the same items): the Beta quantiles are continuous in
    x and lie between those of the neighbouring integers."""
    _check_level(level, "binomial_interval")
    n = check_int("trials", trials, minimum=1)
    x = float(successes)
    if not 0.0 <= x <= n:
        raise ValueError(f"binomial_interval needs 0 <= successes <= trials={n}, got "
                         f"successes={successes!r}")
    alpha = 1.0 - level
    low = 0.0 if x == 0.0 else _beta_quantile(alpha / 2.0, x, n - x + 1.0)
    high = 1.0 if x == n else _beta_quantile(1.0 - alpha / 2.0, x + 1.0, n - x)
    return low, high


def _t_two_sided_tail(t: float, nu: float) -> float:
    """P(|T| ≥ |t|) for Student's t with ``nu`` degrees of freedom: I_x(ν/2, ½) with
    x = ν/(ν + t²), its complement 1 − x = t²/(ν + t²) computed as such (1 − x rounds to 0
    when t² ≪ ν, which would make every small t look like t = 0)."""
    return _incomplete_beta(nu / 2.0, 0.5, nu / (nu + t * t), t * t / (nu + t * t))


def _incomplete_beta(a: float, b: float, x: float, complement: float | None = None) -> float:
    """The regularised incomplete beta function I_x(a, b) by its continued fraction (Lentz's
    method, Numerical Recipes §6.4); ``complement``, when given, is 1 − x computed without
    its rounding."""
    y = 1.0 - x if complement is None else complement
    if x <= 0.0:
        return 0.0
    if y <= 0.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):  # the fraction converges fast on this side only
        return 1.0 - _incomplete_beta(b, a, y, x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x)
                     + b * (math.log1p(-x) if complement is None else math.log(y))) / a
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= c * d
        if abs(c * d - 1.0) < 1e-14:
            break
    return front * h

