"""The multiplicative graded neuron (000 §3) where the product of the other factors leaves the
dtype's range: a zero factor still makes the output 0, with finite gradients."""

import math

import pytest
import torch

from graded.nn import MultiplicativeGradedLinear


def _unit_weights(grades, dtype):
    layer = MultiplicativeGradedLinear(len(grades), 1, grades, bias=False, dtype=dtype)
    with torch.no_grad():
        layer.weight.fill_(1.0)
    return layer


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_a_zero_factor_gives_zero_where_the_other_factors_overflow(dtype):
    # Π (w_i x_i)^{q_i} with x = (0, 300, 300), grades 1: the product is 0·300·300 = 0; in
    # float16 the other factors' 90000 is beyond the range, and the output was NaN (∞·0)
    big = 3e38 if dtype != torch.float16 else 6e4
    layer = _unit_weights([1.0, 1.0, 3.0], dtype)
    x = torch.tensor([[0.0, 300.0, 300.0], [0.0, 0.0, big]], dtype=dtype, requires_grad=True)
    out = layer(x)
    assert out.tolist() == [[0.0], [0.0]]
    out.sum().backward()
    # the slope in x_0 at x_0 = 0 is the product of the others, 300·300^3 = 8.1e9; float16
    # cannot hold it and saturates near its largest value
    top = torch.finfo(dtype).max
    expected_slope = min(300.0 * 300.0**3, top)
    assert math.isclose(float(x.grad[0, 0]), expected_slope, rel_tol=1e-2)
    # two zero factors: the product is 0 near x, its slope 0 everywhere (it was NaN)
    assert x.grad[1].tolist() == [0.0, 0.0, 0.0]
    assert x.grad[0, 1:].tolist() == [0.0, 0.0]


def test_the_grade_gradient_at_a_zero_factor_stays_finite_when_the_others_overflow():
    layer = MultiplicativeGradedLinear(3, 1, [1.0, 2.0, 2.0], bias=False,
                                       learnable_grades=True)
    with torch.no_grad():
        layer.weight.fill_(1.0)
    x = torch.tensor([[0.0, 0.0, 1e20]])  # 1e20^2 is beyond float32
    out = layer(x)
    out.sum().backward()
    assert out.item() == 0.0
    assert layer.grades.grad.tolist() == [0.0, 0.0, 0.0]


def test_a_zero_factor_next_to_an_infinite_one_is_still_nan():
    # 0·∞ has no value: only a finite product beyond the range is read as "0 times it"
    layer = _unit_weights([1.0, 1.0, 1.0], torch.float32)
    out = layer(torch.tensor([[0.0, float("inf"), 1.0], [0.0, 1e30, 1e30]]))
    assert math.isnan(out[0, 0].item()) and out[1, 0].item() == 0.0
