"""L_GT of 004 §3.3 and its bounds (Prop 4.10) against a hand computation in float64."""

import math

import torch

from graded.morphic import lgt_objective

F64 = torch.float64


def test_l_gt_equals_the_boxed_formula_of_section_3_3_and_obeys_prop_4_10():
    """004 §3.3: L_GT = L_LM + λ (1/|B|) Σ_t Σ_e ψ(τ_e − ΔL_t(e)) + μ Ω(α), ψ(u) = log(1 + e^{βu}),
    Ω the entropy penalty (+H, sparsity). Prop 4.10: L_GT ≥ L_LM + λ mean_t Σ_e max{0, β(τ − ΔL)}
    + μΩ, and (softplus ≤ relu + log 2) L_GT ≤ that + λ|𝓔| log 2, the paper's C_β per token."""
    gen = torch.Generator().manual_seed(0)
    util = torch.randn(2, 3, 4, generator=gen, dtype=F64)
    tau = torch.rand(4, generator=gen, dtype=F64)
    probs = torch.softmax(torch.randn(2, 3, 4, generator=gen, dtype=F64), -1)
    entropy = -(probs * probs.log()).sum(-1)
    valid = torch.tensor([[True, True, False], [True, False, True]])
    lm, beta, lam, mu = 1.25, 3.0, 0.4, 0.2
    got = float(lgt_objective(torch.tensor(lm, dtype=F64), util, tau, beta=beta, lam=lam, mu=mu,
                              omega="entropy_penalty", entropy=entropy, alpha=probs, valid=valid))
    rows = [(b, t) for b in range(2) for t in range(3) if valid[b, t]]
    pen = sum(math.log1p(math.exp(beta * (float(tau[e]) - float(util[b, t, e]))))
              for b, t in rows for e in range(4)) / len(rows)
    hinge = sum(max(0.0, beta * (float(tau[e]) - float(util[b, t, e])))
                for b, t in rows for e in range(4)) / len(rows)
    ent = sum(-sum(float(p) * math.log(float(p)) for p in probs[b, t]) for b, t in rows) / len(rows)
    assert math.isclose(got, lm + lam * pen + mu * ent, rel_tol=1e-12)
    low = lm + lam * hinge + mu * ent
    assert low <= got <= low + lam * 4 * math.log(2) + 1e-12
    bonus = float(lgt_objective(torch.tensor(lm, dtype=F64), util, tau, beta=beta, lam=lam,
                                mu=mu, omega="entropy_bonus", entropy=entropy, alpha=probs,
                                valid=valid))
    assert math.isclose(bonus, lm + lam * pen - mu * ent, rel_tol=1e-12)  # §6.2.4: −H
