"""Diagnostics of 004 §5.4 for a trained ``MorphicTransformer`` (notes C4).

- utility histograms of ΔL_t(e) before and after training (Thm 5.1 predicts mass moving > 0);
- routing entropy H_t and thresholded support #{α > ε}, and the smallest set holding 90% mass,
  over the edges the router chooses (an always-on block, ``Router.always_on``, is no choice);
- per destination group (the edges e → h of a destination h with ≥ 2 incoming edges, the only
  place where a router chooses *between edges*): agreement of argmax_{e→h} K(ℓ)_e with
  argmax_{e→h} K(ℓ̃)_e, and entropy and support of the in-group distribution
  q_e = K_e / Σ_{e'→h} K_{e'}. A destination with one incoming edge is reported apart: one
  argmax over one edge always "agrees", so counting it would inflate agreement. Given the
  router's ``always_on`` edges it is listed as always-on only when it is one (no choice at all);
  otherwise (with the stay option: the edge or the identity; under a global softmax: against every
  edge) it is listed under ``single_routed``;
- edge ablation: evaluation loss change when edge e is disabled in its router (``layer.disabled``:
  ℓ_e = −∞, so its mass goes to the other options of its group, the stay option included, and a
  group with no option left routes nothing, leaving z^{(h)} on the skip path) under every routing
  mode, with the deterministic evaluation routing (``model(ids)``: context logits, argmax for
  hard / Gumbel / REINFORCE);
- calibration: routing probability against the realised frequency of ΔL > 0 over equal-count
  (adaptive) bins, ECE = Σ_b (n_b / N) |mean K in b − frac{ΔL > 0} in b|, for every edge the
  router chooses (``Router.routed_groups``: with the stay option every edge, a single edge into
  its destination included), both for the utility-augmented ℓ̃ (partly tautological: it contains
  βΔL) and for the context-only ℓ (what evaluation has). Fixed-width bins put a confident router's
  probabilities into the two end bins, and the table says nothing.

Utilities need targets, so the diagnostics read the targets of the given batches; they measure a
model and are no evaluation path. Every utility here is computed on the states of the
context-only routing, the routing evaluation uses.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator
from itertools import pairwise
from pathlib import Path

import torch
from torch import Tensor
from torch.nn import functional as F

from graded.morphic.edges import EdgeSet
from graded.morphic.model import MorphicTransformer
from graded.morphic.objective import check_edge_positions

Batch = tuple[Tensor, Tensor]


@contextlib.contextmanager
def _context_routing(model: MorphicTransformer) -> Iterator[None]:
    saved = [layer.train_routing for layer in model.layers]
    was_training = model.training
    model.eval()
    for layer in model.layers:
        layer.train_routing = "context"
    try:
        yield
    finally:
        for layer, mode in zip(model.layers, saved):
            layer.train_routing = mode
        model.train(was_training)


@torch.no_grad()
def collect(model: MorphicTransformer, batches: Iterable[Batch]) -> list[dict[str, Tensor]]:
    """Per layer, over valid tokens: utilities, ℓ, ℓ̃, α(ℓ) and α(ℓ̃), each (N, |E|), and the
    routing entropy (N,); the layer's ``disabled`` edges have α = 0 and no entropy."""
    per_layer: list[dict[str, list[Tensor]]] = [
        {k: [] for k in ("utilities", "context_logits", "utility_logits", "context_probs",
                         "utility_probs", "entropy")} for _ in model.layers]
    with _context_routing(model):
        for ids, targets in batches:
            _, traces = model.utility_routing(ids, targets)
            valid = targets != model.ignore_index
            for store, layer, tr in zip(per_layer, model.layers, traces):
                r = layer.router
                store["utilities"].append(tr.utilities[valid])
                store["context_logits"].append(tr.context_logits[valid])
                store["utility_logits"].append(tr.utility_logits[valid])
                off = layer.disabled  # edge ablation: off here as in the routing
                store["context_probs"].append(r.probabilities(tr.context_logits, off)[valid])
                store["utility_probs"].append(r.probabilities(tr.utility_logits, off)[valid])
                store["entropy"].append(r.entropy(tr.context_logits, off)[valid])
    return [{k: torch.cat(v) for k, v in store.items()} for store in per_layer]


