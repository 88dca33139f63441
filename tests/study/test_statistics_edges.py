"""The study's statistics at their edges: input they would otherwise read silently wrong is
refused, naming the bad value and what was expected; quantiles and p-values near the median
against the t density's first-order closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest

from graded.study.core import verdict
from graded.study.experiments._e_common import equivalence_verdict
from graded.study.statistics import (
    bootstrap_interval,
    cluster_bootstrap,
    holm,
    mean_interval,
    paired_bootstrap,
    paired_t_p_value,
    t_interval,
    t_quantile,
    two_stage_bootstrap,
)


def test_a_misspelt_prediction_is_refused_rather_than_read_as_negative():
    # an interval wholly below 0: "postive" used to fall through to the negative branch and
    # report the opposite of the positive rule's "fails" as "holds"
    assert verdict(-1.0, -0.5, predicted="positive") == "fails"
    with pytest.raises(ValueError, match=r"predicted='postive'; expected 'positive' or "
                                         r"'negative'"):
        verdict(-1.0, -0.5, predicted="postive")


@pytest.mark.parametrize("margin", [-0.1, math.nan, math.inf])
def test_a_margin_must_be_a_finite_width(margin):
    # a negative margin would let an interval straddling 0, [−0.05, 0.05], "hold" as positive
    with pytest.raises(ValueError, match=r"margin=.*expected a finite width >= 0"):
        verdict(-0.05, 0.05, predicted="positive", margin=margin)


def test_a_reversed_equivalence_band_is_refused():
    # the band [0.05, 0]: no interval lies inside it, and [0.01, 0.02], inside the intended
    # [0, 0.05], used to "fail" as lying wholly outside it
    assert equivalence_verdict(0.01, 0.02, 0.0, 0.05) == "holds"
    with pytest.raises(ValueError, match=r"band \[lo, hi\] with lo < hi, got lo=0.05, hi=0.0"):
        equivalence_verdict(0.01, 0.02, 0.05, 0.0)


BOOTSTRAPS = {
    "bootstrap_interval": lambda **kw: bootstrap_interval([1.0, 2.0, 4.0], **kw),
    "paired_bootstrap": lambda **kw: paired_bootstrap([1.0, 2.0, 4.0], [0.0, 0.5, 1.0], **kw),
    "cluster_bootstrap": lambda **kw: cluster_bootstrap([1.0, 2.0, 4.0, 3.0], [0, 0, 1, 2],
                                                        **kw),
    "two_stage_bootstrap": lambda **kw: two_stage_bootstrap([1.0, 2.0, 4.0, 3.0], [0, 0, 1, 1],
                                                            [0, 1, 0, 1], **kw),
    "mean_interval": lambda **kw: mean_interval([1.0, 2.0, 4.0], **kw),
}


@pytest.mark.parametrize("name", sorted(BOOTSTRAPS))
@pytest.mark.parametrize("level", [0.0, 1.0, 95.0, -0.5])
def test_a_level_outside_zero_one_is_named(name, level):
    # level 1.0 used to give the resampled min and max, level 0 a point, level 95 numpy's
    # "Quantiles must be in the range [0, 1]" naming no argument
    with pytest.raises(ValueError, match=rf"needs a level strictly between 0 and 1 \(e.g. "
                                         rf"0.95\), got level={level!r}"):
        BOOTSTRAPS[name](level=level)


@pytest.mark.parametrize("name", sorted(BOOTSTRAPS))
def test_a_number_of_resamples_that_is_not_a_positive_integer_is_named(name):
    # n_boot = 0 used to raise numpy's "index -1 is out of bounds for axis 0 with size 0"
    with pytest.raises(ValueError, match=r"n_boot must be >= 1, got 0"):
        BOOTSTRAPS[name](n_boot=0)
    with pytest.raises(TypeError, match=r"n_boot must be an int, got 2.5 \(float\)"):
        BOOTSTRAPS[name](n_boot=2.5)


def test_t_interval_names_a_bad_level_not_the_quantile_it_would_ask_for():
    with pytest.raises(ValueError, match=r"t_interval needs a level strictly between 0 and 1 "
                                         r"\(e.g. 0.95\), got level=1.5"):
        t_interval([1.0, 2.0], level=1.5)


def test_reversed_bounds_are_refused_rather_than_giving_low_above_high():
    # cut to (5, 4) the interval was [5, 4]: low > high, an interval of nothing
    with pytest.raises(ValueError, match=r"bounds \(low, high\) with low < high, got "
                                         r"bounds=\(1.0, 0.0\)"):
        mean_interval([0.2, 0.4, 0.5], bounds=(1.0, 0.0))


def test_holm_refuses_p_values_outside_zero_one_and_a_bad_level():
    # p = 2 (e.g. a one-sided p doubled past 1) or a negative p is no probability: reading it
    # as one still rejected the family's other member
    with pytest.raises(ValueError, match=r"p-values in \[0, 1\].*got \[2.0\]"):
        holm([0.01, 2.0])
    with pytest.raises(ValueError, match=r"got \[-0.01\]"):
        holm([-0.01, 0.2])
    with pytest.raises(ValueError, match=r"holm needs a level strictly between 0 and 1 \(e.g. "
                                         r"0.05\), got level=5.0"):
        holm([0.01, 0.2], level=5.0)
    assert holm([0.01, math.nan, 1.0]) == [True, False, False]  # nan still counts as untested


def _t_density_at_zero(nu: float) -> float:
    return math.exp(math.lgamma((nu + 1) / 2) - math.lgamma(nu / 2)) / math.sqrt(nu * math.pi)


@pytest.mark.parametrize("nu", [2, 10, 1000, 1e5])
def test_t_quantile_near_the_median_is_the_offset_over_the_density_at_zero(nu):
    # F(t) = ½ + f(0)·t + O(t³), so the quantile of ½ + δ is δ/f(0) to relative O(δ²); with
    # t² ≪ ν the argument ν/(ν + t²) of the incomplete beta rounds to 1, and the quantile
    # used to come out 10 times too large at ν = 10⁵
    delta = 1e-7
    assert t_quantile(0.5 + delta, nu) == pytest.approx(delta / _t_density_at_zero(nu),
                                                        rel=1e-6)


def test_the_p_value_of_a_tiny_t_statistic_falls_short_of_one_by_twice_f0_t():
    # 1 − p = P(|T| < t) = 2 f(0) t + O(t³); it used to be exactly 0 (p = 1.0) here
    d = np.array([1.0, -1.0] * 500) + 1e-9
    t = d.mean() / (d.std(ddof=1) / math.sqrt(d.size))
    assert 1.0 - paired_t_p_value(d) == pytest.approx(2 * _t_density_at_zero(d.size - 1) * t,
                                                      rel=1e-6)
