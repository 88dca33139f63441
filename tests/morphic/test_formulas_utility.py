"""Utility ΔL_t(h←g) against identities and bounds of 004, each checked with a hand computation.

The reference values are computed coordinate by coordinate with ``math`` (exp, log) in float64,
never through ``exact_utilities`` itself.
"""

import math

import torch

from graded.morphic import EdgeSet, GradedStateSpace, exact_utilities

F64 = torch.float64


def _space():
    sp = GradedStateSpace({"a": 3, "b": 2})
    es = EdgeSet.explicit(sp, [("a", "b", "b_from_a")])
    return sp, es


def _logits(w, b, z):
    """ℓ_c = Σ_i W[c, i] z_i + b_c, by hand."""
    return [sum(float(w[c, i]) * float(z[i]) for i in range(len(z))) + float(b[c])
            for c in range(w.shape[0])]


def _softmax(xs):
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    s = sum(e)
    return [v / s for v in e]


def _utility_rows(sp, es, w, b, z, cand):
    """exact_utilities for one state z and one candidate, one row per target class y."""
    n_cls = w.shape[0]
    zz = z.expand(1, n_cls, -1).clone()
    cc = cand.expand(1, n_cls, -1).clone()
    targets = torch.arange(n_cls).unsqueeze(0)
    return exact_utilities(zz, [cc], es, sp, w, b, targets)[0, :, 0]  # (V,)


def test_expected_utility_is_the_kl_gain_of_lemma_6_7():
    """004 Lemma 6.7: E_{y~P} ΔL(y) = KL(P‖p_z) − KL(P‖p_{z+}); with P = p_z it is −KL(p_z‖p_{z+})
    ≤ 0 and with P = p_{z+} it is KL(p_{z+}‖p_z) ≥ 0 (z+ = z with slot h replaced by φ)."""
    torch.manual_seed(3)
    sp, es = _space()
    n_cls = 6
    w = torch.randn(n_cls, sp.total_dim, dtype=F64)
    b = torch.randn(n_cls, dtype=F64)
    z = torch.randn(sp.total_dim, dtype=F64)
    phi = torch.randn(2, dtype=F64)
    util = _utility_rows(sp, es, w, b, z, phi)

    z_plus = z.clone()
    z_plus[3:5] = phi  # slot "b" is columns 3..4
    p = _softmax(_logits(w, b, z))
    p_plus = _softmax(_logits(w, b, z_plus))

    def kl(a, c):
        return sum(ai * math.log(ai / ci) for ai, ci in zip(a, c) if ai > 0)

    raw = [float(v) for v in torch.rand(n_cls, dtype=F64) + 0.1]
    data = [v / sum(raw) for v in raw]
    for dist in (data, p, p_plus):
        expected_gain = sum(dist[y] * float(util[y]) for y in range(n_cls))
        assert math.isclose(expected_gain, kl(dist, p) - kl(dist, p_plus), rel_tol=1e-10,
                            abs_tol=1e-12)
    on_model = sum(p[y] * float(util[y]) for y in range(n_cls))
    on_update = sum(p_plus[y] * float(util[y]) for y in range(n_cls))
    assert math.isclose(on_model, -kl(p, p_plus), rel_tol=1e-10) and on_model <= 0
    assert math.isclose(on_update, kl(p_plus, p), rel_tol=1e-10) and on_update >= 0
    # and each ΔL(y) is the log-probability gain of its class, log p⁺_y − log p_y
    for y in range(n_cls):
        assert math.isclose(float(util[y]), math.log(p_plus[y]) - math.log(p[y]), rel_tol=1e-10,
                            abs_tol=1e-12)


