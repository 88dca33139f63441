"""The study's statistics and vocabulary against direct computations."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from graded.study.core import CLAIMS, RULE, Finding, atomic_write_text, verdict
from graded.study.statistics import (
    bootstrap_interval,
    holm,
    paired_bootstrap,
    paired_t_p_value,
)


def test_claims_are_the_28_of_the_notes_plus_000s_three():
    assert [c for c in CLAIMS if c.isdigit()] == [str(i) for i in range(1, 29)]
    assert {"000-S", "000-R", "000-I"} <= set(CLAIMS)
    assert len(CLAIMS) == 31


def test_bootstrap_of_two_values_has_the_enumerated_percentiles():
    # resampled means of [0, 1] are 0, 1/2, 1 with probabilities 1/4, 1/2, 1/4, so the 2.5%
    # and 97.5% quantiles are 0 and 1
    mean, low, high = bootstrap_interval([0.0, 1.0], n_boot=20_000)
    assert (mean, low, high) == (0.5, 0.0, 1.0)


def test_bootstrap_interval_matches_the_normal_approximation_for_a_large_sample():
    x = np.random.default_rng(3).normal(2.0, 1.5, size=2000)
    mean, low, high = bootstrap_interval(x)
    half = 1.96 * x.std(ddof=1) / math.sqrt(x.size)
    assert mean == pytest.approx(x.mean())
    assert low == pytest.approx(x.mean() - half, abs=0.15 * half)
    assert high == pytest.approx(x.mean() + half, abs=0.15 * half)


def test_bootstrap_of_one_value_or_a_constant_sample_is_that_value():
    assert bootstrap_interval([4.0]) == (4.0, 4.0, 4.0)
    assert bootstrap_interval([2.5] * 7) == (2.5, 2.5, 2.5)
    with pytest.raises(ValueError, match="at least one"):
        bootstrap_interval([])


def test_paired_bootstrap_is_the_bootstrap_of_the_differences():
    a, c = [1.0, 2.0, 4.0, 3.0], [0.5, 2.5, 3.0, 1.0]
    assert paired_bootstrap(a, c) == bootstrap_interval([0.5, -0.5, 1.0, 2.0])
    with pytest.raises(ValueError, match="equal lengths"):
        paired_bootstrap([1.0, 2.0], [1.0])


def test_holm_against_a_hand_example():
    # sorted: 0.005 <= 0.05/4 reject; 0.01 <= 0.05/3 reject; 0.03 > 0.05/2 stop
    assert holm([0.01, 0.04, 0.03, 0.005]) == [True, False, False, True]
    # step-down stops at the first non-rejection even if a later p would pass its own level
    assert holm([0.04, 0.045]) == [False, False]
    assert holm([0.02, 0.04]) == [True, True]


@pytest.mark.parametrize("t, df, p", [
    (2.262, 9, 0.05),  # two-sided 5% critical values of Student's t (statistical tables)
    (2.776, 4, 0.05),
    (3.250, 9, 0.01),
    (1.0, 1, 0.5),  # Cauchy: P(|T| > 1) = 1/2 exactly
])
def test_paired_t_p_value_against_tables(t, df, p):
    # a sample of df + 1 differences whose t statistic is exactly t
    z = np.random.default_rng(df).normal(size=df + 1)
    z = (z - z.mean()) / z.std(ddof=1)  # mean 0, sd 1
    d = z + t / math.sqrt(df + 1)  # mean t/√n, sd 1: t statistic = t
    assert paired_t_p_value(d) == pytest.approx(p, abs=2e-4 if df > 1 else 1e-9)
    assert paired_t_p_value(-d) == pytest.approx(paired_t_p_value(d))


def test_paired_t_p_value_for_many_degrees_of_freedom_matches_the_normal_expansion():
    # df = ν = 10,000: P(|T| > t) = 2(1 − Φ(t)) + 2φ(t)(t³ + t)/(4ν) + O(ν⁻²)
    # (Abramowitz & Stegun 26.7.5); 2(1 − Φ(1.96)) = 0.04999579
    t, nu = 1.96, 10_000
    expected = 0.04999579 + 2 * math.exp(-t * t / 2) / math.sqrt(2 * math.pi) * (t**3 + t) / (
        4 * nu)
    z = np.random.default_rng(0).normal(size=nu + 1)
    d = (z - z.mean()) / z.std(ddof=1) + t / math.sqrt(z.size)
    assert paired_t_p_value(d) == pytest.approx(expected, abs=1e-6)


def test_paired_t_p_value_edge_cases():
    assert paired_t_p_value([0.0, 0.0, 0.0]) == 1.0
    assert paired_t_p_value([0.2, 0.2]) == 0.0
    with pytest.raises(ValueError, match="at least two differences, got 1"):
        paired_t_p_value([1.0])


@pytest.mark.parametrize("low, high, predicted, margin, expected", [
    (0.1, 0.5, "positive", 0.0, "holds"),
    (-0.5, -0.1, "positive", 0.0, "fails"),
    (-0.1, 0.5, "positive", 0.0, "inconclusive"),
    (-0.5, -0.1, "negative", 0.0, "holds"),
    (0.1, 0.5, "negative", 0.0, "fails"),
    (-0.5, 0.1, "negative", 0.0, "inconclusive"),
    (0.05, 0.08, "positive", 0.1, "fails"),  # a real but too small effect
    (0.05, 0.2, "positive", 0.1, "inconclusive"),
    (-0.08, -0.02, "negative", 0.1, "fails"),
    (float("nan"), 1.0, "positive", 0.0, "inconclusive"),
])
def test_verdict_rule(low, high, predicted, margin, expected):
    assert verdict(low, high, predicted=predicted, margin=margin) == expected


def test_the_rule_text_names_the_three_verdicts():
    for word in ("holds", "fails", "inconclusive", "95%", "Holm"):
        assert word in RULE


def test_finding_round_trips_through_json_with_nan():
    f = Finding("2", "E1", "q", "c", 0, math.nan, math.nan, math.nan, "inconclusive")
    data = json.loads(json.dumps({k: (None if isinstance(v, float) and math.isnan(v) else v)
                                  for k, v in f.as_dict().items()}))
    back = Finding.from_dict(data)
    assert back.claim == "2" and math.isnan(back.estimate) and back.verdict == "inconclusive"


def test_finding_rejects_an_unknown_claim_or_verdict():
    with pytest.raises(ValueError, match="claim='99'"):
        Finding("99", "E1", "q", "c", 1, 0.0, 0.0, 0.0, "holds")
    with pytest.raises(ValueError, match="verdict='maybe'"):
        Finding("2", "E1", "q", "c", 1, 0.0, 0.0, 0.0, "maybe")


def test_atomic_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "sub" / "x.json"
    atomic_write_text(path, "one")
    atomic_write_text(path, "two")
    assert path.read_text() == "two"
    assert [p.name for p in path.parent.iterdir()] == ["x.json"]