def routing_sparsity(probs: Tensor, entropy: Tensor, eps: float = 0.05,
                     always_on: Iterable[int] = ()) -> dict[str, float]:
    """Mean entropy, mean #{α > ε}, mean size of the smallest edge set holding 90% of the mass
    on the edges (0 for a token with no mass on any edge, e.g. every edge disabled), over the
    edges the router chooses. An always-on block (``always_on``, the router's: the only option
    of its group, α ≡ 1) is no choice: it is left out, as the routing entropy leaves it out
    (it added 1 to every token's support, and its mass of 1 to the 90% set), and
    ``always_on`` says how many there are."""
    always_on = sorted(set(always_on))
    check_edge_positions(always_on, probs.shape[-1])
    routed = [i for i in range(probs.shape[-1]) if i not in always_on]
    probs = probs[..., routed]
    sorted_p = probs.sort(dim=-1, descending=True).values
    mass = probs.sum(-1, keepdim=True)
    cover = (sorted_p.cumsum(-1) / mass.clamp_min(1e-12) < 0.9).sum(-1) + 1
    cover = torch.where(mass.squeeze(-1) > 0, cover, 0)  # was |E| + 1 there
    return {"entropy": float(entropy.mean()), "support_eps": float((probs > eps).float().sum(-1)
            .mean()), "support_90": float(cover.float().mean()), "eps": eps,
            "always_on": len(always_on)}


def destination_groups(edges: EdgeSet) -> tuple[dict[str, list[int]], dict[str, int]]:
    """Split the destinations of 𝓔: {h: [e → h]} for h with ≥ 2 incoming edges (a choice between
    edges) and {h: e} for h with one incoming edge (always-on, no choice between edges)."""
    choice: dict[str, list[int]] = {}
    single: dict[str, int] = {}
    for h in edges.dests:
        idx = edges.incoming(h)
        if len(idx) >= 2:
            choice[h] = idx
        else:
            single[h] = idx[0]
    return choice, single


def group_routing(
    context_probs: Tensor, utility_probs: Tensor, edges: EdgeSet, eps: float = 0.05,
    always_on: Iterable[int] | None = None,
) -> dict[str, object]:
    """Routing diagnostics per destination group, over N tokens ((N, |E|) kernels K per edge).

    For each h with ≥ 2 incoming edges: ``agreement`` = mean_t 1[argmax_{e→h} K(ℓ_t)_e =
    argmax_{e→h} K(ℓ̃_t)_e]; ``entropy`` = mean_t −Σ_{e→h} q_e log q_e and ``support_eps`` =
    mean_t #{e → h : q_e > ε} of the in-group distribution q_e = K(ℓ_t)_e / Σ_{e'→h} K(ℓ_t)_{e'};
    ``choice_freq`` = how often each edge is the context argmax. The pooled ``agreement`` is the
    mean over all (token, group) pairs, None when no destination has a choice. Destinations with
    one incoming edge are listed with their mean K and not counted: in ``always_on`` when their
    edge is one of ``always_on`` (the router's: no choice at all), in ``single_routed`` otherwise
    (the router still chooses: the edge or the identity with the stay option, or against every
    edge under a global softmax). Without ``always_on`` every single edge is listed as always-on.
    """
    if context_probs.shape != utility_probs.shape or context_probs.shape[-1:] != (len(edges),):
        raise ValueError(f"context_probs {tuple(context_probs.shape)} and utility_probs "
                         f"{tuple(utility_probs.shape)} must both be (N, {len(edges)})")
    if not 0 < eps < 1:
        raise ValueError(f"eps must lie in (0, 1), got {eps}")
    choice, single = destination_groups(edges)
    groups, same_all = [], []
    for h, idx in choice.items():
        pc, pu = context_probs[:, idx].float(), utility_probs[:, idx].float()
        pick_c, pick_u = pc.argmax(-1), pu.argmax(-1)
        same = pick_c == pick_u
        same_all.append(same)
        q = pc / pc.sum(-1, keepdim=True).clamp_min(1e-12)
        ent = -(q * q.clamp_min(1e-30).log()).sum(-1)
        n = max(len(pc), 1)
        groups.append({
            "dest": h, "edges": [edges[i].name for i in idx], "tokens": len(pc),
            "agreement": float(same.float().mean()) if len(pc) else None,
            "entropy": float(ent.mean()) if len(pc) else None,
            "support_eps": float((q > eps).float().sum(-1).mean()) if len(pc) else None,
            "choice_freq": (torch.bincount(pick_c, minlength=len(idx)).float() / n).tolist(),
        })
    pooled = torch.cat(same_all) if same_all else torch.zeros(0, dtype=torch.bool)
    fixed = set(single.values()) if always_on is None else set(always_on)
    listed: dict[str, list[dict[str, object]]] = {"always_on": [], "single_routed": []}
    for h, i in single.items():
        mean = float(context_probs[:, i].float().mean()) if len(context_probs) else None
        listed["always_on" if i in fixed else "single_routed"].append(
            {"dest": h, "edge": edges[i].name, "mean_prob": mean})
    return {"groups": groups, **listed, "eps": eps,
            "agreement": float(pooled.float().mean()) if pooled.numel() else None}


