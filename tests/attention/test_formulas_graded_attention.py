"""The graded multi-head variant of 000 Def 5.22 (3) / Eq. (89) against a naive loop.

000 prints the variant, for LGT and for EGT and again in the proofs of Props 5.31 and 6.23, as
Head_h = softmax((M_h Q_h)(M_h K_h)ᵀ/√d_k) V_h: the per-head grading on *both* queries and keys.
Where M sits once or twice is the ambiguity the notes (seeds_001_004, 001 §4.3) ask the
implementation to decide and document: the library's "multi_head" is the per-head form of the
"scores" variant, Q_h M_h K_hᵀ (one M_h, as its module docstring states), and the printed form
is "queries_keys" with per-head grades (num_heads, head_dim). Both are checked here.
"""

import math

import pytest
import torch

from graded.attention.graded import GradedMultiheadAttention

F64 = torch.float64
E, H, D = 8, 2, 4


def _module(grading, grades, variant="multi_head"):
    torch.manual_seed(0)
    return GradedMultiheadAttention(E, H, grading=grading, grades=grades, variant=variant,
                                    batch_first=True).double()


def naive_eq_89(module, x, scales):
    """Eq. (51)/(89): per head h, s_ij = Σ_c (m_hc q_ic)(m_hc k_jc)/√d_k, softmax over j,
    o_i = Σ_j α_ij v_j; heads concatenated and mapped by W^O. x (T, E), scales (H, D)."""
    w, b = module.in_proj_weight.detach(), module.in_proj_bias.detach()
    q = x @ w[:E].T + b[:E]
    k = x @ w[E:2 * E].T + b[E:2 * E]
    v = x @ w[2 * E:].T + b[2 * E:]
    t = x.shape[0]
    heads = []
    for h in range(H):
        m = scales[h]
        out = torch.zeros(t, D, dtype=F64)
        for i in range(t):
            s = [sum(float(m[c] * q[i, h * D + c]) * float(m[c] * k[j, h * D + c])
                     for c in range(D)) / math.sqrt(D) for j in range(t)]
            top = max(s)
            den = sum(math.exp(v_ - top) for v_ in s)
            for j in range(t):
                out[i] += math.exp(s[j] - top) / den * v[j, h * D:(h + 1) * D]
        heads.append(out)
    return torch.cat(heads, -1) @ module.out_proj.weight.detach().T + module.out_proj.bias.detach()


@pytest.mark.parametrize("grading", ["linear", "exponential"])
def test_queries_keys_with_per_head_grades_is_eq_51_89_as_printed(grading):
    grades = torch.tensor([[0.0, 0.5, 1.0, 1.5], [1.5, 1.0, 0.2, 0.0]], dtype=F64)
    module = _module(grading, grades, variant="queries_keys")
    x = torch.randn(1, 5, E, dtype=F64)
    got, _ = module(x, x, x, need_weights=False)
    want = naive_eq_89(module, x[0], module.grading.scales().detach())
    torch.testing.assert_close(got[0].detach(), want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("grading", ["linear", "exponential"])
def test_multi_head_variant_is_eq_89_with_the_grading_on_the_queries_only(grading):
    """The library's reading: s_ij = Σ_c q_ic m_hc k_jc/√d_k, i.e. Eq. (89) with the key-side
    M_h left out (naive_eq_89 with scales √m on both sides)."""
    grades = torch.tensor([[0.0, 0.5, 1.0, 1.5], [1.5, 1.0, 0.2, 0.0]], dtype=F64)
    module = _module(grading, grades)
    x = torch.randn(1, 5, E, dtype=F64)
    got, _ = module(x, x, x, need_weights=False)
    want = naive_eq_89(module, x[0], module.grading.scales().detach().sqrt())
    torch.testing.assert_close(got[0].detach(), want, rtol=1e-10, atol=1e-10)


def test_multi_head_variant_equals_eq_89_at_half_the_egt_grades():
    """For EGT, Q_h M_{2q} K_hᵀ = (M_q Q_h)(M_q K_h)ᵀ since (λ^{q})² = λ^{2q}: the library's
    variant with grades 2q is Eq. (89) with grades q. The model class is the same; the grades
    (and anything read from them: regularisers, learned trajectories) mean twice the paper's."""
    q = torch.tensor([[0.0, 0.5, 1.0, 1.5], [1.5, 1.0, 0.2, 0.0]], dtype=F64)
    module = _module("exponential", 2 * q)
    x = torch.randn(1, 5, E, dtype=F64)
    got, _ = module(x, x, x, need_weights=False)
    paper_scales = torch.tensor([[2.0 ** float(v) for v in row] for row in q], dtype=F64)
    torch.testing.assert_close(got[0].detach(), naive_eq_89(module, x[0], paper_scales),
                               rtol=1e-10, atol=1e-10)
