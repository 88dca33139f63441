import itertools
import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graded.algebra import (
    GradedSpace,
    degree_mask,
    entry_degrees,
    factorize,
    homogeneous_degree,
    is_homogeneous_map,
    is_invariant_subspace,
    spanned_by_homogeneous,
    weighted_gcd,
)

F64 = torch.float64
SETTINGS = settings(max_examples=30, deadline=None, derandomize=True)

int_grades = st.lists(st.integers(1, 5), min_size=1, max_size=5)
pos_grades = st.lists(st.floats(0.25, 4.0), min_size=1, max_size=5)
nonzero_lam = st.one_of(st.floats(-5.0, -0.2), st.floats(0.2, 5.0))


def vectors(n, lo=-3.0, hi=3.0):
    return st.lists(st.floats(lo, hi), min_size=n, max_size=n)


# -- construction and the action --------------------------------------------------------------
def test_bad_grades_raise_errors_naming_the_value():
    with pytest.raises(ValueError, match="nan at index 1"):
        GradedSpace([1.0, float("nan")])
    with pytest.raises(TypeError, match="'a' at index 0"):
        GradedSpace(["a"])
    with pytest.raises(ValueError, match="empty"):
        GradedSpace([])
    space = GradedSpace([1.0, 2.0])
    with pytest.raises(ValueError, match="last dimension must equal the number of grades, 2"):
        space.act(2.0, torch.ones(3))
    with pytest.raises(ValueError, match="λ ≠ 0"):
        space.act(0.0, torch.ones(2))
    with pytest.raises(ValueError, match=r"fractional grade 0\.5"):
        GradedSpace([1, 0.5]).act(-2.0, torch.ones(2))
    with pytest.raises(ValueError, match="grade 0 at index 0"):
        GradedSpace([0, 1]).homogeneous_norm(torch.ones(2))
    with pytest.raises(ValueError, match=r"grades q >= 0, got -1\.0"):
        GradedSpace([1.0, -1.0]).graded_norm(torch.ones(2))


def test_action_equals_coordinatewise_powers_including_negative_lambda():
    space = GradedSpace([0, 1, 2, 3])
    x = torch.tensor([1.5, -2.0, 0.5, 4.0], dtype=F64)
    for lam in (2.0, -1.5, 0.3):
        expected = torch.tensor([lam**q * v for q, v in zip([0, 1, 2, 3], x.tolist())], dtype=F64)
        torch.testing.assert_close(space.act(lam, x), expected)
    frac = GradedSpace([0.5, 1.25])
    torch.testing.assert_close(frac.act(4.0, torch.tensor([1.0, 1.0], dtype=F64)),
                               torch.tensor([2.0, 4.0**1.25], dtype=F64))


def test_action_broadcasts_one_lambda_per_vector():
    space = GradedSpace([1, 2])
    x = torch.ones(3, 2, dtype=F64)
    lam = torch.tensor([1.0, 2.0, -3.0], dtype=F64)
    torch.testing.assert_close(space.act(lam, x),
                               torch.tensor([[1.0, 1.0], [2.0, 4.0], [-3.0, 9.0]], dtype=F64))


def test_action_refuses_a_lambda_shape_that_would_enlarge_the_batch():
    space = GradedSpace([1, 2])
    x = torch.tensor([[1.0, 1.0], [1.0, -1.0], [2.0, 0.5]], dtype=F64)
    # a column of λs would broadcast against the batch into a (3, 3, 2) result
    with pytest.raises(ValueError, match=r"λ has shape \(3, 1\).*x.shape\[:-1\] = \(3,\)"):
        space.act(torch.tensor([[2.0], [3.0], [4.0]], dtype=F64), x)
    with pytest.raises(TypeError, match=r"floating-point x.*torch\.int64"):
        space.act(0.5, torch.tensor([1, 2]))
    # one λ per vector of a (2, 3, 2) batch, against a loop over the vectors
    xs = torch.randn(2, 3, 2, dtype=F64)
    lams = torch.tensor([[0.5, 2.0, -1.5], [3.0, -0.25, 1.0]], dtype=F64)
    expected = torch.tensor([[[lams[i, j].item() ** q * xs[i, j, k].item()
                               for k, q in enumerate((1, 2))] for j in range(3)]
                             for i in range(2)], dtype=F64)
    torch.testing.assert_close(space.act(lams, xs), expected)
    torch.testing.assert_close(space.act(torch.tensor([2.0], dtype=F64), x), space.act(2.0, x))


