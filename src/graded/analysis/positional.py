"""Positional bias of graded positions: attention mass on early keys against α.

Claims tested: 000 Prop 5.28 (LGT, Pe' = (1 − α t)·Pe "biases earlier positions"), 000 Prop
6.20 (EGT, Pe' = λ^{−α t}·Pe: score to an earlier key larger than to a later one) and 001 Prop
4.4. The paper's argument is about the raw inner products of the position vectors; whether
the trained attention actually puts more mass on early keys as α grows is what is measured
here.

:func:`early_attention_mass` is, for each query i that can see beyond the first k keys
(i ≥ k), the mass Σ_{j<k} A_ij its attention puts on keys 0..k−1, averaged over batch, heads
and those queries. Its reference is the uniform attention over the keys a query may see:
k/T without a causal mask, the mean over i ≥ k of k/(i+1) with one. In a padded batch the
positions count each row's real tokens, as the model's do (a left-padded row's first real
token is at position 0): the early keys are a row's first k real tokens.
:func:`positional_bias_sweep` re-runs a graded model with the position grading set to each α
(all other weights fixed) and reports the early mass per layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from graded.analysis._common import (
    Inputs,
    check_weights,
    eval_mode,
    input_length,
    input_lengths,
    pyplot,
    run_model,
    save_figure,
    widened,
)
from graded.analysis.capture import (
    AttentionCall,
    call_keys,
    capture_attention,
    real_queries,
)
from graded.checks import check_bool, check_float, check_int
from graded.grading import ExponentialGrading
from graded.positional import position_start
from graded.transformer.blocks import AttentionSublayer
from graded.transformer.graded import GradedPositions, feature_grading
from graded.transformer.models import InputEmbedding

__all__ = ["early_attention_mass", "plot_positional_bias", "positional_bias_sweep",
           "uniform_early_mass"]


def _check_k(k: int, t_q: int) -> None:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be a positive int (number of early key positions), got {k!r}")
    if t_q < 2:
        raise ValueError(f"the early attention mass needs sequences of at least 2 positions "
                         f"(a query beyond the first k >= 1 keys), got a sequence of {t_q}")
    if k >= t_q:
        raise ValueError(f"k={k} leaves no query beyond the first k positions in a sequence "
                         f"of {t_q}; use 1 <= k < {t_q}")


def check_sweep_k(k: int, inputs: Inputs) -> None:
    """:func:`_check_k` for the sweep over ``inputs``, before any forward pass: the queries of
    each self-attention layer are the positions of one input sequence (the source or the
    target of a seq2seq model), so k must leave a later query in the shortest."""
    _check_k(k, min(input_lengths(inputs)))


def early_attention_mass(weights: Tensor, k: int, queries: Tensor | None = None) -> float:
    """Mean over (batch, heads, queries i ≥ k) of Σ_{j<k} A_ij for self-attention weights
    (..., T, T). With ``queries`` (B, T) bool, True at the real tokens of a padded batch, and
    weights (B, H, T, T), the positions count real tokens only, as the model's positions skip
    left padding (:func:`graded.transformer.models.default_positions`): the early keys j are
    each row's first k real tokens and the queries i its real tokens after them, so a
    sequence has the same mass alone, right-padded and left-padded. A mask with no query at
    position ≥ k gives NaN, the mean of nothing (as ``torch.mean`` of an empty tensor)."""
    check_weights(weights, min_dim=2)
    t_q = weights.shape[-2]
    if weights.shape[-1] != t_q:
        raise ValueError(f"early_attention_mass needs square self-attention weights (..., T, T), "
                         f"got shape {tuple(weights.shape)}")
    _check_k(k, t_q)
    if queries is None:
        return float(widened(weights)[..., k:, :k].sum(dim=-1).mean())  # bf16 summed in f32
    if weights.dim() != 4 or queries.dtype != torch.bool or tuple(queries.shape) != (
            weights.shape[0], t_q):
        raise ValueError(f"queries must be a bool (B, T) = ({weights.shape[0]}, {t_q}) mask "
                         f"with weights (B, H, T, T), got {queries.dtype} "
                         f"{tuple(queries.shape)} and weights {tuple(weights.shape)}")
    w = widened(weights)
    early, late = _early_keys_and_late_queries(queries, k)
    mass = (w * early[:, None, None, :].to(w.dtype)).sum(dim=-1)  # (B, H, T)
    m = late[:, None, :].to(mass.dtype).expand_as(mass)
    return float((mass * m).sum() / m.sum())  # no query: 0 / 0, NaN


def _early_keys_and_late_queries(real: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """(B, T) bool masks of a padded batch whose real tokens are ``real``: the first k real
    tokens of each row (the early keys) and its real tokens after them (the queries i ≥ k),
    positions counted over real tokens as :func:`~graded.transformer.models.default_positions`
    counts them."""
    position = real.long().cumsum(dim=1) - 1
    return real & (position < k), real & (position >= k)


def uniform_early_mass(length: int, k: int, *, causal: bool) -> float:
    """:func:`early_attention_mass` of uniform attention over the visible keys of a sequence
    of ``length`` (an int) positions, with a causal mask when ``causal`` (True or False)."""
    length = check_int("length", length)
    causal = check_bool("causal", causal)
    _check_k(k, length)
    if not causal:
        return k / length
    return sum(k / (i + 1) for i in range(k, length)) / (length - k)


def _uniform_reference(call: AttentionCall, k: int, queries: Tensor | None = None) -> float:
    """:func:`early_attention_mass` of uniform attention over the keys each query of ``call``
    may see: its causal mask, its padding and a sparse backend's pattern (a query with no
    key counts 0, as its attention does); over the ``queries`` (B, Tq) only, when given (NaN
    when they hold no query i ≥ k, as :func:`early_attention_mass`)."""
    t_q, t_k = call.q.shape[-2], call.k.shape[-2]
    _check_k(k, t_q)
    keep, _ = call.keep_and_bias()
    if keep is None:
        return uniform_early_mass(t_q, k, causal=False)
    keep = keep.broadcast_to(call.q.shape[0], call.q.shape[1], t_q, t_k)
    if queries is None:
        keep = keep[..., k:, :]
        seen = keep.sum(dim=-1).to(torch.float64)
        early = keep[..., :k].sum(dim=-1).to(torch.float64)
        return float((early / seen.clamp(min=1.0)).mean())
    early_keys, late = _early_keys_and_late_queries(queries, k)  # as early_attention_mass
    seen = keep.sum(dim=-1).to(torch.float64)  # (B, H, Tq)
    early = (keep & early_keys[:, None, None, :]).sum(dim=-1).to(torch.float64)
    share = early / seen.clamp(min=1.0)
    m = late[:, None, :].to(share.dtype).expand_as(share)
    return float((share * m).sum() / m.sum())  # no query: 0 / 0, NaN


def check_sweep_alphas(model: nn.Module, alphas: Sequence[float], length: int) -> list[float]:
    """``alphas`` as floats, each a finite α ≥ 0 (named by its index when it is not one), at
    least one; for an LGT model each inside 1 − α t > 0 up to the last of ``length``
    positions (t = ``length`` − 1, ``length`` with the 1-indexed ``sinusoidal1``): checked
    before any forward pass, as the position grading each α installs checks it."""
    alphas = [check_float(f"alphas[{i}]", a) for i, a in enumerate(alphas)]
    negative = next((i for i, a in enumerate(alphas) if a < 0), None)
    if negative is not None:  # λ^{−α t}, (1 − α t) with α < 0: a bias toward later positions
        raise ValueError(f"alphas[{negative}] must be >= 0, got {alphas[negative]}")
    if not alphas:
        raise ValueError("alphas must hold at least one value of α")
    if model.config.grading == "linear":
        last = length - 1 + position_start(model.config.positional)
        bad = [a for a in alphas if a * last >= 1.0]
        if bad:
            raise ValueError(f"alphas {bad} leave the LGT domain: the position factor "
                             f"1 - alpha*t must stay positive up to the last position "
                             f"t = {last}; need alpha < {1 / max(last, 1):.4g}")
    return alphas


def sweep_length(inputs: Inputs, model_kwargs: dict[str, object]) -> int:
    """The number of positions the sweep's graded positions cover: the input length, or the
    largest position given (``positions=...``) plus one."""
    length = input_length(inputs)
    given = model_kwargs.get("positions")
    if isinstance(given, torch.Tensor) and given.numel():
        length = max(length, int(given.max()) + 1)
    return length


def _embeddings(model: nn.Module) -> list[InputEmbedding]:
    return [m for m in model.modules() if isinstance(m, InputEmbedding)]


def _cross_attention(model: nn.Module) -> set[int]:
    """Ids of the model's cross-attention modules (their weights are not self-attention)."""
    return {id(m.attn) for m in model.modules() if isinstance(m, AttentionSublayer) and m.cross}