BINNINGS = ("equal_count", "equal_width")


def calibration(probs: Tensor, positive: Tensor, bins: int = 10,
                binning: str = "equal_count") -> dict[str, object]:
    """Reliability table of P(ΔL > 0) against binned routing probability, ECE and monotonicity.

    ``binning="equal_count"`` (default, adaptive): sort the N probabilities and cut them into
    ``bins`` consecutive runs whose sizes differ by at most one (``torch.tensor_split``); ties may
    straddle a cut. ``"equal_width"``: bin b = [b/bins, (b+1)/bins). Empty bins are dropped.
    ``probs`` must be at least one probability in [0, 1] (NaN refused) and ``positive`` the
    0/1 outcomes of the same entries.
    ECE = Σ_b (n_b / N) |mean p in b − mean 1[ΔL > 0] in b|; ``monotone``: the frequencies do not
    decrease from bin to bin.
    """
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins must be a positive int, got {bins!r}")
    if binning not in BINNINGS:
        raise ValueError(f"binning must be one of {BINNINGS}, got {binning!r}")
    p, y = probs.flatten().float(), positive.flatten().float()
    if p.shape != y.shape:
        raise ValueError(f"probs has {p.numel()} entries and positive {y.numel()}; expected "
                         "the same number")
    if p.numel() == 0:  # the ECE of no token read 0.0, a perfect calibration
        raise ValueError("calibration needs at least one routing probability, got none")
    bad = ~((p >= 0) & (p <= 1))  # NaN included
    if bool(bad.any()):
        raise ValueError(f"probs must be probabilities in [0, 1], got {float(p[bad][0])} at "
                         f"entry {int(bad.nonzero()[0])}")
    if not bool(((y == 0) | (y == 1)).all()):
        raise ValueError(f"positive must hold 0/1 (or bool) outcomes 1[ΔL > 0], got "
                         f"{float(y[(y != 0) & (y != 1)][0])}")
    if binning == "equal_count":
        members = [m for m in torch.tensor_split(p.argsort(stable=True), bins) if m.numel()]
    else:
        idx = (p * bins).long().clamp(0, bins - 1)
        members = [m for b in range(bins) if (m := (idx == b).nonzero().flatten()).numel()]
    rows = [{"bin": b, "count": int(m.numel()), "lo": float(p[m].min()), "hi": float(p[m].max()),
             "mean_prob": float(p[m].mean()), "frac_positive": float(y[m].mean())}
            for b, m in enumerate(members)]
    fr = [r["frac_positive"] for r in rows]
    ece = sum(r["count"] * abs(r["mean_prob"] - r["frac_positive"]) for r in rows) / max(len(p), 1)
    return {"bins": rows, "binning": binning,
            "monotone": all(a <= b + 1e-9 for a, b in pairwise(fr)), "ece": ece}


