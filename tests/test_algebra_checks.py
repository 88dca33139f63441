"""GradedSpace and graded maps: the checks no other test reaches, and the w = ∞ norm, tensor
grades and empty subspaces against hand computations (000 §2)."""

from fractions import Fraction

import pytest
import torch

from graded.algebra.maps import (
    entry_degrees,
    homogeneous_degree,
    is_invariant_subspace,
    spanned_by_homogeneous,
)
from graded.algebra.space import GradedSpace

# -- GradedSpace -------------------------------------------------------------------------------


def test_tensor_grades_equal_list_grades():
    space = GradedSpace(torch.tensor([1.0, 2.0, 3.0]))
    assert space == GradedSpace([1, 2, 3]) and hash(space) == hash(GradedSpace([1, 2, 3]))
    assert space != GradedSpace([1, 2]) and space != (1.0, 2.0, 3.0)
    assert repr(space) == "GradedSpace(grades=(1.0, 2.0, 3.0))"


def test_grades_must_be_a_one_dimensional_sequence():
    with pytest.raises(ValueError, match=r"grades must be one-dimensional, got shape \(2, 2\)"):
        GradedSpace(torch.ones(2, 2))
    with pytest.raises(TypeError, match=r"grades must be a sequence of numbers, got '12'"):
        GradedSpace("12")
    with pytest.raises(TypeError, match=r"grades must be a sequence of numbers, got 3"):
        GradedSpace(3)


def test_act_checks_its_inputs():
    space = GradedSpace([1, 2])
    with pytest.raises(TypeError, match=r"x must be a tensor, got list"):
        space.act(2.0, [1.0, 2.0])
    with pytest.raises(ValueError, match=r"λ has shape \(3,\); .* x.shape\[:-1\] = \(2,\)"):
        space.act(torch.ones(3), torch.ones(2, 2))  # (3,) and (2,) do not broadcast
    with pytest.raises(ValueError, match=r"the action needs a finite λ, got λ=inf"):
        space.act(float("inf"), torch.ones(2))


def test_include_checks_the_component_size():
    space = GradedSpace([1, 2, 2])
    with pytest.raises(ValueError, match=r"grade 2 has 2 coordinates, got input shape \(3,\)"):
        space.include(torch.ones(3), 2)


@pytest.mark.parametrize("w", [0.0, -1.0])
def test_norm_exponent_must_be_positive(w):
    with pytest.raises(ValueError, match=rf"exponent w > 0, got w={w!r}"):
        GradedSpace([1, 2]).homogeneous_norm(torch.ones(2), w)


def test_normalize_with_infinite_exponent_has_max_norm_one():
    space = GradedSpace([1, 2, 3])
    x = torch.tensor([[0.5, -8.0, 27.0], [0.0, 4.0, -1.0]], dtype=torch.float64)
    y = space.normalize(x, float("inf"))
    # N_∞(x) = max |x_i|^{1/q_i}: 3 and 2; y = (1/N)⋆x
    n = torch.tensor([3.0, 2.0], dtype=torch.float64)
    expected = x / n.unsqueeze(-1) ** torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    torch.testing.assert_close(y, expected)
    torch.testing.assert_close(space.homogeneous_norm(y, float("inf")),
                               torch.ones(2, dtype=torch.float64))


def test_closure_normal_form_needs_integer_grades():
    space = GradedSpace([1, 1.5])
    with pytest.raises(ValueError, match=r"normal_form\(closure=True\) needs integer grades, got "
                                         r"grade 1.5 at index 1"):
        space.normal_form(torch.ones(2), closure=True)


def test_normal_form_exact_checks_its_input():
    space = GradedSpace([1, 2])
    with pytest.raises(ValueError, match=r"x has 3 coordinates, expected 2"):
        space.normal_form_exact([1, 2, 3])
    with pytest.raises(TypeError, match=r"coordinate 0.5 at index 1 is not an int or Fraction"):
        space.normal_form_exact([1, 0.5])
    with pytest.raises(TypeError, match=r"coordinate True at index 0 is not an int or Fraction"):
        space.normal_form_exact([True, 1])
    with pytest.raises(ValueError, match=r"the zero vector is not a point"):
        space.normal_form_exact([0, Fraction(0)])


# -- maps --------------------------------------------------------------------------------------


def test_maps_check_their_matrix():
    s = GradedSpace([0, 1])
    with pytest.raises(TypeError, match=r"matrix must be a tensor, got list"):
        entry_degrees([[1.0, 0.0], [0.0, 1.0]], s, s)
    with pytest.raises(ValueError, match=r"entry_degrees takes one \(m, n\) matrix, got shape "
                                         r"\(3, 2, 2\)"):
        entry_degrees(torch.ones(3, 2, 2), s, s)


def test_the_zero_map_reports_degree_zero():
    s, t = GradedSpace([0, 1]), GradedSpace([5, 7, 9])
    assert entry_degrees(torch.zeros(3, 2), s, t) == ()
    assert homogeneous_degree(torch.zeros(3, 2), s, t) == 0.0


def test_the_zero_subspace_is_invariant_and_homogeneously_spanned():
    space = GradedSpace([0, 1, 1])
    empty = torch.zeros(0, 3)
    assert is_invariant_subspace(space, empty)
    assert spanned_by_homogeneous(space, empty)


@pytest.mark.parametrize("vectors, shown", [(torch.ones(3), r"\(3,\)"),
                                            (torch.ones(2, 4), r"\(2, 4\)"),
                                            ([[1.0, 0.0, 0.0]], "list")])
def test_subspace_rows_must_be_k_by_n(vectors, shown):
    with pytest.raises(ValueError,
                       match=rf"vectors must be a \(k, 3\) tensor of rows, got {shown}"):
        is_invariant_subspace(GradedSpace([0, 1, 1]), vectors)


def test_maps_refuse_a_bool_matrix_and_a_non_finite_degree():
    # a bool matrix raised NotImplementedError '"abs_cpu" not implemented for Bool'; a NaN
    # degree answered False for every non-zero map
    from graded.algebra.maps import degree_mask, is_homogeneous_map

    q, r = GradedSpace([0, 1]), GradedSpace([1, 2])
    with pytest.raises(TypeError, match=r"matrix must be a real tensor \(floating or integer\), "
                                        r"got torch.bool"):
        is_homogeneous_map(torch.eye(2, dtype=torch.bool), q, r, 1)
    for bad in (float("nan"), float("inf"), "1", None):
        with pytest.raises(ValueError, match=r"degree must be a finite real number, got "):
            is_homogeneous_map(torch.eye(2), q, r, bad)
    assert bool(is_homogeneous_map(torch.eye(2), q, r, Fraction(1)))
    assert degree_mask(q, r, torch.tensor(1.0)).tolist() == [[True, False], [False, True]]


def test_subspace_checks_refuse_non_finite_vectors_naming_the_entry():
    # the SVD raised torch's LinAlgError "The algorithm failed to converge"
    space = GradedSpace([1, 1, 2])
    bad = torch.tensor([[1.0, 0.0, 2.0], [0.0, float("nan"), 1.0]])
    for check in (is_invariant_subspace, spanned_by_homogeneous):
        with pytest.raises(ValueError, match=r"vectors must be finite, got nan at index \(1, 1\)"):
            check(space, bad)
