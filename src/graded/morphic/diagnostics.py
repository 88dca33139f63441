"""Diagnostics of 004 §5.4 for a trained ``MorphicTransformer`` (notes C4).

- utility histograms of ΔL_t(e) before and after training (Thm 5.1 predicts mass moving > 0);
- routing entropy H_t and thresholded support #{α > ε}, and the smallest set holding 90% mass;
- edge ablation: evaluation loss change when α(e) ≡ 0 (the remaining edges of the group are
  renormalised), with context-only routing;
- calibration: binned routing probability against the realised frequency of ΔL > 0, both for the
  utility-augmented ℓ̃ (partly tautological: it contains βΔL) and for the context-only ℓ (what
  evaluation has).

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

from graded.morphic.model import MorphicTransformer

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
    """Per layer, over valid tokens: utilities, ℓ, ℓ̃, α(ℓ) and α(ℓ̃), each (N, |E|)."""
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
                store["context_probs"].append(r.probabilities(tr.context_logits)[valid])
                store["utility_probs"].append(r.probabilities(tr.utility_logits)[valid])
                store["entropy"].append(r.entropy(tr.context_logits)[valid])
    return [{k: torch.cat(v) for k, v in store.items()} for store in per_layer]


def routing_sparsity(probs: Tensor, entropy: Tensor, eps: float = 0.05) -> dict[str, float]:
    """Mean entropy, mean #{α > ε}, mean size of the smallest edge set holding 90% of the mass."""
    sorted_p = probs.sort(dim=-1, descending=True).values
    total = probs.sum(-1, keepdim=True).clamp_min(1e-12)
    cover = (sorted_p.cumsum(-1) / total < 0.9).sum(-1) + 1
    return {"entropy": float(entropy.mean()), "support_eps": float((probs > eps).float().sum(-1)
            .mean()), "support_90": float(cover.float().mean()), "eps": eps}


def calibration(probs: Tensor, positive: Tensor, bins: int = 10) -> dict[str, object]:
    """Reliability table of P(ΔL > 0) against binned routing probability, plus monotonicity."""
    p, y = probs.flatten().float(), positive.flatten().float()
    idx = (p * bins).long().clamp(max=bins - 1)
    rows = []
    for b in range(bins):
        m = idx == b
        if m.any():
            rows.append({"bin": b, "count": int(m.sum()), "mean_prob": float(p[m].mean()),
                         "frac_positive": float(y[m].mean())})
    fr = [r["frac_positive"] for r in rows]
    ece = sum(r["count"] * abs(r["mean_prob"] - r["frac_positive"]) for r in rows) / max(len(p), 1)
    return {"bins": rows, "monotone": all(a <= b + 1e-9 for a, b in pairwise(fr)),
            "ece": ece}


@torch.no_grad()
def evaluation_loss(model: MorphicTransformer, batches: Iterable[Batch]) -> float:
    """Mean next-token CE with context-only routing (``model(ids)``; targets only score it)."""
    total, count = 0.0, 0
    for ids, targets in batches:
        logits = model(ids)
        n = int((targets != model.ignore_index).sum())
        total += float(F.cross_entropy(logits.flatten(0, 1), targets.flatten(),
                                       ignore_index=model.ignore_index, reduction="sum"))
        count += n
    return total / max(count, 1)


@torch.no_grad()
def edge_ablation(model: MorphicTransformer, batches: Iterable[Batch]) -> list[dict[str, float]]:
    """Loss increase when each edge is forced off (α(e) ≡ 0, group renormalised)."""
    batches = list(batches)
    was_training = model.training
    model.eval()
    base = evaluation_loss(model, batches)
    rows = []
    for li, layer in enumerate(model.layers):
        for ei, edge in enumerate(layer.edges):
            layer.disabled = {ei}
            try:
                loss = evaluation_loss(model, batches)
            finally:
                layer.disabled = set()
            rows.append({"layer": li, "edge": edge.name, "loss": loss, "delta": loss - base})
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
        for key, label in (("utility", "utility-augmented"), ("context", "context-only")):
            rows = cal[li][key]["bins"]
            ax.plot([r["mean_prob"] for r in rows], [r["frac_positive"] for r in rows], "o-",
                    label=label)
        ax.plot([0, 1], [0, 1], "k:", lw=0.8)
        ax.set_xlabel("routing probability")
        ax.set_ylabel("P(ΔL > 0)")
        ax.set_title(f"layer {li}")
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
    batches = list(batches)
    if not batches:
        raise ValueError("write_report needs at least one (input_ids, targets) batch")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    after = collect(model, batches)
    prior = collect(before, batches) if before is not None else None
    layers = []
    for li, (stats, layer) in enumerate(zip(after, model.layers)):
        positive = stats["utilities"] > 0
        entry = {
            "edges": [e.name for e in layer.edges],
            "mean_utility": stats["utilities"].mean(0).tolist(),
            "frac_positive_utility": positive.float().mean(0).tolist(),
            "routing": routing_sparsity(stats["context_probs"], stats["entropy"], eps),
            "calibration": {"utility": calibration(stats["utility_probs"], positive),
                            "context": calibration(stats["context_probs"], positive)},
            "context_matches_utility": float((stats["context_probs"].argmax(-1)
                                              == stats["utility_probs"].argmax(-1)).float().mean()),
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
