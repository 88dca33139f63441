"""Numerical and effective rank of attention, graded against ungraded, with a scale control.

Claims tested (SPEC "Decisions: Rank"):

- 001 Prop 3.5: grading *always increases* the numerical rank of the attention matrix.
- 000 Prop 5.17 (LGT) and Prop 6.10 (EGT): the singular values of Q M Kᵀ are at most
  max(M) times those of Q Kᵀ, and the effective rank of the attention "may increase or
  decrease".

A grading also changes the *size* of the scores, and a softmax at a different temperature has
a different rank for that reason alone. So each comparison has three conditions built from the
same Q, K (one head, one batch item: one matrix):

- ``ungraded``: S₀ = Q Kᵀ/√d_k;
- ``graded``: S_g = Q M Kᵀ/√d_k (``"scores"``/``"multi_head"``), (QM)(KM)ᵀ/√d_k
  (``"queries_keys"``), or S₀ (``"values"``: the grading does not touch the scores);
- ``graded_matched``: S_g·‖S₀‖_F/‖S_g‖_F, the graded scores rescaled to the Frobenius norm of
  the ungraded ones (norms over the entries the mask keeps), the scale-matched control.

For each, the score matrix and its softmax A (masked; an additive bias such as ALiBi is added
after the rescaling, since the grading does not scale it) get

- numerical rank: #{σ_i > rtol·σ_1} (σ from the SVD; ``rtol=1e-3`` by default, the ε·σ₁ rule
  of notes/seeds_001_004 Part I #1; torch.linalg.matrix_rank's default tolerance is
  max(m, n)·eps·σ₁, which calls almost every softmax matrix full rank);
- effective rank (Roy & Vetterli 2007): exp(H(p)) with p_i = σ_i/Σ_j σ_j and H the Shannon
  entropy in nats; n for the identity of size n, 1 for a rank-1 matrix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from graded.analysis._common import Inputs, eval_mode, run_model, to_float64
from graded.analysis.capture import (
    AttentionCall,
    call_keys,
    capture_attention,
    check_calls,
    real_queries,
)
from graded.attention.functional import safe_softmax
from graded.attention.graded import VARIANTS, grade_heads
from graded.checks import check_finite, check_float, check_int

__all__ = [
    "CONDITIONS",
    "RankComparison",
    "RankStats",
    "attention_rank",
    "compare_attention_rank",
    "effective_rank",
    "graded_score_matrices",
    "numerical_rank",
    "random_rank_study",
    "singular_values",
]

CONDITIONS = ("ungraded", "graded", "graded_matched")
DEFAULT_RTOL = 1e-3


def singular_values(matrices: Tensor) -> Tensor:
    """Singular values (descending) of each matrix in the last two dims, in float64. The
    entries must be finite (an ∞ entry has no SVD: the ranks would read 0, silently)."""
    if matrices.dim() < 2:
        raise ValueError(f"expected matrices (..., m, n), got shape {tuple(matrices.shape)}")
    check_finite(matrices, "matrices")
    return torch.linalg.svdvals(to_float64(matrices))


def numerical_rank(matrices: Tensor, rtol: float = DEFAULT_RTOL) -> Tensor:
    """#{σ_i > rtol·σ_1} for each matrix (0 for a zero matrix), as a float tensor.

    ``rtol`` is any real number in (0, 1): a Python or NumPy one, or a 0-d tensor (not a bool).
    """
    rtol = check_float("rtol", rtol)  # a number (NotANumberError), not NaN or ±inf
    if not 0.0 < rtol < 1.0:  # rtol >= 1: σ_i > rtol·σ_1 holds for no i, every rank 0
        raise ValueError(f"rtol must be a number in (0, 1), got {rtol}")
    s = singular_values(matrices)
    top = s[..., :1]
    return ((s > rtol * top) & (top > 0)).sum(dim=-1).to(torch.float64)


def effective_rank(matrices: Tensor) -> Tensor:
    """Effective rank exp(−Σ p_i ln p_i), p = σ/Σσ (Roy & Vetterli 2007), per matrix.

    A zero matrix gets effective rank 0 (it has no spectrum to spread)."""
    s = singular_values(matrices)
    total = s.sum(dim=-1, keepdim=True)
    p = s / total.clamp(min=torch.finfo(s.dtype).tiny)
    entropy = -torch.special.xlogy(p, p).sum(dim=-1)
    return torch.where(total.squeeze(-1) > 0, entropy.exp(), torch.zeros_like(entropy))


@dataclass
class RankStats:
    """Ranks of a set of matrices: per-matrix tensors and their means."""

    numerical_rank: float
    effective_rank: float
    numerical_rank_per_matrix: Tensor = field(repr=False)
    effective_rank_per_matrix: Tensor = field(repr=False)

    @classmethod
    def of(cls, matrices: Tensor, rtol: float) -> RankStats:
        nr, er = numerical_rank(matrices, rtol), effective_rank(matrices)
        return cls(float(nr.mean()), float(er.mean()), nr, er)


@dataclass
class RankComparison:
    """Ranks of the score matrices and of the attention matrices in the three conditions
    (keys of :data:`CONDITIONS`), and the mean Frobenius norm of each condition's scores
    (``graded_matched`` equals ``ungraded`` by construction)."""

    scores: dict[str, RankStats]
    attention: dict[str, RankStats]
    frobenius: dict[str, float]

    def to_dict(self) -> dict[str, float]:
        """Flat ``{"attention/graded/effective_rank": value, ...}`` of the means."""
        out: dict[str, float] = {}
        for kind, stats in (("scores", self.scores), ("attention", self.attention)):
            for cond, st in stats.items():
                out[f"{kind}/{cond}/numerical_rank"] = st.numerical_rank
                out[f"{kind}/{cond}/effective_rank"] = st.effective_rank
        for cond, v in self.frobenius.items():
            out[f"scores/{cond}/frobenius"] = v
        return out


def _scale_view(scales: Tensor, q: Tensor) -> Tensor:
    """Grading scales (D,) or (H, D) as a view broadcastable to (B, H, T, D)."""
    if scales.dim() == 1:
        if scales.shape[0] != q.shape[-1]:
            raise ValueError(f"scales have {scales.shape[0]} entries, head_dim is "
                             f"{q.shape[-1]}")
        return scales
    if scales.dim() == 2 and scales.shape == (q.shape[1], q.shape[-1]):
        return scales[:, None, :]
    raise ValueError(f"scales must have shape (head_dim,) or (heads, head_dim) = "
                     f"({q.shape[1]}, {q.shape[-1]}), got {tuple(scales.shape)}")


def graded_score_matrices(
    q: Tensor, k: Tensor, scales: Tensor | None, variant: str = "scores", *,
    keep: Tensor | None = None, scale: float | None = None,
) -> dict[str, Tensor]:
    """The ungraded, graded and scale-matched score matrices (B, H, Tq, Tk) in float64.

    ``q``, ``k``: (B, H, T, D) ungraded per-head queries and keys; ``scales``: the diagonal of
    M, (D,) shared or (H, D) per head, or None (no grading: all three are equal);
    ``keep``: boolean mask (True = may attend) broadcastable to the scores, used for the
    Frobenius norms (masked entries are set to 0 in the returned scores);
    ``scale``: the softmax temperature factor, 1/√D by default.
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if q.dim() != 4 or k.dim() != 4 or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must be (B, H, T, D) with equal D, got {tuple(q.shape)} "
                         f"and {tuple(k.shape)}")
    shape = (*torch.broadcast_shapes(q.shape[:2], k.shape[:2]), q.shape[-2], k.shape[-2])
    if keep is not None:
        _check_broadcasts(keep, shape, "keep")
    check_finite(q, "q")
    check_finite(k, "k")
    if scales is not None:
        check_finite(scales, "scales")
    q64, k64 = to_float64(q), to_float64(k)
    scale = (1.0 / math.sqrt(q.shape[-1]) if scale is None
             else check_float("scale", scale, minimum=0, strict_min=True))
    s0 = q64 @ k64.transpose(-2, -1) * scale
    if scales is None:
        sg = s0
    else:
        m = _scale_view(to_float64(scales), q64)
        qg, kg, _ = grade_heads(variant, lambda x: x * m, q64, k64, k64)
        sg = qg @ kg.transpose(-2, -1) * scale
    if keep is not None:
        s0 = s0.masked_fill(~keep, 0.0)
        sg = sg.masked_fill(~keep, 0.0)
    n0 = torch.linalg.matrix_norm(s0, keepdim=True)
    ng = torch.linalg.matrix_norm(sg, keepdim=True)
    factor = torch.where(ng > 0, n0 / ng.clamp(min=torch.finfo(ng.dtype).tiny),
                         torch.ones_like(ng))
    return {"ungraded": s0, "graded": sg, "graded_matched": sg * factor}


