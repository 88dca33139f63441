"""The fixed pattern of the Sparse Transformer: attention inside a block of ``l`` positions plus
the last ``c`` positions ("summary" positions) of every block.

Exact softmax attention restricted to the pattern's keep-set (seed_002 B.4; Child et al. 2019,
§4.3), computed without forming the T×T matrix: block-local scores beside the scores against
the gathered summary keys, under one softmax.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from graded.attention.backends.base import (
    AttentionBackend,
    Capabilities,
    PatternDecoding,
    check_scale,
    default_scale,
    softmax_rows,
)
from graded.attention.backends.blockwise import pad_to_multiple
from graded.attention.backends.flex import FlexKernel

__all__ = ["SparseFixedBackend", "fixed_pattern_attention"]


def fixed_pattern_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    block: int,
    summary: int,
    scale: float,
    *,
    key_padding_mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
) -> Tensor:
    """Query ``i`` attends to the keys of its own block (``⌊j/block⌋ = ⌊i/block⌋``) and to the
    summary keys ``j mod block >= block - summary`` of every block (causal: ``j <= i`` on top).

    With n = ⌈T/block⌉ blocks each query scores ``block`` local keys and the n·summary summary
    keys of the other blocks (its own block's are among the local ones, so none counts twice),
    one softmax over both: time O(T·(block + T·summary/block)·D), memory
    O(T·(block + T·summary/block)) for the scores and weights.
    """
    b, h, t, d = q.shape
    dv = v.shape[-1]
    n = -(-t // block)
    first = block - summary  # offset of the first summary position in a block
    qb = pad_to_multiple(q, block).view(b, h, n, block, d)
    kb = pad_to_multiple(k, block).view(b, h, n, block, d)
    vb = pad_to_multiple(v, block).view(b, h, n, block, dv)
    ks = kb[:, :, :, first:].reshape(b, h, 1, n * summary, d)  # summary keys of every block
    vs = vb[:, :, :, first:].reshape(b, h, 1, n * summary, dv)
    local = torch.matmul(qb, kb.transpose(-2, -1)) * scale  # (B, H, n, block, block)
    summ = torch.matmul(qb, ks.transpose(-2, -1)) * scale  # (B, H, n, block, n·summary)

    offsets = torch.arange(block, device=q.device)
    starts = torch.arange(n, device=q.device)[:, None] * block
    q_pos = (starts + offsets).view(n, block, 1)
    local_pos = (starts + offsets).view(n, 1, block)
    summ_pos = (starts + first + offsets[:summary]).view(1, 1, n * summary)
    keep_local = local_pos < t
    keep_summ = (summ_pos < t) & (summ_pos // block != q_pos // block)  # other blocks only
    if is_causal:
        keep_local = keep_local & (local_pos <= q_pos)
        keep_summ = keep_summ & (summ_pos <= q_pos)
    keep_local, keep_summ = keep_local[None, None], keep_summ[None, None]
    if key_padding_mask is not None:
        pad = F.pad(key_padding_mask, (0, n * block - t), value=True).view(b, n, block)
        keep_local = keep_local & ~pad[:, None, :, None, :]
        keep_summ = keep_summ & ~pad[:, :, first:].reshape(b, 1, 1, 1, n * summary)
    rows = (keep_local.shape[0], 1, n, block)  # the batch when padded, else 1
    keep = torch.cat([keep_local.expand(*rows, block), keep_summ.expand(*rows, n * summary)],
                     dim=-1)
    weights = softmax_rows(torch.cat([local, summ], dim=-1), keep)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    w_local, w_summ = weights.split([block, n * summary], dim=-1)
    out = torch.matmul(w_local, vb) + torch.matmul(w_summ, vs)  # (B, H, n, block, Dv)
    return out.reshape(b, h, n * block, dv)[:, :, :t]


class SparseFixedBackend(FlexKernel, PatternDecoding, AttentionBackend):
    """The fixed attention pattern of the Sparse Transformer: query ``i`` sees the keys of its
    own block and the last ``summary`` positions of every block.

    Child et al. 2019, §4.3 ("fixed attention"; seed_002 B.4), with ``l = block`` and
    ``c = summary``: A¹_i = {j : ⌊j/l⌋ = ⌊i/l⌋} and A²_i = {j : j mod l ∈ {l−c, …, l−1}}.
    The paper prints A² as {t, …, l} with t = l − c (c + 1 values, and its example l = 128,
    c = 8 names positions 120–128); here, as in seed_002, ``summary`` counts the summary
    positions exactly (positions from 0). The summary positions of a block carry its content to
    every later block.

    This backend computes the union A¹ ∪ A² in every head, the paper's "merged head" (§5.1):
    the library's backends give every head one pattern (none takes a per-head choice), and A²
    alone would leave a position before its block's summary positions no key when causal. The
    paper's other arrangements (A¹ and A² in alternate layers or in separate heads, and heads
    on distinct summary sub-blocks) are not built in. Causal: the past of the block and the
    summary positions of earlier blocks (the paper's form); non-causal: the whole block and
    the summary positions of every block.

    Computation (:func:`fixed_pattern_attention`): the block-local scores (T·l of them) and the
    scores against the ⌈T/l⌉·c gathered summary keys go through one softmax, without the T×T
    matrix. Time O(B·H·T·(l + T·c/l)·D), memory O(B·H·T·(l + T·c/l)); with l ≈ √T and a
    constant c that is O(T√T), the paper's cost. FlexAttention (CUDA) skips only the 128×128
    tiles without a kept pair: with ``block <= 128`` every key tile holds summary positions,
    so it visits every tile (below the diagonal when causal).

    Incremental decoding keeps every key (a later query can see the summary positions of
    every earlier block) and attends each new query over its row of the pattern.

    Options: ``block`` (l, default 128), ``summary`` (c, 1 ≤ c ≤ l, default 8: the paper's
    example of l = 128, c = 8), ``scale``, ``kernel`` (``"auto"``: FlexAttention on CUDA, the
    computation above elsewhere; ``"flex"``; ``"native"``; see
    :class:`~graded.attention.backends.flex.FlexKernel`).
    """

    name = "sparse_fixed"
    capabilities = Capabilities(causal=True, key_padding_mask=True, incremental=True)

    def __init__(
        self, block: int = 128, summary: int = 8, scale: float | None = None,
        kernel: str = "auto",
    ) -> None:
        super().__init__()
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise ValueError(f"{self.name} backend: block must be a positive int, got {block!r}")
        if isinstance(summary, bool) or not isinstance(summary, int) or not 1 <= summary <= block:
            raise ValueError(
                f"{self.name} backend: summary must be an int in [1, block={block}], got "
                f"{summary!r}"
            )
        self.block = block
        self.summary = summary
        self.scale = check_scale(self.name, scale)
        self.init_kernel(kernel)

    def keep(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        same_block = q_pos // self.block == k_pos // self.block
        return same_block | (k_pos.remainder(self.block) >= self.block - self.summary)

    def native_forward(self, q: Tensor, k: Tensor, v: Tensor, *,
                       key_padding_mask: Tensor | None, is_causal: bool,
                       dropout_p: float) -> Tensor:
        return fixed_pattern_attention(
            q, k, v, self.block, self.summary, default_scale(self.scale, q.shape[-1]),
            key_padding_mask=key_padding_mask, is_causal=is_causal, dropout_p=dropout_p,
        )