def test_action_keeps_zero_coordinates_zero_where_lambda_power_overflows():
    # 100^40 is inf in float32 and inf·0 was NaN: homogeneous vectors of grade 1 became NaN.
    # The float64 action (100^40 = 1e80 is finite there) is the reference.
    space = GradedSpace([1, 40])
    x = torch.tensor([[3.0, 0.0], [1.0, 0.0]])
    lam = torch.tensor([100.0, -100.0], requires_grad=True)
    got = space.act(lam, x)
    torch.testing.assert_close(got, space.act(lam.detach().double(), x.double()).float())
    got.sum().backward()  # d/dλ of (λ x_0, λ^40·0) is x_0
    torch.testing.assert_close(lam.grad, x[:, 0])
    # a non-zero coordinate whose true value is out of range is inf, as before
    assert space.act(100.0, torch.tensor([0.0, 1.0])).tolist() == [0.0, math.inf]


@SETTINGS
@given(grades=st.lists(st.floats(0.1, 3.0), min_size=1, max_size=4),
       lam=st.floats(0.2, 5.0), mu=st.floats(0.2, 5.0))
def test_action_is_a_group_action_for_fractional_grades_and_positive_lambda(grades, lam, mu):
    space = GradedSpace(grades)
    x = torch.linspace(-1, 2, len(grades), dtype=F64)
    torch.testing.assert_close(space.act(lam, space.act(mu, x)), space.act(lam * mu, x))
    expected = torch.tensor([(lam * mu) ** q * v for q, v in zip(grades, x.tolist())],
                            dtype=F64)
    torch.testing.assert_close(space.act(lam * mu, x), expected)


@SETTINGS
@given(grades=int_grades, lam=nonzero_lam, mu=nonzero_lam)
def test_action_is_a_group_action(grades, lam, mu):
    space = GradedSpace(grades)
    x = torch.linspace(-1, 2, len(grades), dtype=F64)
    torch.testing.assert_close(space.act(lam, space.act(mu, x)), space.act(lam * mu, x))


# -- homogeneous components --------------------------------------------------------------------
def test_components_projections_and_inclusions():
    space = GradedSpace([2, 1, 2, 3])
    assert space.distinct_grades == (1.0, 2.0, 3.0)
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    comps = space.components(x)
    assert list(comps) == [1.0, 2.0, 3.0]
    torch.testing.assert_close(comps[2.0], torch.tensor([[1.0, 3.0]]))
    torch.testing.assert_close(space.include(comps[2.0], 2), torch.tensor([[1.0, 0, 3.0, 0]]))
    total = sum(space.homogeneous_part(x, d) for d in space.distinct_grades)
    torch.testing.assert_close(total, x)
    assert space.is_homogeneous(torch.tensor([[1.0, 0, 5.0, 0], [1.0, 1, 0, 0]])).tolist() == [
        True, False]
    with pytest.raises(ValueError, match="grade 7"):
        space.project(x, 7)


# -- norms -------------------------------------------------------------------------------------
def test_graded_norm_equals_naive_sum():
    space = GradedSpace([0.5, 1.0, 2.0])
    x = torch.tensor([3.0, -1.0, 2.0], dtype=F64)
    assert math.isclose(float(space.graded_norm(x)), math.sqrt(0.5 * 9 + 1 + 2 * 4))


