"""The study's statistics against independent computations on fixed inputs with known answers.

scipy is not a dependency, so the references are closed forms (Student's t for 1 and 2 degrees
of freedom), a numerical integral of the t density, exhaustive enumeration of a bootstrap
distribution, Holm's adjusted p-values and the textbook rank-correlation formula, each written
here without the study's code.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from graded.study.core import verdict
from graded.study.experiments._e_common import (
    equivalence_verdict,
    finding_from_values,
    least_squares_slope,
    spearman,
    t_test_note,
)
from graded.study.experiments.e1_sample_efficiency import aulc, per_size_family
from graded.study.experiments.e2_robustness import bound_finding
from graded.study.experiments.e7_overhead import MARGIN, _overhead
from graded.study.statistics import (
    bootstrap_interval,
    cluster_bootstrap,
    holm,
    mean_interval,
    paired_bootstrap,
    paired_t_p_value,
    replicate_values,
    t_interval,
    t_quantile,
    two_stage_bootstrap,
)

# ---------------------------------------------------------------- paired t-test


def _t_statistic(d: np.ndarray) -> float:
    n = d.size
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / (n - 1)
    return mean / math.sqrt(var / n)


def _two_sided_p_by_integration(t: float, nu: int) -> float:
    """1 − 2∫₀^|t| f_ν(x) dx with the Student density, composite Simpson on 40,001 points."""
    c = math.exp(math.lgamma((nu + 1) / 2) - math.lgamma(nu / 2)) / math.sqrt(nu * math.pi)
    x = np.linspace(0.0, abs(t), 40_001)
    f = c * (1 + x * x / nu) ** (-(nu + 1) / 2)
    h = x[1] - x[0]
    integral = h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())
    return 1.0 - 2.0 * integral


@pytest.mark.parametrize("d", [
    [0.3, -0.1],  # n = 2 (the --quick seeds): 1 degree of freedom
    [0.5, 0.2, 0.4],
    [1.0, 0.1, 0.4, 0.8, -0.2],
    [-0.05, -0.12, -0.3, 0.01, -0.2, -0.11, -0.09, -0.4, 0.02, -0.15],
])
def test_paired_t_p_value_against_the_closed_forms_and_the_integrated_density(d):
    d = np.asarray(d)
    t, nu = _t_statistic(d), d.size - 1
    p = paired_t_p_value(d)
    assert p == pytest.approx(_two_sided_p_by_integration(t, nu), abs=1e-9)
    if nu == 1:  # Cauchy: P(|T| > t) = 1 − (2/π) arctan|t|
        assert p == pytest.approx(1 - 2 / math.pi * math.atan(abs(t)), abs=1e-12)
    if nu == 2:  # P(|T| > t) = 1 − |t|/√(2 + t²)
        assert p == pytest.approx(1 - abs(t) / math.sqrt(2 + t * t), abs=1e-12)


def test_paired_t_p_value_is_two_sided_and_uses_the_paired_differences():
    arm = np.array([1.0, 5.0, 9.0, 13.0, 2.0])
    control = arm - np.array([0.3, 0.1, 0.2, 0.25, 0.15])  # large shared seed effect
    d = arm - control
    p = paired_t_p_value(d)
    assert p == paired_t_p_value(-d)  # symmetric: two-sided
    assert p == pytest.approx(_two_sided_p_by_integration(_t_statistic(d), 4), abs=1e-9)
    assert p < 0.01  # an unpaired test would drown the 0.2 shift in the spread 1…13


# ---------------------------------------------------------------- Student t interval

T_975_4 = 2.7764451051977987  # t_{0.975, 4}, the textbook table value to 16 digits


def _t_interval_by_hand(x: list[float]) -> tuple[float, float]:
    """mean ± q·s/√n, q = t_{0.975, n−1} from the closed forms for 1 and 2 degrees of freedom
    or the table value for 4; nothing of the study's code."""
    n = len(x)
    mean = sum(x) / n
    s = math.sqrt(sum((v - mean) ** 2 for v in x) / (n - 1))
    q = {1: math.tan(0.475 * math.pi), 2: math.sqrt(2 * 0.95 ** 2 / (1 - 0.95 ** 2)),
         4: T_975_4}[n - 1]
    return mean - q * s / math.sqrt(n), mean + q * s / math.sqrt(n)


@pytest.mark.parametrize("nu", [1, 2, 3, 4, 9, 30])
def test_t_quantile_leaves_five_percent_of_the_integrated_density_outside(nu):
    q = t_quantile(0.975, nu)
    assert _two_sided_p_by_integration(q, nu) == pytest.approx(0.05, abs=1e-9)
    assert t_quantile(0.025, nu) == -q and t_quantile(0.5, nu) == 0.0
    if nu == 1:  # Cauchy: tan(π(p − ½))
        assert q == pytest.approx(math.tan(0.475 * math.pi), rel=1e-12)
    if nu == 2:  # F(t) = ½ + t/(2√(2 + t²)) ⇒ t = √(2a²/(1 − a²)), a = 2p − 1
        assert q == pytest.approx(math.sqrt(2 * 0.95 ** 2 / (1 - 0.95 ** 2)), rel=1e-12)
    if nu == 4:
        assert q == pytest.approx(T_975_4, rel=1e-12)


