"""Metrics: the shape checks no other test reaches, each naming the shapes."""

import pytest
import torch

from graded.evaluation.metrics import accuracy, exact_match, r2


def test_predictions_of_another_shape_are_named():
    with pytest.raises(ValueError, match=r"predictions of shape \(4, 2\) do not match targets "
                                         r"of shape \(3,\)"):
        accuracy(torch.zeros(4, 2), torch.zeros(3, dtype=torch.long))


def test_a_mask_of_another_shape_is_named():
    with pytest.raises(ValueError, match=r"mask of shape \(2,\) does not match targets of shape "
                                         r"\(3,\)"):
        accuracy(torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long),
                 torch.ones(2, dtype=torch.bool))


def test_exact_match_needs_rows_and_a_kept_target():
    with pytest.raises(ValueError, match=r"exact_match needs \(N, T\) targets, got shape \(3,\)"):
        exact_match(torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long))
    t = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"exact_match over an empty set: no row has a kept "
                                         r"target"):
        exact_match(t, t, torch.zeros(2, 3, dtype=torch.bool))


def test_r2_needs_two_examples():
    with pytest.raises(ValueError, match=r"R² needs at least 2 examples, got 1"):
        r2(torch.zeros(1, 2), torch.ones(1, 2))