def test_utility_obeys_the_smoothness_bounds_of_theorem_5_1():
    """004 Thm 5.1 / Lemma 5.2 with a linear softmax readout: for δ = φ − z^{(h)},
    −⟨∇, δ⟩ − (L/2)‖δ‖² ≤ ΔL ≤ −⟨∇, δ⟩ (the upper bound is convexity, μ = 0), with
    ∇ = W_hᵀ(p − e_y) and L = ‖W_h‖₂²/2 (the softmax Hessian diag p − ppᵀ has norm ≤ 1/2).
    For the gradient-step morphism δ = −a∇ this gives ΔL ≥ a(1 − La/2)‖∇‖² > 0 for a < 2/L
    (notes Part I #9)."""
    torch.manual_seed(5)
    sp, es = _space()
    n_cls, y = 5, 2
    w = torch.randn(n_cls, sp.total_dim, dtype=F64) * 1.5
    b = torch.randn(n_cls, dtype=F64)
    z = torch.randn(sp.total_dim, dtype=F64)
    w_h = w[:, 3:5]
    p = _softmax(_logits(w, b, z))
    grad = [sum(float(w_h[c, j]) * (p[c] - (1.0 if c == y else 0.0)) for c in range(n_cls))
            for j in range(2)]
    smooth = float(torch.linalg.matrix_norm(w_h, ord=2)) ** 2 / 2
    grad_sq = sum(g * g for g in grad)
    for a in (0.05, 0.5, 1.0 / smooth, 1.9 / smooth):
        phi = z[3:5] - a * torch.tensor(grad, dtype=F64)
        got = float(_utility_rows(sp, es, w, b, z, phi)[y])
        assert got >= a * (1 - smooth * a / 2) * grad_sq - 1e-12
        assert got > 0
    for _ in range(20):
        delta = torch.randn(2, dtype=F64) * 2
        got = float(_utility_rows(sp, es, w, b, z, z[3:5] + delta)[y])
        lin = -sum(g * float(d) for g, d in zip(grad, delta))
        assert lin - smooth / 2 * float(delta @ delta) - 1e-12 <= got <= lin + 1e-12


def test_adder_program_utility_of_app_a3_and_remark_a6():
    """004 App. A.3 / Remark A.6 (the consistent form of Prop 5.6): Enc(x) = e_x in V_sem, readout
    s·I_p on V_sem, target (x + k) mod p, and the program's composite Φ_{Π_k} = A_k (the cyclic
    shift, A_k e_x = e_{x+k}) written into the sem slot. By hand: L(z) = log(e^s + p − 1),
    L(z⁺) = log(e^s + p − 1) − s, so ΔL = s for every x, and at s = 1 (W = I_p) the post-update
    loss is the minimum −log(e/(e + p − 1)) of notes C1, not 0."""
    from graded.morphic import FixedLinearBlock

    p, k = 7, 3
    sp = GradedStateSpace({"sem": p, "num": p})
    es = EdgeSet.explicit(sp, [("sem", "sem", "program")])
    adder = FixedLinearBlock.cyclic_shift(p, k).double()
    for s in (1.0, 4.0):
        z = torch.zeros(1, p, 2 * p, dtype=F64)
        z[0, torch.arange(p), torch.arange(p)] = 1.0  # token x holds e_x in sem
        w = torch.zeros(p, 2 * p, dtype=F64)
        w[:, :p] = s * torch.eye(p, dtype=F64)
        targets = ((torch.arange(p) + k) % p).unsqueeze(0)
        cand = adder(z[..., :p])
        util = exact_utilities(z, [cand], es, sp, w, None, targets)[0, :, 0]
        before = math.log(math.exp(s) + p - 1)
        after = before - s
        for x in range(p):
            assert math.isclose(float(util[x]), before - after, rel_tol=1e-12)
        if s == 1.0:
            assert math.isclose(after, -math.log(math.e / (math.e + p - 1)), rel_tol=1e-12)


def test_small_eta_step_lowers_the_loss_by_the_routed_first_order_utility_thm_4_13():
    """004 Thm 4.13 (first order): with z^{new} = z + η Σ_e α_e (φ_e − z^{(h)}) (eta_step),
    (L(z) − L(z^{new}))/η → Σ_e α_e (−⟨∇_{z^{(h)}} L, δ_e⟩) as η → 0, L computed by hand."""
    from graded.morphic import apply_update, first_order_utilities

    torch.manual_seed(9)
    sp = GradedStateSpace({"a": 3, "b": 2})
    es = EdgeSet.explicit(sp, [("a", "b", "x"), ("b", "b", "y"), ("b", "a", "z")])
    n_cls, y = 4, 1
    w = torch.randn(n_cls, sp.total_dim, dtype=F64)
    b = torch.randn(n_cls, dtype=F64)
    z = torch.randn(1, 1, sp.total_dim, dtype=F64)
    cands = [torch.randn(1, 1, sp.dim(e.dest), dtype=F64) for e in es]
    alpha = torch.tensor([[[0.3, 0.5, 0.4]]], dtype=F64)
    fo = first_order_utilities(z, cands, es, sp, w, b, torch.tensor([[y]]))[0, 0]
    predicted = sum(float(alpha[0, 0, i]) * float(fo[i]) for i in range(3))

    def loss(state):
        lg = _logits(w, b, state)
        return math.log(sum(math.exp(v) for v in lg)) - lg[y]

    base = loss(z[0, 0])
    for eta in (1e-3, 1e-4):
        new = apply_update("eta_step", z, cands, alpha, es, sp, eta=eta)
        drop = (base - loss(new[0, 0])) / eta
        assert abs(drop - predicted) <= 50 * eta * (1 + abs(predicted))