def test_homogeneous_norm_equals_naive_formula():
    space = GradedSpace([1.0, 2.0, 3.0])
    x = torch.tensor([0.5, -4.0, 8.0], dtype=F64)
    for w in (1.0, 6.0, 2.5):
        naive = sum(abs(v) ** (w / q) for v, q in zip(x.tolist(), [1, 2, 3])) ** (1 / w)
        assert math.isclose(float(space.homogeneous_norm(x, w)), naive, rel_tol=1e-12)
    assert math.isclose(float(space.homogeneous_norm(x, math.inf)), max(0.5, 2.0, 2.0))


@SETTINGS
@given(grades=pos_grades, lam=st.floats(0.05, 20.0), data=st.data())
def test_homogeneous_norm_is_homogeneous_of_degree_one(grades, lam, data):
    space = GradedSpace(grades)
    x = torch.tensor(data.draw(vectors(len(grades))), dtype=F64)
    lhs = space.homogeneous_norm(space.act(lam, x))
    torch.testing.assert_close(lhs, lam * space.homogeneous_norm(x), rtol=1e-9, atol=1e-12)


@SETTINGS
@given(grades=int_grades, lam=nonzero_lam, data=st.data())
def test_homogeneous_norm_scales_by_abs_lambda_for_negative_lambda(grades, lam, data):
    space = GradedSpace(grades)
    x = torch.tensor(data.draw(vectors(len(grades))), dtype=F64)
    torch.testing.assert_close(space.homogeneous_norm(space.act(lam, x)),
                               abs(lam) * space.homogeneous_norm(x), rtol=1e-9, atol=1e-12)


@SETTINGS
@given(grades=pos_grades, data=st.data())
def test_normalize_in_float32_equals_the_float64_action_and_has_unit_norm(grades, data):
    # coordinates from 1e-30 to 1e30 (or 0): the factor N^{-q_i} of (1/N)⋆x overflowed float32
    # for a small N and turned zero coordinates into NaN (0·∞)
    n = len(grades)
    mant = data.draw(st.lists(st.floats(-9.0, 9.0), min_size=n, max_size=n))
    exps = data.draw(st.lists(st.integers(-30, 30), min_size=n, max_size=n))
    zero = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    vals = [0.0 if z else m * 10.0**e for m, e, z in zip(mant, exps, zero)]
    if all(v == 0.0 for v in vals) or any(v != 0 and abs(v) < 1e-30 for v in vals):
        vals[0] = 1e-30  # a non-zero vector, every coordinate a normal float32
    space = GradedSpace(grades)
    x64 = torch.tensor(vals, dtype=F64)
    n64 = float(space.homogeneous_norm(x64))
    expected = torch.tensor([v / n64**q for v, q in zip(vals, grades)], dtype=F64)
    got = space.normalize(x64.float())
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(space.homogeneous_norm(got.double()),
                               torch.tensor(1.0, dtype=F64), rtol=1e-4, atol=0)


def test_normalize_of_a_tiny_vector_with_zero_coordinates_is_finite():
    space = GradedSpace([1, 2, 3.5])
    x = torch.tensor([[1e-30, 0.0, 0.0], [0.0, 0.0, -1e-35]], dtype=torch.float32)
    expected = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, -1.0]], dtype=torch.float32)
    torch.testing.assert_close(space.normalize(x), expected)
    y = x.double().requires_grad_(True)
    space.normalize(y).sum().backward()
    assert torch.isfinite(y.grad).all()


def test_norms_and_normal_forms_refuse_an_integer_x_instead_of_truncating_the_grades():
    # the grades took x's dtype: (0.5, 1.5) became (0, 1), so ‖(2, 2)‖_q was 2 instead of
    # sqrt(0.5·4 + 1.5·4), N was NaN (1/0 exponent) and normalize failed inside torch
    space = GradedSpace([0.5, 1.5])
    x = torch.tensor([2, 2])
    assert math.isclose(float(space.graded_norm(x.double())), math.sqrt(0.5 * 4 + 1.5 * 4))
    for method in (space.graded_norm, space.homogeneous_norm, space.normalize,
                   space.normal_form):
        with pytest.raises(TypeError, match=r"floating-point x, got torch\.int64"):
            method(x)


