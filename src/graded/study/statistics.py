"""The statistics behind the claims study's verdicts: intervals of a mean over replicates and
paired tests over families of comparisons.

- Percentile bootstrap intervals: :func:`bootstrap_interval` of a mean, :func:`paired_bootstrap`
  of a mean paired difference, :func:`cluster_bootstrap` for values that come in dependent
  clusters (Davison & Hinkley 1997, *Bootstrap Methods and their Application*, §3.8, strategy 1),
  and :func:`two_stage_bootstrap` for values on a grid of tasks and seeds, resampling both.
- Student t: :func:`t_quantile` (bisection on the regularised incomplete beta function, which
  :func:`_incomplete_beta` evaluates by its continued fraction, Lentz's method, Numerical
  Recipes §6.4) and :func:`t_interval`.
- The study's interval (:data:`graded.study.core.RULE`): :func:`mean_interval`, the hull of the
  percentile bootstrap and the t interval of the :func:`replicate_values` (cluster means, or
  their ratio-estimator linearisation for unequal sizes, Cochran 1977, *Sampling Techniques*,
  ch. 6), returned as an :class:`Interval`. Why the hull: the percentile interval alone is too
  narrow for few replicates (Efron & Tibshirani 1993, *An Introduction to the Bootstrap*,
  ch. 13; Hesterberg 2015, "What Teachers Should Know About the Bootstrap", its narrowness
  bias). :func:`stratified_interval` is its form for replicates within fixed strata (the mean
  of the strata's means, Welch–Satterthwaite degrees of freedom).
- Accuracies over a known number of independent trials: :func:`binomial_interval`, the exact
  (Clopper–Pearson 1934) interval, which :func:`mean_interval` joins to its hull when given
  ``trials``: replicates that all score 1 (or 0) have no spread, and the bootstrap and t
  intervals then shrink to the point, as if the accuracy were known exactly.
- Families of paired comparisons: :func:`paired_t_p_value` (two-sided paired t-test) and
  :func:`holm` (Holm 1979, step-down correction).

The verdict that reads an interval, :func:`graded.study.core.verdict`, stays with the study's
vocabulary in :mod:`graded.study.core`. scipy is not a dependency, so the t distribution is
computed here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from graded.checks import check_int

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


def _check_level(level: float, caller: str, example: float = 0.95) -> None:
    """A ``level`` (an interval's coverage, a test's size) lies strictly between 0 and 1."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"{caller} needs a level strictly between 0 and 1 (e.g. {example}), "
                         f"got level={level!r}")


def _check_resampling(n_boot: int, level: float, caller: str) -> None:
    """A bootstrap's number of resamples is a positive integer and its level lies in (0, 1)."""
    check_int("n_boot", n_boot, minimum=1)
    _check_level(level, caller)


