"""Head diversity: how different the heads' attention maps and outputs are.

Claims tested: 000 Prop 5.31 (LGT) and Prop 6.23 (EGT), "distinct grading tuples q_h in the
graded multi-head variant enhance representational capacity", and 001 Prop 4.7 (the
concatenated heads "span a richer subspace"). Two measurements:

- pairwise Jensen–Shannon divergence between heads' attention rows,
  JS(p, r) = ½ KL(p ‖ m) + ½ KL(r ‖ m), m = ½(p + r), in nats (0 for identical rows, at most
  ln 2), averaged over batch and query rows; :func:`head_diversity` reports the (H, H) matrix
  per layer and the mean over pairs h ≠ h' (NaN for one head, which has no pair);
- the numerical and effective rank (:mod:`graded.analysis.rank`) of the concatenated head
  outputs [head_1 | ... | head_H] ∈ R^{T × H·d_v} of each sequence, before the output
  projection.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from graded.analysis._common import (
    Inputs,
    check_distributions,
    check_weights,
    eval_mode,
    run_model,
    widened,
)
from graded.analysis.capture import (
    call_keys,
    capture_attention,
    check_calls,
    real_queries,
)
from graded.analysis.rank import DEFAULT_RTOL, effective_rank, numerical_rank
from graded.checks import check_finite_nonnegative

__all__ = ["concatenated_head_rank", "head_diversity", "js_divergence", "pairwise_head_js"]


def js_divergence(p: Tensor, r: Tensor) -> Tensor:
    """Jensen–Shannon divergence (nats) between distributions along the last dimension.

    Rows must be distributions (non-negative, summing to 1 within 1e-4, 1e-2 for
    float16/bfloat16); a row of all zeros (a fully masked query) on both sides gives 0.
    float16/bfloat16 rows are summed in float32 (the result is float32).
    """
    check_weights(p, "p")
    check_weights(r, "r")
    if p.shape[-1] != r.shape[-1]:
        raise ValueError(f"p and r must be distributions over the same keys (last dimension), "
                         f"got {p.shape[-1]} and {r.shape[-1]} keys")
    check_finite_nonnegative(p, "p")
    check_finite_nonnegative(r, "r")
    check_distributions(p, "p")
    check_distributions(r, "r")
    return _js(widened(p), widened(r))


def _js(p: Tensor, r: Tensor) -> Tensor:
    """:func:`js_divergence` of rows already checked (at the tolerance of their own dtype)."""
    m = 0.5 * (p + r)
    kl_p = torch.special.xlogy(p, p) - torch.special.xlogy(p, m)
    kl_r = torch.special.xlogy(r, r) - torch.special.xlogy(r, m)
    return 0.5 * (kl_p.sum(dim=-1) + kl_r.sum(dim=-1))


def _check_queries(queries: Tensor | None, b: int, t: int) -> None:
    if queries is not None and (queries.dtype != torch.bool or tuple(queries.shape) != (b, t)):
        raise ValueError(f"queries must be a bool (B, Tq) = ({b}, {t}) mask of the query rows "
                         f"to use, got {queries.dtype} {tuple(queries.shape)}")


def pairwise_head_js(weights: Tensor, queries: Tensor | None = None) -> Tensor:
    """(H, H) matrix of JS divergences between heads of (B, H, Tq, Tk) weights, averaged over
    batch and query rows (those where ``queries`` (B, Tq) is True, when given; a mask that
    selects no row gives NaN, the mean of nothing, as ``torch.mean`` of an empty tensor)."""
    check_weights(weights)
    if weights.dim() != 4:
        raise ValueError(f"weights must be (B, H, Tq, Tk), got {tuple(weights.shape)}")
    _check_queries(queries, weights.shape[0], weights.shape[2])
    # checked in their own dtype: float16 rows sum to 1 within 1e-2, not float64's 1e-4
    check_finite_nonnegative(weights, "weights")
    check_distributions(weights, "weights")
    w = weights.detach().to(torch.float64)
    js = _js(w[:, :, None], w[:, None, :])  # (B, H, H, Tq)
    if queries is None:
        return js.mean(dim=(0, 3))
    m = queries.to(js.dtype)[:, None, None, :]
    return (js * m).sum(dim=(0, 3)) / m.sum()  # no row: 0 / 0, NaN


def concatenated_head_rank(heads: Tensor, rtol: float = DEFAULT_RTOL,
                           queries: Tensor | None = None) -> dict[str, float]:
    """Mean numerical and effective rank over the batch of the (T, H·d_v) concatenation of
    per-head outputs ``heads`` (B, H, T, d_v); with ``queries`` (B, T) bool, of each item's
    rows where it is True (an item without such rows is left out; NaN, the mean of nothing,
    when every item is, as :func:`pairwise_head_js`)."""
    if heads.dim() != 4:
        raise ValueError(f"heads must be (B, H, T, d_v), got {tuple(heads.shape)}")
    _check_queries(queries, heads.shape[0], heads.shape[2])
    concat = heads.transpose(1, 2).flatten(-2)  # (B, T, H·d_v)
    if queries is None:
        return {"numerical_rank": float(numerical_rank(concat, rtol).mean()),
                "effective_rank": float(effective_rank(concat).mean())}
    items = [concat[b, queries[b]] for b in range(concat.shape[0])  # one size each
             if bool(queries[b].any())]
    if not items:  # padding only: no matrix to take the rank of
        return {"numerical_rank": float("nan"), "effective_rank": float("nan")}
    return {"numerical_rank": float(torch.stack([numerical_rank(x, rtol) for x in items]).mean()),
            "effective_rank": float(torch.stack([effective_rank(x) for x in items]).mean())}


@torch.no_grad()
def head_diversity(model: nn.Module, inputs: Inputs, *, rtol: float = DEFAULT_RTOL,
                   **model_kwargs: object) -> dict[str, dict[str, object]]:
    """Per attention call (keyed as :func:`~graded.analysis.call_keys`): ``js_matrix``
    (H, H), ``mean_js`` over pairs h ≠ h' (NaN for a layer of one head: the mean over no
    pair), and the ``numerical_rank`` / ``effective_rank`` of the concatenated head outputs.
    With padded queries (self-attention with a ``key_padding_mask``, cross-attention with the
    target's), a call uses the rows of its real
    queries only (:func:`~graded.analysis.capture.real_queries`); a call whose queries are all
    padding has no row to measure, and its numbers are NaN."""
    with eval_mode(model), capture_attention(model) as calls:
        run_model(model, inputs, **model_kwargs)
    check_calls(calls, model, "head_diversity")
    out: dict[str, dict[str, object]] = {}
    for key, call in zip(call_keys(calls), calls, strict=True):
        rows = real_queries(call)
        js = pairwise_head_js(call.weights, rows)
        h = js.shape[0]
        off = js.sum() / (h * (h - 1)) if h > 1 else js.new_full((), float("nan"))
        out[key] = {"js_matrix": js, "mean_js": float(off),
                    **concatenated_head_rank(call.heads, rtol, rows)}
    return out
