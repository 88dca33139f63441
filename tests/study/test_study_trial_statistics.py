"""The study's statistics against independent computations (mpmath's incomplete beta
function and root finder, naive loops over the resampling distribution, Holm's definition by
adjusted p-values) and at their edges: one or two values, equal values, NaN and infinities,
ties, a p-value exactly at the level, bounds."""

from __future__ import annotations

import itertools
import math

import mpmath as mp
import numpy as np
import pytest

from graded.study.core import verdict
from graded.study.statistics import (
    binomial_interval,
    bootstrap_interval,
    holm,
    mean_interval,
    paired_t_p_value,
    stratified_interval,
    t_interval,
    t_quantile,
)


def _mp_t_two_sided(t: float, nu: float) -> float:
    """P(|T| ≥ |t|) = I_{ν/(ν+t²)}(ν/2, 1/2), evaluated by mpmath at 30 digits."""
    with mp.workdps(30):
        return float(mp.betainc(mp.mpf(nu) / 2, mp.mpf(1) / 2, 0, nu / (nu + mp.mpf(t) ** 2),
                                regularized=True))


def _mp_root(f, low, high) -> float:
    """The root of the increasing function ``f`` on [low, high], by bisection at 40 digits."""
    with mp.workdps(40):
        low, high = mp.mpf(low), mp.mpf(high)
        for _ in range(400):
            mid = (low + high) / 2
            low, high = (mid, high) if f(mid) < 0 else (low, mid)
        return float((low + high) / 2)


def _mp_t_quantile(p: float, nu: float) -> float:
    """The root of 1 − ½·I_{ν/(ν+t²)}(ν/2, ½) = p (p > ½)."""
    return _mp_root(lambda t: 1 - mp.betainc(mp.mpf(nu) / 2, mp.mpf(1) / 2, 0,
                                             nu / (nu + t * t), regularized=True) / 2 - p,
                    0, 1e8)


@pytest.mark.parametrize("nu", [1, 2, 3, 4, 9, 0.5, 2.7, 200])
@pytest.mark.parametrize("p", [0.975, 0.995, 0.6])
def test_t_quantile_matches_mpmaths_incomplete_beta(nu, p):
    assert t_quantile(p, nu) == pytest.approx(_mp_t_quantile(p, nu), rel=1e-10)
    assert t_quantile(1 - p, nu) == pytest.approx(-_mp_t_quantile(p, nu), rel=1e-10)


@pytest.mark.parametrize("nu", [math.nan, math.inf, 0.0, -1.0])
def test_t_quantile_refuses_degrees_of_freedom_that_are_not_finite_and_positive(nu):
    # t_quantile(0.975, inf) returned 1.3e154 and t_quantile(0.975, nan) 3e-61
    with pytest.raises(ValueError, match=f"nu={nu}"):
        t_quantile(0.975, nu)


@pytest.mark.parametrize("d", [[0.3, -0.1], [1.0, 2.0, 4.5], [0.01, 0.02, -0.005, 0.04, 0.0],
                               [1e-9, 2e-9, 3e-9], [-3.0, -3.1, -2.9, -3.05]])
def test_paired_t_p_value_matches_mpmath(d):
    x = np.asarray(d)
    t = x.mean() / (x.std(ddof=1) / math.sqrt(x.size))
    assert paired_t_p_value(d) == pytest.approx(_mp_t_two_sided(t, x.size - 1.0), rel=1e-9)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on NaN and inf
def test_paired_t_p_value_of_a_non_finite_difference_is_nan_which_holm_never_rejects():
    assert math.isnan(paired_t_p_value([0.1, math.nan, 0.2]))
    assert math.isnan(paired_t_p_value([0.1, math.inf, 0.2]))
    assert holm([paired_t_p_value([0.1, math.nan]), 0.001]) == [False, True]


def test_t_interval_matches_mpmath_for_two_values():
    mean, low, high = t_interval([1.0, 2.0])
    assert mean == 1.5
    half = _mp_t_quantile(0.975, 1.0) * math.sqrt(0.5) / math.sqrt(2.0)
    assert (low, high) == pytest.approx((1.5 - half, 1.5 + half), rel=1e-12)


@pytest.mark.parametrize(("x", "n"), [(0, 1), (1, 1), (3, 10), (9.5, 10), (55, 55), (0, 55),
                                      (1, 2), (17, 40)])
def test_binomial_interval_matches_mpmaths_beta_quantiles(x, n):
    def beta_quantile(q, a, b):
        return _mp_root(lambda u: mp.betainc(a, b, 0, u, regularized=True) - q, 0, 1)

    low, high = binomial_interval(x, n)
    assert low == (0.0 if x == 0 else pytest.approx(beta_quantile(0.025, x, n - x + 1), abs=1e-12))
    assert high == (1.0 if x == n else pytest.approx(beta_quantile(0.975, x + 1, n - x), abs=1e-12))


