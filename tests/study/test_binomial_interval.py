"""The exact binomial (Clopper–Pearson) interval of the study's accuracies (claims 14 and 15):
against the binomial tail sums it inverts, its closed forms, and its coverage."""

from __future__ import annotations

import math

import numpy as np
import pytest

from graded.study.experiments._e_common import finding_from_values
from graded.study.statistics import binomial_interval, mean_interval


def _upper_tail(x: int, n: int, p: float) -> float:
    """P(X ≥ x) for X ~ Binomial(n, p), summed term by term."""
    return sum(math.comb(n, k) * p ** k * (1 - p) ** (n - k) for k in range(x, n + 1))


@pytest.mark.parametrize(("x", "n"), [(1, 10), (5, 10), (9, 10), (17, 40), (54, 55)])
def test_each_end_puts_alpha_over_two_in_the_binomial_tail_beyond_the_count(x, n):
    low, high = binomial_interval(x, n)
    assert _upper_tail(x, n, low) == pytest.approx(0.025, rel=1e-9)
    assert 1.0 - _upper_tail(x + 1, n, high) == pytest.approx(0.025, rel=1e-9)


def test_the_published_value_for_five_of_ten():
    # Clopper & Pearson's table (and every statistics package): [0.1871, 0.8129]
    low, high = binomial_interval(5, 10)
    assert (round(low, 4), round(high, 4)) == (0.1871, 0.8129)


@pytest.mark.parametrize("n", [1, 11, 33, 55])
def test_all_or_none_right_have_their_closed_forms(n):
    assert binomial_interval(n, n) == (pytest.approx(0.025 ** (1 / n), rel=1e-12), 1.0)
    assert binomial_interval(0, n) == (0.0, pytest.approx(1 - 0.025 ** (1 / n), rel=1e-12))


def test_a_fractional_count_lies_between_its_integer_neighbours():
    lo3, hi3 = binomial_interval(3, 20)
    lo4, hi4 = binomial_interval(4, 20)
    lo, hi = binomial_interval(3.5, 20)
    assert lo3 < lo < lo4 and hi3 < hi < hi4


def test_it_covers_the_probability_at_least_at_the_level():
    rng = np.random.default_rng(0)
    for p in (0.05, 0.5, 0.93):
        counts = rng.binomial(30, p, size=800)
        cover = np.mean([lo <= p <= hi for lo, hi in (binomial_interval(int(c), 30)
                                                      for c in counts)])
        assert cover >= 0.95


@pytest.mark.parametrize(("successes", "trials"), [(-1, 10), (11, 10), (3, 0), (3, 2.5)])
def test_bad_counts_are_named(successes, trials):
    with pytest.raises((ValueError, TypeError), match=r"successes|trials"):
        binomial_interval(successes, trials)


def test_replicates_without_spread_no_longer_make_an_accuracy_certain():
    """Claims 14/15: 5 seeds × 2 tools, every run right on all 11 held-out pairs. The
    bootstrap and t intervals are the point 1; the interval now reaches down to the exact
    bound over the 55 distinct pairs, so a 0.9 threshold is cleared by evidence, not by a
    zero spread."""
    values, seeds = [1.0] * 10, [s for s in range(5) for _ in range(2)]
    assert mean_interval(values, seeds, bounds=(0.0, 1.0)).low == 1.0  # the old interval
    iv = mean_interval(values, seeds, bounds=(0.0, 1.0), trials=55)
    assert iv.low == pytest.approx(0.025 ** (1 / 55)) and iv.high == 1.0
    assert "exact binomial interval [0.9351, 1.0000] over 55 trials" in iv.note()
    kwargs = dict(experiment="E8", quantity="accuracy", control="threshold 0.9",
                  predicted="positive", margin=0.9, bounds=(0.0, 1.0), clusters=seeds,
                  items_per_replicate=11)
    assert finding_from_values(claim="14", values=values, **kwargs).verdict == "holds"
    # three seeds (the quick study's 33 pairs): 0.894 < 0.9, no longer a holding claim
    quick = finding_from_values(claim="14", values=[1.0] * 6,
                                **{**kwargs, "clusters": [0, 0, 1, 1, 2, 2]})
    assert quick.low == pytest.approx(0.025 ** (1 / 33)) and quick.verdict == "inconclusive"


def test_the_binomial_interval_only_widens_the_hull():
    rng = np.random.default_rng(1)
    values = rng.uniform(0.6, 0.9, size=8)
    plain = mean_interval(values, bounds=(0.0, 1.0))
    assert plain.note().startswith(
        f"Interval: the hull of the percentile bootstrap [{plain.bootstrap[0]:.4f}, "
        f"{plain.bootstrap[1]:.4f}] and the t interval [{plain.t[0]:.4f}, ")
    joined = mean_interval(values, bounds=(0.0, 1.0), trials=8 * 20)
    assert joined.low <= plain.low and joined.high >= plain.high
    with pytest.raises(ValueError, match="accuracies in"):
        mean_interval([1.5, 2.0], trials=10)
