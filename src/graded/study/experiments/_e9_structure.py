"""E9's checks of 004's structural statements (claims 23–28).

- 23, idempotent round trips (Prop 6.6, Cor A.2): P = Enc ∘ Dec of the library's typed tools
  (``OneHotEncoder``, ``ArgmaxDecoder``) and an isometric projection ι π; ‖P²x − Px‖ and the
  exact utility of applying the round trip a second time.
- 24, conjugation invariance (Props 2.9, 3.11, 4.14): ``ConjugatedBlocks`` (004's EGT) on z
  against ``BandedBlocks`` with the same kernels (its LGT) on ẑ = D⁻¹z with readout ŴD; logits,
  exact utilities and the utility penalty of L_GT must agree. Control: a gradewise LayerNorm
  before the readout.
- 25, block identifiability (Lemma 2.11): least-squares recovery of a planted block map from
  block-orthogonal inputs; error against N (predicted ∝ N^{−1/2}). The library has no estimator for
  this; the check is the statement itself on synthetic data.
- 26, parameter and FLOP counts (Props 2.14, 4.3; Cor 2.17): ``BandedBlocks`` parameters against
  |Δ|d², ``ConjugatedBlocks`` against ``BandedBlocks``, and counted FLOPs
  (``torch.utils.flop_counter``) against 2·N·d²·|𝓔| (linear in |Δ| at fixed |G|).
- 27, hard-routing limits (Props 3.8, 4.9): the library's router as T → 0 (one-hot), as β → ∞
  with tied utilities (uniform over the ties), and logistic gates as β → ∞ (indicator, ½ at a tie).
- 28, Gibbs optimum (Prop 6.10): argmax_{α∈Δ} Σα(ΔL − τ) − T Σ α log α found by pairwise
  ascent with bisection (:func:`gibbs_by_pairwise_ascent`) against the library's routing
  softmax((ΔL − τ)/T) (router with ℓ = 0, β = 1, temperature T).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

from graded.morphic.banded import BandedBlocks, ConjugatedBlocks
from graded.morphic.edges import EdgeSet
from graded.morphic.norm import GradewiseNorm
from graded.morphic.objective import utility_augmented_logits, utility_penalty
from graded.morphic.router import Router
from graded.morphic.state import Grade, GradedStateSpace
from graded.morphic.tools import ArgmaxDecoder, OneHotEncoder
from graded.morphic.utilities import exact_utilities
from graded.study.experiments._e_common import least_squares_slope, nan_max

__all__ = [
    "check_conjugation",
    "check_counts",
    "check_gibbs",
    "check_hard_limits",
    "check_identifiability",
    "check_round_trip",
    "gibbs_by_pairwise_ascent",
    "gibbs_objective",
]

DT = torch.float64


# ------------------------------------------------------------------------ claim 23
def check_round_trip(generator: torch.Generator, n: int) -> dict[str, object]:
    """Largest ‖P²x − Px‖ (one-hot round trip and isometric projection) and largest |ΔL| of
    applying the one-hot round trip again to a state that already went through it."""
    space = GradedStateSpace({"g": 6, "h": 3})
    edges = EdgeSet.explicit(space, [("g", "g", "round_trip")])
    dec = ArgmaxDecoder()
    idem, proj_err, second_gain = 0.0, 0.0, 0.0
    for _ in range(n):
        enc = OneHotEncoder(6, scale=0.5 + 3 * float(torch.rand((), generator=generator)))

        def p(x: Tensor, enc: OneHotEncoder = enc) -> Tensor:
            return enc(dec(x)).to(x.dtype)

        x = torch.randn(32, 6, generator=generator, dtype=DT)
        idem = nan_max(idem, float((p(p(x)) - p(x)).abs().max()))
        u, _ = torch.linalg.qr(torch.randn(6, 2, generator=generator, dtype=DT))
        pr = u @ u.T
        proj_err = nan_max(proj_err, float(torch.linalg.matrix_norm(pr @ pr - pr)))
        z = torch.randn(1, 32, 9, generator=generator, dtype=DT)
        z[..., :6] = p(z[..., :6])  # the round trip applied once
        w = torch.randn(5, 9, generator=generator, dtype=DT)
        y = torch.randint(0, 5, (1, 32), generator=generator)
        util = exact_utilities(z, [p(z[..., :6])], edges, space, w, None, y)
        second_gain = nan_max(second_gain, float(util.abs().max()))
    return {"idempotence": idem, "projection": proj_err, "second_gain": second_gain}


# ------------------------------------------------------------------------ claim 24
def check_conjugation(generator: torch.Generator, n: int) -> dict[str, object]:
    """Largest relative difference of logits, exact utilities and the L_GT utility penalty
    between 004's EGT on z and its conjugated LGT on ẑ = D⁻¹z (D_g = λ^{index g} or a random
    positive diagonal); the same with a gradewise LayerNorm before the readout (the control that
    breaks invariance)."""
    d, labels = 3, ("g0", "g1", "g2")
    space = GradedStateSpace([Grade(g, d, i) for i, g in enumerate(labels)])
    worst, worst_ln = 0.0, 0.0
    for i in range(n):
        if i % 2 == 0:
            egt = ConjugatedBlocks(space, [0, 1], base=0.5 + 2 * float(
                torch.rand((), generator=generator)))
        else:
            egt = ConjugatedBlocks(space, [0, 1], scales={
                g: 0.3 + 2 * torch.rand(d, generator=generator) for g in labels})
        lgt = BandedBlocks(space, [0, 1])
        for key in egt.kernels:
            torch.nn.init.normal_(egt.kernels[key].proj.weight, generator=generator)
        lgt.kernels.load_state_dict(egt.kernels.state_dict())
        egt, lgt = egt.double(), lgt.double()
        diag = torch.cat([egt.scale(g) for g in labels]).to(DT)
        z = torch.randn(1, 16, 3 * d, generator=generator, dtype=DT)
        z_hat = z / diag
        w = torch.randn(7, 3 * d, generator=generator, dtype=DT)
        b = torch.randn(7, generator=generator, dtype=DT)
        w_hat = w * diag
        y = torch.randint(0, 7, (1, 16), generator=generator)
        edges = egt.edge_set

        def cands(blocks, state, edges=edges):
            return [blk(space.project(state, e.source)) for blk, e in zip(blocks.blocks(), edges)]

        with torch.no_grad():
            u = exact_utilities(z, cands(egt, z), edges, space, w, b, y)
            u_hat = exact_utilities(z_hat, cands(lgt, z_hat), edges, space, w_hat, b, y)
        logits, logits_hat = z @ w.T + b, z_hat @ w_hat.T + b
        tau, valid = torch.zeros(len(edges), dtype=DT), torch.ones(1, 16, dtype=torch.bool)
        penalty = utility_penalty(u, tau, 5.0, valid)
        penalty_hat = utility_penalty(u_hat, tau, 5.0, valid)
        scale = 1 + float(u.abs().max())
        worst = nan_max(worst, float((u - u_hat).abs().max()) / scale,
                    float((logits - logits_hat).abs().max()) / (1 + float(logits.abs().max())),
                    float((penalty - penalty_hat).abs()) / (1 + float(penalty.abs())))
        norm = GradewiseNorm(space).double()
        with torch.no_grad():
            worst_ln = nan_max(worst_ln, float((norm(z) @ w.T - norm(z_hat) @ w_hat.T).abs()
                                               .max())
                               / (1 + float((norm(z) @ w.T).abs().max())))
    return {"max_rel_diff": worst, "max_rel_diff_layernorm": worst_ln}


# ------------------------------------------------------------------------ claim 25
def block_recovery_errors(generator: torch.Generator, sizes: tuple[int, ...], *, d: int = 3,
                          noise: float = 0.5) -> tuple[list[float], list[float], list[float]]:
    """For each N: Frobenius error of the least-squares on-𝓔 block, the largest off-𝓔 block
    norm, and the difference between the joint and the per-block estimates (Lemma 2.11's
    decoupling), with z = (z_a, z_b) independent Gaussian blocks of random covariance and
    y_h = Φ*_{h←a} z_a + noise, y_k = Φ*_{k←b} z_b + noise (off-𝓔 blocks zero)."""
    g = np.random.default_rng(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
    phi_ha, phi_kb = g.normal(size=(d, d)), g.normal(size=(d, d))
    ca, cb = g.normal(size=(d, d)), g.normal(size=(d, d))
    on, off, decouple = [], [], []
    for n in sizes:
        za = g.normal(size=(n, d)) @ ca.T
        zb = g.normal(size=(n, d)) @ cb.T
        z = np.hstack([za, zb])
        y = np.hstack([za @ phi_ha.T, zb @ phi_kb.T]) + noise * g.normal(size=(n, 2 * d))
        phi = np.linalg.lstsq(z, y, rcond=None)[0].T  # (2d, 2d), rows = outputs
        on.append(float(np.linalg.norm(phi[:d, :d] - phi_ha)))
        off.append(float(max(np.linalg.norm(phi[:d, d:]), np.linalg.norm(phi[d:, :d]))))
        per_block = np.linalg.lstsq(za, y[:, :d], rcond=None)[0].T
        decouple.append(float(np.linalg.norm(per_block - phi[:d, :d])))
    return on, off, decouple


def check_identifiability(generator: torch.Generator, n: int,
                          sizes: tuple[int, ...] = (100, 200, 400, 800, 1600, 3200)
                          ) -> dict[str, object]:
    """Per instance, the slope of log error against log N for the on-𝓔 block and the off-𝓔
    blocks (Lemma 2.11 predicts −1/2)."""
    slopes, off_slopes, decouple_last = [], [], []
    logn = [math.log(s) for s in sizes]
    for _ in range(n):
        on, off, dec = block_recovery_errors(generator, sizes)
        slopes.append(least_squares_slope(logn, [math.log(v) for v in on]))
        off_slopes.append(least_squares_slope(logn, [math.log(v) for v in off]))
        decouple_last.append(dec[-1])
    return {"slopes": slopes, "off_slopes": off_slopes, "decoupling_gap": decouple_last}


# ------------------------------------------------------------------------ claim 26
def check_counts(d: int = 4, tokens: int = 32) -> dict[str, object]:
    """Exact comparisons over |G| ∈ {3, 5, 8} and Δ ∈ {{0}, {0, 1}, {−1, 0, 1}, {−2, −1, 0, 1}}."""
    rows = []
    for n_grades in (3, 5, 8):
        space = GradedStateSpace([Grade(f"g{i}", d, i) for i in range(n_grades)])
        for shifts in ((0,), (0, 1), (-1, 0, 1), (-2, -1, 0, 1)):
            banded = BandedBlocks(space, shifts)
            conj = ConjugatedBlocks(space, shifts, base=2.0)
            params = sum(p.numel() for p in banded.parameters())
            params_conj = sum(p.numel() for p in conj.parameters())
            x = torch.randn(tokens, d)
            with FlopCounterMode(display=False) as counter:
                for blk in banded.blocks():
                    blk(x)
            rows.append({"grades": n_grades, "shifts": len(shifts), "edges": len(banded.edge_set),
                         "params": params, "params_formula": len(shifts) * d * d,
                         "params_conjugated": params_conj, "flops": counter.get_total_flops(),
                         "flops_formula": 2 * tokens * d * d * len(banded.edge_set)})
    exact = all(r["params"] == r["params_formula"] == r["params_conjugated"]
                and r["flops"] == r["flops_formula"] for r in rows)
    return {"rows": rows, "exact": exact}


# ------------------------------------------------------------------------ claim 27
def check_hard_limits(generator: torch.Generator, n: int) -> dict[str, float]:
    """Largest deviation from the limits: one-hot at T = 10⁻³ (unique max, gap ≥ 0.1); uniform
    over ties at β = 10⁴ (two tied best utilities, others ≥ 0.1 below); logistic gates at
    β = 10⁴ (indicator of ΔL > τ, ½ at ΔL = τ)."""
    space = GradedStateSpace({"a": 2, "c": 2})
    edges = EdgeSet.explicit(space, [("a", "c", f"e{i}") for i in range(5)])
    cold = Router(space, edges, stay=False, temperature=1e-3).double()
    warm = Router(space, edges, stay=False, temperature=1.0).double()
    gates = Router(space, edges, stay=False, normalization="logistic").double()
    one_hot, ties, gate = 0.0, 0.0, 0.0
    zero = torch.zeros(5, dtype=DT)
    for _ in range(n):
        ell = torch.rand(5, generator=generator, dtype=DT)
        top = int(ell.argmax())
        ell[top] = torch.cat([ell[:top], ell[top + 1:]]).max() + 0.1
        one_hot = nan_max(one_hot, float((cold.probabilities(ell)
                                          - torch.nn.functional.one_hot(torch.tensor(top), 5))
                                         .abs().max()))
        util = torch.rand(5, generator=generator, dtype=DT) * 0.5
        pair = torch.randperm(5, generator=generator)[:2]
        util[pair] = util.max() + 0.1
        expected = torch.zeros(5, dtype=DT)
        expected[pair] = 0.5
        p = warm.probabilities(utility_augmented_logits(zero, util, 1e4, zero))
        ties = nan_max(ties, float((p - expected).abs().max()))
        tau = torch.rand(5, generator=generator, dtype=DT)
        u = tau + torch.tensor([0.1, -0.1, 0.0, 0.2, -0.3], dtype=DT)
        g = gates.probabilities(utility_augmented_logits(zero, u, 1e4, tau))
        target = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.0], dtype=DT)
        gate = nan_max(gate, float((g - target).abs().max()))
    return {"one_hot": one_hot, "ties_uniform": ties, "logistic_indicator": gate}


# ------------------------------------------------------------------------ claim 28
def gibbs_objective(alpha: np.ndarray, gain: np.ndarray, temperature: float) -> float:
    """Σ α (ΔL − τ) − T Σ α log α (0 log 0 = 0)."""
    a = np.clip(alpha, 0, None)
    ent = np.where(a > 0, a * np.log(np.where(a > 0, a, 1.0)), 0.0).sum()
    return float((a * gain).sum() - temperature * ent)


def _pair_split(diff: float, total: float, temperature: float) -> float:
    """The t ∈ (0, total) with diff − T(log t − log(total − t)) = 0, by bisection (the derivative
    of the objective along the pair's segment; strictly decreasing in t)."""
    lo, hi = 0.0, total
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if diff - temperature * (math.log(mid) - math.log(total - mid)) > 0:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def gibbs_by_pairwise_ascent(gain: np.ndarray, temperature: float, *, iters: int = 5_000,
                             tol: float = 1e-12) -> np.ndarray:
    """Maximise :func:`gibbs_objective` over the simplex by sequential pairwise ascent (the
    maximal-violating-pair rule of SMO): move mass between the two coordinates with the largest
    and smallest marginal gain ΔL_e − τ_e − T(log α_e + 1), solving the one-dimensional
    problem by bisection, until the marginal gains agree within ``tol`` (the KKT condition of an
    interior optimum). No closed form is used."""
    alpha = np.full(gain.size, 1.0 / gain.size)
    for _ in range(iters):
        marginal = gain - temperature * np.log(alpha)
        i, j = int(np.argmax(marginal)), int(np.argmin(marginal))
        if marginal[i] - marginal[j] < tol:
            break
        total = alpha[i] + alpha[j]
        # solve for the coordinate of lower gain: its optimum lies in (0, total/2], where the
        # bisection keeps full relative precision however small it is
        low, high = (i, j) if gain[i] < gain[j] else (j, i)
        alpha[low] = _pair_split(gain[low] - gain[high], total, temperature)
        alpha[high] = total - alpha[low]
    return alpha


def check_gibbs(generator: torch.Generator, n: int) -> dict[str, object]:
    """Largest |α_numerical − α_library| and the objective gap F(α_library) − F(α_numerical)."""
    diffs, gaps = [], []
    for _ in range(n):
        m = int(torch.randint(2, 8, (1,), generator=generator))
        space = GradedStateSpace({"a": 2, "c": 2})
        edges = EdgeSet.explicit(space, [("a", "c", f"e{i}") for i in range(m)])
        temperature = 0.2 + 1.8 * float(torch.rand((), generator=generator))
        router = Router(space, edges, stay=False, normalization="global",
                        temperature=temperature).double()
        util = torch.randn(m, generator=generator, dtype=DT)
        tau = 0.2 * torch.rand(m, generator=generator, dtype=DT)
        lib = router.probabilities(utility_augmented_logits(torch.zeros(m, dtype=DT), util, 1.0,
                                                            tau)).numpy()
        gain = (util - tau).numpy()
        num = gibbs_by_pairwise_ascent(gain, temperature)
        diffs.append(float(np.abs(num - lib).max()))
        gaps.append(gibbs_objective(lib, gain, temperature)
                    - gibbs_objective(num, gain, temperature))
    return {"max_abs_diff": diffs, "objective_gap": gaps}