def test_homogeneous_norm_is_inf_not_nan_when_a_coordinate_power_overflows():
    # a_0 = 2^{1/0.001} = 2^1000 overflows float32 (m = ∞ gave ∞/∞ = NaN); N ≥ a_0 there, and
    # in float64 N = 2^1000 exactly (the other term is 1/2^2000 of it)
    space = GradedSpace([0.001, 1.0])
    x = torch.tensor([2.0, 1.0], dtype=F64)
    assert math.isclose(float(space.homogeneous_norm(x)), 2.0**1000, rel_tol=1e-12)
    assert float(space.homogeneous_norm(x.float())) == math.inf
    inf = torch.tensor([[math.inf, 1.0], [-math.inf, 0.0]])
    assert torch.equal(GradedSpace([1, 2]).homogeneous_norm(inf), torch.full((2,), math.inf))


def test_a_nan_coordinate_makes_the_norms_nan_not_zero():
    # NaN > 0 is False, so a NaN vector was taken for the origin: both norms returned 0 and a
    # NaN that reached them went unnoticed; the reference is the plain formula, NaN too
    space = GradedSpace([1.0, 2.0, 3.0])
    x = torch.tensor([[1.0, math.nan, 2.0], [0.0, 0.0, 0.0]], dtype=F64)
    plain = (torch.tensor([1.0, 2.0, 3.0], dtype=F64) * x * x).sum(-1).sqrt()
    torch.testing.assert_close(space.graded_norm(x), plain, equal_nan=True)
    for w in (2.0, 6.0, math.inf):  # w = ∞ (a max) propagated the NaN already
        got = space.homogeneous_norm(x, w)
        assert math.isnan(float(got[0])), w
        assert float(got[1]) == 0.0


def test_homogeneous_norm_gradient_is_finite_with_zero_coordinates():
    space = GradedSpace([1.0, 2.0, 3.0])
    x = torch.tensor([0.0, 1.5, 0.0], dtype=F64, requires_grad=True)
    space.homogeneous_norm(x).backward()
    assert torch.isfinite(x.grad).all()
    y = torch.tensor([0.3, -1.5, 0.7], dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: space.homogeneous_norm(v, 5.0), (y,))