def _enumerated_percentiles(x, level=0.95):
    """The percentile interval of the exact bootstrap distribution: every one of the n^n
    equally likely resamples, by a naive loop."""
    x = list(x)
    means = sorted(sum(r) / len(x) for r in itertools.product(x, repeat=len(x)))
    return np.quantile(means, (1 - level) / 2), np.quantile(means, (1 + level) / 2)


@pytest.mark.parametrize("x", [[0.0, 1.0, 1.0, 3.0], [2.0, 2.0, 2.0, 5.0]])
def test_bootstrap_interval_approaches_the_enumerated_distribution_with_ties(x):
    _, low, high = bootstrap_interval(x, n_boot=200_000, seed=3)
    want = _enumerated_percentiles(x)
    assert (low, high) == pytest.approx(want, abs=0.06)


def test_all_values_equal_give_the_point_and_n_equals_one_gives_no_interval():
    iv = mean_interval([0.25] * 4, n_boot=200)
    assert (iv.estimate, iv.low, iv.high) == (0.25, 0.25, 0.25)
    one = mean_interval([0.25], n_boot=200)
    assert (one.low, one.high) == (-math.inf, math.inf)
    assert verdict(one.low, one.high, predicted="positive") == "inconclusive"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on NaN and inf
@pytest.mark.parametrize("values", [[1.0, 2.0, math.inf], [1.0, 2.0, 3.0, 4.0, -math.inf],
                                    [1.0, math.nan, 2.0]])
def test_a_non_finite_value_leaves_no_half_interval(values):
    # min(b_low, t_low) kept the bootstrap's finite end beside the t interval's nan: [1, 2, inf]
    # gave the interval [1.0, nan], [1, 2, 3, 4, -inf] gave [nan, 3.2]
    iv = mean_interval(values, n_boot=500)
    assert math.isnan(iv.low) and math.isnan(iv.high)
    assert verdict(iv.low, iv.high, predicted="positive") == "inconclusive"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on NaN and inf
def test_an_accuracy_that_could_not_be_measured_gives_no_interval_rather_than_an_error():
    # mean_interval(trials=...) raised "is for accuracies in [0, 1]" for a NaN mean
    iv = mean_interval([1.0, math.nan], bounds=(0.0, 1.0), trials=22, n_boot=200)
    assert math.isnan(iv.estimate) and math.isnan(iv.low) and math.isnan(iv.high)
    assert iv.binomial is None
    with pytest.raises(ValueError, match=r"the mean of the values is 1\.5"):
        mean_interval([1.0, 2.0], trials=22, n_boot=200)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on NaN and inf
def test_a_stratified_interval_with_a_non_finite_value_leaves_no_half_interval():
    iv = stratified_interval([1.0, 2.0, 3.0, math.inf], [0, 0, 1, 1], n_boot=500)
    assert math.isnan(iv.low) and math.isnan(iv.high)


def test_a_mean_outside_its_bounds_is_refused_rather_than_left_outside_its_interval():
    # mean_interval([2, 3], bounds=(0, 1)) gave estimate 2.5 with the interval [0, 1]
    with pytest.raises(ValueError, match=r"2\.5, lies outside bounds=\(0\.0, 1\.0\)"):
        mean_interval([2.0, 3.0], bounds=(0.0, 1.0), n_boot=200)


def test_a_mean_on_its_bound_is_kept_and_the_interval_is_cut_there():
    iv = mean_interval([1.0, 1.0, 0.9, 1.0], bounds=(0.0, 1.0), n_boot=500)
    x = np.array([1.0, 1.0, 0.9, 1.0])
    half = _mp_t_quantile(0.975, 3.0) * x.std(ddof=1) / 2.0
    assert iv.high == 1.0 and iv.t[1] == pytest.approx(x.mean() + half, rel=1e-10)
    assert iv.low == pytest.approx(x.mean() - half, rel=1e-10)
    top = mean_interval([1.0, 1.0], bounds=(0.0, 1.0), trials=22, n_boot=200)
    assert top.estimate == 1.0 and top.high == 1.0
    assert top.low == pytest.approx(0.025 ** (1 / 22), rel=1e-10)


