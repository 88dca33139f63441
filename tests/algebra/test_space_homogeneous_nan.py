"""``GradedSpace.is_homogeneous`` (000 §2.1: non-zero in at most one grade component) counts a
NaN coordinate as non-zero, as the graded maps' checks refuse a NaN that would pass for 0."""

import math

import torch

from graded.algebra import GradedSpace


def test_a_nan_coordinate_counts_as_a_non_zero_component():
    space = GradedSpace([1, 2, 2])
    nan = math.nan
    x = torch.tensor([[nan, 1.0, 0.0],   # components of grades 1 and 2: not homogeneous
                      [nan, 0.0, 0.0],   # grade 1 only
                      [0.0, nan, 3.0],   # grade 2 only
                      [1.0, 0.0, 0.0],
                      [1.0, 0.0, 2.0]])
    # by hand: the number of grades d with some coordinate of grade d not exactly 0, <= 1
    expected = [sum(any(not (abs(v) <= 0.0) for v, g in zip(row, space.grades) if g == d)
                    for d in (1.0, 2.0)) <= 1 for row in x.tolist()]
    assert expected == [False, True, True, True, False]
    assert space.is_homogeneous(x).tolist() == expected
    # atol still reads small coordinates as 0
    assert space.is_homogeneous(torch.tensor([1.0, 1e-9, 0.0]), atol=1e-6).item()
