"""The utility-aware objective L_GT and its parts (004 §3.3, §4.2.3, §4.3, Prop 4.8; notes B8).

L_GT = L_LM + λ · mean_t Σ_e ψ(τ_e − ΔL_t(e)) + μ · Ω(α),   ψ(u) = softplus(β u) = log(1 + e^{βu}).

Utilities are detached inside the routing logits ℓ̃ = ℓ + β(ΔL − τ) (Lemma 4.4) and attached in
the penalty (Prop 4.8). Ω ∈ {"entropy_penalty" (+H, sparsity: §3.3 and App. B),
"entropy_bonus" (−H, the Gibbs form of §6.2.4), "group_lasso" (Σ_e ‖K(e)‖₂ over tokens, K the
routing kernel: α for softmax routing, the gate probabilities for logistic gates; 004 does not
define the groups; the norm is divided by √N so it does not grow with the batch; the sum runs
over the edges the router chooses, always-on blocks left out)}.

The penalty's form: SPEC writes Σ_e ψ(τ_e − ΔL_e) over all edges (``penalty="sum"``, the
default); the proof of 004 Prop 4.16 uses the expectation under the routing kernel,
Σ_e p_e ψ(τ_e − ΔL_e) (``penalty="expectation"``, K's probabilities p_e attached, so the
penalty also moves probability away from the edges whose utility is below their threshold).

Per-token terms are averaged over the valid tokens, as 004 §4.7's expectation writes them;
§3.3 (boxed, R(α) = Σ_t Σ_e Ω) and §4.3 sum them over the tokens instead, so their λ and μ are
this module's divided by the number of tokens N (for the group lasso, its μ is this μ divided by
√N).

Threshold sign (notes B8, G4): ∂L_GT/∂τ_e = λβ · mean_t σ(β(τ_e − ΔL_t(e))) ≥ 0. 004 Prop 4.8
prints the opposite sign. Minimising L_GT over τ therefore drives every threshold to its lower
bound, so thresholds are hyperparameters here (a buffer, never a Parameter).
"""

from __future__ import annotations

from collections.abc import Collection

import torch
from torch import Tensor
from torch.nn import functional as F

from graded.checks import check_float

OMEGAS = ("entropy_penalty", "entropy_bonus", "group_lasso", "none")
#: The utility penalty's forms: ψ summed over the edges, or weighted by the kernel's p_e.
PENALTIES = ("sum", "expectation")


def utility_augmented_logits(
    context_logits: Tensor, utilities: Tensor, beta: float, thresholds: Tensor
) -> Tensor:
    """ℓ̃ = ℓ + β(ΔL − τ) with ΔL detached (004 §4.2.3, Lemma 4.4)."""
    beta = check_utility_terms(utilities, thresholds, beta)
    if tuple(getattr(context_logits, "shape", ())) != tuple(utilities.shape):
        raise ValueError(f"context_logits must have the utilities' shape "
                         f"{tuple(utilities.shape)} (one logit per token and edge), got "
                         f"{tuple(getattr(context_logits, 'shape', ()))}")
    return context_logits + beta * (utilities.detach() - thresholds)


def check_utility_terms(utilities: Tensor, thresholds: Tensor | float, beta: float,
                        valid: Tensor | None = None, weights: Tensor | None = None) -> float:
    """β as a float, once it is checked finite and > 0 (NaN compared false with ``beta <= 0``
    and made every term NaN), with a ValueError naming the value and the expected shape for
    thresholds that are not one τ_e per edge, (|E|,) or one shared 0-d value (a (|E|+1,) τ
    broadcast against a (…, 1) utility silently), and for ``valid`` that is not the utilities'
    (B, T), or ``weights`` (the kernel's p_t(e)) that are not the utilities' (B, T, |E|).
    Shapes only: no tensor value is read (a device sync per layer and step)."""
    beta = check_float("beta", beta, minimum=0, strict_min=True)
    n = utilities.shape[-1]
    shape = tuple(getattr(thresholds, "shape", ()))
    if shape not in ((), (n,)):
        raise ValueError(f"thresholds must hold one τ_e per edge, shape ({n},), or one value "
                         f"for all; got shape {shape}")
    if valid is not None and tuple(valid.shape) != tuple(utilities.shape[:-1]):
        raise ValueError(f"valid must mark the utilities' tokens, shape "
                         f"{tuple(utilities.shape[:-1])}; got shape {tuple(valid.shape)}")
    if weights is not None and weights.shape != utilities.shape:
        raise ValueError(f"weights must have the utilities' shape {tuple(utilities.shape)} "
                         f"(one kernel probability per token and edge), got "
                         f"{tuple(weights.shape)}")
    return beta


