"""PNG plots of the rank comparison, head diversity and attention rollout diagnostics."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from torch import Tensor

from graded.analysis._common import pyplot, save_figure, short_names
from graded.analysis.rank import CONDITIONS, RankComparison

__all__ = ["plot_head_diversity", "plot_rank_comparison", "plot_rollout"]


def plot_rank_comparison(ranks: Mapping[str, RankComparison], out_dir: str | Path, *,
                         filename: str = "attention_rank.png") -> Path:
    """Grouped bars per layer: effective rank and numerical rank of the attention matrices in
    the three conditions (ungraded, graded, graded scale-matched)."""
    if not ranks:
        raise ValueError("plot_rank_comparison needs at least one layer")
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.4))
    names = list(ranks)
    width = 0.8 / len(CONDITIONS)
    for ax, stat in zip(axes, ("effective_rank", "numerical_rank")):
        for c, cond in enumerate(CONDITIONS):
            values = [getattr(ranks[n].attention[cond], stat) for n in names]
            ax.bar([i + c * width for i in range(len(names))], values, width, label=cond)
        ax.set_xticks([i + width for i in range(len(names))])
        ax.set_xticklabels([f"L{i}" for i in range(len(names))], fontsize=7)
        ax.set_title(f"attention {stat.replace('_', ' ')}", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=7)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.12, top=0.9, wspace=0.25)
    return save_figure(fig, out_dir, filename)


def plot_head_diversity(diversity: Mapping[str, Mapping[str, object]], out_dir: str | Path, *,
                        filename: str = "head_diversity.png") -> Path:
    """One heat map per layer of the pairwise JS divergence between heads (a layer of one
    head has no pair, and its title says so instead of a mean)."""
    if not diversity:
        raise ValueError("plot_head_diversity needs at least one layer")
    plt = pyplot()
    n = len(diversity)
    fig, axes = plt.subplots(1, n, figsize=(2.8 * n, 2.8), squeeze=False)
    labels = short_names(list(diversity))
    for ax, d, label in zip(axes[0], diversity.values(), labels, strict=True):
        js: Tensor = d["js_matrix"]
        im = ax.imshow(js.float().cpu().numpy(), cmap="magma", vmin=0.0, vmax=0.6931)
        pairs = f"mean JS {d['mean_js']:.3f}" if js.shape[0] > 1 else "one head: no pair"
        ax.set_title(f"{label}\n{pairs}", fontsize=7)
        ticks = list(range(js.shape[0]))
        ax.set_xticks(ticks)
        ax.set_yticks(ticks)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("head", fontsize=7)
        ax.set_ylabel("head", fontsize=7)
    fig.colorbar(im, ax=list(axes[0]), shrink=0.8, label="JS (nats, max ln 2)")
    return save_figure(fig, out_dir, filename)


def plot_rollout(rollout: Tensor, out_dir: str | Path, *, sample: int = 0,
                 filename: str = "attention_rollout.png") -> Path:
    """Heat map of the rollout matrix R (outputs × inputs) of batch item ``sample``."""
    if (rollout.dim() != 3 or isinstance(sample, bool) or not isinstance(sample, int)
            or not 0 <= sample < rollout.shape[0]):
        raise ValueError(f"rollout must be (B, T, T) with 0 <= sample < B, got shape "
                         f"{tuple(rollout.shape)} and sample={sample!r}")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(3.6, 3.2))
    im = ax.imshow(rollout[sample].float().cpu().numpy(), cmap="viridis")
    ax.set_xlabel("input token")
    ax.set_ylabel("output token")
    ax.set_title("attention rollout", fontsize=9)
    fig.subplots_adjust(left=0.15, right=0.95, bottom=0.15, top=0.9)
    fig.colorbar(im, ax=ax, shrink=0.8)
    return save_figure(fig, out_dir, filename)