# -- weighted projective normal forms --------------------------------------------------------
@SETTINGS
@given(grades=int_grades, lam=nonzero_lam, data=st.data())
def test_normal_forms_agree_on_an_orbit(grades, lam, data):
    space = GradedSpace(grades)
    x = torch.tensor(data.draw(vectors(len(grades))), dtype=F64)
    if not bool((x != 0).any()):
        x[0] = 1.0
    nf = space.normal_form(x)
    torch.testing.assert_close(space.normal_form(space.act(lam, x)), nf, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(space.homogeneous_norm(nf), torch.tensor(1.0, dtype=F64))


@SETTINGS
@given(grades=pos_grades, lam=st.floats(0.05, 20.0), data=st.data())
def test_normal_forms_agree_on_a_positive_orbit_for_fractional_grades(grades, lam, data):
    # fractional grades: the orbit is under λ > 0 only, and the normal form is the point of
    # unit homogeneous norm
    space = GradedSpace(grades)
    x = torch.tensor(data.draw(vectors(len(grades))), dtype=F64)
    if not bool((x != 0).any()):
        x[0] = 1.0
    nf = space.normal_form(x)
    torch.testing.assert_close(space.normal_form(space.act(lam, x)), nf, rtol=1e-9, atol=1e-12)
    n = float(space.homogeneous_norm(x))
    expected = torch.tensor([v / n**q for v, q in zip(x.tolist(), grades)], dtype=F64)
    torch.testing.assert_close(nf, expected, rtol=1e-9, atol=1e-12)


@SETTINGS
@given(grades=int_grades.filter(lambda g: len(g) >= 2), lam=nonzero_lam,
       delta=st.floats(0.1, 3.0), data=st.data())
def test_normal_forms_differ_off_the_orbit(grades, lam, delta, data):
    # y = λ⋆x with one coordinate scaled by 1 + δ: x has two non-zero coordinates, so no μ
    # with μ⋆x = y exists (μ would need μ^{q_j} = λ^{q_j} and μ^{q_k} = (1 + δ)λ^{q_k}).
    space = GradedSpace(grades)
    x = torch.tensor(data.draw(vectors(len(grades), 0.5, 3.0)), dtype=F64)
    y = space.act(lam, x)
    y[0] *= 1 + delta
    assert not bool(space.same_point(x, y))
    assert not torch.allclose(space.normal_form(x), space.normal_form(y), rtol=1e-6)


def test_normal_form_is_batched_and_picks_positive_first_odd_coordinate():
    space = GradedSpace([1, 2, 3])
    x = torch.tensor([[-2.0, 1.0, 3.0], [0.0, 1.0, -3.0], [0.0, 2.0, 0.0]], dtype=F64)
    nf = space.normal_form(x)
    assert nf[0, 0] > 0 and nf[1, 2] > 0
    torch.testing.assert_close(nf[2], torch.tensor([0.0, 1.0, 0.0], dtype=F64))
    with pytest.raises(ValueError, match="zero vector"):
        space.normal_form(torch.zeros(3))


def test_closure_normal_form_identifies_the_i_action_on_p_2_4_6_10():
    # In P(2,4,6,10) over ℂ, i⋆x = (−x0, x1, −x2, −x3) is the same point; over ℝ it is not.
    space = GradedSpace([2, 4, 6, 10])
    x = torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=F64)
    y = x * torch.tensor([-1.0, 1.0, -1.0, -1.0], dtype=F64)
    assert not bool(space.same_point(x, y))
    assert bool(space.same_point(x, y, closure=True))
    assert space.normal_form_exact([1, 1, 3, 5]) != space.normal_form_exact([-1, 1, -3, -5])
    assert (space.normal_form_exact([1, 1, 3, 5], closure=True)
            == space.normal_form_exact([-1, 1, -3, -5], closure=True))


rational = st.builds(Fraction, st.integers(-6, 6).filter(bool), st.integers(1, 6))


@SETTINGS
@given(grades=int_grades, lam=rational, data=st.data())
def test_exact_normal_forms_agree_on_a_rational_orbit(grades, lam, data):
    space = GradedSpace(grades)
    x = data.draw(st.lists(st.integers(-30, 30), min_size=len(grades), max_size=len(grades))
                  .filter(any))
    y = [lam**q * v for q, v in zip(grades, x)]
    nf = space.normal_form_exact(x)
    assert nf == space.normal_form_exact(y)
    assert all(isinstance(v, int) for v in nf) and weighted_gcd(nf, grades) == 1


def _same_rational_orbit_brute(x, y, grades, bound=8):
    for a in range(1, bound + 1):
        for b in range(1, bound + 1):
            for lam in (Fraction(a, b), Fraction(-a, b)):
                if all(lam**q * u == v for q, u, v in zip(grades, x, y)):
                    return True
    return False


def test_exact_normal_forms_are_equal_exactly_when_points_share_an_orbit():
    grades = [1, 2, 3]
    space = GradedSpace(grades)
    points = [p for p in itertools.product(range(-2, 3), [0, 1, 4], [0, 8, -1]) if any(p)]
    for x, y in itertools.combinations(points, 2):
        same = space.normal_form_exact(x) == space.normal_form_exact(y)
        assert same == _same_rational_orbit_brute(x, y, grades), (x, y)


def test_weighted_gcd_and_factorize_against_brute_force():
    cases = [((12, 16), (1, 2)), ((64, -96, 0), (2, 3, 1)), ((7,), (3,)), ((2**12, 3**6), (3, 2))]
    for x, q in cases:
        brute = max(d for d in range(1, 100) if all(v % d**k == 0 for v, k in zip(x, q)))
        assert weighted_gcd(x, q) == brute
    for n in [1, 2, 360, 2**31 - 1, (2**61 - 1) * 1009**2, 600851475143]:
        f = factorize(n)
        assert math.prod(p**e for p, e in f.items()) == n
        assert all(all(p % d for d in range(2, min(p, 2000))) for p in f)
    with pytest.raises(ValueError, match="zero tuple"):
        weighted_gcd([0, 0], [1, 2])