def utility_penalty(utilities: Tensor, thresholds: Tensor, beta: float, valid: Tensor, *,
                    disabled: Collection[int] = (), weights: Tensor | None = None) -> Tensor:
    """mean over valid tokens of Σ_e ψ(τ_e − ΔL_t(e)), ψ(u) = log(1 + e^{βu}) (004 §3.3);
    with ``weights`` (B, T, |E|), the routing kernel's p_t(e), Σ_e p_t(e) ψ(τ_e − ΔL_t(e)), the
    expectation form of 004 Prop 4.16's proof.

    The sum runs over the edges the router can choose: ``disabled`` edge positions
    (``MorphicLayer.disabled``, edge ablation) are not options and add nothing, nor any
    gradient to their blocks."""
    beta = check_utility_terms(utilities, thresholds, beta, valid, weights)
    per_edge = F.softplus(beta * (thresholds - utilities))  # (B, T, |E|)
    if weights is not None:
        per_edge = per_edge * weights
    return _masked_mean(_drop_edges(per_edge, disabled).sum(-1), valid)


def check_edge_positions(disabled: Collection[int], n: int,
                         names: list[str] | None = None) -> None:
    """``disabled`` (``MorphicLayer.disabled``) must hold edge positions 0..n−1; ValueError
    naming the others (and the layer's edges, given their ``names``)."""
    bad = sorted((i for i in disabled
                  if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n), key=repr)
    if bad:
        edges = f" (the layer has {n} edges: {names})" if names is not None else ""
        raise ValueError(f"disabled edges must be edge positions in [0, {n}){edges}, got {bad}")


def _drop_edges(per_edge: Tensor, disabled: Collection[int]) -> Tensor:
    """``per_edge`` (…, |E|) with the ``disabled`` columns set to 0 (their gradient too)."""
    if not disabled:
        return per_edge
    check_edge_positions(disabled, per_edge.shape[-1])
    return per_edge.index_fill(-1, torch.tensor(sorted(disabled), device=per_edge.device), 0.0)


def routing_regularizer(
    kind: str, *, entropy: Tensor, alpha: Tensor, valid: Tensor,
    always_on: Collection[int] = (),
) -> Tensor:
    """Ω: ``entropy`` is the per-token routing entropy (B, T), ``alpha`` (B, T, |E|) the routing
    kernel K per edge (the layer trace's ``probs``: α itself for softmax routing), over the
    ``valid`` tokens (B, T): ±mean_t H_t for the entropies, :func:`group_lasso` for the group
    lasso (means, not the sums of 004 §3.3: the module's docstring). ``always_on``: the edge
    positions of the router's always-on blocks (``Router.always_on``), which the group lasso
    leaves out as the routing entropy does."""
    if kind == "entropy_penalty":
        return _masked_mean(entropy, valid)
    if kind == "entropy_bonus":
        return -_masked_mean(entropy, valid)
    if kind == "group_lasso":
        return group_lasso(alpha, valid, always_on=always_on)
    if kind == "none":
        return entropy.new_zeros(())
    raise ValueError(f"omega must be one of {OMEGAS}, got {kind!r}")


def group_lasso(alpha: Tensor, valid: Tensor, *, always_on: Collection[int] = ()) -> Tensor:
    """Σ_e √(mean_t K_t(e)²) over the ``valid`` tokens (B, T) of the kernel ``alpha``
    (B, T, |E|): 004 §3.3's group-lasso Ω with one group per edge across the tokens (notes
    B8: 004 does not define the groups), the sum over tokens divided by N (the norm by √N).

    The sum runs over the edges the router chooses. An always-on block (``always_on``, the
    router's: the only option of its group, K ≡ 1) cannot be switched off, so a penalty
    "encouraging selectivity" (§3.3) has nothing to select there: it is left out, as the
    routing entropy leaves it out, instead of adding a constant 1 per such block to Ω."""
    check_edge_positions(always_on, alpha.shape[-1])
    w = valid.unsqueeze(-1).to(alpha.dtype)  # the valid tokens' rows, without indexing
    n = w.sum().clamp(min=1.0)
    norms = ((alpha * w).pow(2).sum((0, 1)) / n + 1e-12).sqrt()  # (|E|,)
    return _drop_edges(norms, always_on).sum()