@pytest.mark.parametrize("x", [
    [0.3, -0.1],
    [0.5, 0.2, 0.4],
    [1.0, 0.1, 0.4, 0.8, -0.2],
])
def test_t_interval_is_the_mean_plus_minus_the_quantile_times_the_standard_error(x):
    mean, low, high = t_interval(x)
    assert mean == pytest.approx(np.mean(x))
    assert (low, high) == pytest.approx(_t_interval_by_hand(x), rel=1e-12)
    # an endpoint is where the two-sided t-test of "the mean is the endpoint" has p = 0.05
    se = np.std(x, ddof=1) / math.sqrt(len(x))
    assert _two_sided_p_by_integration((mean - low) / se, len(x) - 1) == pytest.approx(0.05,
                                                                                       abs=1e-9)
    assert t_interval([0.7]) == (0.7, -math.inf, math.inf)  # 0 df: no interval


def test_a_five_replicate_verdict_interval_contains_the_t_interval_and_the_bootstrap():
    x = [0.05, 0.01, -0.01, 0.03, 0.02]  # t = 2.0 on 4 df: p = 0.116
    _, b_low, b_high = bootstrap_interval(x)
    t_low, t_high = _t_interval_by_hand(x)
    assert b_low > 0 and t_low < 0  # the percentile interval alone would say "holds"
    f = finding_from_values(claim="11", experiment="E8", quantity="q", control="c", values=x,
                            predicted="positive")
    assert f.seeds == 5
    eps = 1e-12  # the study's t interval and this one round differently
    assert f.low <= t_low + eps and f.high >= t_high - eps
    assert f.low <= b_low and f.high >= b_high
    assert (f.low, f.high) == pytest.approx((min(b_low, t_low), max(b_high, t_high)))
    assert f.verdict == "inconclusive" and paired_t_p_value(x) > 0.05
    assert f"[{t_low:.4f}, {t_high:.4f}] (4 df)" in f.detail  # both intervals are shown


def test_the_hull_keeps_the_bootstrap_where_it_reaches_further():
    # one far replicate: the percentile interval's upper end can exceed the symmetric t's
    x = [0.0] * 9 + [1.0]
    iv = mean_interval(x)
    assert iv.low == min(iv.bootstrap[0], iv.t[0]) and iv.high == max(iv.bootstrap[1], iv.t[1])
    assert iv.low <= iv.t[0] and iv.high >= iv.bootstrap[1]


def test_an_interval_is_cut_to_the_range_of_its_quantity():
    # accuracies near 1: the symmetric t interval passes 1, which a mean accuracy cannot
    x = [1.0, 1.0, 0.96, 1.0, 0.9]
    free = mean_interval(x)
    assert free.high > 1.0
    cut = mean_interval(x, bounds=(0.0, 1.0))
    assert (cut.low, cut.high) == (free.low, 1.0)
    assert (cut.bootstrap, cut.t) == (free.bootstrap, free.t)
    assert "cut to the quantity's range [0, 1]" in cut.note()
    assert "cut to" not in mean_interval([0.4, 0.5, 0.6], bounds=(0.0, 1.0)).note()
    f = finding_from_values(claim="14", experiment="E8", quantity="q", control="c", values=x,
                            predicted="positive", margin=0.9, bounds=(0.0, 1.0))
    assert f.high == 1.0 and f.low == free.low


def test_one_replicate_gives_no_verdict():
    # `--seeds 1`: one seed (or one cluster of a seed's tools) has no spread to estimate; the t
    # interval has 0 degrees of freedom (t_{0.975, 0} is infinite), so no verdict may read a
    # zero-width interval [x, x] as holding, as the p = 1 beside it already says
    one = mean_interval([0.8])
    assert one.estimate == 0.8 and (one.low, one.high) == (-math.inf, math.inf)
    assert mean_interval([0.8, 0.7], [0, 0]).t == (-math.inf, math.inf)
    cut = mean_interval([0.95], bounds=(0.0, 1.0))
    assert (cut.low, cut.high) == (0.0, 1.0)
    f = finding_from_values(claim="12", experiment="E8", quantity="q", control="c",
                            values=[0.8, 0.7], clusters=[0, 0], predicted="positive",
                            t_test=True)
    assert f.seeds == 1 and f.estimate == pytest.approx(0.75) and f.verdict == "inconclusive"
    acc = finding_from_values(claim="14", experiment="E8", quantity="q", control="c",
                              values=[0.95], predicted="positive", margin=0.9,
                              bounds=(0.0, 1.0))
    assert (acc.low, acc.high, acc.verdict) == (0.0, 1.0, "inconclusive")
    # two replicates still give the finite t interval with 1 degree of freedom
    assert mean_interval([0.7, 0.8]).t == pytest.approx(_t_interval_by_hand([0.7, 0.8]))


def test_equal_clusters_give_the_t_interval_of_the_cluster_means():
    values = [0.1, 0.3, -0.2, 0.0, 0.5, 0.7, 0.2, 0.2, 0.4, 0.0]
    clusters = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    means = [0.2, -0.1, 0.6, 0.2, 0.2]
    assert replicate_values(values, clusters) == pytest.approx(means)
    iv = mean_interval(values, clusters)
    assert iv.replicates == 5 and iv.t == pytest.approx(_t_interval_by_hand(means))
    assert iv.bootstrap == cluster_bootstrap(values, clusters)[1:]


