"""The statistics behind the claims study's verdicts: intervals of a mean over replicates and
paired tests over families of comparisons.

The study's interval (:data:`graded.study.core.RULE`) is defined here: :func:`mean_interval`,
the hull of the percentile bootstrap and the t interval of the :func:`replicate_values`
(cluster means, or their ratio-estimator linearisation for unequal sizes, Cochran 1977,
*Sampling Techniques*, ch. 6), returned as an :class:`Interval`. Why the hull: the percentile
interval alone is too narrow for few replicates (Efron & Tibshirani 1993, *An Introduction to
the Bootstrap*, ch. 13; Hesterberg 2015, "What Teachers Should Know About the Bootstrap", its
narrowness bias). :func:`stratified_interval` is its form for replicates within fixed strata
(the mean of the strata's means, Welch–Satterthwaite degrees of freedom). Given ``trials``,
:func:`mean_interval` also joins the exact binomial interval to its hull.

The pieces it is built from live in their own modules and are importable from here too:

- :mod:`graded.study.bootstrap`: percentile bootstrap intervals, :func:`bootstrap_interval` of
  a mean, :func:`paired_bootstrap` of a mean paired difference, :func:`cluster_bootstrap` for
  values that come in dependent clusters (Davison & Hinkley 1997, *Bootstrap Methods and their
  Application*, §3.8, strategy 1), and :func:`two_stage_bootstrap` for values on a grid of tasks
  and seeds, resampling both.
- :mod:`graded.study.distributions`: Student t, :func:`t_quantile` (bisection on the
  regularised incomplete beta function, evaluated by its continued fraction, Lentz's method,
  Numerical Recipes §6.4) and :func:`t_interval`; and for accuracies over a known number of
  independent trials, :func:`binomial_interval`, the exact (Clopper–Pearson 1934) interval,
  which :func:`mean_interval` joins to its hull when given ``trials``: replicates that all
  score 1 (or 0) have no spread, and the bootstrap and t intervals then shrink to the point,
  as if the accuracy were known exactly.
- :mod:`graded.study.significance`: families of paired comparisons, :func:`paired_t_p_value`
  (two-sided paired t-test) and :func:`holm` (Holm 1979, step-down correction).

The verdict that reads an interval, :func:`graded.study.core.verdict`, stays with the study's
vocabulary in :mod:`graded.study.core`. scipy is not a dependency, so the t distribution is
computed in :mod:`graded.study.distributions`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from graded.checks import check_int
from graded.study.bootstrap import (
    _check_resampling,
    _cluster_sums,
    _codes,
    bootstrap_interval,
    cluster_bootstrap,
    paired_bootstrap,
    two_stage_bootstrap,
)
from graded.study.distributions import binomial_interval, t_interval, t_quantile
from graded.study.significance import holm, paired_t_p_value

__all__ = [
    "Interval",
    "binomial_interval",
    "bootstrap_interval",
    "cluster_bootstrap",
    "holm",
    "mean_interval",
    "paired_bootstrap",
    "paired_t_p_value",
    "replicate_values",
    "stratified_interval",
    "t_interval",
    "t_quantile",
    "two_stage_bootstrap",
]


def replicate_values(values, clusters=None) -> np.ndarray:
    """One value per replicate, whose mean is the finding's estimate: ``values`` themselves
    without ``clusters``; otherwise, for cluster c with sum S_c of m_c values,
    u_c = R + (S_c − R·m_c)/m̄, with R = ΣS/Σm (the mean over all values, the estimate) and m̄
    the mean cluster size. With equal sizes u_c is the cluster mean; with unequal sizes it is
    the linearised contribution of the cluster to the ratio estimate R, so that the t interval
    of the u_c is R ± t·s.e., s.e. the cluster-robust (ratio-estimator) standard error
    (Cochran 1977, *Sampling Techniques*, ch. 6). Clusters are taken in the order of their
    first value."""
    x = np.asarray(values, dtype=np.float64).ravel()
    if clusters is None:
        return x
    sums, sizes = _cluster_sums(x, clusters, "replicate_values")
    if np.all(sizes == sizes[0]):
        return sums / sizes
    ratio = float(sums.sum() / sizes.sum())
    return ratio + (sums - ratio * sizes) / sizes.mean()


@dataclass(frozen=True)
class Interval:
    """A finding's estimate and its verdict interval [low, high]: the hull of the percentile
    bootstrap interval ``bootstrap`` and the Student t interval ``t`` over ``replicates``
    replicates (see :data:`graded.study.core.RULE`)."""

    estimate: float
    low: float
    high: float
    bootstrap: tuple[float, float]
    t: tuple[float, float]
    replicates: int
    bounds: tuple[float, float] | None = None
    df: float | None = None  # the t interval's degrees of freedom, when not replicates − 1
    binomial: tuple[float, float, int] | None = None  # (low, high, trials) when joined

    def note(self, fmt: str = ".4f") -> str:
        """The two intervals behind [low, high], for a finding's detail."""
        b, t = self.bootstrap, self.t
        df = f"{self.replicates - 1}" if self.df is None else f"{self.df:.1f}"
        hull = (min(b[0], t[0]), max(b[1], t[1]))
        exact = ""
        if self.binomial is not None:
            c = self.binomial
            hull = (min(hull[0], c[0]), max(hull[1], c[1]))
            exact = (f" and the exact binomial interval [{c[0]:{fmt}}, {c[1]:{fmt}}] over "
                     f"{c[2]} trials")
        cut = "" if self.bounds is None or (self.low, self.high) == hull else (
            f", cut to the quantity's range [{self.bounds[0]:g}, {self.bounds[1]:g}]")
        if t == (-math.inf, math.inf):  # 0 degrees of freedom: no spread to estimate
            why = (f"n = {self.replicates}: no interval" if self.df is None
                   else "a stratum of one value: no interval")
            t_part = f"the t interval (−∞, ∞) ({why}, so no verdict)"
        else:
            t_part = f"the t interval [{t[0]:{fmt}}, {t[1]:{fmt}}] ({df} df)"
        return (f"Interval: the hull of the percentile bootstrap [{b[0]:{fmt}}, {b[1]:{fmt}}]"
                f"{',' if exact else ' and'} {t_part}{exact}{cut}.")


