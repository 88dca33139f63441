"""Scaled dot-product attention of 002 §2.5, §3.1, §3.4 against a naive loop in float64."""

import math

import pytest
import torch

from graded.attention.functional import attention

F64 = torch.float64


def naive_attention(q, k, v, keep=None, scale=None):
    """002 Eqs 2.25-2.27 (and Def 3.2 masking), one query, key and coordinate at a time:
    e_ij = Σ_c q_ic k_jc · s (s = 1/√d_k), α_ij = exp(e_ij)/Σ_j' exp(e_ij') over the kept j,
    o_i = Σ_j α_ij v_j. q (Tq, d), k (Tk, d), v (Tk, dv)."""
    t_q, t_k, d = q.shape[0], k.shape[0], q.shape[1]
    s = 1.0 / math.sqrt(d) if scale is None else scale
    out = torch.zeros(t_q, v.shape[1], dtype=F64)
    weights = torch.zeros(t_q, t_k, dtype=F64)
    for i in range(t_q):
        js = [j for j in range(t_k) if keep is None or keep[i][j]]
        e = {j: sum(float(q[i, c]) * float(k[j, c]) for c in range(d)) * s for j in js}
        m = max(e.values())
        den = sum(math.exp(x - m) for x in e.values())
        for j in js:
            a = math.exp(e[j] - m) / den
            weights[i, j] = a
            out[i] += a * v[j]
    return out, weights


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("t_q, t_k", [(5, 5), (3, 6)])
def test_attention_equals_the_naive_formula_unmasked_causal_and_masked(need_weights, t_q, t_k):
    """002 §2.5 (softmax(QKᵀ/√d_k)V) and §3.4 Def 3.2 (S̃_ij = −∞ for j > i). With fewer queries
    than keys the causal mask is aligned bottom-right (query i sits at t_k − t_q + i, a KV cache),
    the library's documented convention."""
    gen = torch.Generator().manual_seed(t_q * 10 + t_k)
    q = torch.randn(1, 2, t_q, 4, generator=gen, dtype=F64)
    k = torch.randn(1, 2, t_k, 4, generator=gen, dtype=F64)
    v = torch.randn(1, 2, t_k, 3, generator=gen, dtype=F64)
    causal = [[j <= t_k - t_q + i for j in range(t_k)] for i in range(t_q)]
    custom = torch.rand(t_q, t_k, generator=gen) > 0.4
    custom[:, 0] = True
    cases = [(dict(), None), (dict(is_causal=True), causal),
             (dict(attn_mask=custom), custom.tolist()),
             (dict(attn_mask=custom, is_causal=True),
              [[c and m for c, m in zip(cr, mr)] for cr, mr in zip(causal, custom.tolist())])]
    for kwargs, keep in cases:
        out, w = attention(q, k, v, need_weights=need_weights, **kwargs)
        for h in range(2):
            want, want_w = naive_attention(q[0, h], k[0, h], v[0, h], keep)
            torch.testing.assert_close(out[0, h], want, rtol=1e-12, atol=1e-12)
            if need_weights:
                torch.testing.assert_close(w[0, h], want_w, rtol=1e-12, atol=1e-12)
    out, _ = attention(q, k, v, scale=0.3, need_weights=need_weights)
    torch.testing.assert_close(out[0, 0], naive_attention(q[0, 0], k[0, 0], v[0, 0],
                                                           scale=0.3)[0], rtol=1e-12, atol=1e-12)


def test_outputs_are_convex_combinations_of_the_values_prop_2_1():
    """002 Prop 2.1: A(q, K, V) ∈ conv{v_1..v_n}: weights ≥ 0 summing to 1 per row, so each
    output coordinate lies between the smallest and largest value coordinate of its keys."""
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(2, 2, 6, 4, generator=gen, dtype=F64) * 3
    k = torch.randn(2, 2, 6, 4, generator=gen, dtype=F64) * 3
    v = torch.randn(2, 2, 6, 5, generator=gen, dtype=F64)
    out, w = attention(q, k, v, is_causal=True, need_weights=True)
    assert bool((w >= 0).all())
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 6, dtype=F64), rtol=0, atol=1e-12)
    for i in range(6):  # causal: query i sees values 0..i
        seen = v[:, :, : i + 1]
        assert bool((out[:, :, i] >= seen.amin(-2) - 1e-12).all())
        assert bool((out[:, :, i] <= seen.amax(-2) + 1e-12).all())


def test_self_attention_is_permutation_equivariant_theorem_3_1():
    """002 Thm 3.1: without a mask, Attention(PQ, PK, PV) = P·Attention(Q, K, V)."""
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(1, 1, 7, 4, generator=gen, dtype=F64)
    v = torch.randn(1, 1, 7, 4, generator=gen, dtype=F64)
    perm = torch.randperm(7, generator=gen)
    out, _ = attention(x, x, v)
    out_p, _ = attention(x[:, :, perm], x[:, :, perm], v[:, :, perm])
    torch.testing.assert_close(out_p, out[:, :, perm], rtol=1e-12, atol=1e-12)
