"""The interval of a mean over fixed strata (E7's model sizes) against hand computations and a
coverage simulation, and E7's verdict with timings whose overhead differs by size."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import graded.study.experiments.e7_overhead as e7
from graded.study.core import Context
from graded.study.statistics import stratified_interval, t_quantile


def test_two_strata_of_equal_spread_give_the_welch_interval_of_two_degrees_of_freedom():
    # strata {1.0, 1.2} and {0.0, 0.2}: s² = 0.02 in each, v_s = 0.02/(2²·2) = 0.0025, se² =
    # 0.005, Welch–Satterthwaite ν = (2v)²/(2v²/1) = 2, whose 0.975 quantile is
    # 0.95/√(2·0.975·0.025) = 4.3027 (t₂'s closed form); pooling the four values would give
    # 0.6 ± t₃·0.5888/2 = 0.6 ± 0.937 instead
    iv = stratified_interval([1.0, 1.2, 0.0, 0.2], ["a", "a", "b", "b"], n_boot=2000)
    half = 0.95 / math.sqrt(2 * 0.975 * 0.025) * math.sqrt(0.005)
    assert iv.estimate == pytest.approx(0.6)
    assert iv.df == pytest.approx(2.0)
    assert iv.t == pytest.approx((0.6 - half, 0.6 + half))
    assert (iv.low, iv.high) == pytest.approx((0.6 - half, 0.6 + half))  # the t part is wider
    assert "(2.0 df)" in iv.note()


def test_unequal_strata_take_the_mean_of_means_and_the_satterthwaite_degrees_of_freedom():
    groups = {"s": [0.21, 0.25, 0.22, 0.24, 0.20, 0.23], "m": [0.05, 0.12, -0.02, 0.09],
              "l": [0.01, 0.02, 0.04]}
    values = [v for g in groups.values() for v in g]
    labels = [k for k, g in groups.items() for _ in g]
    iv = stratified_interval(values, labels, n_boot=500)
    k = len(groups)
    means, parts = [], []
    for g in groups.values():
        m = sum(g) / len(g)
        s2 = sum((x - m) ** 2 for x in g) / (len(g) - 1)
        means.append(m)
        parts.append((s2 / (k * k * len(g)), len(g)))
    se2 = sum(v for v, _ in parts)
    nu = se2 ** 2 / sum(v * v / (n - 1) for v, n in parts)
    est = sum(means) / k
    assert iv.estimate == pytest.approx(est)
    assert iv.df == pytest.approx(nu)
    half = t_quantile(0.975, nu) * math.sqrt(se2)
    assert iv.t == pytest.approx((est - half, est + half))
    assert iv.low <= min(iv.t[0], iv.bootstrap[0]) and iv.high >= max(iv.t[1], iv.bootstrap[1])


def test_the_stratified_bootstrap_lies_within_its_enumerated_distribution():
    # two strata of two values: 4 resamples each, 16 equally likely means of means
    a, b = [0.0, 1.0], [10.0, 14.0]
    support = sorted((np.mean(ra) + np.mean(rb)) / 2 for ra in itertools.product(a, repeat=2)
                     for rb in itertools.product(b, repeat=2))
    iv = stratified_interval(a + b, [0, 0, 1, 1], n_boot=4000)
    assert support[0] <= iv.bootstrap[0] <= support[1]  # 2.5% of 16 points: the lowest two
    assert support[-2] <= iv.bootstrap[1] <= support[-1]


def test_the_stratified_interval_covers_the_mean_of_means_at_its_nominal_level():
    # strata with different true means (0.2, 0.05) and spreads (0.01, 0.06), 6 values each: the
    # mean of means 0.125 is covered about 95% of the time (600 samples, standard error 0.9
    # points), where pooling the 12 values counts the 0.15 between the strata as noise and
    # covers nearly always
    rng = np.random.default_rng(7)
    labels = [0] * 6 + [1] * 6
    hits = pooled_hits = 0
    reps = 600
    for _ in range(reps):
        x = np.concatenate([rng.normal(0.2, 0.01, 6), rng.normal(0.05, 0.06, 6)])
        iv = stratified_interval(x, labels, n_boot=100, seed=int(rng.integers(1 << 30)))
        hits += iv.low <= 0.125 <= iv.high
        half = t_quantile(0.975, 11) * x.std(ddof=1) / math.sqrt(12)
        pooled_hits += abs(x.mean() - 0.125) <= half
    assert 0.925 <= hits / reps <= 0.985
    assert pooled_hits / reps > 0.995


def test_a_stratum_of_one_value_gives_no_t_interval_and_no_spread_gives_the_point():
    iv = stratified_interval([0.1, 0.2, 0.3], ["a", "a", "b"], n_boot=100)
    assert iv.t == (-math.inf, math.inf) and iv.df == 0.0
    flat = stratified_interval([0.1, 0.1, 0.3, 0.3], ["a", "a", "b", "b"], n_boot=100)
    assert (flat.estimate, flat.low, flat.high) == pytest.approx((0.2, 0.2, 0.2))


def test_stratified_interval_names_mismatched_labels_and_empty_input():
    with pytest.raises(ValueError, match="one stratum label per value, got 3 values and 2"):
        stratified_interval([0.1, 0.2, 0.3], ["a", "b"])
    with pytest.raises(ValueError, match="at least one value"):
        stratified_interval([], [])


def test_e7_verdict_counts_only_the_rounds_spread_not_the_difference_between_sizes(
        tmp_path, monkeypatch):
    # graded/ungraded = 1.25 at the small size and 1.05 at the large one, each round jittered by
    # ±0.5%: the overhead is exp((ln 1.25 + ln 1.05)/2) − 1 = 14.6%, with a narrow interval, so
    # the claim fails. Pooling the 12 rounds as one sample (the between-size gap of 0.17 in log
    # counted as noise) gave an interval reaching below 10%: inconclusive.
    sizes = ((16, 1, 2, 8, 2), (24, 1, 2, 8, 2))
    monkeypatch.setattr(e7, "SIZES", sizes)
    jitter = itertools.cycle([1.0, 1.005, 0.995, 1.002, 0.998, 1.004])

    def fake_time(model, ids, repeats):
        base = 1e-3 * model.config.d_model
        if model.config.grading is None:
            return base
        return base * (1.25 if model.config.d_model == 16 else 1.05) * next(jitter)

    monkeypatch.setattr(e7, "time_pass", fake_time)
    (f,) = e7.OverheadExperiment().run(Context(out=tmp_path, quick=True, seeds=2))
    assert f.estimate == pytest.approx(math.sqrt(1.25 * 1.05) - 1, abs=2e-3)
    assert 0.10 < f.low < f.estimate < f.high < 0.20
    assert f.verdict == "fails"


def test_one_stratum_is_the_studys_interval_of_a_mean_draw_for_draw():
    from graded.study.statistics import mean_interval

    x = [0.3, -0.1, 0.45, 0.2, 0.05, 0.6]
    iv, ref = stratified_interval(x, ["only"] * 6, n_boot=1000), mean_interval(x, n_boot=1000)
    assert iv.df == pytest.approx(5.0)
    assert iv.bootstrap == pytest.approx(ref.bootstrap, abs=1e-15)
    assert (iv.estimate, *iv.t) == pytest.approx((ref.estimate, *ref.t), abs=1e-12)