def _hull(*intervals: tuple[float, float]) -> tuple[float, float]:
    """The smallest interval holding every one of ``intervals``; NaN where any end is NaN (a
    value that could not be measured leaves no interval, whatever the order of the parts:
    Python's ``min(1.0, nan)`` is 1.0 but ``min(nan, 1.0)`` is nan)."""
    lows = [float(i[0]) for i in intervals]
    highs = [float(i[1]) for i in intervals]
    if any(math.isnan(v) for v in lows + highs):
        return math.nan, math.nan
    return min(lows), max(highs)


def mean_interval(values, clusters=None, *, n_boot: int = 10_000, level: float = 0.95,
                  seed: int = 0, bounds: tuple[float, float] | None = None,
                  trials: int | None = None) -> Interval:
    """The study's interval of a mean over replicates (:data:`graded.study.core.RULE`): the hull
    of the percentile bootstrap (:func:`bootstrap_interval`, or :func:`cluster_bootstrap` when
    ``clusters`` names each value's replicate) and the Student t interval
    (:func:`t_interval`) of the :func:`replicate_values`.

    The percentile bootstrap alone is too narrow for few replicates: it estimates the spread
    with divisor k rather than k − 1 and uses normal-like rather than t quantiles, so with
    k = 5 it is about 0.63 times as wide as the t interval (1.96·√(4/5) against
    t_{0.975,4} = 2.776) and covers the mean far less than 95% of the time (Efron &
    Tibshirani 1993, ch. 13; Hesterberg 2015's narrowness bias). The t interval alone would
    drop the bootstrap's asymmetry for skewed replicates; the hull keeps both.

    ``bounds`` (low, high): the range the quantity can take (an accuracy [0, 1], a
    correlation [−1, 1]); the interval is cut to it, as the t interval of a mean near a bound
    can pass it and the mean cannot. A mean outside ``bounds`` is refused: cut there, the
    interval would no longer hold its estimate.

    A value that is NaN or infinite leaves no interval: [low, high] is NaN (no verdict),
    whatever the order in which the parts of the hull meet it.

    ``trials``: for a mean accuracy (values in [0, 1]) over that many independent trials in
    all (distinct items: runs that answer the same items count them once), the hull also
    takes the exact binomial interval of estimate·trials successes
    (:func:`binomial_interval`). Replicates that all score 1 have no spread, so the bootstrap
    and t intervals are the point 1; 55 items all answered rightly still leave the
    accuracy's lower end at (0.025)^(1/55) = 0.935.

    One replicate (one value, or one cluster) has no spread to estimate: its t interval has
    0 degrees of freedom and is the whole line (−∞, ∞), so the interval is ``bounds`` or
    unbounded and no verdict reads it as holding or failing."""
    if bounds is not None and not bounds[0] < bounds[1]:
        raise ValueError(f"mean_interval needs bounds (low, high) with low < high, got "
                         f"bounds={bounds!r}")
    x = np.asarray(values, dtype=np.float64).ravel()
    if clusters is None:
        est, b_low, b_high = bootstrap_interval(x, n_boot=n_boot, level=level, seed=seed)
    else:
        est, b_low, b_high = cluster_bootstrap(x, clusters, n_boot=n_boot, level=level,
                                               seed=seed)
    u = replicate_values(x, clusters)
    _, t_low, t_high = t_interval(u, level=level)  # one replicate: the whole line, no verdict
    low, high = _hull((b_low, b_high), (t_low, t_high))
    exact = None
    if trials is not None and not math.isnan(est):  # NaN: no interval to join
        n = check_int("trials", trials, minimum=1)
        if not 0.0 <= est <= 1.0:
            raise ValueError(f"mean_interval(trials={n}) is for accuracies in [0, 1]; the "
                             f"mean of the values is {est!r}")
        exact = (*binomial_interval(min(max(est * n, 0.0), float(n)), n, level=level), n)
        low, high = _hull((low, high), exact[:2])
    if bounds is not None:
        if not bounds[0] <= est <= bounds[1] and not math.isnan(est):
            raise ValueError(f"mean_interval: the mean of the values, {est!r}, lies outside "
                             f"bounds={bounds!r}, the range the quantity can take; cutting the "
                             "interval to them would leave the estimate outside its interval")
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return Interval(est, low, high, (b_low, b_high), (t_low, t_high), int(u.size), bounds,
                    binomial=exact)


