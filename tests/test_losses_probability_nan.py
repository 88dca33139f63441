"""graded_cross_entropy on probabilities: a NaN probability gives a NaN loss, not ∞."""

import math

import pytest
import torch
import torch.nn.functional as F

from graded.losses import graded_cross_entropy

NAN = math.nan


def test_a_nan_probability_of_the_target_class_gives_nan_as_torch_does():
    # read as p = 0 it gave -log 0 = ∞: a diverged model's loss looked like a confident miss
    probs = torch.tensor([[NAN, 0.5, 0.5], [0.2, 0.3, 0.5]])
    grades = torch.tensor([1.0, 2.0, 3.0])
    target = torch.tensor([0, 2])
    reference = F.nll_loss(probs.log(), target)  # the unweighted loss: NaN
    assert math.isnan(reference)
    loss = graded_cross_entropy(probs, target, grades, from_logits=False, reduction="none")
    assert math.isnan(loss[0])
    assert float(loss[1]) == pytest.approx(-3.0 * math.log(0.5))
    soft = torch.tensor([[0.7, 0.3, 0.0], [0.0, 0.0, 1.0]])
    per = graded_cross_entropy(probs, soft, grades, from_logits=False, reduction="none")
    assert math.isnan(per[0]) and float(per[1]) == pytest.approx(-3.0 * math.log(0.5))


def test_a_nan_probability_where_the_term_is_zero_leaves_the_loss_by_hand():
    # a term with y_i = 0 or q_i = 0 is 0 (the documented 0·log 0 = 0), NaN ŷ_i or not
    probs = torch.tensor([[NAN, 0.25, 0.75]])
    grades = torch.tensor([1.0, 2.0, 4.0])
    by_hand = -(2.0 * 0.5 * math.log(0.25) + 4.0 * 0.5 * math.log(0.75))
    soft = torch.tensor([[0.0, 0.5, 0.5]])
    assert float(graded_cross_entropy(probs, soft, grades, from_logits=False)) == \
        pytest.approx(by_hand)
    zero_first = torch.tensor([0.0, 2.0, 4.0])
    assert float(graded_cross_entropy(probs, torch.tensor([0]), zero_first,
                                      from_logits=False)) == 0.0
    # a zero probability is still -log 0 = ∞ where its term counts
    assert graded_cross_entropy(torch.tensor([[0.0, 1.0]]), torch.tensor([0]),
                                torch.ones(2), from_logits=False) == math.inf
