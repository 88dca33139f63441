"""The weighted projective normalisation's derivatives, and subspace tests that must not depend
on the lengths of the spanning rows (000 §2, Lemma 2.4)."""

import math

import pytest
import torch

from graded.algebra import GradedSpace, is_invariant_subspace, spanned_by_homogeneous

F64 = torch.float64
P2_4_6_10 = GradedSpace([2, 4, 6, 10])


def _naive_norm(x: list[float], grades: list[int], w: float) -> float:
    return sum(abs(v) ** (w / q) for v, q in zip(x, grades)) ** (1.0 / w)


def test_normalize_has_slope_n_to_the_minus_q_in_a_zero_coordinate():
    # y = (1/N)⋆x, so y_0 = x_0·N^{-q_0}; at x_0 = 0, ∂N/∂x_0 = 0 (w/q_0 = 10 > 1), and the
    # slope ∂y_0/∂x_0 is N^{-q_0}: it was 0 (a zero column in the Jacobian)
    values = [0.0, 0.7, -1.3, 0.4]
    x = torch.tensor(values, dtype=F64)
    n = _naive_norm(values, [2, 4, 6, 10], 20.0)
    jac = torch.autograd.functional.jacobian(P2_4_6_10.normalize, x)
    assert math.isclose(float(jac[0, 0]), n ** -2, rel_tol=1e-12)
    assert torch.equal(jac[1:, 0], torch.zeros(3, dtype=F64))  # y_j for j > 0: N is flat in x_0
    # every column against central differences, an independent computation
    eps = 1e-6
    for i in range(4):
        e = torch.zeros(4, dtype=F64)
        e[i] = eps
        fd = (P2_4_6_10.normalize(x + e) - P2_4_6_10.normalize(x - e)) / (2 * eps)
        assert torch.allclose(jac[:, i], fd, rtol=1e-6, atol=1e-8), i
    # the value is unchanged: a zero coordinate, −0 included, is +0
    y = P2_4_6_10.normalize(torch.tensor([-0.0, 0.7, -1.3, 0.4], dtype=F64))
    assert not bool(torch.signbit(y[0]))
    expected = [v * n ** -q for v, q in zip(values, [2, 4, 6, 10])]
    assert torch.allclose(y, torch.tensor(expected, dtype=F64), rtol=1e-13, atol=0)


def test_normalize_of_a_tiny_point_has_finite_gradients():
    # N = (1e-200)^{1/4} = 1e-50: N^{-q_i} of the zero coordinates is 1e100, 1e300 and beyond
    # float64 (capped at its largest value); the unused exp(−q_i ln N) = ∞ made every entry of
    # the gradient NaN
    x = torch.tensor([0.0, 1e-200, 0.0, 0.0], dtype=F64, requires_grad=True)
    y = P2_4_6_10.normalize(x)
    assert torch.equal(y.detach(), torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=F64))
    y.sum().backward()
    assert bool(torch.isfinite(x.grad).all()), x.grad
    assert x.grad[1] == 0  # y = (0, 1, 0, 0) all along the positive x_1 axis
    assert math.isclose(float(x.grad[0]), 1e100, rel_tol=1e-12)
    assert math.isclose(float(x.grad[2]), 1e300, rel_tol=1e-12)


@pytest.mark.parametrize("length", [1.0, 1e-10, 1e-200, 1e10, 1e200])
def test_invariance_of_a_span_does_not_depend_on_the_lengths_of_its_rows(length):
    # span{e_0, c·(e_1 + e_2)} on grades (1, 2, 3) is the same subspace for every c ≠ 0 and is
    # not invariant: e_1 + e_2 mixes grades 2 and 3 (its projection e_1 is not in the span)
    space = GradedSpace([1, 2, 3])
    mixed = torch.tensor([[1.0, 0.0, 0.0], [0.0, length, length]], dtype=F64)
    assert is_invariant_subspace(space, mixed) is False
    assert spanned_by_homogeneous(space, mixed) is False
    homogeneous = torch.tensor([[1.0, 0.0, 0.0], [0.0, length, 0.0]], dtype=F64)
    assert is_invariant_subspace(space, homogeneous) is True
    assert spanned_by_homogeneous(space, homogeneous) is True