def _scored_batches(model: MorphicTransformer, batches: Iterable[Batch],
                    caller: str) -> list[Batch]:
    """``batches`` as a list, with at least one batch and one target that is not the model's
    ``ignore_index``; ValueError otherwise: every figure would be a mean over no token (a loss
    or an ECE of 0 was reported)."""
    batches = list(batches)
    if not batches:
        raise ValueError(f"{caller} needs at least one (input_ids, targets) batch")
    if not any(bool((targets != model.ignore_index).any()) for _, targets in batches):
        raise ValueError(f"{caller} needs at least one scored token; every target of the "
                         f"{len(batches)} batch(es) is ignore_index = {model.ignore_index}")
    return batches


@torch.no_grad()
def evaluation_loss(model: MorphicTransformer, batches: Iterable[Batch]) -> float:
    """Mean next-token CE with context-only routing (``model(ids)``; targets only score it), in
    eval mode (training-only noise such as ``NoisyCodeTransformer``'s is off); the model's mode
    is restored. No batch, or no target other than ``model.ignore_index``: ValueError."""
    batches = _scored_batches(model, batches, "evaluation_loss")
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    try:
        for ids, targets in batches:
            logits = model(ids)
            n = int((targets != model.ignore_index).sum())
            total += float(F.cross_entropy(logits.flatten(0, 1), targets.flatten(),
                                           ignore_index=model.ignore_index, reduction="sum"))
            count += n
    finally:
        model.train(was_training)
    return total / count


@torch.no_grad()
def edge_ablation(model: MorphicTransformer, batches: Iterable[Batch]) -> list[dict[str, object]]:
    """Loss increase L(e off) − L when each edge e is disabled in its layer's router.

    ``layer.disabled = {e}`` sets ℓ_e = −∞ in ``Router.route``: soft routing renormalises the
    rest of e's group (stay option included); hard, Gumbel and REINFORCE routing, evaluated
    deterministically (argmax, ``stochastic=False``), pick another option of the group, and a
    group with no option left selects nothing (α ≡ 0, z^{(h)} kept by the skip path). Both losses
    use the evaluation routing, ``model(ids)`` in eval mode (``evaluation_loss``).
    """
    batches = list(batches)
    was_training = model.training
    model.eval()
    try:
        base = evaluation_loss(model, batches)
        rows = []
        for li, layer in enumerate(model.layers):
            saved = set(layer.disabled)
            for ei, edge in enumerate(layer.edges):
                layer.disabled = saved | {ei}
                try:
                    loss = evaluation_loss(model, batches)
                finally:
                    layer.disabled = saved
                rows.append({"layer": li, "edge": edge.name, "dest": edge.dest, "loss": loss,
                             "delta": loss - base})
    finally:
        model.train(was_training)
    return rows


def _plot_histograms(after, before, path: Path) -> None:
    from graded.plotting import pyplot, save_figure

    plt = pyplot()

    n = len(after)
    fig, axes = plt.subplots(1, n, figsize=(4 * n, 3), squeeze=False)
    for li, ax in enumerate(axes[0]):
        ax.hist(after[li]["utilities"].flatten().numpy(), bins=40, alpha=0.6, label="after")
        if before is not None:
            ax.hist(before[li]["utilities"].flatten().numpy(), bins=40, alpha=0.6, label="before")
        ax.axvline(0.0, color="k", lw=0.8)
        ax.set_title(f"layer {li}: ΔL")
        ax.legend()
    fig.tight_layout()
    save_figure(fig, path, dpi=100)


