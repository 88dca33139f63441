"""The weighted projective normal forms moved from ``graded.algebra.space`` to
``graded.algebra.projective``: the methods of ``GradedSpace`` give what the functions give, and
the package still gives every name it gave."""

from __future__ import annotations

from fractions import Fraction

import torch

import graded.algebra
from graded.algebra import projective, space
from graded.algebra.space import GradedSpace


def test_the_methods_are_the_projective_functions():
    s = GradedSpace([2, 4, 6, 10])
    x = torch.tensor([[0.5, -1.0, 0.0, 2.0], [3.0, 0.0, -0.25, 1.0]], dtype=torch.float64)
    y = s.act(torch.tensor([-1.7, 0.3], dtype=torch.float64), x)
    assert torch.equal(s.normalize(x), projective.normalize(s, x))
    for closure in (False, True):
        assert torch.equal(s.normal_form(x, closure=closure),
                           projective.normal_form(s, x, closure=closure))
    assert s.same_point(x, y).tolist() == [True, True]
    assert projective.same_point(s, x, y[[1, 0]]).tolist() == [False, False]
    point = [Fraction(1, 2), 3, 0, -1]
    assert s.normal_form_exact(point) == projective.normal_form_exact(s, point)


def test_a_normal_form_matches_a_worked_example():
    """P(1, 2), x = (-3, 4), w = 2·q_max = 4: N(x) = (3^4 + 4^2)^{1/4} = 97^{1/4}, so
    (1/N)⋆x = (-3·97^{-1/4}, 4·97^{-1/2}); grade 1 is odd and the first coordinate negative,
    so the normal form is (-1)⋆ of it."""
    s = GradedSpace([1, 2])
    x = torch.tensor([-3.0, 4.0], dtype=torch.float64)
    expected = torch.tensor([3 * 97**-0.25, 4 * 97**-0.5], dtype=torch.float64)
    assert torch.allclose(s.normal_form(x), expected, rtol=1e-14, atol=0)
    assert torch.allclose(projective.normal_form(s, x), expected, rtol=1e-14, atol=0)


def test_the_package_names_are_unchanged():
    assert graded.algebra.GradedSpace is space.GradedSpace
    assert set(graded.algebra.__all__) == {
        "GradedSpace", "degree_mask", "entry_degrees", "factorize", "homogeneous_degree",
        "is_homogeneous_map", "is_invariant_subspace", "spanned_by_homogeneous", "weighted_gcd"}
    assert set(space.__all__) == {"GradedSpace", "power_norm"}
    assert set(projective.__all__) <= set(dir(GradedSpace))