def bootstrap_interval(values, *, n_boot: int = 10_000, level: float = 0.95,
                       seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``values`` and its percentile bootstrap interval."""
    _check_resampling(n_boot, level, "bootstrap_interval")
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0:
        raise ValueError("bootstrap_interval needs at least one value")
    if x.size == 1:
        return float(x[0]), float(x[0]), float(x[0])
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)
    tail = (1.0 - level) / 2.0
    return float(x.mean()), float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def _codes(labels: list) -> np.ndarray:
    """Each label's index among the distinct labels, taken in the order of their first value
    (so a resampling depends on that order, not on the labels themselves)."""
    index: dict = {}
    return np.array([index.setdefault(c, len(index)) for c in labels], dtype=np.int64)


def _cluster_sums(x: np.ndarray, clusters, caller: str) -> tuple[np.ndarray, np.ndarray]:
    """The sum and the number of the values of each cluster (:func:`_codes` order)."""
    labels = list(clusters)
    if len(labels) != x.size:
        raise ValueError(f"{caller} needs one cluster label per value, got {x.size} "
                         f"values and {len(labels)} labels")
    member = _codes(labels)
    k = int(member.max()) + 1 if member.size else 0
    return (np.bincount(member, weights=x, minlength=k),
            np.bincount(member, minlength=k).astype(np.float64))


def cluster_bootstrap(values, clusters, *, n_boot: int = 10_000, level: float = 0.95,
                      seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``values`` and its percentile bootstrap interval when the values come in
    clusters that are not independent within (the layers or tools of one seed, the bases of one
    random draw, the tasks of one seed): whole clusters are resampled, ``clusters[i]`` naming
    the cluster of ``values[i]`` (the cluster bootstrap, Davison & Hinkley 1997 §3.8, strategy
    1: resample clusters, keep each cluster's values as they are).

    The estimate is the mean over all values; a resample's statistic is the mean over all
    values of its clusters (Σ cluster sums / Σ cluster sizes, so with equal sizes the mean of
    the cluster means). Clusters are taken in the order of their first value, so the resampling
    depends on that order and not on the labels. With one value per cluster this is
    :func:`bootstrap_interval`, draw for draw."""
    _check_resampling(n_boot, level, "cluster_bootstrap")
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0:
        raise ValueError("cluster_bootstrap needs at least one value")
    sums, sizes = _cluster_sums(x, clusters, "cluster_bootstrap")
    k = sums.size
    if k == 1:
        return float(x.mean()), float(x.mean()), float(x.mean())
    rng = np.random.default_rng(seed)
    draw = rng.integers(0, k, size=(n_boot, k))
    if np.all(sizes == 1.0):  # singletons: exactly bootstrap_interval's arithmetic
        means = sums[draw].mean(axis=1)
    else:
        means = sums[draw].sum(axis=1) / sizes[draw].sum(axis=1)
    tail = (1.0 - level) / 2.0
    return float(x.mean()), float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def two_stage_bootstrap(values, tasks, seeds, *, n_boot: int = 10_000, level: float = 0.95,
                        seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``values`` and its percentile bootstrap interval when the tasks, too, are treated
    as a sample: ``values[i]`` was measured on task ``tasks[i]`` with seed ``seeds[i]``, and
    each bootstrap replicate resamples the tasks with replacement (stage 1), then the seeds
    with replacement (stage 2), and takes the mean over every value of the drawn (task, seed)
    cells (a task or seed drawn twice counts twice; a cell holding several values weighs them
    all, Σ sums / Σ counts, as :func:`cluster_bootstrap` does). The two-stage bootstrap of
    Davison & Hinkley 1997 §3.8 (strategy 2) and Field & Welsh 2007 ("Bootstrapping clustered
    data", JRSS B 69), with one departure: the seeds are drawn **once** per replicate and
    shared by every drawn task, not drawn afresh within each, because here a seed index is
    one training seed on every task (the same subset order, minibatch order and
    initialisation), so tasks and seeds are crossed factors, not nested ones. Resampling both
    crossed factors is Owen's pigeonhole bootstrap (Owen 2007, *Ann. Appl. Stat.* 1(2);
    McCullagh 2000, *Bernoulli* 6, shows that no bootstrap of a crossed array is exact; this
    one errs wide). Drawing seeds afresh within each task would count one seed's shared effect
    as k independent ones and shrink its part of the spread by √k; with identical tasks it
    would be √k narrower than the bootstrap of the seeds, while this one then draws exactly
    what ``cluster_bootstrap(values, seeds)`` draws.

    The estimate is the mean over all values. Tasks and seeds are taken in the order of their
    first value; the seeds are drawn first from the generator, then the tasks. A percentile
    interval over only k = 3 or 4 tasks is itself too narrow (the narrowness bias of
    :func:`mean_interval`'s docstring, at k rather than at the number of seeds): read it as
    the least a sample of tasks would add, not as a verdict interval."""
    _check_resampling(n_boot, level, "two_stage_bootstrap")
    x = np.asarray(values, dtype=np.float64).ravel()
    task_labels, seed_labels = list(tasks), list(seeds)
    if x.size == 0:
        raise ValueError("two_stage_bootstrap needs at least one value")
    if not len(task_labels) == len(seed_labels) == x.size:
        raise ValueError(f"two_stage_bootstrap needs one task and one seed label per value, got "
                         f"{x.size} values, {len(task_labels)} tasks and {len(seed_labels)} "
                         "seeds")
    t, s = _codes(task_labels), _codes(seed_labels)
    k, m = int(t.max()) + 1, int(s.max()) + 1
    sums = np.zeros((k, m))
    counts = np.zeros((k, m))
    np.add.at(sums, (t, s), x)
    np.add.at(counts, (t, s), 1.0)
    rng = np.random.default_rng(seed)
    seed_draw = rng.integers(0, m, size=(n_boot, m))
    task_draw = rng.integers(0, k, size=(n_boot, k))
    # how often each seed and each task is drawn in each replicate
    seed_times = np.zeros((n_boot, m))
    np.add.at(seed_times, (np.arange(n_boot)[:, None], seed_draw), 1.0)
    task_times = np.zeros((n_boot, k))
    np.add.at(task_times, (np.arange(n_boot)[:, None], task_draw), 1.0)
    total = np.einsum("bi,ij,bj->b", task_times, sums, seed_times)
    number = np.einsum("bi,ij,bj->b", task_times, counts, seed_times)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = total / number
    means = means[number > 0]  # a replicate of missing cells only has no mean
    tail = (1.0 - level) / 2.0
    return float(x.mean()), float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def paired_bootstrap(arm, control, **kwargs) -> tuple[float, float, float]:
    """Mean paired difference ``arm − control`` (same seeds, same data) with its interval."""
    a = np.asarray(arm, dtype=np.float64).ravel()
    c = np.asarray(control, dtype=np.float64).ravel()
    if a.shape != c.shape:
        raise ValueError(f"paired values need equal lengths, got {a.size} and {c.size}")
    return bootstrap_interval(a - c, **kwargs)


def t_quantile(p: float, nu: float) -> float:
    """The ``p`` quantile of Student's t with ``nu`` degrees of freedom: the root of
    F(t) = p, F(t) = 1 − ½·I_{ν/(ν+t²)}(ν/2, ½) for t ≥ 0 (and symmetric), by bisection."""
    if not 0.0 < p < 1.0 or nu <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and nu > 0, got p={p}, nu={nu}")
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
    n − 1 in the denominator); one value gives the point."""
    _check_level(level, "t_interval")
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0:
        raise ValueError("t_interval needs at least one value")
    mean = float(x.mean())
    if x.size == 1:
        return mean, mean, mean
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
        return (f"Interval: the hull of the percentile bootstrap [{b[0]:{fmt}}, {b[1]:{fmt}}]"
                f"{',' if exact else ' and'} the t interval [{t[0]:{fmt}}, {t[1]:{fmt}}] ({df} df)"
                f"{exact}{cut}.")


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
    can pass it and the mean cannot.

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
    if u.size < 2:  # 0 degrees of freedom: the t interval is the whole line, no verdict
        t_low, t_high = -math.inf, math.inf
    else:
        _, t_low, t_high = t_interval(u, level=level)
    low, high = min(b_low, t_low), max(b_high, t_high)
    exact = None
    if trials is not None:
        n = check_int("trials", trials, minimum=1)
        if not 0.0 <= est <= 1.0:
            raise ValueError(f"mean_interval(trials={n}) is for accuracies in [0, 1]; the "
                             f"mean of the values is {est!r}")
        exact = (*binomial_interval(min(max(est * n, 0.0), float(n)), n, level=level), n)
        low, high = min(low, exact[0]), max(high, exact[1])
    if bounds is not None:
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
        if v.sum() == 0.0:
            t_low = t_high = estimate
        else:
            df = float(v.sum() ** 2 / np.sum(v * v / np.array([g.size - 1.0 for g in groups])))
            half = t_quantile((1.0 + level) / 2.0, df) * math.sqrt(float(v.sum()))
            t_low, t_high = estimate - half, estimate + half
    return Interval(estimate, min(b_low, t_low), max(b_high, t_high), (b_low, b_high),
                    (t_low, t_high), int(x.size), None, df)


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


def paired_t_p_value(differences) -> float:
    """Two-sided p-value of the paired t-test of "the mean difference is 0": t = mean/(s/√n)
    with n − 1 degrees of freedom, p = I_{ν/(ν+t²)}(ν/2, 1/2). Needs at least two
    differences; a constant sample gives 1.0 at 0 and 0.0 elsewhere."""
    d = np.asarray(differences, dtype=np.float64).ravel()
    if d.size < 2:
        raise ValueError(f"paired_t_p_value needs at least two differences, got {d.size}")
    sd = float(d.std(ddof=1))
    if sd == 0.0:
        return 1.0 if float(d.mean()) == 0.0 else 0.0
    t = float(d.mean()) / (sd / math.sqrt(d.size))
    return _t_two_sided_tail(t, d.size - 1.0)


def holm(p_values, level: float = 0.05) -> list[bool]:
    """Holm's step-down rejections for a family of p-values (True = rejected at ``level``).

    A non-finite p-value (a comparison that could not be tested, e.g. a diverged run) counts
    as 1: it is never rejected and still counts in the family's size. A finite p-value outside
    [0, 1], or a level outside (0, 1), raises."""
    _check_level(level, "holm", example=0.05)
    p = np.asarray(p_values, dtype=np.float64).ravel()
    bad = np.isfinite(p) & ((p < 0.0) | (p > 1.0))
    if bad.any():
        raise ValueError(f"holm needs p-values in [0, 1] (or nan for an untested comparison), "
                         f"got {p[bad].tolist()}")
    p = np.where(np.isfinite(p), p, 1.0)
    order = np.argsort(p)
    reject = [False] * p.size
    for rank, i in enumerate(order):
        if p[i] > level / (p.size - rank):
            break
        reject[int(i)] = True
    return reject