def _plot_calibration(cal: list[dict], path: Path) -> None:
    from graded.plotting import pyplot, save_figure

    plt = pyplot()

    n = len(cal)
    fig, axes = plt.subplots(1, n, figsize=(4 * n, 3), squeeze=False)
    for li, ax in enumerate(axes[0]):
        ax.set_title(f"layer {li}")
        if cal[li] is None:
            ax.text(0.5, 0.5, "no routed edge\n(always-on blocks only)", ha="center",
                    va="center", transform=ax.transAxes)
            continue
        for key, label in (("utility", "utility-augmented"), ("context", "context-only")):
            rows = cal[li][key]["bins"]
            ax.plot([r["mean_prob"] for r in rows], [r["frac_positive"] for r in rows], "o-",
                    label=label)
        ax.plot([0, 1], [0, 1], "k:", lw=0.8)
        ax.set_xlabel("routing probability")
        ax.set_ylabel("P(ΔL > 0)")
        ax.legend()
    fig.tight_layout()
    save_figure(fig, path, dpi=100)


def _plot_ablation(rows: list[dict], path: Path) -> None:
    from graded.plotting import pyplot, save_figure

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(max(4, 0.6 * len(rows)), 3))
    ax.bar([f"L{r['layer']}:{r['edge']}" for r in rows], [r["delta"] for r in rows])
    ax.set_ylabel("Δ loss when edge off")
    ax.tick_params(axis="x", rotation=60)
    fig.tight_layout()
    save_figure(fig, path, dpi=100)


def write_report(
    model: MorphicTransformer, batches: Iterable[Batch], out_dir: str | Path, *,
    before: MorphicTransformer | None = None, eps: float = 0.05,
) -> dict[str, object]:
    """Write report.json and PNGs (utility histograms, calibration, ablation) into ``out_dir``.

    ``before`` is the model before training (``train_morphic(..., keep_initial=True)`` keeps
    one); without it the histogram shows the trained model only. Returns the JSON content.
    """
    batches = _scored_batches(model, batches, "write_report")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    after = collect(model, batches)
    prior = collect(before, batches) if before is not None else None
    layers = []
    for li, (stats, layer) in enumerate(zip(after, model.layers)):
        positive = stats["utilities"] > 0
        router = layer.router
        groups = group_routing(stats["context_probs"], stats["utility_probs"], layer.edges, eps,
                               always_on=router.always_on)
        # calibration over every edge the router chooses (against another edge or the identity)
        cols = sorted(i for idx in router.routed_groups for i in idx)
        entry = {
            "edges": [e.name for e in layer.edges],
            "mean_utility": stats["utilities"].mean(0).tolist(),
            "frac_positive_utility": positive.float().mean(0).tolist(),
            "routing": routing_sparsity(stats["context_probs"], stats["entropy"], eps,
                                        always_on=router.always_on),
            "groups": groups,
            "calibration": {"utility": calibration(stats["utility_probs"][:, cols],
                                                   positive[:, cols]),
                            "context": calibration(stats["context_probs"][:, cols],
                                                   positive[:, cols])} if cols else None,
            "context_matches_utility": groups["agreement"],
        }
        if prior is not None:
            entry["mean_utility_before"] = prior[li]["utilities"].mean(0).tolist()
            entry["frac_positive_utility_before"] = (prior[li]["utilities"] > 0).float().mean(
                0).tolist()
        layers.append(entry)
    ablation = edge_ablation(model, batches)
    report = {"layers": layers, "ablation": ablation,
              "evaluation_loss": evaluation_loss(model, batches)}
    _plot_histograms(after, prior, out / "utility_histograms.png")
    _plot_calibration([entry["calibration"] for entry in layers], out / "calibration.png")
    _plot_ablation(ablation, out / "edge_ablation.png")
    (out / "report.json").write_text(json.dumps(report, indent=2))
    return report
