"""Grading maps of 000 §5-6 and 001 §2, §4 against worked examples and hand computations."""

import math

import pytest
import torch

from graded.grading import ExponentialGrading, LinearGrading
from graded.transformer.graded import GradedFeatures, GradedPositions

F64 = torch.float64


def _explicit_matrix(grading, d):
    """The matrix of x ↦ grading(x), column j = grading(e_j)."""
    return grading(torch.eye(d, dtype=F64)).T


@pytest.mark.parametrize("kind", ["linear", "exponential"])
def test_eigenvalues_spectral_norm_and_jacobian_of_the_grading_matrix(kind):
    """000 Lemma 5.5 (iv)-(v) (LGT: eigenvalues f(q_i), ‖M_q‖₂ = max f(q_i)), 000 Prop 6.5
    (iv)-(v) and 001 Prop 2.4 (4)-(5), Lemma 4.3 (EGT: eigenvalues λ^{q_i}, spectral norm and
    Lipschitz constant λ^{q_max}, Jacobian diag(λ^{q_i})), with the values computed by hand."""
    q = [0.0, 0.4, 1.3, 2.2, 0.7]
    if kind == "linear":
        g = LinearGrading(5, q, f="shift", dtype=F64)
        want = [qi + 1.0 for qi in q]
    else:
        g = ExponentialGrading(5, q, base=1.8, dtype=F64)
        want = [math.pow(1.8, qi) for qi in q]
    m = _explicit_matrix(g, 5)
    eig = sorted(torch.linalg.eigvals(m).real.tolist())
    for got, w in zip(eig, sorted(want)):
        assert math.isclose(got, w, rel_tol=1e-12)
    spectral = float(torch.linalg.matrix_norm(m, ord=2))
    assert math.isclose(spectral, max(want), rel_tol=1e-12)
    assert math.isclose(g.max_scale(), max(want), rel_tol=1e-12)
    x = torch.randn(5, dtype=F64)
    jac = torch.autograd.functional.jacobian(g, x)
    torch.testing.assert_close(jac, torch.diag(torch.tensor(want, dtype=F64)), rtol=1e-12,
                               atol=0)
    # Lipschitz: ‖Mx − My‖ ≤ max_i m_i ‖x − y‖, attained on the top coordinate
    y = torch.randn(5, dtype=F64)
    assert float((g(x) - g(y)).norm()) <= max(want) * float((x - y).norm()) * (1 + 1e-12)
    top = torch.zeros(5, dtype=F64)
    top[want.index(max(want))] = 1.0
    assert math.isclose(float(g(top).norm()), max(want), rel_tol=1e-12)


def test_example_5_4_and_5_6_linear_grading_scales():
    """000 Ex. 5.4: q = (1, 0.5, 0, 0) with f(q) = q + 1 gives (2, 1.5, 1, 1).
    000 Ex. 5.6: q = (2, 1) scales the first feature by 2 and bounds norms by 2."""
    g = LinearGrading(4, [1.0, 0.5, 0.0, 0.0], f="shift", dtype=F64)
    torch.testing.assert_close(g.scales(), torch.tensor([2.0, 1.5, 1.0, 1.0], dtype=F64))
    h = LinearGrading(2, [2.0, 1.0], f="identity", dtype=F64)
    torch.testing.assert_close(h(torch.tensor([3.0, 5.0], dtype=F64)),
                               torch.tensor([6.0, 5.0], dtype=F64))
    assert h.max_scale() == 2.0


def test_example_5_20_through_the_normalised_input_stage():
    """000 Def 5.19 / Ex. 5.20 on the library's input stage (not a hand-written division):
    x = [1, 0.5, 0.1], q = (1, 1.1, 1.2), M_q x = [1, 0.55, 0.12], x'' ≈ [0.871, 0.479, 0.105]."""
    g = LinearGrading(3, [1.0, 1.1, 1.2], f="identity", dtype=F64)
    stage = GradedFeatures(g, normalize=True)
    x = torch.tensor([[1.0, 0.5, 0.1]], dtype=F64)
    got = stage(x)[0]
    norm = math.sqrt(1.0 + 0.55**2 + 0.12**2)
    for gi, w in zip(got.tolist(), (1.0 / norm, 0.55 / norm, 0.12 / norm)):
        assert math.isclose(gi, w, rel_tol=1e-12)
    torch.testing.assert_close(got, torch.tensor([0.871, 0.479, 0.105], dtype=F64), atol=6e-4,
                               rtol=0)


def test_egt_positional_factor_and_its_lipschitz_bound_001_lemma_4_5():
    """000 §6 / 001 §4.2: Pe'(t) = λ^{−αt} Pe(t), λ the feature grading's base (followed through
    set_base, i.e. λ annealing); 001 Lemma 4.5: |λ^{−αt} − λ^{−αt'}| ≤ α ln λ |t − t'|
    for t, t' ≥ 0.
    000 Def 5.21 (LGT): (1 − αt) Pe(t)."""
    alpha = 0.3
    feature = ExponentialGrading(4, [0.0, 1.0, 2.0, 3.0], base=1.7, dtype=F64)
    pos = GradedPositions("exponential", alpha, 16, base_source=feature)
    t = torch.arange(16)
    got = pos.factors(t, F64).tolist()
    for ti, gi in enumerate(got):
        assert math.isclose(gi, math.pow(1.7, -alpha * ti), rel_tol=1e-12)
    for i in range(16):
        for j in range(16):
            assert abs(got[i] - got[j]) <= alpha * math.log(1.7) * abs(i - j) + 1e-15
    pe = torch.randn(16, 4, dtype=F64)
    out = pos(pe, t)
    for ti in range(16):
        torch.testing.assert_close(out[ti], math.pow(1.7, -alpha * ti) * pe[ti], rtol=1e-12,
                                   atol=0)
    feature.set_base(1.2)
    assert math.isclose(float(pos.factors(torch.tensor([5]), F64)[0]), math.pow(1.2, -1.5),
                        rel_tol=1e-12)
    lgt = GradedPositions("linear", 0.05, 16)
    for ti, gi in enumerate(lgt.factors(t, F64).tolist()):
        assert math.isclose(gi, 1.0 - 0.05 * ti, rel_tol=1e-12, abs_tol=1e-15)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_positional_factors_in_half_precision_are_the_exact_factors_rounded_once(dtype):
    """In bfloat16 the positions themselves round (1001 → 1000), so factors computed there were
    off by up to 6% (1 − 0.0009·t at t = 1003 gave 0.0977 for 0.0973): the factors are computed
    in float32 and rounded once, to the float64 formula rounded to ``dtype``."""
    t = torch.arange(1000, 1100)
    lgt = GradedPositions("linear", 0.0009, 1100)
    exact = 1.0 - 0.0009 * t.to(F64)
    torch.testing.assert_close(lgt.factors(t, dtype), exact.to(dtype), atol=0, rtol=0.01)
    assert lgt.factors(t, dtype).dtype == dtype
    feature = ExponentialGrading(4, base=1.01, dtype=F64)
    egt = GradedPositions("exponential", 0.5, 1100, base_source=feature)
    torch.testing.assert_close(egt.factors(t, dtype),
                               torch.pow(1.01, -0.5 * t.to(F64)).to(dtype), atol=0, rtol=0.01)


@pytest.mark.parametrize("alpha", [math.nan, math.inf, -0.1])
def test_positional_alpha_must_be_a_finite_number_at_least_zero(alpha):
    with pytest.raises(ValueError, match=r"grade_position_alpha must be"):
        GradedPositions("exponential", alpha, 16, base_source=ExponentialGrading(4))