def test_unequal_clusters_give_the_ratio_estimators_standard_error():
    # the estimate is Σ values / n (clusters weigh by size); its cluster-robust standard error
    # is √(Σ_c (S_c − R m_c)² / (k (k − 1) m̄²)) (Cochran 1977, ch. 6)
    values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 0.5, 1.5]
    clusters = ["a", "a", "b", "b", "b", "c", "d", "d", "d"]
    groups = {"a": [1.0, 2.0], "b": [3.0, 4.0, 5.0], "c": [6.0], "d": [7.0, 0.5, 1.5]}
    r = sum(values) / len(values)
    k, m_bar = len(groups), len(values) / len(groups)
    se = math.sqrt(sum((sum(g) - r * len(g)) ** 2 for g in groups.values())
                   / (k * (k - 1) * m_bar ** 2))
    u = replicate_values(values, clusters)
    assert np.mean(u) == pytest.approx(r)
    iv = mean_interval(values, clusters)
    q = _two_sided_p_by_integration  # the quantile for 3 df, checked against the density
    assert q((r - iv.t[0]) / se, 3) == pytest.approx(0.05, abs=1e-9)
    assert iv.t == pytest.approx((r - t_quantile(0.975, 3) * se, r + t_quantile(0.975, 3) * se))
    assert iv.estimate == pytest.approx(r)


# ---------------------------------------------------------------- bootstrap


def _exact_bootstrap_quantiles(x: list[float], level: float = 0.95) -> tuple[float, float]:
    """Quantiles of the exact distribution of resampled means (all n^n resamples)."""
    means = sorted(sum(c) / len(x) for c in itertools.product(x, repeat=len(x)))
    tail = (1 - level) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def test_bootstrap_interval_matches_the_enumerated_resampling_distribution():
    x = [0.0, 0.1, 0.3, 0.35, 1.2]  # 5^5 = 3125 equally likely resamples
    exact_low, exact_high = _exact_bootstrap_quantiles(x)
    mean, low, high = bootstrap_interval(x, n_boot=20_000)
    assert mean == pytest.approx(np.mean(x))
    step = 0.06  # resampled means near the tails are ~0.01–0.05 apart
    assert low == pytest.approx(exact_low, abs=step) and high == pytest.approx(exact_high, abs=step)


def test_bootstrap_of_two_values_spans_them_so_two_seeds_hold_only_when_both_agree():
    # n = 2 (--quick): the interval is [min, max], so the verdict reads "both seeds on one side"
    assert bootstrap_interval([-0.3, -0.1])[1:] == (-0.3, -0.1)
    assert verdict(*bootstrap_interval([-0.3, -0.1])[1:], predicted="negative") == "holds"
    assert verdict(*bootstrap_interval([-0.3, 0.1])[1:], predicted="negative") == "inconclusive"


def test_paired_bootstrap_resamples_pairs_not_arms():
    # a constant paired difference on top of a large seed effect: the paired interval is a point;
    # resampling the arms independently would give an interval of width ~ the seed spread
    arm, control = [1.0, 5.0, 9.0, 13.0], [0.5, 4.5, 8.5, 12.5]
    assert paired_bootstrap(arm, control) == (0.5, 0.5, 0.5)


def test_bootstrap_of_a_zero_variance_sample_and_of_ties():
    assert bootstrap_interval([0.0] * 5) == (0.0, 0.0, 0.0)
    mean, low, high = bootstrap_interval([1.0, 1.0, 1.0, 1.0, 2.0])
    assert mean == 1.2 and low == 1.0 and high <= 2.0


# ---------------------------------------------------------------- Holm


def _holm_adjusted(p: list[float]) -> list[float]:
    """Holm's adjusted p-values: p̃_(i) = max_{j ≤ i} min(1, (m − j + 1) p_(j))."""
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted


@pytest.mark.parametrize("seed", range(6))
def test_holm_rejects_exactly_where_the_adjusted_p_value_is_at_most_the_level(seed):
    rng = np.random.default_rng(seed)
    p = list(np.concatenate([rng.uniform(0, 0.02, 4), rng.uniform(0, 1, 8)]))
    p[3] = p[2]  # a tie
    assert holm(p) == [a <= 0.05 for a in _holm_adjusted(p)]
    assert holm(p, level=0.01) == [a <= 0.01 for a in _holm_adjusted(p)]


def test_holm_never_rejects_a_comparison_that_could_not_be_tested():
    # a nan p-value (a diverged run) counts as 1: the family still has 3 members
    assert holm([0.001, math.nan, 0.02]) == [True, False, True]
    assert holm([0.001, math.nan]) == [True, False]
    assert holm([0.03, math.nan, 0.001]) == [False, False, True]  # 0.03 > 0.05/2


def test_per_size_family_leaves_out_seeds_whose_run_diverged():
    b = {"tasks": ["poly_e5"], "sizes": [100]}
    curves = {("poly_e5", "none"): {100: {s: 1.0 for s in range(6)}},
              ("poly_e5", "fixed_aligned"): {100: {0: 0.5, 1: 0.6, 2: 0.4, 3: 0.55, 4: 0.5,
                                                   5: math.inf}}}
    fam = per_size_family(b, curves)
    assert len(fam) == 1 and len(fam[0]["diffs"]) == 5
    assert math.isfinite(fam[0]["p"]) and fam[0]["est"] == pytest.approx(-0.49)


# ---------------------------------------------------------------- Spearman, slopes, AULC


def test_spearman_without_ties_is_one_minus_six_sum_d_squared():
    x = [0.3, 1.2, -0.4, 2.2, 0.9, 1.7, -1.0]
    y = [1.0, 0.5, -0.2, 3.0, 0.8, 0.7, -2.0]
    rx = {v: r for r, v in enumerate(sorted(x))}
    ry = {v: r for r, v in enumerate(sorted(y))}
    n = len(x)
    d2 = sum((rx[a] - ry[b]) ** 2 for a, b in zip(x, y))
    assert spearman(x, y) == pytest.approx(1 - 6 * d2 / (n * (n * n - 1)), abs=1e-12)