def _check_broadcasts(mask: Tensor, shape: tuple[int, ...], name: str) -> None:
    """``mask`` must broadcast to the scores' (B, H, Tq, Tk) ``shape`` (and keep-masks be
    boolean)."""
    if name == "keep" and mask.dtype != torch.bool:
        raise TypeError(f"keep must be a bool mask (True = may attend), got {mask.dtype}")
    try:
        ok = torch.broadcast_shapes(mask.shape, shape) == torch.Size(shape)
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"{name} must broadcast to the scores' shape (B, H, Tq, Tk) = "
                         f"{tuple(shape)}, got shape {tuple(mask.shape)}")


def _softmax(scores: Tensor, keep: Tensor | None, bias: Tensor | None) -> Tensor:
    if bias is not None:
        scores = scores + to_float64(bias)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    return safe_softmax(scores)


def compare_attention_rank(
    q: Tensor, k: Tensor, scales: Tensor | None, variant: str = "scores", *,
    keep: Tensor | None = None, bias: Tensor | None = None, scale: float | None = None,
    rtol: float = DEFAULT_RTOL,
) -> RankComparison:
    """Ranks of scores and softmax attention, ungraded / graded / scale-matched (see the
    module docstring). Arguments as in :func:`graded_score_matrices`; ``bias`` is an additive
    finite bias (e.g. ALiBi) added to all three conditions after the rescaling."""
    scores = graded_score_matrices(q, k, scales, variant, keep=keep, scale=scale)
    if bias is not None:
        _check_broadcasts(bias, tuple(scores["ungraded"].shape), "bias")
    attn = {c: _softmax(s, keep, bias) for c, s in scores.items()}
    return RankComparison(
        scores={c: RankStats.of(s, rtol) for c, s in scores.items()},
        attention={c: RankStats.of(a, rtol) for c, a in attn.items()},
        frobenius={c: float(torch.linalg.matrix_norm(s).mean()) for c, s in scores.items()},
    )


