"""Graded algebra of 000 §2 (and §5's weighted-action category) against definitions computed
independently: exact rational arithmetic, explicit diagonal matrices, naive loops."""

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graded.algebra import GradedSpace, homogeneous_degree, is_homogeneous_map
from graded.algebra.maps import is_invariant_subspace, spanned_by_homogeneous
from graded.grading import ExponentialGrading, LinearGrading

F64 = torch.float64
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True)

# grades in ½ℤ (000 Def 2.1 allows ℚ-grades); with λ = 4 every power λ^{k/2} is a power of 2,
# exact in float64, so the definitions below hold or fail exactly
half_grades = st.lists(st.integers(0, 6).map(lambda k: Fraction(k, 2)), min_size=1, max_size=4)
LAM = 4


def _diag_action(grades, lam):
    """The matrix of x ↦ λ⋆x, diag(λ^{q_i}), written out from 000 §2.2."""
    return torch.diag(torch.tensor([lam ** float(g) for g in grades], dtype=F64))


def _intertwines(a, q, r, d, lam=LAM):
    """000 §2.2: φ is homogeneous of degree d iff φ(V_j) ⊆ W_{q_j + d} for all j, i.e.
    φ(λ⋆x) = λ^{-d}·(λ⋆φ(x)) for every λ > 0 (on V_j both sides are λ^{q_j}φ(x)). With one
    λ > 1 and exponents in ½ℤ, λ^{a} = λ^{b} iff a = b, so one λ decides it."""
    lhs = (lam ** float(d)) * (a @ _diag_action(q, lam))
    rhs = _diag_action(r, lam) @ a
    return bool(torch.equal(lhs, rhs))


def _map_of_degree(q, r, d, values):
    """A matrix with a_ij ≠ 0 exactly where r_i = q_j + d (a naive loop over the entries)."""
    a = torch.zeros(len(r), len(q), dtype=F64)
    for i, ri in enumerate(r):
        for j, qj in enumerate(q):
            if ri == qj + d:
                a[i, j] = values[(i * len(q) + j) % len(values)]
    return a


@SETTINGS
@given(q=half_grades, r=half_grades, d=st.integers(-4, 4).map(lambda k: Fraction(k, 2)),
       homogeneous=st.booleans(),
       values=st.lists(st.integers(-3, 3).filter(bool), min_size=16, max_size=16),
       mask=st.lists(st.booleans(), min_size=16, max_size=16))
def test_lemma_2_3_degree_is_the_degree_of_the_intertwining_definition(q, r, d, homogeneous,
                                                                      values, mask):
    """000 Lemma 2.3 (a_ij ≠ 0 ⟹ r_i = q_j + d, the proof's index; see graded.algebra.maps)
    against the definition f(V_j) ⊆ W_{j+d}, checked as λ^d A diag(λ^q) = diag(λ^r) A."""
    source, target = GradedSpace([float(g) for g in q]), GradedSpace([float(g) for g in r])
    if homogeneous:
        a = _map_of_degree(q, r, d, values)
    else:  # an arbitrary sparsity pattern, usually of no single degree
        a = torch.tensor([v if m else 0 for v, m in zip(values, mask)], dtype=F64)
        a = a[: len(r) * len(q)].reshape(len(r), len(q))  # at most 4 × 4 = 16 entries
    degrees = [Fraction(k, 2) for k in range(-16, 17)]
    holds = [e for e in degrees if _intertwines(a, q, r, e)]
    for e in (d, *holds):
        assert bool(is_homogeneous_map(a, source, target, float(e))) == (e in holds)
    got = homogeneous_degree(a, source, target)
    if not bool(a.any()):  # the zero map has every degree; the library reports 0
        assert got == 0.0 and len(holds) == len(degrees)
    elif holds:
        assert len(holds) == 1 and got == float(holds[0])
    else:
        assert got is None


@SETTINGS
@given(q=half_grades, d1=st.integers(-2, 2).map(lambda k: Fraction(k, 2)),
       d2=st.integers(-2, 2).map(lambda k: Fraction(k, 2)),
       values=st.lists(st.integers(1, 3), min_size=16, max_size=16))
