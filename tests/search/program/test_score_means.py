"""The mean of scores (``mean_score``, behind a program's score, its named scores and its
cluster's score) against the exact mean of Python's fractions."""

from fractions import Fraction

import pytest

from graded.search.program.evaluate import mean_score


def _exact_mean(values):
    return float(sum(map(Fraction, values)) / len(values))


@pytest.mark.parametrize("values", [[1e308] * 3, [1.7e308, 1.7e308, -1e-300, 5.0],
                                    [1.0, 2.0, 4.0], [-1e308, -1e308], [0.5, 0.25, 2.0**-40]])
def test_mean_score_is_the_exact_mean_rounded_where_the_sum_is_exact_or_overflows(values):
    # sums representable exactly (as the old sum(values) / n): the mean is unchanged
    assert mean_score(values) == _exact_mean(values)


@pytest.mark.parametrize("values", [[0.1, 0.2, 0.3], [1e16, 1.0, -1e16, 3.0],
                                    [0.1 * i for i in range(1, 50)]])
def test_mean_score_is_off_the_exact_mean_by_two_roundings_at_most(values):
    exact = sum(map(Fraction, values)) / len(values)  # fsum rounds the sum, then / n rounds
    two_roundings = (1 + Fraction(2) ** -53) ** 2 - 1
    assert abs(Fraction(mean_score(values)) - exact) <= abs(exact) * two_roundings


def test_mean_score_of_no_scores_is_refused():
    with pytest.raises(ValueError, match=r"the mean of no scores; expected at least one score"):
        mean_score([])