@pytest.mark.parametrize("seed", range(6))
def test_holm_equals_its_adjusted_p_values_with_ties_and_untested_comparisons(seed):
    rng = np.random.default_rng(seed)
    p = rng.choice([0.001, 0.01, 0.0125, 0.025, 0.05, 0.2, math.nan], size=7).tolist()
    m = len(p)
    filled = [1.0 if math.isnan(v) else v for v in p]
    order = sorted(range(m), key=lambda i: filled[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):  # Holm 1979: max over the earlier ranks of (m − r)·p
        running = max(running, min(1.0, (m - rank) * filled[i]))
        adjusted[i] = running
    assert holm(p) == [a <= 0.05 for a in adjusted]


def test_holm_rejects_a_p_value_exactly_at_its_step_level():
    assert holm([0.05 / 3, 0.05 / 2, 0.05]) == [True, True, True]
    assert holm([0.0, 0.05 / 2, 0.05]) == [True, True, True]
    assert holm([0.0, 0.05 / 2 + 1e-12, 0.03]) == [True, False, False]
    assert holm([0.05]) == [True] and holm([0.05 + 1e-12]) == [False]
    assert holm([]) == []


@pytest.mark.parametrize(("low", "high", "expected"), [
    (0.0, 1.0, "inconclusive"),    # touching zero from above: zero is not excluded
    (-1.0, 0.0, "fails"),          # touching zero from below: no positive value inside
    (0.0, 0.0, "fails"),           # the point 0: inside ±0
    (1e-12, 2.0, "holds"),
    (math.nan, 1.0, "inconclusive"),
    (0.5, math.inf, "inconclusive"),
])
def test_verdict_of_intervals_touching_zero_for_a_positive_prediction(low, high, expected):
    assert verdict(low, high, predicted="positive") == expected
    assert verdict(-high, -low, predicted="negative") == expected


@pytest.mark.parametrize(("low", "high", "expected"), [
    (0.91, 1.0, "holds"), (0.9, 1.0, "inconclusive"), (0.85, 0.9, "fails"),
    (0.0, 0.9, "fails"), (0.5, 0.95, "inconclusive"),
])
def test_verdict_of_an_accuracy_against_its_threshold_reads_at_or_below_as_failing(low, high,
                                                                                   expected):
    # claims 14 and 15: "holds if the interval lies above 0.9, fails if it lies at or below"
    assert verdict(low, high, predicted="positive", margin=0.9) == expected


def test_cluster_bootstrap_equals_a_naive_loop_over_the_same_draws():
    from graded.study.statistics import cluster_bootstrap

    values = [1.0, 2.0, 4.0, 0.5, 7.0, 3.0, 3.0]
    clusters = ["b", "b", "a", "c", "c", "c", "d"]  # unequal sizes, first-appearance order
    order = ["b", "a", "c", "d"]
    n_boot = 400
    draw = np.random.default_rng(5).integers(0, 4, size=(n_boot, 4))
    means = []
    for row in draw:  # the mean over every value of the drawn clusters
        picked = [v for i in row for v, c in zip(values, clusters) if c == order[i]]
        means.append(sum(picked) / len(picked))
    est, low, high = cluster_bootstrap(values, clusters, n_boot=n_boot, seed=5)
    assert est == pytest.approx(np.mean(values))
    assert (low, high) == pytest.approx(tuple(np.quantile(means, [0.025, 0.975])), rel=1e-12)


def test_two_stage_bootstrap_equals_a_naive_loop_over_the_same_draws():
    from graded.study.statistics import two_stage_bootstrap

    # 3 tasks × 3 seeds, one cell empty and one holding two values
    cells = [("t1", "s1", 1.0), ("t1", "s2", 2.0), ("t1", "s3", 0.0), ("t2", "s1", 5.0),
             ("t2", "s2", 4.0), ("t2", "s2", 6.0), ("t3", "s1", -1.0), ("t3", "s3", 3.0)]
    tasks, seeds, values = zip(*cells)
    n_boot = 300
    rng = np.random.default_rng(9)
    seed_draw = rng.integers(0, 3, size=(n_boot, 3))  # seeds first, then tasks
    task_draw = rng.integers(0, 3, size=(n_boot, 3))
    t_names, s_names = ["t1", "t2", "t3"], ["s1", "s2", "s3"]
    means = []
    for b in range(n_boot):
        picked = [v for ti in task_draw[b] for si in seed_draw[b] for t, s, v in cells
                  if t == t_names[ti] and s == s_names[si]]
        if picked:
            means.append(sum(picked) / len(picked))
    est, low, high = two_stage_bootstrap(values, tasks, seeds, n_boot=n_boot, seed=9)
    assert est == pytest.approx(np.mean(values))
    assert (low, high) == pytest.approx(tuple(np.quantile(means, [0.025, 0.975])), rel=1e-12)


@pytest.mark.parametrize("seed", range(40))
def test_a_t_interval_excludes_zero_exactly_when_the_t_test_rejects_at_five_percent(seed):
    # docs/study.md: for a margin of 0 the t part of the hull lies on one side of 0 exactly
    # where the two-sided paired t-test rejects 0 at 5%
    rng = np.random.default_rng(seed)
    x = rng.normal(loc=rng.uniform(0, 1.5), size=int(rng.integers(2, 8)))
    _, low, high = t_interval(x)
    assert (low > 0 or high < 0) == (paired_t_p_value(x) < 0.05)
