"""Morphic objective and norm: the option checks no other test reaches, and the utility penalty
against ψ(u) = log(1 + e^{βu}) summed over edges and averaged over valid tokens."""

import math

import pytest
import torch

from graded.morphic import GradedStateSpace, GradewiseNorm
from graded.morphic.objective import routing_regularizer, utility_penalty


def test_norm_kind_is_checked():
    with pytest.raises(ValueError, match=r"kind must be 'layer' or 'rms', got 'batch'"):
        GradewiseNorm(GradedStateSpace({"a": 2}), kind="batch")


def test_utility_penalty_needs_positive_beta_and_is_the_softplus_mean():
    u = torch.tensor([[[0.5, -1.0], [2.0, 0.0]]])  # (B=1, T=2, E=2)
    tau = torch.tensor([0.1, 0.3])
    valid = torch.tensor([[True, False]])
    with pytest.raises(ValueError, match=r"beta must be > 0, got 0"):
        utility_penalty(u, tau, 0, valid)
    beta = 2.0
    expected = sum(math.log1p(math.exp(beta * (t - x))) for x, t in zip([0.5, -1.0], [0.1, 0.3]))
    assert float(utility_penalty(u, tau, beta, valid)) == pytest.approx(expected)


def test_an_unknown_regularizer_is_named():
    z = torch.zeros(1, 2)
    with pytest.raises(ValueError, match=r"omega must be one of .*, got 'l1'"):
        routing_regularizer("l1", entropy=z, alpha=torch.zeros(1, 2, 3), valid=z.bool())
