"""Weighted projective tasks: the checks no other test reaches, positive λ for fractional
weights, and the same-point task's canonical / relabelled copies against graded.algebra."""

import pytest
import torch

from graded.algebra import GradedSpace
from graded.tasks import WeightedProjectiveInvariants, WeightedProjectiveSamePoint

SPACE = GradedSpace((2, 4, 6, 10))


@pytest.mark.parametrize("weights, shown", [((2,), r"\(2.0,\)"), ((2, -1), r"\(2.0, -1.0\)")])
def test_weights_must_be_at_least_two_positive_numbers(weights, shown):
    with pytest.raises(ValueError, match=rf"weights must be >= 2 positive numbers, got {shown}"):
        WeightedProjectiveInvariants(weights=weights)


def test_norm_p_must_be_positive():
    with pytest.raises(ValueError, match=r"norm_p.*0"):
        WeightedProjectiveInvariants(norm_p=0.0)


def test_fractional_weights_get_only_positive_lambdas():
    task = WeightedProjectiveInvariants(weights=(1.5, 2.0), lambda_range=(0.5, 2.0))
    lam = task.sample_lambdas(500, torch.Generator().manual_seed(0))
    assert bool((lam >= 0.5).all()) and bool((lam <= 2.0).all())  # no sign flip: λ^{1.5} real
    integer = WeightedProjectiveInvariants().sample_lambdas(500, torch.Generator().manual_seed(0))
    assert bool((integer < 0).any())  # integer weights do get negative λ


def test_same_point_pairs_carry_no_output_grades():
    assert WeightedProjectiveSamePoint().output_grades is None


def test_same_point_canonical_copies_are_normal_forms_of_each_token():
    task = WeightedProjectiveSamePoint()
    data = task.generate(50, seed=2)
    canon = task.canonicalize(data)
    assert torch.equal(canon.targets, data.targets)
    for t in range(2):
        expected = SPACE.normal_form(data.inputs[:, t].double())
        torch.testing.assert_close(canon.inputs[:, t], expected.float(), atol=1e-5, rtol=1e-5)


def test_same_point_relabelling_moves_each_token_within_its_point():
    task = WeightedProjectiveSamePoint()
    data = task.generate(50, seed=2)
    moved = task.relabel(data, seed=7)
    assert torch.equal(moved.targets, data.targets)
    assert moved.inputs.shape == data.inputs.shape
    assert not torch.allclose(moved.inputs, data.inputs)
    for t in range(2):
        same = SPACE.same_point(moved.inputs[:, t].double(), data.inputs[:, t].double(),
                                rtol=1e-4, atol=1e-6)
        assert bool(same.all())
    assert torch.equal(task.relabel(data, seed=7).inputs, moved.inputs)  # a function of the seed


def test_igusa_ratios_accept_float_weights_whose_ratios_are_integers():
    # 0.6 / 0.2 is 2.9999999999999996 in floating point; the weights are still divisible
    task = WeightedProjectiveInvariants(weights=(0.2, 0.6, 1.0), invariants="igusa")
    data = task.generate(50, seed=0)
    x = data.inputs[:, 0].to(torch.float64)
    expected = torch.stack([x[:, 1] / x[:, 0] ** 3, x[:, 2] / x[:, 0] ** 5], dim=1)
    torch.testing.assert_close(data.targets.to(torch.float64), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"divisible by the first, got \(0\.2, 0\.5\)"):
        WeightedProjectiveInvariants(weights=(0.2, 0.5), invariants="igusa")