def test_a_composition_of_graded_maps_has_the_sum_of_their_degrees(q, d1, d2, values):
    """000 §2.2: f(V_j) ⊆ W_{j+d1} and g(W_k) ⊆ U_{k+d2} give g∘f(V_j) ⊆ U_{j+d1+d2}, so the
    composition (the matrix product BA) is homogeneous of degree d1 + d2; grade-preserving
    maps (d = 0) compose to grade-preserving ones."""
    r = [g + d1 for g in q]
    s = [g + d2 for g in r]
    a, b = _map_of_degree(q, r, d1, values), _map_of_degree(r, s, d2, values[::-1])
    vq, vr, vs = (GradedSpace([float(g) for g in t]) for t in (q, r, s))
    assert homogeneous_degree(a, vq, vr) == float(d1)
    assert homogeneous_degree(b, vr, vs) == float(d2)
    ba = b @ a  # positive entries: no cancellation, BA ≠ 0
    assert bool(ba.any())
    assert homogeneous_degree(ba, vq, vs) == float(d1 + d2)
    assert _intertwines(ba, q, s, d1 + d2)


def test_example_2_2_and_the_action_is_a_grade_preserving_linear_map():
    """000 Ex. 2.2: grades (1, 1/2); 4⋆[x_0, x_1] = [4x_0, 2x_1].
    000 §2.2: λ⋆ is a graded linear map of degree 0: its matrix (the images of the basis
    vectors) is diag(λ^{q_i}), homogeneous of degree 0, and it is linear."""
    space = GradedSpace([1, Fraction(1, 2)])
    got = space.act(4.0, torch.tensor([3.0, -5.0], dtype=F64))
    assert got.tolist() == [12.0, -10.0]
    grades = [0, Fraction(1, 2), 1, 3, Fraction(5, 2)]
    space = GradedSpace(grades)
    for lam in (0.5, 2.0, 4.0, 9.0):
        matrix = torch.stack([space.act(lam, e) for e in torch.eye(5, dtype=F64)], 1)
        want = torch.diag(torch.tensor([lam ** float(g) for g in grades], dtype=F64))
        torch.testing.assert_close(matrix, want, rtol=1e-15, atol=0)
        assert space.degree_of(matrix, space) == 0.0
        x, y = torch.randn(2, 5, dtype=F64)
        torch.testing.assert_close(space.act(lam, 2.5 * x - 3.0 * y),
                                   2.5 * space.act(lam, x) - 3.0 * space.act(lam, y))


def test_the_grading_maps_commute_with_the_weighted_action():
    """000 §5 (before Prop 5.3): M = M_q is diagonal, so M(λ⋆v) = λ⋆(Mv); the same for the
    exponential map M_{q,λ'} (000 Def 6.1). Both sides written out coordinatewise."""
    q = [0.0, 0.5, 1.0, 2.0, 3.5]
    space = GradedSpace(q)
    x = torch.randn(7, 5, dtype=F64)
    for grading, m in ((LinearGrading(5, [0.3, 1.0, 2.0, 0.0, 4.0], f="shift", dtype=F64),
                        [1.3, 2.0, 3.0, 1.0, 5.0]),
                       (ExponentialGrading(5, [0.0, 1.0, 2.0, 0.5, 1.5], base=1.5, dtype=F64),
                        [1.5**g for g in (0.0, 1.0, 2.0, 0.5, 1.5)])):
        for lam in (0.3, 2.0, 7.0):
            naive = x * torch.tensor([mi * lam**qi for mi, qi in zip(m, q)], dtype=F64)
            torch.testing.assert_close(grading(space.act(lam, x)), naive)
            torch.testing.assert_close(space.act(lam, grading(x)), naive)


def _rank(rows):
    """Rank of a list of rows of Fractions by Gaussian elimination (exact)."""
    m = [list(r) for r in rows]
    rank, col, ncol = 0, 0, len(m[0]) if m else 0
    while rank < len(m) and col < ncol:
        pivot = next((i for i in range(rank, len(m)) if m[i][col] != 0), None)
        if pivot is None:
            col += 1
            continue
        m[rank], m[pivot] = m[pivot], m[rank]
        for i in range(len(m)):
            if i != rank and m[i][col] != 0:
                f = m[i][col] / m[rank][col]
                m[i] = [a - f * b for a, b in zip(m[i], m[rank])]
        rank += 1
        col += 1
    return rank


