"""A size split at the smallest ranges: either two valid sides or a ValueError that names the
option values the user gave (not a value of a derived configuration)."""

import pytest

from graded.tasks import get_task


def test_polynomial_size_split_of_degrees_0_to_1_is_refused_naming_the_range():
    task = get_task("polynomials", min_degree=0, max_degree=1)
    # the cut at the midpoint, degree 0, would train on constants: a max_degree the task
    # refuses; the error names the configured range, not "max_degree ... got 0"
    with pytest.raises(ValueError, match=r"min_degree=0.*max_degree=1") as err:
        task.split("size", 2, 2, seed=0)
    assert "got 0" not in str(err.value)


@pytest.mark.parametrize("name", ["polynomials", "polynomials_seq2seq"])
def test_polynomial_size_split_of_degrees_0_to_2_trains_on_degree_1_at_most(name):
    task = get_task(name, min_degree=0, max_degree=2, coeff_range=2, operation="product")
    small, large = task.size_configs()
    assert (small.min_degree, small.max_degree) == (0, 1)
    assert (large.min_degree, large.max_degree) == (2, 2)
    train, test = task.split("size", 20, 20, seed=1)
    degrees = [max(len(p), len(q)) - 1 for p, q, _ in map(task.parse_example,
                                                          task.examples(train))]
    assert max(degrees) <= 1
    degrees = [max(len(p), len(q)) - 1 for p, q, _ in map(task.parse_example,
                                                          task.examples(test))]
    assert min(degrees) == 2