def reinforce_surrogate(
    log_prob: Tensor, utilities: Tensor, chosen: Tensor, thresholds: Tensor, probs: Tensor,
    valid: Tensor,
) -> Tensor:
    """Score-function term −mean_t (r_t − b_t) log K_θ(sample_t) (§6.3.1, Remark 4.17).

    Per token, with A_e = ΔL_t(e) − τ_e (utilities detached), ``chosen`` the update weights α of
    the sample and ``probs`` the kernel K per edge:

    - reward r = Σ_e chosen_e A_e; baseline b = Σ_e probs_e A_e.
    - Softmax normalisations ("dest", "global"): the sample is one option per group, chosen is
      its one-hot (0 for a sampled stay option, whose utility is 0) and probs its probability, so
      b = E[r], the expected reward under the current kernel.
    - Logistic gates: ``log_prob`` is Σ_e log Bernoulli(o_e; g_e) over the sampled open/closed
      gates o, probs are the gates g_e, and b = Σ_e g_e A_e = E[Σ_e o_e A_e]. With the stay option
      (default) chosen_e = o_e / #{open gates into h} (the open gates of a destination share its
      mass), so r averages the open gates' A_e per destination and b is *not* E[r] (they agree
      when at most one gate per destination is open, e.g. single-edge destinations, and without
      ``stay``, where chosen = o). Either way b does not depend on the sample, so the gradient
      estimate stays unbiased; a b far from E[r] only adds variance.
    """
    reward = (utilities.detach() - thresholds)
    r = (chosen.detach() * reward).sum(-1)
    b = (probs.detach() * reward).sum(-1)
    return -_masked_mean((r - b) * log_prob, valid)


def _masked_mean(x: Tensor, valid: Tensor) -> Tensor:
    w = valid.to(x.dtype)
    return (x * w).sum() / w.sum().clamp(min=1.0)


def lgt_objective(
    lm_loss: Tensor, utilities: Tensor, thresholds: Tensor, *, beta: float, lam: float, mu: float,
    omega: str, entropy: Tensor, alpha: Tensor, valid: Tensor, disabled: Collection[int] = (),
    always_on: Collection[int] = (),
) -> Tensor:
    """L_GT for one layer's routing (the full model sums the penalty terms over layers);
    ``disabled`` edges are left out of the penalty (:func:`utility_penalty`), ``always_on``
    blocks out of the group lasso (:func:`group_lasso`)."""
    penalty = utility_penalty(utilities, thresholds, beta, valid, disabled=disabled)
    reg = routing_regularizer(omega, entropy=entropy, alpha=alpha, valid=valid,
                              always_on=always_on)
    return lm_loss + lam * penalty + mu * reg


def threshold_gradient(utilities: Tensor, thresholds: Tensor, *, beta: float, lam: float,
                       valid: Tensor, disabled: Collection[int] = (),
                       weights: Tensor | None = None) -> Tensor:
    """Closed form ∂L_GT/∂τ_e = λβ mean_t σ(β(τ_e − ΔL_t(e))) ≥ 0 (corrected Prop 4.8); 0 for
    ``disabled`` edges, which the penalty leaves out. With ``weights`` (the expectation form
    of :func:`utility_penalty`) each token's term is weighted by its p_t(e) (held fixed: the
    kernel does not depend on τ)."""
    beta = check_utility_terms(utilities, thresholds, beta, valid, weights)
    lam = check_float("lam", lam, minimum=0)
    s = torch.sigmoid(beta * (thresholds - utilities))
    if weights is not None:
        s = s * weights
    s = _drop_edges(s, disabled)
    s = s * valid.unsqueeze(-1).to(utilities.dtype)
    return lam * beta * s.sum((0, 1)) / valid.to(utilities.dtype).sum().clamp(min=1.0)
