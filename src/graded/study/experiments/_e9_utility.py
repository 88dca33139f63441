"""E9's checks of 004's utility statements (claims 9, 10, 18–22) on random readout instances.

An instance is a graded state space of three grades a, b, c (d = 4 each), a linear readout
(W, b) to V classes, states z (N, 12) and targets y, all float64. The library gives the measured
side: exact and first-order utilities (:func:`graded.morphic.utilities.exact_utilities`,
``first_order_utilities``), routing probabilities (:class:`graded.morphic.router.Router`,
:func:`graded.morphic.objective.utility_augmented_logits`) and the η-step update
(:func:`graded.morphic.update.apply_update`). The paper's side (bounds, KL divergences, the
loss L(z) itself) is computed here directly from W, b, z and y.

Each ``check_*`` draws ``n`` instances from ``generator`` and returns a dict with the per-instance
values the finding summarises and the scalar it reports. A statement checked per instance gives
``holds``, one :func:`outcome` per instance: 1.0 where it holds, 0.0 where it does not, NaN where
a quantity it compares could not be measured (a comparison with NaN is False, which would count
an unmeasured instance as a counterexample, or as a success where the statement is negated).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.nn import functional as F

from graded.morphic.edges import EdgeSet
from graded.morphic.objective import utility_augmented_logits
from graded.morphic.router import Router
from graded.morphic.state import GradedStateSpace
from graded.morphic.update import apply_update
from graded.morphic.utilities import exact_utilities, first_order_utilities
from graded.study.experiments._e_common import nan_max

__all__ = [
    "Instance",
    "check_additivity",
    "check_chain",
    "check_first_order",
    "check_kl_identity",
    "check_selectivity",
    "check_usefulness",
    "check_utility_bounds",
    "count_holding",
    "kl_identity_sides",
    "loss_per_token",
    "outcome",
]

DT = torch.float64
D, V = 4, 12
SPACE = GradedStateSpace({"a": D, "b": D, "c": D})
POINTS = 65  # sample points of a segment for the local curvature constants


class Instance:
    """A random readout problem (module doc)."""

    def __init__(self, generator: torch.Generator, n: int = 16, scale: float = 1.0,
                 weight: Tensor | None = None) -> None:
        self.space = SPACE
        self.weight = (weight if weight is not None
                       else torch.randn(V, 3 * D, generator=generator, dtype=DT) * scale)
        self.bias = torch.randn(V, generator=generator, dtype=DT) * 0.1
        self.z = torch.randn(n, 3 * D, generator=generator, dtype=DT)
        self.y = torch.randint(0, V, (n,), generator=generator)

    def slot(self, label: str) -> slice:
        return self.space.slices[label]

    def utilities(self, edges: EdgeSet, candidates: list[Tensor], z: Tensor | None = None,
                  y: Tensor | None = None, kind: str = "exact") -> Tensor:
        """Library utilities (N, |E|) of replacing slot h by each candidate (N, d_h)."""
        z = self.z if z is None else z
        y = self.y if y is None else y
        fn = exact_utilities if kind == "exact" else first_order_utilities
        return fn(z[None], [c[None] for c in candidates], edges, self.space, self.weight,
                  self.bias, y[None], attach="all")[0]


def outcome(ok: Tensor | bool, *compared: Tensor | float) -> list[float]:
    """Per instance: 1.0 where ``ok`` holds, 0.0 where it does not, NaN where any of the
    ``compared`` quantities (broadcastable to ``ok``) is NaN, so the comparison ``ok`` could not
    be made."""
    ok = torch.as_tensor(ok)
    unmeasured = torch.zeros(ok.shape, dtype=torch.bool)
    for value in compared:
        unmeasured = unmeasured | torch.as_tensor(value).isnan().broadcast_to(ok.shape)
    status = torch.where(ok, 1.0, 0.0).to(DT)
    return torch.where(unmeasured, math.nan, status).reshape(-1).tolist()


def count_holding(holds: list[float]) -> int:
    """The number of instances of :func:`outcome` where the statement holds (1.0)."""
    return sum(h == 1.0 for h in holds)


def loss_per_token(weight: Tensor, bias: Tensor, z: Tensor, y: Tensor) -> Tensor:
    """Cross-entropy of the readout per token, computed directly (the paper's L)."""
    return F.cross_entropy(z @ weight.T + bias, y, reduction="none")


def _edges(*triples: tuple[str, str, str]) -> EdgeSet:
    return EdgeSet.explicit(SPACE, list(triples))


# ------------------------------------------------------------------------- claim 9
def check_utility_bounds(generator: torch.Generator, n: int) -> dict[str, object]:
    """004 Thm 5.1 for the gradient-step morphism δ = −a∇_{z^{(h)}}L with a = c/L_global,
    c ∈ (0.1, 1.9), L_global = ‖W_h‖₂²/2:
    a(1 − La/2)‖∇‖² ≤ ΔL ≤ a(1 − μa/2)‖∇‖², with L, μ the largest and smallest Hessian eigenvalue
    of L(z) in slot h over ``POINTS`` points of the segment [z, z + δ] (local constants, a
    sampled estimate of the supremum and infimum). Violations are relative to a‖∇‖²."""
    both, lower_ok, upper_ok, positive, worst = [], [], [], [], -math.inf
    for _ in range(n):
        inst = Instance(generator, n=8)
        s = inst.slot("c")
        w_h = inst.weight[:, s]
        p = torch.softmax(inst.z @ inst.weight.T + inst.bias, -1)
        grad = (p - F.one_hot(inst.y, V).to(DT)) @ w_h  # (N, d)
        c = 0.1 + 1.8 * torch.rand(len(inst.z), generator=generator, dtype=DT)
        # a < 2/L_global (L_global = ‖W_h‖₂²/2 bounds the Hessian everywhere, since
        # diag p − ppᵀ ≼ I/2) keeps the segment short; the bounds use the local L, μ on it
        step = c / (float(torch.linalg.matrix_norm(w_h, ord=2)) ** 2 / 2)
        hi_all, lo_all = [], []
        for t in range(len(inst.z)):
            eig_lo, eig_hi = math.inf, 0.0
            for frac in torch.linspace(0, 1, POINTS, dtype=DT):
                zt = inst.z[t].clone()
                zt[s] = zt[s] - frac * step[t] * grad[t]
                pt = torch.softmax(inst.weight @ zt + inst.bias, -1)
                ev = torch.linalg.eigvalsh(_hessian(w_h, pt))
                eig_lo, eig_hi = min(eig_lo, float(ev[0])), max(eig_hi, float(ev[-1]))
            lo_all.append(eig_lo)
            hi_all.append(eig_hi)
        lip, mu = torch.tensor(hi_all, dtype=DT), torch.tensor(lo_all, dtype=DT)
        cand = inst.z[:, s] - step[:, None] * grad
        util = inst.utilities(_edges(("c", "c", "step")), [cand])[:, 0]
        g2 = (grad * grad).sum(-1)
        lower = step * (1 - lip * step / 2) * g2
        upper = step * (1 - mu * step / 2) * g2
        tol = 1e-10 * (1 + util.abs())
        low_ok, up_ok = util >= lower - tol, util <= upper + tol
        both += outcome(low_ok & up_ok, util, lower, upper)
        lower_ok += low_ok.tolist()
        upper_ok += up_ok.tolist()
        positive += (util > 0).tolist()
        rel = step * g2
        worst = nan_max(worst, *((lower - util) / rel).tolist(), *((util - upper) / rel).tolist())
    return {"holds": both, "lower_ok": lower_ok, "upper_ok": upper_ok, "positive": positive,
            "worst_violation": worst}


def _hessian(w_h: Tensor, p: Tensor) -> Tensor:
    """∇²_{z^{(h)}} CE = W_hᵀ (diag p − ppᵀ) W_h."""
    return w_h.T @ (torch.diag(p) - torch.outer(p, p)) @ w_h


# ------------------------------------------------------------------------ claim 10
def check_selectivity(generator: torch.Generator, n: int) -> dict[str, object]:
    """004 Thm 5.5 (corrected, notes G6): with one useful edge whose utility beats the others by
    γ, the routed mass satisfies 1 − α* ≤ (m − 1)·exp(−(βγ − Δℓ)/T), Δℓ = max_{e≠*} ℓ_e − ℓ_*;
    also the printed 1 − α* ≤ exp(−βγ/(2T)) at ℓ = 0, and the decay rate of −log(1 − α*) per
    unit βγ/T for the tight case (all others exactly γ below, ℓ = 0)."""
    holds, printed, xs, ys = [], [], [], []
    for _ in range(n):
        m = int(torch.randint(2, 7, (1,), generator=generator))
        edges = _edges(*[("a", "c", f"e{i}") for i in range(m)])
        temp = 0.2 + 1.8 * float(torch.rand((), generator=generator, dtype=DT))
        beta = 0.5 + 9.5 * float(torch.rand((), generator=generator, dtype=DT))
        gamma = 0.05 + 1.5 * float(torch.rand((), generator=generator, dtype=DT))
        router = Router(SPACE, edges, stay=False, temperature=temp).double()
        star = int(torch.randint(0, m, (1,), generator=generator))
        util = torch.rand(m, generator=generator, dtype=DT)
        others = torch.cat([util[:star], util[star + 1:]])
        util[star] = others.max() + gamma
        ell = 0.3 * torch.randn(m, generator=generator, dtype=DT)
        tau = torch.zeros(m, dtype=DT)
        alpha = router.probabilities(utility_augmented_logits(ell, util, beta, tau))[star]
        d_ell = float(torch.cat([ell[:star], ell[star + 1:]]).max() - ell[star])
        bound = (m - 1) * math.exp(-(beta * gamma - d_ell) / temp)
        holds += outcome(float(1 - alpha) <= bound * (1 + 1e-12) + 1e-15, float(alpha), bound)
        alpha0 = router.probabilities(utility_augmented_logits(torch.zeros(m, dtype=DT), util,
                                                               beta, tau))[star]
        printed.append(float(1 - alpha0) <= math.exp(-beta * gamma / (2 * temp)) + 1e-15)
        tight = torch.zeros(m, dtype=DT)
        tight[star] = gamma
        a_t = router.probabilities(utility_augmented_logits(torch.zeros(m, dtype=DT), tight,
                                                            beta, tau))[star]
        if float(1 - a_t) > 1e-300 and beta * gamma / temp > 2:
            xs.append(beta * gamma / temp - math.log(m - 1))
            ys.append(-math.log(float(1 - a_t)))
    return {"holds": holds, "printed_holds": printed, "decay_x": xs, "decay_y": ys}


# ------------------------------------------------------------------------ claim 18
def check_first_order(generator: torch.Generator, n: int,
                      etas: tuple[float, ...] = (1e-1, 1e-2, 1e-3, 1e-4)) -> dict[str, object]:
    """004 Thm 4.13: L(z + ηΣα_eδ_e) ≤ L(z) − ηΣα_eΔ_e + o(η). The remainder
    R(η) = [L(z + ηΣαδ) − L(z) + ηΣαΔ]/η (Δ the exact utilities) must have lim sup ≤ 0; the
    z + ηΣαδ state comes from the library's ``eta_step`` update, and R(η) → Σα(Δ − Δ_first_order)
    ≤ 0 by convexity of the cross-entropy in z."""
    edges = _edges(("a", "a", "ea"), ("b", "c", "ebc"), ("c", "b", "ecb"))
    rem_small, decrease, limits = [], [], []
    for _ in range(n):
        inst = Instance(generator, n=8)
        cands = [torch.randn(len(inst.z), D, generator=generator, dtype=DT) for _ in edges]
        alpha = torch.rand(1, len(inst.z), len(edges), generator=generator, dtype=DT) / len(edges)
        util = inst.utilities(edges, cands)
        fo = inst.utilities(edges, cands, kind="first_order")
        base = loss_per_token(inst.weight, inst.bias, inst.z, inst.y)
        rem = []
        for eta in etas:
            z_new = apply_update("eta_step", inst.z[None], [c[None] for c in cands], alpha, edges,
                                 SPACE, eta=eta)[0]
            after = loss_per_token(inst.weight, inst.bias, z_new, inst.y)
            rem.append((after - base + eta * (alpha[0] * util).sum(-1)) / eta)
        rem_small += rem[-1].tolist()
        limits += (alpha[0] * (util - fo)).sum(-1).tolist()
        decrease += outcome(rem[-1] <= 1e-6, rem[-1])
    return {"holds": decrease, "remainder_smallest_eta": rem_small, "limit": limits}


# ------------------------------------------------------------------------ claim 19
def lgt_expectation(p: Tensor, post_loss: Tensor, util: Tensor, tau: Tensor, *, beta: float,
                    lam: float, mu: float) -> Tensor:
    """Expectation-form L_GT (notes B8): Σ p_e L(z_e^+) + λ Σ p_e ψ(τ_e − ΔL_e) + μ H(p)."""
    psi = F.softplus(beta * (tau - util))
    entropy = -(p * p.clamp_min(1e-300).log()).sum(-1)
    return (p * post_loss).sum(-1) + lam * (p * psi).sum(-1) + mu * entropy


def check_usefulness(generator: torch.Generator, n: int, *, beta: float = 5.0, lam: float = 0.1,
                     mu: float = 1e-3, step: float = 1e-5) -> dict[str, object]:
    """004 Prop 4.16: for an edge with ΔL_e > τ_e, raising its kernel probability (its logit θ_e,
    the other logits fixed) lowers the expectation-form L_GT. Central finite differences of
    L_GT(softmax θ) in θ_e, with p from the library's router and ΔL from its exact utilities.
    ``holds`` has one :func:`outcome` per useful (token, edge), and per (token, edge) whose
    utility is NaN (it may be useful: not measured); ``worse_than_average`` one entry per useful
    (token, edge)."""
    edges = _edges(*[("a", "c", f"e{i}") for i in range(4)])
    router = Router(SPACE, edges, stay=False).double()
    holds, below_mean = [], []
    for _ in range(n):
        inst = Instance(generator, n=4)
        cands = [torch.randn(len(inst.z), D, generator=generator, dtype=DT) for _ in edges]
        util = inst.utilities(edges, cands)
        post = loss_per_token(inst.weight, inst.bias, inst.z, inst.y)[:, None] - util
        tau = 0.05 * torch.rand(len(edges), generator=generator, dtype=DT)
        theta = torch.randn(len(inst.z), len(edges), generator=generator, dtype=DT)
        for e in range(len(edges)):
            bump = torch.zeros_like(theta)
            bump[:, e] = step
            up = lgt_expectation(router.probabilities(theta + bump), post, util, tau, beta=beta,
                                 lam=lam, mu=mu)
            down = lgt_expectation(router.probabilities(theta - bump), post, util, tau, beta=beta,
                                   lam=lam, mu=mu)
            deriv = (up - down) / (2 * step)
            useful = util[:, e] > tau[e]
            # an edge whose utility could not be measured may be useful: not measured
            counted = useful | util[:, e].isnan()
            holds += outcome(deriv[counted] < 0, deriv[counted], util[counted, e])
            p = router.probabilities(theta)
            below_mean += (post[useful, e] > (p * post).sum(-1)[useful]).tolist()
    return {"holds": holds, "worse_than_average": below_mean}


# ------------------------------------------------------------------------ claim 20
def kl_identity_sides(inst: Instance, cand: Tensor, target_dist: Tensor) -> tuple[Tensor, Tensor]:
    """(E_{y~P} ΔL via the library's exact utilities, KL(P‖p_z) − KL(P‖p_{z+}) directly) per token
    for the edge c ← a with candidate ``cand`` (N, d) and target distributions P (N, V)."""
    edges = _edges(("a", "c", "e"))
    n = len(inst.z)
    z_rep = inst.z.repeat_interleave(V, 0)
    y_rep = torch.arange(V).repeat(n)
    util = inst.utilities(edges, [cand.repeat_interleave(V, 0)], z=z_rep, y=y_rep)[:, 0]
    expected = (util.view(n, V) * target_dist).sum(-1)
    z_plus = inst.z.clone()
    z_plus[:, inst.slot("c")] = cand
    log_p = torch.log_softmax(inst.z @ inst.weight.T + inst.bias, -1)
    log_q = torch.log_softmax(z_plus @ inst.weight.T + inst.bias, -1)
    log_t = target_dist.clamp_min(1e-300).log()
    kl_p = (target_dist * (log_t - log_p)).sum(-1)
    kl_q = (target_dist * (log_t - log_q)).sum(-1)
    return expected, kl_p - kl_q


def check_kl_identity(generator: torch.Generator, n: int) -> dict[str, object]:
    """004 Lemma 6.7: E_{y~P} ΔL = KL(P‖p_z) − KL(P‖p_{z+}), exactly."""
    diffs = []
    for _ in range(n):
        inst = Instance(generator, n=6)
        cand = torch.randn(len(inst.z), D, generator=generator, dtype=DT)
        target = torch.softmax(2 * torch.randn(len(inst.z), V, generator=generator, dtype=DT), -1)
        lhs, rhs = kl_identity_sides(inst, cand, target)
        diffs += (lhs - rhs).abs().tolist()
    return {"abs_diff": diffs, "max_abs_diff": nan_max(*diffs)}


# ------------------------------------------------------------------------ claim 21
def _orthogonal_readout(generator: torch.Generator) -> Tensor:
    """W whose column spaces for slots a and b are orthogonal (W δ_a ⊥ W δ_b)."""
    q, _ = torch.linalg.qr(torch.randn(V, V, generator=generator, dtype=DT))
    w = torch.randn(V, 3 * D, generator=generator, dtype=DT)
    w[:, 0:D] = q[:, 0:D] @ torch.randn(D, D, generator=generator, dtype=DT)
    w[:, D:2 * D] = q[:, D:2 * D] @ torch.randn(D, D, generator=generator, dtype=DT)
    return w


def additivity_gap(inst: Instance, generator: torch.Generator, scale: float) -> Tensor:
    """|ΔL(S) − ΔL(e_a) − ΔL(e_b)| / (|ΔL(e_a)| + |ΔL(e_b)|) per token for edges into a and b."""
    edges = _edges(("c", "a", "ea"), ("c", "b", "eb"))
    deltas = [scale * torch.randn(len(inst.z), D, generator=generator, dtype=DT) for _ in edges]
    cands = [inst.z[:, inst.slot(e.dest)] + d for e, d in zip(edges, deltas)]
    util = inst.utilities(edges, cands)
    z_joint = inst.z.clone()
    for e, c in zip(edges, cands):
        z_joint[:, inst.slot(e.dest)] = c
    joint = (loss_per_token(inst.weight, inst.bias, inst.z, inst.y)
             - loss_per_token(inst.weight, inst.bias, z_joint, inst.y))
    return (joint - util.sum(-1)).abs() / util.abs().sum(-1).clamp_min(1e-300)


def check_additivity(generator: torch.Generator, n: int, scale: float = 0.5) -> dict[str, object]:
    """004 Prop 6.11: with Wδ_e mutually orthogonal, ΔL(S) = Σ_e ΔL(e). Relative additivity gap
    under orthogonality, and for the control (a generic W)."""
    ortho, control = [], []
    for _ in range(n):
        inst = Instance(generator, n=16, weight=_orthogonal_readout(generator))
        ortho.append(float(additivity_gap(inst, generator, scale).median()))
        inst_c = Instance(generator, n=16)
        control.append(float(additivity_gap(inst_c, generator, scale).median()))
    return {"orthogonal": ortho, "control": control}


# ------------------------------------------------------------------------ claim 22
def chain_terms(inst: Instance, a1: Tensor, a2: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(Δ(Π), Δ(φ₁) + Δ(φ₂), ‖z^{(a)}‖‖z^{(b)}‖) per token for the path b ← a (φ₁ = A₁), then
    c ← b (φ₂ = A₂), replacement updates; step utilities are taken at the original state."""
    edges = _edges(("a", "b", "p1"), ("b", "c", "p2"))
    za, zb = inst.z[:, inst.slot("a")], inst.z[:, inst.slot("b")]
    util = inst.utilities(edges, [za @ a1.T, zb @ a2.T])
    z_path = inst.z.clone()
    z_path[:, inst.slot("b")] = za @ a1.T
    z_path[:, inst.slot("c")] = z_path[:, inst.slot("b")] @ a2.T
    path = (loss_per_token(inst.weight, inst.bias, inst.z, inst.y)
            - loss_per_token(inst.weight, inst.bias, z_path, inst.y))
    return path, util.sum(-1), za.norm(dim=-1) * zb.norm(dim=-1)


def check_chain(generator: torch.Generator, n: int) -> dict[str, object]:
    """004 §6.3.3: Δ(Π) ≥ Σ_i Δ(φ_i) − C Σ_{i<j}‖z^{(g_{i−1})}‖‖z^{(g_{j−1})}‖, with the constant
    read here as C = ‖W‖₂²·max(1, ‖A₁‖₂, ‖A₂‖₂)² (the paper leaves C unspecified: "depending on
    the head's Lipschitz constant and the block norms"). Generic states, and states with
    z^{(b)} = 0, where the cross term vanishes and no finite C can cover a positive shortfall
    (``zero_b_holds``: the :func:`outcome` of "no shortfall" on those states)."""
    holds, zero_b_holds, zero_b_shortfall, c_needed = [], [], [], []
    for _ in range(n):
        inst = Instance(generator, n=16)
        a1 = torch.randn(D, D, generator=generator, dtype=DT) / math.sqrt(D)
        a2 = torch.randn(D, D, generator=generator, dtype=DT) / math.sqrt(D)
        c = float(torch.linalg.matrix_norm(inst.weight, ord=2)) ** 2 * max(
            1.0, float(torch.linalg.matrix_norm(a1, ord=2)),
            float(torch.linalg.matrix_norm(a2, ord=2))) ** 2
        path, total, cross = chain_terms(inst, a1, a2)
        holds += outcome(path >= total - c * cross - 1e-12, path, total, cross)
        c_needed += ((total - path) / cross).clamp_min(0).tolist()
        inst.z[:, inst.slot("b")] = 0.0
        path0, total0, _ = chain_terms(inst, a1, a2)
        zero_b_holds += outcome(total0 - path0 <= 1e-12, total0, path0)
        zero_b_shortfall += (total0 - path0 > 1e-12).tolist()
    return {"holds": holds, "zero_b_holds": zero_b_holds, "zero_b_shortfall": zero_b_shortfall,
            "c_needed": c_needed}