def test_least_squares_slope_recovers_a_power_law_exponent():
    # E6 and E9 read exponents as slopes of log–log fits: y = 3 x^1.7 gives 1.7 exactly
    x = np.array([0.2, 0.5, 1.0, 2.0, 5.0])
    assert least_squares_slope(np.log(x), np.log(3 * x ** 1.7)) == pytest.approx(1.7, abs=1e-12)
    # the normal-equation slope Σ(x − x̄)(y − ȳ)/Σ(x − x̄)²
    xs, ys = [1.0, 2.0, 4.0, 7.0], [0.5, 1.1, 1.8, 3.9]
    xm, ym = sum(xs) / 4, sum(ys) / 4
    expected = (sum((a - xm) * (b - ym) for a, b in zip(xs, ys))
                / sum((a - xm) ** 2 for a in xs))
    assert least_squares_slope(xs, ys) == pytest.approx(expected, abs=1e-12)


def test_aulc_is_the_trapezoidal_mean_over_log2_n():
    sizes, losses = [100, 200, 400, 800, 1600, 3200], [0.9, 0.5, 0.3, 0.25, 0.2, 0.21]
    x = np.log2(sizes)
    area = sum((losses[i] + losses[i + 1]) / 2 * (x[i + 1] - x[i]) for i in range(5))
    assert aulc(sizes, losses) == pytest.approx(area / (x[-1] - x[0]), abs=1e-12)
    # uneven spacing weighs each segment by its width in log2 n
    assert aulc([100, 400, 1600], [1.0, 0.5, 0.5]) == pytest.approx(0.625)


@pytest.mark.parametrize("sizes", [[100, 1600, 400], [100, 100], [0, 100]])
def test_aulc_refuses_sizes_that_are_not_a_learning_curve(sizes):
    # out of order, the segments' signed widths gave 0.85 for the curve 1.0, 0.5 (n=400),
    # 0.2 (n=1600) whose area by hand is 0.55; a repeated n divided by 0 (NaN); n = 0 has no log
    with pytest.raises(ValueError, match=r"aulc needs positive, strictly increasing sizes, "
                                         rf"got \[{sizes[0]}, {sizes[1]}"):
        aulc(sizes, [1.0, 0.5, 0.2][:len(sizes)])


# ---------------------------------------------------------------- E7 and the verdict margins


def test_e7_overhead_is_the_geometric_mean_ratio_minus_one():
    ratios = [1.10, 1.05, 1.20, 0.98, 1.12]
    est, low, high = _overhead([math.log(r) for r in ratios])
    assert est == pytest.approx(math.prod(ratios) ** (1 / len(ratios)) - 1, abs=1e-12)
    logs = [math.log(r) for r in ratios]
    _, b_lo, b_hi = bootstrap_interval(logs)
    t_lo, t_hi = _t_interval_by_hand(logs)
    assert (low, high) == pytest.approx((math.exp(min(b_lo, t_lo)) - 1,
                                         math.exp(max(b_hi, t_hi)) - 1))


@pytest.mark.parametrize("low, high, expected", [
    (0.02, 0.08, "holds"),  # the whole interval below the 10% margin
    (0.099, 0.12, "inconclusive"),
    (0.10, 0.15, "fails"),
    (0.12, 0.20, "fails"),
])
def test_e7_margin_rule(low, high, expected):
    # E7 reads "negligible" as an overhead below MARGIN: verdict on the shifted interval
    assert MARGIN == 0.10
    assert verdict(low - MARGIN, high - MARGIN, predicted="negative") == expected


def test_equivalence_band_rule_for_predicted_values():
    # E6 (slope 1 ± [0.8, 1.25]) and E9 (slope −1/2 in [−0.6, −0.4], gap in [0, 0.05])
    assert equivalence_verdict(1.46, 1.88, 0.8, 1.25) == "fails"  # E6's claim 7 interval
    assert equivalence_verdict(-0.55, -0.46, -0.6, -0.4) == "holds"
    assert equivalence_verdict(0.03, 0.06, 0.0, 0.05) == "inconclusive"


# ---------------------------------------------------------------- E2's bounds


def test_a_bound_holds_only_when_every_model_is_within_it():
    # the full study's claim-3 values include two models 4–5% above λ^{q_max}
    # (ratio 4.528 against 4.34 and 6.591 against 6.24) among eight well below it: their mean is
    # negative, but a bound is about every model, not the mean
    values = [math.log(4.528 / 4.34), math.log(6.591 / 6.24)] + [-0.8] * 8
    f = bound_finding("3", "q", "c", values, "d.", [])
    assert f.estimate == pytest.approx(max(values)) == f.low == f.high
    assert f.verdict == "inconclusive" and "2/10 above 0" in f.detail
    ok = bound_finding("6", "q", "c", [-8.0, -7.5, -9.1], "d.", [])
    assert ok.verdict == "holds" and ok.estimate == -7.5
    none = bound_finding("3", "q", "c", [math.nan], "d.", [])
    assert none.verdict == "inconclusive" and none.seeds == 0


def test_an_infinite_excess_over_a_bound_is_above_it_not_left_out():
    # a graded constant over an ungraded one of 0 gives log(ratio) = +inf: a model above the
    # bound, which used to be dropped with the NaNs so that the rest "held"
    f = bound_finding("3", "q", "c", [-0.5, math.inf, -0.7, math.nan], "d.", [])
    assert f.verdict == "inconclusive" and f.seeds == 3 and f.estimate == math.inf
    assert "1/3 above 0" in f.detail


# ---------------------------------------------------------------- replicates are seeds


