"""Scaled dot-product attention: the fused kernel and an explicit path that returns weights.

Implements 002 Eq. (2.5) / 003 (2.5), ``softmax(Q Kᵀ / √d_k) V``, on tensors laid out as
(batch, heads, length, head_dim). Masks follow the convention of
:func:`torch.nn.functional.scaled_dot_product_attention`: a boolean mask is ``True`` where a
query *may* attend, a floating mask is added to the scores.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from graded.checks import check_bool

__all__ = [
    "DEFAULT_MAX_EXPLICIT_ELEMENTS",
    "attention",
    "causal_mask",
    "check_explicit_size",
    "merge_masks",
    "safe_softmax",
    "to_additive_mask",
]

# The explicit path materialises a (B, H, Tq, Tk) tensor; beyond this many elements it refuses.
DEFAULT_MAX_EXPLICIT_ELEMENTS = 2**31


def causal_mask(t_q: int, t_k: int, device: torch.device | str | None = None) -> Tensor:
    """Boolean (t_q, t_k) mask, ``True`` where query ``i`` may attend to key ``j``.

    Aligned bottom-right: query ``i`` sits at absolute position ``t_k - t_q + i``, as when the
    keys include a KV cache of earlier tokens.
    """
    if t_q < 0 or t_k < 0:
        raise ValueError(f"causal_mask needs non-negative lengths, got t_q={t_q}, t_k={t_k}")
    rows = torch.arange(t_q, device=device).unsqueeze(1) + (t_k - t_q)
    cols = torch.arange(t_k, device=device).unsqueeze(0)
    return cols <= rows


def to_additive_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """Convert a keep-mask (bool, ``True`` = attend) or an additive mask to an additive one."""
    if mask.dtype == torch.bool:
        out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
        return out.masked_fill(~mask, float("-inf"))
    return mask.to(dtype)


def merge_masks(a: Tensor | None, b: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """Combine two masks (either may be None). Two boolean keep-masks stay boolean (AND);
    otherwise both become additive and are summed."""
    if a is None:
        return b
    if b is None:
        return a
    if a.dtype == torch.bool and b.dtype == torch.bool:
        return a & b
    return to_additive_mask(a, dtype) + to_additive_mask(b, dtype)


def check_explicit_size(shape: tuple[int, ...], dtype: torch.dtype, limit: int) -> None:
    """Refuse to materialise an attention matrix with more than ``limit`` elements."""
    n = math.prod(shape)
    if n > limit:
        nbytes = n * torch.empty((), dtype=dtype).element_size()
        raise MemoryError(
            f"explicit attention would materialise a weight tensor of shape {tuple(shape)} "
            f"({n} elements, {nbytes / 2**30:.2f} GiB in {dtype}), above the limit of {limit} "
            "elements; use need_weights=False (fused kernel) or the 'chunked' backend, or raise "
            "max_explicit_elements"
        )


def safe_softmax(scores: Tensor) -> Tensor:
    """Softmax over the last dimension that gives zeros, not NaN, for a row whose scores are
    all -inf (a fully masked query), as the fused kernel does. Such a row is softmaxed as a
    row of zeros before its weights are zeroed, so its gradient is zero too, not NaN (the
    softmax of an all -inf row is NaN, and its backward would spread NaN to every input and
    parameter through 0·NaN)."""
    dead = torch.isneginf(scores).all(dim=-1, keepdim=True)
    weights = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1)
    return weights.masked_fill(dead, 0.0)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None = None,
    *,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    need_weights: bool = False,
    max_explicit_elements: int = DEFAULT_MAX_EXPLICIT_ELEMENTS,
) -> tuple[Tensor, Tensor | None]:
    """Attention over (B, H, Tq, D) queries and (B, H, Tk, D) keys/values.

    Returns ``(out, weights)``: ``out`` is (B, H, Tq, Dv); ``weights`` is the (B, H, Tq, Tk)
    softmax matrix (after dropout, as ``torch.nn.MultiheadAttention`` returns it) when
    ``need_weights`` is set, else ``None`` and the fused kernel is used. The weights' path
    computes half-precision inputs in float32 and rounds the output and weights once, as the
    fused kernels accumulate and the ``explicit`` backend computes.
    ``is_causal`` applies :func:`causal_mask` (bottom-right aligned) on top of ``attn_mask``.
    ``is_causal`` and ``need_weights`` take True or False only (a NumPy bool too), ``TypeError``
    otherwise: read truthily, ``need_weights="no"`` would materialise the weights and
    ``is_causal="false"`` mask the future. The check of a Python bool is one type comparison
    (a constant under ``torch.compile``).
    """
    if type(is_causal) is not bool:  # the bool itself passes on one comparison
        is_causal = check_bool("attention: is_causal", is_causal)
    if type(need_weights) is not bool:
        need_weights = check_bool("attention: need_weights", need_weights)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            "attention expects q, k, v of shape (batch, heads, length, head_dim); got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    t_q, t_k = q.shape[-2], k.shape[-2]
    if is_causal:
        if attn_mask is None and t_q == t_k and not need_weights:
            return F.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale
            ), None
        attn_mask = merge_masks(attn_mask, causal_mask(t_q, t_k, q.device), q.dtype)
    if not need_weights:
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale
        )
        return out, None
    from graded.attention.backends.softmax import compute_dtype  # the backends import this

    batch_heads = (max(q.shape[0], k.shape[0]), max(q.shape[1], k.shape[1]))
    check_explicit_size((*batch_heads, t_q, t_k), q.dtype, max_explicit_elements)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    acc = compute_dtype(q.dtype)  # half precision: scores, softmax and sum in float32
    scores = torch.matmul(q.to(acc), k.to(acc).transpose(-2, -1)) * scale
    if attn_mask is not None:
        scores = scores + to_additive_mask(attn_mask, scores.dtype)
    weights = safe_softmax(scores)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return torch.matmul(weights, v.to(acc)).to(v.dtype), weights.to(v.dtype)
