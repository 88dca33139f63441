"""One value has no Student t interval: `t_interval` gives the whole line (0 degrees of
freedom), the study's verdicts read it as inconclusive, and reports say there is no interval
instead of printing a zero-width one."""

from __future__ import annotations

import math

import pytest

from graded.study.core import verdict
from graded.study.experiments._e_common import equivalence_verdict, finding_from_values
from graded.study.statistics import mean_interval, t_interval, t_quantile


@pytest.mark.parametrize("level", [0.5, 0.95, 0.999])
def test_one_value_has_no_t_interval_at_any_level(level):
    assert t_interval([0.7], level=level) == (0.7, -math.inf, math.inf)
    assert t_interval([[-3.25]], level=level) == (-3.25, -math.inf, math.inf)


def test_the_t_quantile_grows_without_bound_as_the_degrees_of_freedom_go_to_zero():
    # the one-value interval is the limit nu -> 0 of mean ± t_{0.975, nu}·s/√n: the quantile
    # passes any finite width (t_{0.975, 1} = 12.706, Student's table)
    assert t_quantile(0.975, 1.0) == pytest.approx(12.7062047, rel=1e-7)
    widths = [t_quantile(0.975, nu) for nu in (1.0, 0.5, 0.1)]
    assert widths == sorted(widths) and widths[-1] > 1e6


@pytest.mark.parametrize("predicted", ["positive", "negative"])
@pytest.mark.parametrize("margin", [0.0, 0.5])
@pytest.mark.parametrize("value", [-2.0, 0.0, 0.7, 5.0])
def test_no_verdict_reads_the_one_value_interval_as_holding_or_failing(predicted, margin, value):
    _, low, high = t_interval([value])
    assert verdict(low, high, predicted=predicted, margin=margin) == "inconclusive"
    assert equivalence_verdict(low, high, -1.0, 1.0) == "inconclusive"


def test_mean_interval_of_one_replicate_takes_the_t_interval_of_one_value():
    one = mean_interval([0.8], n_boot=100)
    assert one.t == t_interval([0.8])[1:] and (one.low, one.high) == (-math.inf, math.inf)
    clustered = mean_interval([0.8, 0.7], [0, 0], n_boot=100)  # one seed measured twice
    assert clustered.t == t_interval([0.75])[1:] and clustered.replicates == 1


def test_a_single_seed_finding_is_inconclusive_and_its_note_says_there_is_no_interval():
    # 0.95 lies well above the 0.9 threshold; one seed still decides nothing
    f = finding_from_values(claim="14", experiment="E8", quantity="q", control="c",
                            values=[0.95], predicted="positive", margin=0.9)
    assert (f.seeds, f.estimate, f.verdict) == (1, 0.95, "inconclusive")
    assert "the t interval (−∞, ∞) (n = 1: no interval, so no verdict)" in f.detail
    assert "inf" not in f.detail and "[0.9500, 0.9500] and the t interval [" not in f.detail