def _naively_invariant(grades, rows):
    """000 Lemma 2.4 (i), by definition: λ⋆w ∈ W for every w ∈ W and λ ≠ 0. With r distinct
    grades, invariance under r distinct λ > 0 gives it for all λ (the generalised Vandermonde
    [λ_a^{d_b}] is invertible, so each projection P_d is a combination of those λ⋆); λ = −1
    is covered because P_d W ⊆ W then. Checked exactly: rank [W; λ⋆W] = rank W."""
    base = _rank(rows)
    for lam in (2, 3, 5, 7, 11)[:len(set(grades))]:
        moved = [[Fraction(lam) ** g * v for g, v in zip(grades, row)] for row in rows]
        if _rank(rows + moved) != base:
            return False
    return True


@SETTINGS
@given(grades=st.lists(st.integers(0, 3), min_size=2, max_size=5), data=st.data())
def test_lemma_2_4_invariance_and_homogeneous_spanning_against_the_definition(grades, data):
    """000 Lemma 2.4: W is invariant under λ⋆ iff it is spanned by homogeneous vectors; both
    library checks against the definition (i) computed in exact arithmetic. Each row keeps
    the coordinates of a random set of grades (one grade: a homogeneous row), so that spans
    such as span(e_0, e_1 + e_2) with grades (0, 1, 2), invariant under P_0 but not P_1, occur
    next to invariant ones."""
    n = len(grades)
    k = data.draw(st.integers(1, n))
    distinct = sorted(set(grades))
    rows = []
    for _ in range(k):
        row = data.draw(st.lists(st.integers(-2, 2), min_size=n, max_size=n))
        keep = data.draw(st.lists(st.booleans(), min_size=len(distinct), max_size=len(distinct)))
        kept = {d for d, b in zip(distinct, keep) if b}
        rows.append([Fraction(v) if g in kept else Fraction(0) for v, g in zip(row, grades)])
    want = _naively_invariant(grades, rows)
    w = torch.tensor([[float(v) for v in row] for row in rows], dtype=F64)
    space = GradedSpace(grades)
    assert is_invariant_subspace(space, w) == want
    assert spanned_by_homogeneous(space, w) == want
    # 000 Cor 2.5: every line V_j = F e_j is invariant
    for j in range(n):
        assert is_invariant_subspace(space, torch.eye(n, dtype=F64)[j:j + 1])


@pytest.mark.parametrize(("grades", "rows", "invariant"), [
    ([0, 1, 2], [[1, 0, 0], [0, 1, 1]], False),  # P_0 W ⊆ W, but P_1 (e_1 + e_2) = e_1 ∉ W
    ([2, 0, 1], [[0, 1, 0], [1, 0, 1]], False),
    ([0, 1, 1, 2], [[1, 0, 0, 0], [0, 1, 2, 0]], True),
    ([0, 1, 1, 2], [[1, 1, 0, 0], [0, 0, 0, 1]], False),
    ([1, 1, 3], [[1, 2, 0], [2, 1, 0], [0, 0, 5]], True),
])
def test_lemma_2_4_hand_examples_agree_with_the_exact_definition(grades, rows, invariant):
    """000 Lemma 2.4 on small subspaces whose invariance is read off by hand."""
    exact = [[Fraction(v) for v in row] for row in rows]
    assert _naively_invariant(grades, exact) == invariant
    w = torch.tensor(rows, dtype=F64)
    assert is_invariant_subspace(GradedSpace(grades), w) == invariant
    assert spanned_by_homogeneous(GradedSpace(grades), w) == invariant


@SETTINGS
@given(grades=st.lists(st.floats(0.0, 3.0), min_size=1, max_size=5),
       lam=st.floats(0.25, 4.0), data=st.data())
def test_graded_norm_of_the_action_is_the_sum_in_the_mse_scaling_identity(grades, lam, data):
    """000 Eq. 3, ‖x‖_q² = Σ q_i x_i², and the scaling identity under it in §3.3:
    ‖λ⋆x‖_q² = Σ q_i λ^{2q_i} x_i², both as naive sums."""
    x = data.draw(st.lists(st.floats(-3.0, 3.0), min_size=len(grades), max_size=len(grades)))
    space = GradedSpace(grades)
    t = torch.tensor(x, dtype=F64)
    naive = sum(g * v * v for g, v in zip(grades, x))
    assert math.isclose(float(space.graded_norm(t)) ** 2, naive, rel_tol=1e-12, abs_tol=1e-300)
    scaled = sum(g * lam ** (2 * g) * v * v for g, v in zip(grades, x))
    assert math.isclose(float(space.graded_norm(space.act(lam, t))) ** 2, scaled,
                        rel_tol=1e-12, abs_tol=1e-300)
