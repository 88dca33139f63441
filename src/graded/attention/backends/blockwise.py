"""The block-gather kernel that the sparse patterns share.

The sequence is cut into blocks of ``block`` positions; each query block attends to a short
list of key blocks (its *selection*), gathered into one contiguous tensor, with an element-wise
keep rule on top (a window, causality, padding). This is the "blockified" computation of BigBird
(Zaheer et al. 2020, App. D) and Longformer (Beltagy et al. 2020, §3.1): time
O(B·H·T·s·block·D) and memory O(B·H·T·s·block) for ``s`` selected blocks per query block, never
O(T²).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from graded.attention.backends.base import compute_dtype, softmax_rows
from graded.checks import check_bool

__all__ = ["KeepRule", "gathered_block_attention", "pad_to_multiple"]

# keep(q_pos (nQ, block, 1), k_pos (nQ, 1, L)) -> bool broadcastable to (nQ, block, L)
KeepRule = Callable[[Tensor, Tensor], Tensor]


def pad_to_multiple(x: Tensor, multiple: int, dim: int = 2) -> Tensor:
    """Zero-pad ``x`` along ``dim`` (a non-negative axis) up to a multiple of ``multiple``."""
    extra = (-x.shape[dim]) % multiple
    if extra == 0:
        return x
    pad = [0, 0] * (x.dim() - dim - 1) + [0, extra]
    return F.pad(x, pad)


def gathered_block_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_blocks: Tensor,
    block: int,
    scale: float,
    *,
    query_blocks: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    is_causal: bool = False,
    keep_rule: KeepRule | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """Attention of selected query blocks over their selected key blocks.

    ``q, k, v`` are (B, H, T, ·) self-attention tensors. ``key_blocks`` is (nQ, s) long: for the
    n-th computed query block, the indices of its key blocks (``-1`` = unused slot); the indices
    in a row must be distinct. ``query_blocks`` (nQ,) names the query blocks to compute (default
    all, in order). Returns (B, H, nQ·block, Dv); rows of padded positions past T are included
    and must be dropped by the caller. Half-precision inputs are computed in float32 and the
    output rounded once (:func:`~.base.compute_dtype`). ``is_causal``: True or False only.
    """
    if type(is_causal) is not bool:  # the bool itself passes on one comparison
        is_causal = check_bool("gathered_block_attention: is_causal", is_causal)
    dtype = v.dtype
    q, k, v = (x.to(compute_dtype(dtype)) for x in (q, k, v))
    b, h, t, d = q.shape
    n_blocks = -(-t // block)
    q, k, v = (pad_to_multiple(x, block) for x in (q, k, v))
    if query_blocks is None:
        query_blocks = torch.arange(n_blocks, device=q.device)
    n_q, s = key_blocks.shape
    qb = q.view(b, h, n_blocks, block, d)[:, :, query_blocks]
    idx = key_blocks.clamp(min=0)
    kg = k.view(b, h, n_blocks, block, d)[:, :, idx].reshape(b, h, n_q, s * block, d)
    vg = v.view(b, h, n_blocks, block, -1)[:, :, idx].reshape(b, h, n_q, s * block, -1)
    scores = torch.matmul(qb, kg.transpose(-2, -1)) * scale  # (B, H, nQ, block, s·block)

    offsets = torch.arange(block, device=q.device)
    k_pos = (idx[:, :, None] * block + offsets).reshape(n_q, 1, s * block)
    q_pos = (query_blocks[:, None] * block + offsets).reshape(n_q, block, 1)
    used = (key_blocks >= 0)[:, :, None].expand(n_q, s, block).reshape(n_q, 1, s * block)
    keep = used & (k_pos < t)
    if is_causal:
        keep = keep & (k_pos <= q_pos)
    if keep_rule is not None:
        keep = keep & keep_rule(q_pos, k_pos)
    keep = keep[None, None]
    if key_padding_mask is not None:
        pad = F.pad(key_padding_mask, (0, n_blocks * block - t), value=True)
        keep = keep & ~pad[:, k_pos.reshape(-1)].view(b, 1, n_q, 1, s * block)
    weights = softmax_rows(scores, keep)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    out = torch.matmul(weights, vg)  # (B, H, nQ, block, Dv)
    return out.reshape(b, h, n_q * block, -1).to(dtype)