def test_weighted_gcd_refuses_grades_and_coordinates_that_are_not_integers():
    # these returned 0.125 (grade -1), 8 (grade 1.5 read as 1) and a ZeroDivisionError
    for q, bad in (([-1], "-1"), ([1.5], r"1\.5"), ([0], "0")):
        with pytest.raises(ValueError, match=rf"positive integer grades, got {bad} at index 0"):
            weighted_gcd([8], q)
    with pytest.raises(ValueError, match=r"integer coordinates, got 8\.5 at index 1"):
        weighted_gcd([4, 8.5], [1, 3])
    assert weighted_gcd([8.0, 16], [3.0, 2]) == 2  # integer values given as floats: 2^3 | 8


# -- graded linear maps (000 Lemma 2.3) --------------------------------------------------------
@SETTINGS
@given(q=st.lists(st.integers(0, 4), min_size=1, max_size=4),
       r=st.lists(st.integers(0, 6), min_size=1, max_size=4),
       d=st.integers(-2, 3), seed=st.integers(0, 10_000))
def test_degree_check_accepts_lemma_2_3_matrices_and_rejects_perturbed_ones(q, r, d, seed):
    source, target = GradedSpace(q), GradedSpace(r)
    mask = degree_mask(source, target, d)
    gen = torch.Generator().manual_seed(seed)
    a = (torch.rand(len(r), len(q), generator=gen, dtype=F64) + 0.5) * mask
    assert bool(is_homogeneous_map(a, source, target, d))
    if mask.any():
        assert homogeneous_degree(a, source, target) == d
    if not mask.all():
        i, j = (~mask).nonzero()[0].tolist()
        b = a.clone()
        b[i, j] = 1e-3
        assert not bool(is_homogeneous_map(b, source, target, d))
        assert homogeneous_degree(b, source, target) != d


def test_degree_of_explicit_maps():
    v = GradedSpace([1, 2])
    assert v.degree_of(torch.eye(2), v) == 0.0  # grade-preserving
    shift = torch.tensor([[0.0, 0.0], [3.0, 0.0]])  # e_0 (grade 1) -> f_1 (grade 2)
    assert v.degree_of(shift, v) == 1.0
    assert v.degree_of(torch.ones(2, 2), v) is None
    assert entry_degrees(torch.ones(2, 2), v, v) == (-1.0, 0.0, 1.0)
    batch = torch.stack([torch.eye(2), torch.ones(2, 2)])
    assert is_homogeneous_map(batch, v, v, 0).tolist() == [True, False]
    with pytest.raises(ValueError, match=r"\(\.\.\., 2, 2\)"):
        v.degree_of(torch.ones(3, 2), v)
    # a NaN entry is not a zero entry: it was read as one, and the map passed as degree 0
    nan_map = torch.tensor([[1.0, float("nan")], [0.0, 1.0]])
    with pytest.raises(ValueError, match=r"finite, got nan at index \(0, 1\)"):
        v.degree_of(nan_map, v)
    with pytest.raises(ValueError, match=r"finite, got nan at index \(0, 1\)"):
        is_homogeneous_map(nan_map, v, v, 0)


# -- invariant subspaces (000 Lemma 2.4) -----------------------------------------------------
@SETTINGS
@given(grades=st.lists(st.integers(0, 3), min_size=2, max_size=5), k=st.integers(1, 4),
       homogeneous=st.booleans(), seed=st.integers(0, 10_000))
