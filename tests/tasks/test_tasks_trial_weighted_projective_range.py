"""Weighted projective tasks keep their float32 inputs finite and nonzero: a ``lambda_range``
whose λ^w leaves the float32 range is refused by name instead of generating ∞ or 0."""

import math

import pytest
import torch

from graded.tasks import get_task

NAMES = ["weighted_projective", "weighted_projective_pair"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("lambda_range", [(1e3, 1e4), (1e-5, 1e-4), (1e-4, 1e4)])
def test_a_lambda_range_beyond_float32_is_refused_naming_it(name, lambda_range):
    # λ^10 reaches 1e40 (∞ in float32) or 1e-50 (0 in float32) for the default weights
    with pytest.raises(ValueError, match=r"lambda_range=.*weights=.*float32"):
        get_task(name, lambda_range=lambda_range)


@pytest.mark.parametrize("name", NAMES)
def test_a_relabelled_split_refuses_a_range_whose_composed_actions_overflow(name):
    # (0.01, 100): one action scales by up to 100^10 = 1e20, finite; a relabelled input is
    # (λ'λ)⋆x, up to 1e40, which float32 holds as ∞
    task = get_task(name, lambda_range=(0.01, 100.0))
    train, test = task.split("random", 100, 100, seed=0)
    assert bool(torch.isfinite(train.inputs).all() and torch.isfinite(test.inputs).all())
    with pytest.raises(ValueError, match=r"relabelled coordinates .* lambda_range"):
        task.split("relabelled", 100, 100, seed=0)


@pytest.mark.parametrize("name", NAMES)
def test_every_input_is_finite_and_nonzero_at_a_wide_accepted_range(name):
    task = get_task(name, lambda_range=(0.1, 10.0))
    for data in (task.generate(300, seed=1), *task.split("relabelled", 200, 200, seed=2)):
        x = data.inputs.double()
        assert bool(torch.isfinite(x).all())
        assert bool((x != 0).all())
    # the scales a relabelled input reaches, by hand: |λ'λ|^10 within 10^±20
    lo, hi = task.lambda_range
    assert 2 * max(task.weights) * max(abs(math.log10(lo)), abs(math.log10(hi))) == 20.0