def stratified_interval(values, strata, *, n_boot: int = 10_000, level: float = 0.95,
                        seed: int = 0) -> Interval:
    """The study's interval of the mean of per-stratum means, for replicates taken within
    fixed strata whose true means differ (E7's rounds within each model size): the estimate
    is (1/S)·Σ_s x̄_s over the S strata, and only the spread *within* each stratum is sampling
    noise. Pooling the values into :func:`mean_interval` would count the fixed differences
    between strata as noise and widen the interval by them.

    The hull, as in :func:`mean_interval`, of the stratified percentile bootstrap (each
    resample draws every stratum's values from that stratum, with replacement; Davison &
    Hinkley 1997, §3.7) and the t interval x̄ ± t_{(1+level)/2, ν}·se with
    se² = Σ_s s_s²/(S²·n_s) and the Welch–Satterthwaite degrees of freedom
    ν = (Σ_s v_s)² / Σ_s v_s²/(n_s − 1), v_s = s_s²/(S²·n_s) (Satterthwaite 1946; Welch
    1947). A stratum of one value has no spread to estimate: the t interval is then the whole
    line and no verdict reads it; with no spread in any stratum it is the point. Strata are
    taken in the order of their first value."""
    _check_resampling(n_boot, level, "stratified_interval")
    x = np.asarray(values, dtype=np.float64).ravel()
    labels = list(strata)
    if x.size == 0:
        raise ValueError("stratified_interval needs at least one value")
    if len(labels) != x.size:
        raise ValueError(f"stratified_interval needs one stratum label per value, got {x.size} "
                         f"values and {len(labels)} labels")
    member = _codes(labels)
    groups = [x[member == c] for c in range(int(member.max()) + 1)]
    k = len(groups)
    estimate = float(np.mean([g.mean() for g in groups]))
    rng = np.random.default_rng(seed)
    means = np.zeros(n_boot)
    for g in groups:
        means += g[rng.integers(0, g.size, size=(n_boot, g.size))].mean(axis=1) / k
    tail = (1.0 - level) / 2.0
    b_low, b_high = float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))
    df = float(x.size - k)
    if any(g.size < 2 for g in groups):
        t_low, t_high, df = -math.inf, math.inf, 0.0
    else:
        v = np.array([g.var(ddof=1) / (k * k * g.size) for g in groups])
        if not math.isfinite(float(v.sum())):  # a value that could not be measured
            t_low = t_high = df = math.nan
        elif v.sum() == 0.0:
            t_low = t_high = estimate
        else:
            df = float(v.sum() ** 2 / np.sum(v * v / np.array([g.size - 1.0 for g in groups])))
            half = t_quantile((1.0 + level) / 2.0, df) * math.sqrt(float(v.sum()))
            t_low, t_high = estimate - half, estimate + half
    low, high = _hull((b_low, b_high), (t_low, t_high))
    return Interval(estimate, low, high, (b_low, b_high), (t_low, t_high), int(x.size), None, df)