def test_lemma_2_4_invariance_and_homogeneous_spanning_agree(grades, k, homogeneous, seed):
    space = GradedSpace(grades)
    gen = torch.Generator().manual_seed(seed)
    n = len(grades)
    if homogeneous:
        # k homogeneous vectors, then mixed by an invertible integer matrix (same span)
        rows = []
        for _ in range(k):
            d = space.distinct_grades[int(torch.randint(len(space.distinct_grades), (1,),
                                                        generator=gen))]
            v = torch.randint(-3, 4, (n,), generator=gen).to(F64)
            rows.append(space.homogeneous_part(v, d))
        w = torch.stack(rows)
        mix = torch.eye(k, dtype=F64) + torch.triu(torch.randint(-2, 3, (k, k), generator=gen)
                                                   .to(F64), 1)
        w = mix @ w
    else:
        w = torch.randint(-3, 4, (k, n), generator=gen).to(F64)
    invariant = is_invariant_subspace(space, w)
    assert invariant == spanned_by_homogeneous(space, w)
    if homogeneous:
        assert invariant


def test_lemma_2_4_examples():
    space = GradedSpace([0, 1, 1, 2])
    assert space.is_invariant(torch.tensor([[1.0, 0, 0, 0], [0, 1, 2, 0]]))
    assert not space.is_invariant(torch.tensor([[1.0, 1, 0, 0]]))
    assert not space.is_spanned_by_homogeneous(torch.tensor([[1.0, 1, 0, 0]]))
    # a mixed vector whose span with another is still a sum of homogeneous pieces
    assert space.is_spanned_by_homogeneous(torch.tensor([[1.0, 1, 0, 0], [0, 1, 0, 0]]))


@SETTINGS
@given(grades=st.lists(st.integers(0, 40), min_size=2, max_size=5, unique=True),
       seed=st.integers(0, 10_000))
def test_lemma_2_4_with_grades_far_apart_rejects_a_mixed_line(grades, seed):
    # span(e_a + e_b) with grades q_a ≠ q_b is never invariant (λ⋆ moves it off the line);
    # with 2^{q} as the test operator, grades 0 and 30 made it look invariant
    space = GradedSpace(grades)
    gen = torch.Generator().manual_seed(seed)
    a, b = torch.randperm(len(grades), generator=gen)[:2].tolist()
    line = torch.zeros(1, len(grades), dtype=F64)
    line[0, a], line[0, b] = 1.0, 1.0
    assert not space.is_invariant(line)
    assert not space.is_spanned_by_homogeneous(line)
    # adding e_a makes the span ⊕ of its homogeneous parts: invariant
    plane = torch.cat([line, torch.eye(len(grades), dtype=F64)[a:a + 1]])
    assert space.is_invariant(plane) and space.is_spanned_by_homogeneous(plane)


def test_lemma_2_4_example_with_grades_0_and_30():
    space = GradedSpace([0, 30])
    line = torch.tensor([[1.0, 1.0]], dtype=F64)
    moved = space.act(2.0, line)  # (1, 2^30): not a multiple of (1, 1)
    assert not torch.allclose(moved / moved[0, 0], line)
    assert not space.is_invariant(line)