def _call_grading(call: AttentionCall) -> tuple[Tensor | None, str]:
    module = call.module
    grading = getattr(module, "grading", None)
    if grading is None:
        return None, "scores"
    return grading.scales().detach(), module.variant


def _check_score(call: AttentionCall) -> None:
    """A layer with a score other than the scaled dot product is refused; a grade-typed
    attention (no ``score``) has the scaled dot product."""
    from graded.attention.scores import ScaledDotScore

    score = getattr(call.module, "score", None)
    if score is not None and not isinstance(score, ScaledDotScore):
        raise ValueError(
            f"attention_rank supports the scaled dot-product score only; layer {call.name!r} "
            f"uses {type(call.module.score).__name__}"
        )


@torch.no_grad()
def attention_rank(
    model: nn.Module, inputs: Inputs, *, rtol: float = DEFAULT_RTOL,
    **model_kwargs: object,
) -> dict[str, RankComparison]:
    """:func:`compare_attention_rank` for every attention call of ``model`` on ``inputs``,
    keyed as :func:`~graded.analysis.call_keys`.

    Q and K are the layer's own projections (captured before its grading), the scales and
    variant those of its :class:`~graded.attention.graded.GradedMultiheadAttention`; masks
    (causal, padding, ALiBi, a sparse backend's pattern), the softmax scale and the
    grouped-query sharing of keys are the layer's. A plain attention layer gives three equal
    conditions. What "ungraded" removes is the *attention* grading only: the feature gradings
    upstream (input, FFN) have already shaped Q and K; compare with
    :func:`graded.analysis.ungraded_twin` for the whole-model contrast.

    With padded queries (a self-attention call's ``key_padding_mask``, a seq2seq model's
    target padding in its cross-attention), a matrix keeps the rows of its real queries only
    (:func:`~graded.analysis.capture.real_queries`), so a sequence has the same ranks alone
    and padded in a batch. A sequence of padding only has no matrix and is left out; a call
    whose queries are all padding has none at all, and its ranks and norms are NaN, the mean
    of nothing, as in :func:`~graded.analysis.head_diversity`.
    """
    with eval_mode(model), capture_attention(model, need_weights=False) as calls:
        run_model(model, inputs, **model_kwargs)
    check_calls(calls, model, "attention_rank")
    out: dict[str, RankComparison] = {}
    for key, call in zip(call_keys(calls), calls, strict=True):
        _check_score(call)
        scales, variant = _call_grading(call)
        keep, bias = call.keep_and_bias()
        k = call.keys_per_head()  # grouped-query keys, one per query head
        scale = call.scale()  # the layer's temperature
        rows = real_queries(call)
        if rows is None:
            out[key] = compare_attention_rank(call.q, k, scales, variant, keep=keep,
                                              bias=bias, scale=scale, rtol=rtol)
            continue
        shape = (call.q.shape[0], 1, call.q.shape[-2], k.shape[-2])
        parts = []
        for b in range(call.q.shape[0]):  # each sequence's real query rows: one size each
            idx = rows[b].nonzero().squeeze(-1)
            if idx.numel() == 0:  # a sequence of padding only has no matrix
                continue
            parts.append(compare_attention_rank(
                call.q[b : b + 1, :, idx], k[b : b + 1], scales, variant,
                keep=_item_rows(keep, shape, b, idx), bias=_item_rows(bias, shape, b, idx),
                scale=scale, rtol=rtol))
        out[key] = _merge(parts, heads=call.q.shape[1], device=call.q.device)
    return out


