"""Attention maps, attention entropy and attention rollout (002 §3.3; Abnar & Zuidema 2020).

- :func:`attention_maps` returns every layer's (B, H, Tq, Tk) softmax weights of a model.
- :func:`plot_attention_maps` draws them as a layers × heads grid (one PNG).
- :func:`attention_entropy` is the Shannon entropy −Σ_j A_ij ln A_ij of each query row (nats):
  0 for a one-hot row, ln n for a uniform row over n keys.
- :func:`attention_rollout` is the rollout of Abnar & Zuidema (2020), "Quantifying Attention
  Flow in Transformers": with the residual stream modelled as an identity,
  Â_l = ½ A_l + ½ I (rows renormalised) and R = Â_L ⋯ Â_2 Â_1, so R_ij is how much output
  token i draws on input token j through all layers. Heads are fused first (mean by default,
  as in the paper; ``"max"``/``"min"`` are common variants).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from graded.analysis._common import (
    Inputs,
    check_distributions,
    check_weights,
    eval_mode,
    pyplot,
    run_model,
    save_figure,
    short_names,
    widened,
)
from graded.analysis.capture import call_keys, capture_attention, check_calls
from graded.checks import check_finite_nonnegative

__all__ = ["attention_entropy", "attention_maps", "attention_rollout", "plot_attention_maps"]

HEAD_FUSIONS = ("mean", "max", "min")


@torch.no_grad()
def attention_maps(model: nn.Module, inputs: Inputs, **model_kwargs: object) -> dict[str, Tensor]:
    """The softmax weights (B, H, Tq, Tk) of every attention layer during one forward pass,
    keyed by the attention module's qualified name in call order (:func:`call_keys`: a module
    called twice gives ``name`` and ``name#1``). Runs in eval mode, so dropout is off.

    Reads a graded transformer's attention layers and a morphic model's grade-typed attention
    blocks (:func:`~graded.analysis.capture_attention`); a model that makes no attention call
    on ``inputs`` is refused (ValueError naming its class), not answered with ``{}``."""
    with eval_mode(model), capture_attention(model) as calls:
        run_model(model, inputs, **model_kwargs)
    check_calls(calls, model, "attention_maps")
    return {key: call.weights for key, call in zip(call_keys(calls), calls, strict=True)}


def plot_attention_maps(
    maps: dict[str, Tensor] | Sequence[Tensor], out_dir: str | Path, *, sample: int = 0,
    filename: str = "attention_maps.png", title: str = "",
) -> Path:
    """A grid of heat maps, one row per layer and one column per head, for batch item
    ``sample``. Returns the PNG path."""
    items = list(maps.items()) if isinstance(maps, dict) else [
        (f"layer {i}", w) for i, w in enumerate(maps)]
    if not items:
        raise ValueError("plot_attention_maps needs at least one attention map, got none")
    for name, w in items:
        check_weights(w, f"attention map {name!r}")
        if w.dim() != 4:
            raise ValueError(f"attention map {name!r} must be (B, H, Tq, Tk), got "
                             f"{tuple(w.shape)}")
        if isinstance(sample, bool) or not isinstance(sample, int) or not 0 <= sample < w.shape[0]:
            raise ValueError(f"sample must be an int in [0, {w.shape[0]}) (an item of the "
                             f"batch of {w.shape[0]}), got sample={sample!r}")
    heads = max(w.shape[1] for _, w in items)
    labels = short_names([name for name, _ in items])
    plt = pyplot()
    fig, axes = plt.subplots(len(items), heads, figsize=(2.2 * heads, 2.2 * len(items)),
                             squeeze=False)
    for row, ((_, w), label) in enumerate(zip(items, labels, strict=True)):
        for h in range(heads):
            ax = axes[row][h]
            if h < w.shape[1]:
                ax.imshow(w[sample, h].detach().float().cpu().numpy(), cmap="viridis",
                          vmin=0.0, vmax=1.0, interpolation="nearest")
                ax.set_title(f"{label} h{h}", fontsize=7)
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle(title or "attention maps (rows: queries, columns: keys)", fontsize=9)
    fig.subplots_adjust(left=0.02, right=0.98, bottom=0.02, top=0.9, wspace=0.1, hspace=0.3)
    return save_figure(fig, out_dir, filename)


def attention_entropy(weights: Tensor) -> Tensor:
    """Entropy −Σ_j A_ij ln A_ij of each row (nats), shape ``weights.shape[:-1]``.

    Each row must be a distribution (summing to 1 within 1e-4, 1e-2 for float16/bfloat16), or
    all zero (a fully masked query, entropy 0).
    Zero weights (masked keys) contribute 0 (the convention 0·ln 0 = 0, via ``xlogy``).
    float16/bfloat16 weights are summed in float32 (the result is float32).
    """
    check_weights(weights)
    check_finite_nonnegative(weights, "attention weights")
    check_distributions(weights, "attention weights")
    w = widened(weights)
    return -torch.special.xlogy(w, w).sum(dim=-1)


def attention_rollout(
    maps: dict[str, Tensor] | Sequence[Tensor], *, head_fusion: str = "mean",
    residual: bool = True,
) -> Tensor:
    """Attention rollout R = Â_L ⋯ Â_1 (Abnar & Zuidema 2020), shape (B, T, T).

    ``maps`` are self-attention weights (B, H, T, T) in layer order (the dict order of
    :func:`attention_maps` for a single-stack model). ``residual`` adds the identity for the
    skip connection: Â = ½A + ½I with rows renormalised (for rows of a softmax this is
    already stochastic; renormalising also covers fully masked rows). float16/bfloat16 maps
    are multiplied in float32 (the result is float32).
    """
    if head_fusion not in HEAD_FUSIONS:
        raise ValueError(f"head_fusion must be one of {HEAD_FUSIONS}, got {head_fusion!r}")
    if not isinstance(residual, bool):
        raise TypeError(f"residual must be True or False, got {residual!r}")
    layers = list(maps.values()) if isinstance(maps, dict) else list(maps)
    if not layers:
        raise ValueError("attention_rollout needs at least one layer of attention maps")
    result: Tensor | None = None
    for i, w in enumerate(layers):
        check_weights(w, f"layer {i} weights")
        if w.dim() != 4 or w.shape[-1] != w.shape[-2]:
            raise ValueError(
                f"layer {i} weights must be square self-attention (B, H, T, T), got "
                f"{tuple(w.shape)}"
            )
        check_finite_nonnegative(w, f"layer {i} weights")
        fused = {"mean": lambda a: a.mean(dim=1), "max": lambda a: a.amax(dim=1),
                 "min": lambda a: a.amin(dim=1)}[head_fusion](widened(w))
        if residual:
            eye = torch.eye(fused.shape[-1], dtype=fused.dtype, device=fused.device)
            fused = 0.5 * fused + 0.5 * eye
            fused = fused / fused.sum(dim=-1, keepdim=True).clamp(min=1e-12)
        if result is not None and result.shape != fused.shape:
            raise ValueError(f"layer {i} has shape {tuple(fused.shape)}, the previous "
                             f"layers {tuple(result.shape)}")
        result = fused if result is None else fused @ result
    return result