def test_e6_gradient_slopes_are_averaged_per_seed(tmp_path, monkeypatch):
    """A seed's model at initialisation and after training share weights' seed and batch: the
    interval resamples seeds (their mean slope), not 2 × seeds instances."""
    from graded.study.core import Context
    from graded.study.experiments import e6_gradients as e6

    slopes = [1.0, 2.0, 1.2, 2.2, 0.8, 1.8]  # initial, trained for seeds 0, 1, 2
    calls = {"n": 0}

    def fake_norm(model, ids, targets, lam, q_max):
        k = slopes[calls["n"] // (len(e6.BASES) * len(e6.Q_MAXES))]
        calls["n"] += 1
        return (lam ** q_max * math.log(lam)) ** k

    monkeypatch.setattr(e6, "grade_gradient_norm", fake_norm)
    monkeypatch.setattr(e6, "train_lm", lambda *a, **k: 0.0)
    monkeypatch.setattr(e6, "save_plot", lambda *a, **k: "x.png")
    ctx = Context(out=tmp_path, quick=True, seeds=3, seeds_given=True)
    f = e6.GradientsExperiment()._gradient_scaling(ctx)
    assert f.seeds == 3
    assert f.estimate == pytest.approx(1.5)
    # 3 seeds: the t interval (2 df, closed-form quantile) is wider than the bootstrap's
    assert (f.low, f.high) == pytest.approx(_t_interval_by_hand([1.5, 1.7, 1.3]))


def test_e4_slope_differences_are_averaged_per_seed(tmp_path, monkeypatch):
    from graded.study.core import Context
    from graded.study.experiments import e45_heads_positions as e45

    alphas = np.asarray(e45.ALPHAS)
    calls = {"n": 0}

    def fake_sweep(model, ids, alphas_, *, k):
        slope = 0.1 * (calls["n"] + 1)  # slopes 0.1, 0.2, … per call, both layers
        calls["n"] += 1
        masses = list(0.25 + slope * alphas)
        return {"layers": {"l0": masses, "l1": masses}, "uniform": 0.25, "mean": masses}

    monkeypatch.setattr(e45, "positional_bias_sweep", fake_sweep)
    monkeypatch.setattr(e45, "matched_control_sweep",
                        lambda *a, **k: {"l0": [0.25] * len(alphas), "l1": [0.25] * len(alphas)})
    monkeypatch.setattr(e45, "train_lm", lambda *a, **k: 0.0)
    monkeypatch.setattr(e45, "save_plot", lambda *a, **k: "x.png")
    ctx = Context(out=tmp_path, quick=True, seeds=2, seeds_given=True)
    f = e45.PositionsHeadsExperiment()._positions(ctx, steps=1, n_models=2)
    # seed 0: initial 0.1, trained 0.2 (two layers each) → 0.15; seed 1: 0.3, 0.4 → 0.35;
    # two seeds: 1 degree of freedom, the Cauchy quantile tan(0.475π) = 12.706
    assert f.seeds == 2 and f.estimate == pytest.approx(0.25)
    half = math.tan(0.475 * math.pi) * 0.1
    assert (f.low, f.high) == pytest.approx((0.25 - half, 0.25 + half))


def test_e1_findings_do_not_depend_on_the_order_in_which_runs_finished(tmp_path, monkeypatch):
    from graded.study.core import Context
    from graded.study.experiments import e1_sample_efficiency as e1

    monkeypatch.setattr(e1.SampleEfficiencyExperiment, "_plots", staticmethod(lambda *a: []))
    monkeypatch.setattr(e1.SampleEfficiencyExperiment, "_section", staticmethod(lambda *a: None))
    ctx = Context(out=tmp_path, quick=True, seeds=2)
    exp = e1.SampleEfficiencyExperiment()
    rng = np.random.default_rng(0)
    results = {}
    for job in exp.plan(ctx, 1, {}):
        first = float(rng.uniform(1.0, 2.0))
        results[job["key"]] = {**job, "val": 0.5, "test": float(rng.uniform(0.2, 1.0)),
                               "train_first": first, "train_last": first * rng.uniform(0.1, 0.9),
                               "diverged": False}
    keys = list(results)
    shuffled = {k: results[k] for k in rng.permutation(keys)}
    a, b = exp.summarise(ctx, results), exp.summarise(ctx, shuffled)
    assert [(f.estimate, f.low, f.high) for f in a] == [(f.estimate, f.low, f.high) for f in b]


# ---------------------------------------------------------------- clustered replicates


def _exact_cluster_bootstrap(values: list[float], clusters: list[int]) -> list[tuple[float, int]]:
    """The exact distribution of the cluster bootstrap's statistic: every one of the k^k
    equally likely resamples of k clusters, each giving the mean over all values of the clusters
    drawn (counted with multiplicity), as (statistic, 1) atoms."""
    groups: dict[int, list[float]] = {}
    for v, c in zip(values, clusters):
        groups.setdefault(c, []).append(v)
    members = list(groups.values())
    atoms = []
    for draw in itertools.product(range(len(members)), repeat=len(members)):
        pooled = [v for i in draw for v in members[i]]
        atoms.append((sum(pooled) / len(pooled), 1))
    return atoms


def _inverse_cdf(atoms: list[tuple[float, int]], p: float) -> float:
    """The smallest atom whose cumulative probability reaches ``p``."""
    atoms = sorted(atoms)
    total, running = sum(w for _, w in atoms), 0
    for value, weight in atoms:
        running += weight
        if running / total >= p - 1e-12:
            return value
    return atoms[-1][0]


def test_cluster_bootstrap_equals_the_enumerated_distribution_of_three_clusters():
    # clusters of sizes 1, 2 and 3: each of the 27 resamples has probability 1/27 > 2.5%, so
    # the 2.5% and 97.5% quantiles are the extreme atoms (all three draws the lowest-mean
    # cluster, or the highest) and the Monte Carlo percentiles hit them exactly
    values = [0.9, 0.1, 0.3, -0.4, 0.0, -0.2]
    clusters = [0, 1, 1, 2, 2, 2]
    atoms = _exact_cluster_bootstrap(values, clusters)
    mean, low, high = cluster_bootstrap(values, clusters, n_boot=20_000)
    assert mean == pytest.approx(np.mean(values))  # the mean over values, not over clusters
    assert low == pytest.approx(_inverse_cdf(atoms, 0.025)) == pytest.approx(-0.2)
    assert high == pytest.approx(_inverse_cdf(atoms, 0.975)) == pytest.approx(0.9)


def test_cluster_bootstrap_percentiles_lie_within_the_enumerated_distribution_of_four_clusters():
    # 4^4 = 256 cluster resamples of unequal sizes: the ratio statistic Σ sums / Σ sizes (a
    # resample drawing the big cluster twice weighs it twice)
    values = [1.2, 0.4, 0.5, 0.45, -0.3, -0.1, 0.0, 0.2, 0.25]
    clusters = [7, 3, 3, 3, 5, 5, 9, 9, 9]
    atoms = _exact_cluster_bootstrap(values, clusters)
    _, low, high = cluster_bootstrap(values, clusters, n_boot=40_000)
    # the Monte Carlo fraction below a value is within ~0.002 of its exact probability
    assert _inverse_cdf(atoms, 0.018) <= low <= _inverse_cdf(atoms, 0.032)
    assert _inverse_cdf(atoms, 0.968) <= high <= _inverse_cdf(atoms, 0.982)
    # resampling the nine values as if independent gives another (narrower) distribution
    _, ind_low, ind_high = bootstrap_interval(values, n_boot=40_000)
    assert ind_high - ind_low < 0.9 * (high - low)


def test_a_cluster_of_two_identical_copies_does_not_narrow_the_interval():
    # a seed measured twice identically (two tools or layers that agree) is one replicate: the
    # cluster bootstrap of the doubled sample draws exactly what the bootstrap of the seeds
    # draws, while counting the copies as independent shrinks the interval by about √2
    seeds = [0.31, -0.05, 0.12, 0.4, 0.02, 0.22, -0.1]
    doubled = [v for v in seeds for _ in range(2)]
    labels = [s for s in range(len(seeds)) for _ in range(2)]
    assert cluster_bootstrap(doubled, labels) == pytest.approx(bootstrap_interval(seeds),
                                                               abs=1e-15)
    _, low, high = bootstrap_interval(seeds)
    _, naive_low, naive_high = bootstrap_interval(doubled)
    assert (naive_high - naive_low) / (high - low) == pytest.approx(1 / math.sqrt(2), abs=0.12)


def test_cluster_bootstrap_with_singleton_clusters_is_the_plain_bootstrap():
    x = list(np.random.default_rng(4).normal(size=9))
    assert cluster_bootstrap(x, [f"s{i}" for i in range(9)]) == bootstrap_interval(x)
    assert cluster_bootstrap([0.2, 0.4], ["a", "a"]) == pytest.approx((0.3, 0.3, 0.3))
    with pytest.raises(ValueError, match="one cluster label per value"):
        cluster_bootstrap([0.1, 0.2], [0])



def _exact_two_stage_bootstrap(cells: dict[tuple[int, int], list[float]], k: int,
                               m: int) -> list[tuple[float, int]]:
    """The exact distribution of the two-stage bootstrap of a k-task × m-seed grid: every one
    of the k^k task draws times every one of the m^m seed draws (one seed draw shared by the
    drawn tasks), equally likely, each giving the mean over all values of the drawn (task,
    seed) cells counted with multiplicity, as (statistic, 1) atoms."""
    atoms = []
    for tasks in itertools.product(range(k), repeat=k):
        for seeds in itertools.product(range(m), repeat=m):
            pooled = [v for t in tasks for s in seeds for v in cells[(t, s)]]
            atoms.append((sum(pooled) / len(pooled), 1))
    return atoms


def test_two_stage_bootstrap_percentiles_lie_within_the_enumerated_distribution():
    # 3 tasks × 3 seeds, one cell measured twice: 27 · 27 = 729 equally likely resamples.
    # With 40,000 draws the Monte Carlo fraction below a value has standard deviation
    # √(p(1 − p)/40,000): 0.0008 at p = 0.025 and 0.0022 at p = 0.25, so the percentiles lie
    # between the exact quantiles at p ∓ 0.007 (9 s.d.) and p ∓ 0.012 (5.5 s.d.)
    cells = {(0, 0): [0.9], (0, 1): [0.1, 0.5], (0, 2): [0.3],
             (1, 0): [-0.4], (1, 1): [0.0], (1, 2): [-0.2],
             (2, 0): [0.35], (2, 1): [-0.6], (2, 2): [0.05]}
    values = [v for c in cells.values() for v in c]
    tasks = [f"task{t}" for (t, _), c in cells.items() for _ in c]
    seeds = [s for (_, s), c in cells.items() for _ in c]
    atoms = _exact_two_stage_bootstrap(cells, 3, 3)
    for level, tol in ((0.95, 0.007), (0.5, 0.012)):
        mean, low, high = two_stage_bootstrap(values, tasks, seeds, n_boot=40_000, level=level)
        assert mean == pytest.approx(np.mean(values))  # the mean over values, not over cells
        tail = (1 - level) / 2
        assert _inverse_cdf(atoms, tail - tol) <= low <= _inverse_cdf(atoms, tail + tol)
        assert _inverse_cdf(atoms, 1 - tail - tol) <= high <= _inverse_cdf(atoms, 1 - tail + tol)
    # resampling the seeds alone (the tasks held fixed) gives a narrower distribution here,
    # where the tasks differ
    _, fixed_low, fixed_high = cluster_bootstrap(values, seeds, n_boot=40_000)
    _, low, high = two_stage_bootstrap(values, tasks, seeds, n_boot=40_000)
    assert fixed_high - fixed_low < high - low
    with pytest.raises(ValueError, match="one task and one seed label per value"):
        two_stage_bootstrap([0.1, 0.2], ["a", "b"], [0])


@pytest.mark.parametrize("k", [1, 4])
def test_two_stage_bootstrap_of_identical_tasks_is_the_bootstrap_of_the_seeds(k):
    # k tasks on which every seed gives the same value add nothing: the seed draw is shared
    # by the drawn tasks, so each replicate is the mean of the drawn seeds, draw for draw the
    # cluster bootstrap of the seeds (and, to rounding, the plain bootstrap of their values).
    # Drawing seeds afresh within each drawn task instead would average k independent seed
    # resamples and come out about √k narrower, counting one seed's shared effect k times.
    per_seed = [0.31, -0.05, 0.12, 0.4, 0.02, 0.22, -0.1]
    values = [v for _ in range(k) for v in per_seed]
    tasks = [t for t in range(k) for _ in per_seed]
    seeds = [s for _ in range(k) for s in range(len(per_seed))]
    got = two_stage_bootstrap(values, tasks, seeds)
    assert got == pytest.approx(cluster_bootstrap(values, seeds), abs=1e-12)
    assert got == pytest.approx(bootstrap_interval(per_seed), abs=1e-12)
    x = np.asarray(per_seed)
    nested = x[np.random.default_rng(0).integers(0, x.size, size=(10_000, k, x.size))]
    nested_means = nested.mean(axis=(1, 2))
    width = got[2] - got[1]
    nested_width = np.quantile(nested_means, 0.975) - np.quantile(nested_means, 0.025)
    assert nested_width / width == pytest.approx(1 / math.sqrt(k), abs=0.08)


def test_the_t_test_sentence_is_over_the_values_of_the_t_interval():
    # two tools per seed: the test is over the seeds' means, as the t interval is; a finding
    # with a margin (a threshold other than 0) does not get it
    values = [0.3, 0.1, -0.05, 0.2, 0.15, 0.25, 0.0, 0.1]
    seeds = [0, 0, 1, 1, 2, 2, 3, 3]
    means = [0.2, 0.075, 0.2, 0.05]
    p = paired_t_p_value(means)
    assert t_test_note(values, seeds) == (
        f"Two-sided t-test of the 4 seeds' means against 0: p = {p:.3g}.")
    assert t_test_note(means) == f"Two-sided t-test of the 4 seeds' values against 0: p = {p:.3g}."
    f = finding_from_values(claim="11", experiment="E8", quantity="q", control="c",
                            values=values, clusters=seeds, predicted="positive", t_test=True)
    assert f"p = {p:.3g}." in f.detail
    g = finding_from_values(claim="14", experiment="E8", quantity="q", control="c",
                            values=values, clusters=seeds, predicted="positive", margin=0.9,
                            t_test=True)
    assert "t-test" not in g.detail

def test_e1_pooled_rows_resample_seeds_with_every_task_kept(tmp_path, monkeypatch):
    """A seed's ΔAULC on the three structured feature tasks shares the seed's subset and batch
    order: the pooled interval resamples the 5 seeds, not 15 (task, seed) pairs."""
    from graded.study.core import Context
    from graded.study.experiments import e1_sample_efficiency as e1

    monkeypatch.setattr(e1.SampleEfficiencyExperiment, "_plots", staticmethod(lambda *a: []))
    monkeypatch.setattr(e1.SampleEfficiencyExperiment, "_section", staticmethod(lambda *a: None))
    ctx = Context(out=tmp_path, quick=False, seeds=5, seeds_given=True)
    exp = e1.SampleEfficiencyExperiment()
    effect = {0: -0.30, 1: 0.05, 2: -0.12, 3: -0.02, 4: -0.21}  # the same on every task
    results = {}
    for job in exp.plan(ctx, 1, {}):
        test = 1.0 + (effect[job["seed"]] if job["arm"] == "fixed_aligned" else 0.0)
        results[job["key"]] = {**job, "val": 0.5, "test": test, "train_first": 1.0,
                               "train_last": 0.5, "diverged": False}
    finding = exp.summarise(ctx, results)[0]
    assert finding.quantity.startswith("paired ΔAULC (test loss), fixed aligned − none")
    assert finding.seeds == 5
    assert finding.estimate == pytest.approx(np.mean(list(effect.values())))
    iv = mean_interval(list(effect.values()))
    assert (finding.low, finding.high) == pytest.approx((iv.low, iv.high), abs=1e-12)
    _, naive_low, naive_high = bootstrap_interval(list(effect.values()) * 3)
    assert finding.high - finding.low > 1.3 * (naive_high - naive_low)
    # the same effect on every task: resampling the tasks too adds nothing, and the detail's
    # two-stage interval is the bootstrap part of the verdict interval
    assert finding.detail.endswith(
        " With tasks resampled too (two-stage bootstrap over the 3 tasks and their seeds): "
        f"[{iv.bootstrap[0]:.4f}, {iv.bootstrap[1]:.4f}].")


def test_e3_replicates_are_random_draws_and_trained_seeds(tmp_path, monkeypatch):
    """The bases of a random draw share its Q, K and the layers of a model share its seed: the
    random finding's interval resamples the draws, the trained finding's the seeds, each with
    all its instances (the two populations were one pooled sample of draws and seeds)."""
    from types import SimpleNamespace

    import torch

    from graded.study.core import Context
    from graded.study.experiments import e3_rank as e3

    draw_value = {}

    def fake_random(*, n, trials, seed):
        values = [float(np.sin(t + 1.0)) for t in range(trials)]  # one value per draw
        draw_value["values"] = values
        rows = {k: [values[t] for _ in e3.BASES for t in range(trials)]
                for k in ("matched", "raw", "eff_matched", "eff_raw")}
        return rows, {lam: {"ungraded": 1.0, "graded": 1.0, "graded_matched": 1.0}
                      for lam in e3.BASES}

    def stats(value):
        t = torch.tensor([[value]])
        return SimpleNamespace(numerical_rank_per_matrix=t, effective_rank_per_matrix=t)

    seed_value = {0: 0.5, 1: -1.5, 2: 2.5}
    calls = {"n": 0}

    def fake_attention_rank(model, ids):
        v = seed_value[calls["n"]]
        calls["n"] += 1
        cmp = SimpleNamespace(attention={"ungraded": stats(0.0), "graded": stats(v),
                                         "graded_matched": stats(v)})
        return {"l0": cmp, "l1": cmp, "l2": cmp}  # three layers: clusters of equal size

    monkeypatch.setattr(e3, "random_rank_differences", fake_random)
    monkeypatch.setattr(e3, "attention_rank", fake_attention_rank)
    monkeypatch.setattr(e3, "train_lm", lambda *a, **k: 0.0)
    monkeypatch.setattr(e3, "save_plot", lambda *a, **k: "x.png")
    ctx = Context(out=tmp_path, quick=True, seeds=3, seeds_given=True)
    random, trained = e3.RankExperiment()._run(ctx)
    for f, replicates in ((random, draw_value["values"]), (trained, list(seed_value.values()))):
        assert f.seeds == len(replicates)
        assert f.estimate == pytest.approx(np.mean(replicates))
        iv = mean_interval(replicates)
        assert (f.low, f.high) == pytest.approx((iv.low, iv.high), abs=1e-12)
    assert random.seeds == 16 and trained.seeds == 3


def test_e8_replicates_are_seeds_with_both_tools(tmp_path, monkeypatch):
    """The two tools of a seed share its split, initialisation seed and batches: two tools that
    measure the same value give the interval of the seeds, not of twice as many runs."""
    from graded.study.core import Context
    from graded.study.experiments import e8_morphic as e8

    gain = {0: 0.02, 1: -0.04, 2: 0.07, 3: 0.01}

    def fake_adder_run(tool, seed, steps, *, report_dir=None):
        return {"frac_positive_after": 0.5 + gain[seed], "frac_positive_before": 0.5,
                "ablation_min_adder": 1.0, "ablation_distractor": 0.0,
                "calibration_spearman": 0.3, "calibration_bins": 10,
                "calibration_monotone": 0.0, "calibration_ece": 0.1, "held_routing": 1.0,
                "held_answer": 1.0, "held_loss": 0.1, "entropy": 0.01, "support_90": 1.0}

    monkeypatch.setattr(e8, "adder_run", fake_adder_run)
    monkeypatch.setattr(e8.MorphicExperiment, "_retrieval", lambda self, ctx: None)
    monkeypatch.setattr(e8.MorphicExperiment, "_dyck", lambda self, ctx, seeds, steps: None)
    ctx = Context(out=tmp_path, quick=True, seeds=4, seeds_given=True)
    f = e8.MorphicExperiment()._run(ctx)[0]
    assert f.claim == "11" and f.seeds == 4
    assert f.estimate == pytest.approx(np.mean(list(gain.values())))
    iv = mean_interval(list(gain.values()))
    assert (f.low, f.high) == pytest.approx((iv.low, iv.high), abs=1e-12)
    _, naive_low, naive_high = bootstrap_interval(list(gain.values()) * 2)
    assert f.high - f.low > naive_high - naive_low


def test_the_e1_section_per_n_line_leaves_out_seeds_whose_run_diverged(tmp_path):
    # the line beside the per-n table pairs the same seeds as per_size_family: a run that
    # diverged (test loss inf) is left out, not averaged into an inf or nan interval
    from graded.study.core import Context
    from graded.study.experiments.e1_sample_efficiency import SampleEfficiencyExperiment

    b = {"tasks": ["poly_e5"], "sizes": [100], "small_seeds": 6, "large_seeds": 6,
         "lrs": [3e-3], "steps": 1, "n_eval": 10}
    aligned = [0.5, 0.6, 0.4, 0.55, 0.5]
    curves = {("poly_e5", "none"): {100: {s: 1.0 for s in range(6)}},
              ("poly_e5", "fixed_aligned"): {100: {**dict(enumerate(aligned)), 5: math.inf}}}
    ctx = Context(out=tmp_path, quick=True, seeds=6)
    SampleEfficiencyExperiment._section(ctx, b, curves, [], [], per_size_family(b, curves))
    line = next(x for x in (tmp_path / "section.md").read_text().splitlines()
                if x.startswith("Per-n paired difference"))
    iv = mean_interval([a - 1.0 for a in aligned])
    assert line == (f"Per-n paired difference, fixed aligned − none: n=100: "
                    f"{iv.estimate:+.4f} [{iv.low:+.4f}, {iv.high:+.4f}] (5 seeds)")
    assert iv.estimate == pytest.approx(-0.49)