@torch.no_grad()
def positional_bias_sweep(
    model: nn.Module, inputs: Inputs, alphas: Sequence[float], *, k: int = 1,
    **model_kwargs: object,
) -> dict[str, object]:
    """Early attention mass of every self-attention layer for each α in ``alphas``.

    The model must be graded (``config.grading``) with additive positions (sinusoidal or
    learned): each α installs the position grading of 000 Def 5.21 / §6 ((1 − α t) for LGT,
    λ^{−α t} for EGT with the model's feature base λ) on every input embedding for one
    forward pass; the model's own position grading is restored afterwards. For LGT every α
    must keep 1 − α t > 0 over the input length.

    Returns ``{"alphas": [...], "k": k, "layers": {name: [mass per α]}, "mean": [mass per α
    averaged over layers], "uniform": the uniform reference averaged over layers,
    "uniform_by_layer": {name: reference}}``. The reference is uniform attention over the keys
    each query may see: its causal mask, its ``key_padding_mask`` and a sparse backend's
    pattern. Both the masses and the reference average over the real queries only (a padded
    query's row is left out: :func:`~graded.analysis.capture.real_queries`).
    """
    config = getattr(model, "config", None)
    kind = getattr(config, "grading", None)
    if kind is None:
        raise ValueError("positional_bias_sweep needs a graded model (config.grading set); "
                         "the graded positions of 000 Def 5.21 are undefined otherwise")
    embeds = _embeddings(model)
    if not embeds or any(e.positions is None for e in embeds):
        raise ValueError(f"positional_bias_sweep needs additive positions (sinusoidal or "
                         f"learned), got positional={config.positional!r}")
    # a list, or a 1-D tensor or array, of numbers; each named by its index when it is not one
    length = sweep_length(inputs, model_kwargs)
    alphas = check_sweep_alphas(model, alphas, length)
    check_sweep_k(k, inputs)
    feature = feature_grading(model)
    base = feature if isinstance(feature, ExponentialGrading) else None
    if kind == "exponential" and base is None:
        raise ValueError("an EGT model without a feature grading has no base λ for its "
                         "positions")
    saved = [e.position_grading for e in embeds]
    cross = _cross_attention(model)
    layers: dict[str, list[float]] = {}
    uniform: dict[str, float] = {}
    try:
        with eval_mode(model):
            for alpha in alphas:
                with capture_attention(model) as calls:
                    for e in embeds:
                        e.position_grading = GradedPositions(
                            kind, float(alpha), length, base,
                            start=position_start(config.positional))
                    run_model(model, inputs, **model_kwargs)
                for key, call in zip(call_keys(calls), calls, strict=True):
                    if id(call.module) in cross:
                        continue
                    rows = real_queries(call)  # None: every query
                    layers.setdefault(key, []).append(
                        early_attention_mass(call.weights, k, rows))
                    uniform[key] = _uniform_reference(call, k, rows)
    finally:
        for e, pg in zip(embeds, saved):
            e.position_grading = pg
    n = len(alphas)
    mean = [sum(v[i] for v in layers.values()) / len(layers) for i in range(n)]
    return {"alphas": [float(a) for a in alphas], "k": k, "layers": layers, "mean": mean,
            "uniform": sum(uniform.values()) / len(uniform), "uniform_by_layer": uniform}


def plot_positional_bias(sweep: dict[str, object], out_dir: str | Path, *,
                         filename: str = "positional_bias.png") -> Path:
    """Early attention mass against α, one line per layer, with the uniform reference."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.0, 3.4))
    alphas = sweep["alphas"]
    for name, masses in sweep["layers"].items():
        ax.plot(alphas, masses, marker="o", label=name)
    ax.axhline(sweep["uniform"], color="grey", ls="--", lw=1, label="uniform")
    ax.set_xlabel("position grading α")
    ax.set_ylabel(f"attention mass on first {sweep['k']} keys")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    fig.subplots_adjust(left=0.15, right=0.97, bottom=0.15, top=0.95)
    return save_figure(fig, out_dir, filename)
