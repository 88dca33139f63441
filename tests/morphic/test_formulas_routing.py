"""Router formulas of 004 (§4.2.1 pooling, Prop 3.8, Prop 6.10) against hand computations."""

import math

import torch

from graded.morphic import EdgeSet, GradedStateSpace, Router, utility_augmented_logits

F64 = torch.float64


def _three_edges():
    sp = GradedStateSpace({"a": 2})
    es = EdgeSet.explicit(sp, [("a", "a", "x"), ("a", "a", "y"), ("a", "a", "z")])
    return sp, es


def test_gibbs_routing_maximises_the_entropy_regularised_utility_of_prop_6_10():
    """004 Prop 6.10: max_{α∈Δ(𝓔)} Σ_e α_e(ΔL_e − τ_e) − T Σ_e α_e log α_e is attained at
    α* = softmax((ΔL − τ)/T), with value T log Σ_e exp((ΔL_e − τ_e)/T). The router with zero
    context logits, β = 1 and a global softmax without the stay option is that α*."""
    sp, es = _three_edges()
    temp = 0.7
    router = Router(sp, es, normalization="global", stay=False, temperature=temp).double()
    util = torch.tensor([[0.9, -0.3, 0.4]], dtype=F64)
    tau = torch.tensor([0.1, 0.0, 0.2], dtype=F64)
    logits = utility_augmented_logits(torch.zeros_like(util), util, 1.0, tau)
    alpha = router.probabilities(logits)[0]

    gain = [float(u) - float(t) for u, t in zip(util[0], tau)]
    den = sum(math.exp(g / temp) for g in gain)
    want = [math.exp(g / temp) / den for g in gain]
    for got, w in zip(alpha.tolist(), want):
        assert math.isclose(got, w, rel_tol=1e-12)

    def objective(a):
        return sum(ai * g for ai, g in zip(a, gain)) - temp * sum(
            ai * math.log(ai) for ai in a if ai > 0)

    best = temp * math.log(den)
    assert math.isclose(objective(alpha.tolist()), best, rel_tol=1e-12)
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        a = -torch.rand(3, generator=gen, dtype=F64).clamp_min(1e-9).log()  # Dirichlet(1, 1, 1)
        a = (a / a.sum()).tolist()
        assert objective(a) <= best + 1e-12
    for vertex in ([1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]):
        assert objective(vertex) < best


def test_sharp_utility_softmax_is_uniform_over_the_tied_argmax_set_prop_3_8():
    """004 Prop 3.8: as β → ∞, softmax_e(β(ΔL_e − τ_e)) tends to the uniform distribution over
    argmax_e(ΔL_e − τ_e) (ties share the mass); the logistic gate σ(β(ΔL − τ)) tends to the
    indicator of ΔL > τ, with 1/2 at equality."""
    sp, es = _three_edges()
    util = torch.tensor([[0.5, 0.7, 0.1]], dtype=F64)
    tau = torch.tensor([0.0, 0.2, 0.0], dtype=F64)  # gains 0.5, 0.5, 0.1: a two-way tie
    logits = utility_augmented_logits(torch.zeros_like(util), util, 1e4, tau)
    soft = Router(sp, es, normalization="global", stay=False).double().probabilities(logits)
    torch.testing.assert_close(soft, torch.tensor([[0.5, 0.5, 0.0]], dtype=F64), atol=1e-12,
                               rtol=0)
    tau = torch.tensor([0.4, 0.9, 0.1], dtype=F64)  # gains 0.1 > 0, −0.2 < 0, 0.0 = 0
    logits = utility_augmented_logits(torch.zeros_like(util), util, 1e4, tau)
    gates = Router(sp, es, normalization="logistic", stay=False).double().probabilities(logits)
    torch.testing.assert_close(gates, torch.tensor([[1.0, 0.0, 0.5]], dtype=F64), atol=1e-12,
                               rtol=0)


def _router(pooling):
    sp = GradedStateSpace({"a": 3, "b": 2})
    es = EdgeSet.explicit(sp, [("a", "b", "e1"), ("b", "b", "e2")])
    torch.manual_seed(1)
    r = Router(sp, es, rank=4, pooling=pooling, init_std=0.5).double()
    if pooling == "attention":
        with torch.no_grad():
            r.pool_query.copy_(torch.randn(4, dtype=F64))
    return sp, es, r


def _naive_context(r, z_row, t, pooling):
    """c_t from the strictly earlier rows z_0..z_{t−1} (c_0 = 0), written out by hand."""
    d = z_row.shape[-1]
    if t == 0:
        return torch.zeros(d, dtype=F64)
    if pooling == "last":
        return z_row[t - 1].clone()
    wk, q = r.pool_key.weight, r.pool_query
    scores = [sum(float(q[a]) * sum(float(wk[a, i]) * float(z_row[s, i]) for i in range(d))
                  for a in range(wk.shape[0])) for s in range(t)]
    m = max(scores)
    e = [math.exp(x - m) for x in scores]
    c = torch.zeros(d, dtype=F64)
    for s in range(t):
        c += e[s] / sum(e) * z_row[s]
    return c


def test_last_and_attention_pooling_give_the_context_logits_of_section_4_2_1():
    """004 §4.2.1: ℓ_t(h←g) = u(z_{<t})ᵀ W_{h←g} v(z_t^{(g)}), u = proj_u(c_t) with c_t the
    previous state ("last") or an attention pool Σ_{s<t} softmax_s(⟨W_k z_s, q⟩) z_s (c_0 = 0)."""
    for pooling in ("last", "attention"):
        sp, es, r = _router(pooling)
        z = torch.randn(2, 5, sp.total_dim, dtype=F64)
        got = r.context_logits(z).detach()
        r.requires_grad_(False)
        for b in range(2):
            for t in range(5):
                c = _naive_context(r, z[b], t, pooling)
                u = r.proj_u.weight @ c + r.proj_u.bias
                for i, e in enumerate(es):
                    v_layer = r.proj_v[e.source]
                    v = v_layer.weight @ sp.project(z[b, t], e.source) + v_layer.bias
                    want = sum(float(u[k]) * float(r.bilinear[i, k, m]) * float(v[m])
                               for k in range(4) for m in range(4))
                    assert math.isclose(float(got[b, t, i]), want, rel_tol=1e-9, abs_tol=1e-12)