def _item_rows(mask: Tensor | None, shape: tuple[int, ...], b: int, idx: Tensor
               ) -> Tensor | None:
    """Batch item ``b``'s query rows ``idx`` of a mask or bias broadcastable to ``shape``
    (B, 1, Tq, Tk): (1, H or 1, len(idx), Tk)."""
    if mask is None:
        return None
    full = mask.broadcast_to(torch.broadcast_shapes(mask.shape, shape))
    return full[b : b + 1, :, idx]


def _merge(parts: list[RankComparison], heads: int, device: torch.device
           ) -> RankComparison:
    """One comparison of the matrices of ``parts`` (batch items with ``heads`` matrices each).
    No part (every sequence is padding): no matrix, per-matrix ranks of shape (0, heads) and
    NaN means, the mean of nothing (``torch.mean`` of an empty tensor)."""

    def stats(kind: str, cond: str) -> RankStats:
        empty = torch.empty(0, heads, dtype=torch.float64, device=device)
        nr = torch.cat([empty, *(getattr(p, kind)[cond].numerical_rank_per_matrix
                                 for p in parts)])
        er = torch.cat([empty, *(getattr(p, kind)[cond].effective_rank_per_matrix
                                 for p in parts)])
        return RankStats(float(nr.mean()), float(er.mean()), nr, er)

    def frobenius(cond: str) -> float:
        return sum(p.frobenius[cond] for p in parts) / len(parts) if parts else float("nan")

    return RankComparison(
        scores={c: stats("scores", c) for c in CONDITIONS},
        attention={c: stats("attention", c) for c in CONDITIONS},
        frobenius={c: frobenius(c) for c in CONDITIONS},
    )


def random_rank_study(
    *, n: int = 64, d_k: int = 16, q_max: float = 2.0, bases: tuple[float, ...] = (1.0, 2.0, 4.0),
    trials: int = 50, seed: int = 0, rtol: float = DEFAULT_RTOL,
) -> dict[float, RankComparison]:
    """The numerical check of notes/seeds_001_004 Part A (001 Prop 3.5): Gaussian Q, K of shape
    (n, d_k) in ``trials`` draws, EGT grades q = linspace(0, q_max, d_k) with scales λ^q for
    each λ in ``bases`` (λ = 1 is the ungraded case), "scores" variant, no mask."""
    n, d_k, trials = (check_int(name, v) for name, v in (("n", n), ("d_k", d_k),
                                                          ("trials", trials)))
    if n < 1 or d_k < 1 or trials < 1:
        raise ValueError(f"need positive n, d_k and trials, got n={n}, d_k={d_k}, "
                         f"trials={trials}")
    seed = check_int("seed", seed)
    q_max = check_float("q_max", q_max)
    # λ^q for λ > 0; λ <= 0 has no real power λ^q at a fractional grade
    bases = tuple(check_float(f"bases[{i}]", lam, minimum=0, strict_min=True)
                  for i, lam in enumerate(bases))
    if not bases:
        raise ValueError("bases must hold at least one base λ (1.0 is the ungraded case)")
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(trials, 1, n, d_k, generator=gen, dtype=torch.float64)
    k = torch.randn(trials, 1, n, d_k, generator=gen, dtype=torch.float64)
    grades = torch.linspace(0.0, q_max, d_k, dtype=torch.float64)
    return {float(lam): compare_attention_rank(q, k, float(lam) ** grades, "scores", rtol=rtol)
            for lam in bases}