@pytest.mark.parametrize(("x", "expected"), [
    # over ℚ̄ every [0:0:0:c] is one point (λ = c^(-1/10)), and every [0:b:0:0] (λ = b^(-1/4))
    ([0, 0, 0, 1024], (0, 0, 0, 1)),
    ([0, 0, 0, -7], (0, 0, 0, 1)),
    ([0, 3, 0, 0], (0, 1, 0, 0)),
    ([0, 0, Fraction(5, 2), 0], (0, 0, 1, 0)),
    # support grades (4, 10), g = 2: μ⋆ with the grades (2, 5); i⋆ flips the sign of c
    ([0, 12, 0, -7], (0, 12, 0, 7)),
    ([0, 48, 0, 7 * 32], (0, 12, 0, 7)),  # μ = 1/2: (48/2^2, 224/2^5)
])
def test_closure_exact_normal_form_of_points_with_zero_coordinates(x, expected):
    # a zero coordinate whose grade is not a multiple of the support's gcd raised
    # "weighted_gcd needs positive integer grades, got 0" (its grade q_i // g was 0)
    space = GradedSpace([2, 4, 6, 10])
    got = space.normal_form_exact(x, closure=True)
    assert got == expected
    # the same point as x over ℂ, as the floating-point normal form says
    assert bool(space.same_point(torch.tensor([float(v) for v in x], dtype=F64),
                                 torch.tensor(got, dtype=F64), closure=True))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_results_are_the_float64_results_rounded_once(dtype):
    # computed in the input's dtype, λ = 1.01 became 1.0078 in bfloat16 (the action off by
    # 3.5 eps) and the normal form's logarithms lost digits (off by 9 eps, up to 0.07 in
    # bfloat16); now within one unit of the dtype's eps of the float64 value on the same input
    torch.manual_seed(0)
    space = GradedSpace([2, 4, 6, 10])
    x = (torch.randn(2000, 4, dtype=F64) * torch.tensor([1.0, 3.0, 10.0, 30.0], dtype=F64))
    x = x.to(dtype)  # the same input in both dtypes
    x64 = x.double()
    eps = torch.finfo(dtype).eps

    def close(got, ref):
        assert got.dtype == dtype
        err = (got.double() - ref).abs()
        assert bool((err <= eps * ref.abs()).all()), float((err / ref.abs()).max() / eps)

    close(space.act(1.01, x), space.act(1.01, x64))
    close(space.act(-1.3, x), space.act(-1.3, x64))
    close(space.homogeneous_norm(x), space.homogeneous_norm(x64))
    close(space.normalize(x), space.normalize(x64))
    close(space.normal_form(x), space.normal_form(x64))


def test_graded_norm_does_not_overflow_where_the_norm_is_finite():
    # Σ q_i x_i² overflowed: float16 (max 65504) at √q_i |x_i| > 256, float32 at 1.8e19
    space = GradedSpace([1.0, 2.0, 0.0])
    x16 = torch.tensor([300.0, 400.0, 1000.0], dtype=torch.float16)
    expected = math.sqrt(300.0**2 + 2 * 400.0**2)  # 640.3
    assert float(space.graded_norm(x16)) == pytest.approx(expected, rel=1e-3)
    assert space.graded_norm(x16).dtype == torch.float16
    x32 = torch.tensor([3e19, 4e19, 1e30], dtype=torch.float32)
    assert float(space.graded_norm(x32)) == pytest.approx(math.sqrt(9e38 + 32e38), rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("grades", [[2, 4, 6, 10], [0.5, 1.0, 4.0]])
def test_same_point_default_tolerance_accepts_rounded_representatives(dtype, grades):
    # the fixed rtol=1e-6 (below float32's rounding of the normal form) called 0.3% of the
    # float32 pairs (x, λ⋆x) different points, and 95% of the bfloat16 ones
    torch.manual_seed(0)
    space = GradedSpace(grades)
    n = 5000
    x = torch.randn(n, len(grades), dtype=F64)
    lam = torch.exp(torch.empty(n, dtype=F64).uniform_(-2.0, 2.0))
    if space.integer_grades:
        lam = lam * (torch.randint(0, 2, (n,)) * 2 - 1)
    y = space.act(lam, x)  # exact representatives, each rounded once to the dtype
    normal = lambda v: ((v.abs() >= torch.finfo(dtype).tiny)  # noqa: E731
                        & (v.abs() <= torch.finfo(dtype).max)).all(-1)
    keep = normal(x) & normal(y)  # float16 cannot hold λ^10 for λ = e^2, nor tiny coordinates
    assert int(keep.sum()) > n // 2
    x, y = x[keep], y[keep]
    assert bool(space.same_point(x.to(dtype), y.to(dtype)).all())
    assert bool(space.same_point(x, y.to(dtype)).all())  # mixed dtypes: the narrower's eps
    # still a test: the first coordinate of (1, ..., 1) moved by 4 tolerances is another point
    # (over ℝ only λ = ±1 fixes the other coordinates)
    eps = torch.finfo(dtype).eps
    t = max(1e-6, (1 + max(grades) / min(grades)) * eps)
    ones = torch.ones(len(grades), dtype=F64)
    moved = ones.clone()
    moved[0] = 1 + 4 * t
    assert not bool(space.same_point(ones.to(dtype), moved.to(dtype)))
