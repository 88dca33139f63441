"""A routing logit of +∞ (a utility logit ℓ̃ = ℓ + β(ΔL − τ) that overflows float16, whose
largest value is 65504) is the limit of a large logit: its group's mass goes to it (shared
equally among the group's +∞ options), under every mode. The softmax of [+∞, …] is NaN
(∞ − ∞), which the kernel read as "no option": the edge with the highest utility got
probability 0 and hard routing stayed."""

from __future__ import annotations

import math

import pytest
import torch

from graded.morphic import EdgeSet, GradedStateSpace, Router, utility_augmented_logits

INF = float("inf")


def _router(normalization: str, mode: str = "soft") -> Router:
    space = GradedStateSpace({"a": 3, "b": 2})
    edges = EdgeSet(space, [("a", "b", "t1"), ("b", "b", "t2"), ("b", "a", "back")])
    return Router(space, edges, normalization=normalization, mode=mode)


@pytest.mark.parametrize("normalization", ["dest", "global"])
def test_an_infinite_logit_takes_its_groups_mass_as_a_large_one_does(normalization):
    ell = torch.tensor([[INF, 0.0, 1.0]])
    big = torch.tensor([[1e4, 0.0, 1.0]], dtype=torch.float64)  # the limit, in float64
    router = _router(normalization)
    want = router.double().probabilities(big).float()
    torch.testing.assert_close(router.float().probabilities(ell), want, rtol=0, atol=1e-6)
    torch.testing.assert_close(router.route(ell).weights, want, rtol=0, atol=1e-6)
    assert router.entropy(ell).tolist() == pytest.approx(router.entropy(big).tolist(), abs=1e-6)
    for mode in ("hard", "gumbel"):
        hard = _router(normalization, mode).route(ell, stochastic=True).weights
        assert hard[0, 0] == 1.0 and hard[0, 1] == 0.0


def test_infinite_logits_of_one_group_share_its_mass_equally():
    got = _router("global").probabilities(torch.tensor([[INF, INF, 2.0]]))
    assert got.tolist() == [[0.5, 0.5, 0.0]]


def test_gate_entropy_and_kl_at_infinite_logits_are_their_limits():
    """σ(±∞) ∈ {0, 1}: an open or shut gate adds no entropy, and its KL term is the limit
    −log σ(x_student) (0 · log 0 = 0), where both gave NaN."""
    router = _router("logistic")
    ell = torch.tensor([[INF, -INF, 1.0]])
    p = 1 / (1 + math.exp(-1.0))
    h = -(p * math.log(p) + (1 - p) * math.log(1 - p))
    assert router.entropy(ell).item() == pytest.approx(h, rel=1e-6)
    kl_half = p * math.log(2 * p) + (1 - p) * math.log(2 * (1 - p))
    assert router.kl(ell, torch.zeros(1, 3)).item() == pytest.approx(
        2 * math.log(2) + kl_half, rel=1e-6)


def test_a_float16_utility_logit_that_overflows_routes_to_the_best_tool():
    """β = 1e4 and ΔL = 10 for t1: ℓ̃ = 1e5 is +∞ in float16. t1, the most useful edge into b,
    gets b's whole mass (it got 0, and hard routing kept the state)."""
    util = torch.tensor([[10.0, 0.5, 0.2]], dtype=torch.float16)
    tilde = utility_augmented_logits(torch.zeros(1, 3, dtype=torch.float16), util, 1e4,
                                     torch.zeros(3, dtype=torch.float16))
    assert math.isinf(float(tilde[0, 0]))
    soft = _router("dest").route(tilde.float()).weights
    hard = _router("dest", "hard").route(tilde.float()).weights
    assert soft[0, 0].item() == 1.0 and soft[0, 1].item() == 0.0
    assert hard[0].tolist() == [1.0, 0.0, 1.0]
