"""The fixed pattern of the Sparse Transformer: attention inside a block of ``l`` positions plus
the last ``c`` positions ("summary" positions) of every block, or, per head, one of the block's
sub-blocks of ``c`` positions; the two sets merged in every head, one alone, or each in its own
heads.

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
    check_int_option,
    check_option,
    checked_option,
    compute_dtype,
    default_scale,
    softmax_rows,
)
from graded.attention.backends.blockwise import pad_to_multiple
from graded.attention.backends.flex import FlexKernel
from graded.checks import check_bool

__all__ = ["PARTS", "SUMMARY_HEADS", "SparseFixedBackend", "fixed_pattern_attention",
           "summary_offsets"]

SUMMARY_HEADS = ("shared", "split")
#: Which of the two factorized sets a head attends to (Child et al. 2019, §4.3 and §5.1): the
#: union A¹ ∪ A² ("both", the merged head, Eq. 7), the block A¹ alone ("local") or the summary
#: positions A² alone ("summary"), the last two for interleaving them over layers (Eq. 6), or A¹
#: in the even heads and A² in the odd heads of one layer ("heads", Eq. 8).
PARTS = ("both", "local", "summary", "heads")


def summary_offsets(block: int, summary: int, heads: int | None = None,
                    device: torch.device | str | None = None) -> Tensor:
    """The offsets within a block of each head's summary positions, (H, c) long.

    ``heads=None``: one row, the last ``c = summary`` offsets {l − c, …, l − 1} shared by
    every head. ``heads=H``: head ``h`` takes sub-block h′ = h mod (l // c) counted back from
    the block's end, {l − c·(h′+1), …, l − c·h′ − 1} (Child et al. 2019, §4.3: heads on
    distinct sub-blocks of length c), so head 0 keeps the shared offsets and heads cycle
    through the l // c sub-blocks."""
    sub = torch.arange(heads or 1, device=device) % (block // summary)  # h′
    return block - summary * (sub[:, None] + 1) + torch.arange(summary, device=device)


def fixed_pattern_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    block: int,
    summary: int,
    scale: float,
    *,
    split_heads: bool = False,
    part: str = "both",
    key_padding_mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
) -> Tensor:
    """Query ``i`` attends to the keys of its own block (``⌊j/block⌋ = ⌊i/block⌋``) and to the
    summary keys ``j mod block >= block - summary`` of every block (causal: ``j <= i`` on top);
    with ``split_heads`` head h's summary keys are ``j mod block`` in its row of
    :func:`summary_offsets` instead.

    ``part`` (one of :data:`PARTS`) keeps one of the two sets: ``"local"`` scores the block's
    keys only (no summary column is gathered: time O(T·block·D)); ``"summary"`` keeps the summary
    keys only, those of its own block too (the block's keys masked to its summary offsets), so
    a causal query before the first summary position of block 0 has no key and returns zeros.
    ``"heads"`` computes ``"local"`` in the even heads and ``"summary"`` in the odd ones, each
    on its own heads (with ``split_heads`` the odd heads take the sub-blocks in their own order:
    odd head h is summary head ⌊h/2⌋).

    With n = ⌈T/block⌉ blocks each query scores ``block`` local keys and the n·summary summary
    keys of the other blocks (its own block's are among the local ones, so none counts twice),
    one softmax over both: time O(T·(block + T·summary/block)·D), memory
    O(T·(block + T·summary/block)) for the scores and weights. Half-precision inputs are
    computed in float32 and the output rounded once (:func:`~.base.compute_dtype`).
    ``split_heads`` and ``is_causal`` take True or False only.
    """
    if type(split_heads) is not bool:  # the bool itself passes on one comparison
        split_heads = check_bool("fixed_pattern_attention: split_heads", split_heads)
    if type(is_causal) is not bool:
        is_causal = check_bool("fixed_pattern_attention: is_causal", is_causal)
    dtype = v.dtype
    q, k, v = (x.to(compute_dtype(dtype)) for x in (q, k, v))
    b, h, t, d = q.shape
    if part == "heads":  # A¹ in heads 0, 2, …; A² in heads 1, 3, …
        masks = {"key_padding_mask": key_padding_mask, "is_causal": is_causal,
                 "dropout_p": dropout_p}
        local = fixed_pattern_attention(q[:, 0::2], k[:, 0::2], v[:, 0::2], block, summary,
                                        scale, part="local", **masks)
        summ = fixed_pattern_attention(q[:, 1::2], k[:, 1::2], v[:, 1::2], block, summary,
                                       scale, split_heads=split_heads, part="summary", **masks)
        head = torch.arange(h, device=q.device)
        order = torch.where(head % 2 == 0, head // 2, local.shape[1] + head // 2)
        return torch.cat([local, summ], dim=1).index_select(1, order).to(dtype)  # (B, H, T, Dv)
    dv = v.shape[-1]
    n = -(-t // block)
    cols = summary_offsets(block, summary, h if split_heads else None, q.device)  # (H′, c)
    if part == "local":  # no summary column: the block's keys alone
        cols = cols[:, :0]
    hs, summary = cols.shape  # H′: H when split, else 1
    qb = pad_to_multiple(q, block).view(b, h, n, block, d)
    kb = pad_to_multiple(k, block).view(b, h, n, block, d)
    vb = pad_to_multiple(v, block).view(b, h, n, block, dv)
    index = cols[None, :, None, :, None]  # (1, H′, 1, c, 1): each head's summary offsets

    def gather_summary(x: Tensor) -> Tensor:  # (B, H, n, block, E) -> (B, H, 1, n·c, E)
        picked = x.gather(3, index.expand(b, h, n, summary, x.shape[-1]))
        return picked.reshape(b, h, 1, n * summary, x.shape[-1])

    ks, vs = gather_summary(kb), gather_summary(vb)  # summary keys of every block
    local = torch.matmul(qb, kb.transpose(-2, -1)) * scale  # (B, H, n, block, block)
    summ = torch.matmul(qb, ks.transpose(-2, -1)) * scale  # (B, H, n, block, n·summary)

    offsets = torch.arange(block, device=q.device)
    starts = torch.arange(n, device=q.device)[:, None] * block
    q_pos = (starts + offsets).view(n, block, 1)
    local_pos = (starts + offsets).view(n, 1, block)
    summ_pos = (starts[None] + cols[:, None, :]).view(hs, 1, 1, n * summary)
    keep_local = local_pos < t
    keep_summ = (summ_pos < t) & (summ_pos // block != q_pos // block)  # other blocks only
    if is_causal:
        keep_local = keep_local & (local_pos <= q_pos)
        keep_summ = keep_summ & (summ_pos <= q_pos)
    keep_local, keep_summ = keep_local[None, None], keep_summ[None]  # (·, 1 | H′, n, block, ·)
    if part == "summary":  # the own block's keys at its summary offsets only (per head)
        own = (offsets[None, :, None] == cols[:, None, :]).any(-1)  # (H′, block)
        keep_local = keep_local & own[None, :, None, None, :]
    if key_padding_mask is not None:
        pad = F.pad(key_padding_mask, (0, n * block - t), value=True).view(b, n, block)
        keep_local = keep_local & ~pad[:, None, :, None, :]
        pad_summ = pad[:, :, cols].transpose(1, 2)  # (B, H′, n, c)
        keep_summ = keep_summ & ~pad_summ.reshape(b, hs, 1, 1, n * summary)
    rows = (keep_local.shape[0], hs, n, block)  # the batch when padded, else 1
    keep = torch.cat([keep_local.expand(*rows, block), keep_summ.expand(*rows, n * summary)],
                     dim=-1)
    weights = softmax_rows(torch.cat([local, summ], dim=-1), keep)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    w_local, w_summ = weights.split([block, n * summary], dim=-1)
    out = torch.matmul(w_local, vb) + torch.matmul(w_summ, vs)  # (B, H, n, block, Dv)
    return out.reshape(b, h, n * block, dv)[:, :, :t].to(dtype)


class SparseFixedBackend(FlexKernel, PatternDecoding, AttentionBackend):
    """The fixed attention pattern of the Sparse Transformer: query ``i`` sees the keys of its
    own block and the last ``summary`` positions of every block (or, with
    ``summary_heads="split"``, its head's sub-block of ``summary`` positions of every block).

    Child et al. 2019, §4.3 ("fixed attention"; seed_002 B.4), with ``l = block`` and
    ``c = summary``: A¹_i = {j : ⌊j/l⌋ = ⌊i/l⌋} and A²_i = {j : j mod l ∈ {l−c, …, l−1}}.
    The paper prints A² as {t, …, l} with t = l − c (c + 1 values, and its example l = 128,
    c = 8 names positions 120–128); here, as in seed_002, ``summary`` counts the summary
    positions exactly (positions from 0). The summary positions of a block carry its content to
    every later block.

    By default (``part="both"``) this backend computes the union A¹ ∪ A² in every head, the
    paper's "merged head" (§5.1, Eq. 7). ``part="local"`` computes A¹ alone and
    ``part="summary"`` A² alone (its own block's summary positions included, j <= i on top when
    causal), for the paper's first arrangement, "one attention type per residual block",
    interleaved, attention(X) = W_p · attend(X, A^(r mod p)) (§5.1, Eq. 6): a
    :class:`~graded.transformer.TransformerConfig` gives alternate layers the two parts through
    ``attn_backend_cycle``. With ``"summary"`` and causal masking a query before the first
    summary position of block 0 has no key and returns zeros (every backend's convention).

    ``part="heads"`` is the paper's third arrangement, multi-head attention whose n_h attention
    products are computed in parallel and concatenated, attention(X) = W_p (attend(X, A)^(i))
    for i = 1 … n_h, where "the A can be the separate attention patterns" (§5.1, Eq. 8): within
    one layer the even heads (0, 2, …) attend A¹ and the odd heads (1, 3, …) A², each exactly
    as ``"local"`` and ``"summary"`` do. The paper does not say which head takes which pattern;
    the alternation is ours: it is Eq. 6's A^(r mod p) taken over heads instead of layers,
    and it makes a head's keep-set a function of its index alone, whatever the number of heads
    (the FlexAttention ``mask_mod``, decoding and :meth:`pattern_keep` read only the head
    index). With an odd number of heads there is one more local head than summary heads; a
    call with fewer than two heads is refused (it would have no summary head).

    ``summary_heads`` says which summary positions the heads attend to (it does not act with
    ``"local"``):

    - ``"shared"`` (default): every head the same, the last c of each block, as above;
    - ``"split"``: the paper's "heads attend to distinct subblocks of length c within the
      block of size l", which it found preferable to all heads on the same one (§4.3). The
      block splits into l // c sub-blocks (c must divide l); head h (0-based) takes sub-block
      h′ = h mod (l // c) counted back from the block's end,
      A²_{i,h} = {j : j mod l ∈ {l − c·(h′+1), …, l − c·h′ − 1}}, so head 0 keeps the shared
      summary positions and, with more than l // c heads, heads cycle through the sub-blocks
      (heads h and h + l // c share one). The paper does not say how heads map to sub-blocks;
      this order is ours. A¹ is the same in every head. With ``part="heads"`` the rule counts
      the summary heads among themselves: odd head h is summary head m = ⌊h/2⌋ and takes
      sub-block m mod (l // c), so head 1 keeps the shared summary positions, head 3 the c
      before them, and so on (h mod (l // c) on the odd heads would leave every other
      sub-block unused when l // c is even).

    Causal: the past of the block and the summary positions of earlier blocks
    (the paper's form); non-causal: the whole block and the summary positions of every block.

    Computation (:func:`fixed_pattern_attention`): the block-local scores (T·l of them) and the
    scores against the ⌈T/l⌉·c gathered summary keys (per head when split) go through one
    softmax, without the T×T matrix (``"local"``: the block-local scores alone, time
    O(B·H·T·l·D); ``"summary"``: the same two, the block-local keys masked to the block's
    summary offsets; ``"heads"``: ``"local"`` on the ⌈H/2⌉ even heads and ``"summary"`` on the
    ⌊H/2⌋ odd heads, time O(B·T·(⌈H/2⌉·l + ⌊H/2⌋·(l + T·c/l))·D)). Time
    O(B·H·T·(l + T·c/l)·D), memory O(B·H·T·(l + T·c/l)); with l ≈ √T and a constant c that is
    O(T√T), the paper's cost, split or not, whatever the part. FlexAttention (CUDA) skips only
    the 128×128 tiles without a kept pair (per head when split or with ``"heads"``): with
    ``block <= 128`` every key tile holds summary positions, so it visits every tile (below
    the diagonal when causal; with ``"local"``, and in the local heads of ``"heads"``, only
    the tiles that meet a block).

    Incremental decoding keeps every key (a later query can see the summary positions of
    every earlier block; with ``"local"`` only the last ``block`` keys) and attends each new
    query over its row of the pattern (its head's row when split or with ``"heads"``).

    Options: ``block`` (l, default 128), ``summary`` (c, 1 ≤ c ≤ l, default 8: the paper's
    example of l = 128, c = 8), ``summary_heads`` (``"shared"``, default, or ``"split"``),
    ``part`` (``"both"``, default, ``"local"``, ``"summary"`` or ``"heads"``), ``scale``,
    ``kernel`` (``"auto"``: FlexAttention on CUDA, the computation above elsewhere;
    ``"flex"``; ``"native"``; see :class:`~graded.attention.backends.flex.FlexKernel`).
    """

    name = "sparse_fixed"
    capabilities = Capabilities(causal=True, key_padding_mask=True, incremental=True)

    part = checked_option("part", lambda name, value: check_option(name, "part", value, PARTS))

    def __init__(
        self, block: int = 128, summary: int = 8, summary_heads: str = "shared",
        part: str = "both", scale: float | None = None, kernel: str = "auto",
    ) -> None:
        super().__init__()
        self._summary: int | None = None
        self._summary_heads: str | None = None
        self.block = block  # each checked by its property, here and when set later
        self.summary = summary
        self.summary_heads = summary_heads
        self.part = part
        self.scale = scale
        self.init_kernel(kernel)

    @property
    def block(self) -> int:
        """The ``block`` option, l (checked when set: a positive int, at least ``summary``,
        a multiple of it with ``summary_heads="split"``)."""
        return self._block

    @block.setter
    def block(self, value: object) -> None:
        block = check_int_option(self.name, "block", value)
        self._check_summary(block, self._summary, self._summary_heads)
        self._block = block

    @property
    def summary(self) -> int:
        """The ``summary`` option, c (checked when set: an int in [1, block], a divisor of
        ``block`` with ``summary_heads="split"``)."""
        return self._summary

    @summary.setter
    def summary(self, value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= self.block:
            raise ValueError(
                f"{self.name} backend: summary must be an int in [1, block={self.block}], got "
                f"{value!r}"
            )
        self._check_summary(self.block, value, self._summary_heads)
        self._summary = value

    @property
    def summary_heads(self) -> str:
        """The ``summary_heads`` option (checked when set: one of :data:`SUMMARY_HEADS`)."""
        return self._summary_heads

    @summary_heads.setter
    def summary_heads(self, value: object) -> None:
        check_option(self.name, "summary_heads", value, SUMMARY_HEADS)
        self._check_summary(self.block, self._summary, value)
        self._summary_heads = value

    def _check_summary(self, block: int, summary: int | None, summary_heads: str | None) -> None:
        """The options together: c <= l, and c divides l when the heads split the block."""
        if summary is None:
            return
        if summary > block:
            raise ValueError(
                f"{self.name} backend: summary must be an int in [1, block={block}], got "
                f"{summary!r}"
            )
        if summary_heads == "split" and block % summary:
            raise ValueError(
                f"{self.name} backend: summary_heads='split' needs summary to divide block (the "
                f"heads take the block's block // summary sub-blocks), got block={block}, "
                f"summary={summary}"
            )

    @property
    def split_heads(self) -> bool:
        """Whether the heads take distinct summary sub-blocks (``"split"``, unless the part
        is ``"local"``, which has no summary positions)."""
        return self._summary_heads == "split" and self.part != "local"

    @property
    def per_head_keep(self) -> bool:
        """Whether the keep-set differs between heads (split summaries, ``part="heads"``)."""
        return self.split_heads or self.part == "heads"

    @property
    def horizon(self) -> int | None:
        """The keys a later query can still see: with A¹ alone the last ``block`` positions
        (a query sees only keys of its own block), all of them otherwise."""
        return self._block if self.part == "local" else None

    def pattern_key(self) -> tuple[int, int, str, str]:
        """The options: set after construction, they give another pattern (BlockMasks)."""
        return (self._block, self._summary, self._summary_heads, self.part)

    def keep(self, q_pos: Tensor, k_pos: Tensor, head: Tensor | None = None) -> Tensor:
        """Bool keep-set of broadcastable query and key positions, before causality; ``head``
        (broadcastable head indices) picks each head's pattern where the heads differ (split
        summary sub-blocks, ``part="heads"``), and is ignored otherwise."""
        same_block = q_pos // self.block == k_pos // self.block
        if self.part == "local":
            return same_block
        if self.per_head_keep and head is None:
            why = "part='heads'" if self.part == "heads" else "summary_heads='split'"
            raise ValueError(
                f"{self.name} backend: with {why} each head has its own keep-set; pass the "
                "head index (pattern_keep(..., heads=H))"
            )
        # the summary heads counted among themselves: every head, or with "heads" the odd ones
        summary_head = head // 2 if self.part == "heads" else head
        sub = summary_head.remainder(self.block // self.summary) if self.split_heads else 0  # h′
        first = self.block - self.summary * (sub + 1)
        offset = k_pos.remainder(self.block)
        in_summary = (offset >= first) & (offset < first + self.summary)
        if self.part == "summary":
            return in_summary & (q_pos == q_pos)  # broadcast to the query axis too
        if self.part == "heads":
            return torch.where(head.remainder(2) == 1, in_summary, same_block)
        return same_block | in_summary

    def check_heads(self, heads: int) -> None:
        """Refuse a call whose ``heads`` cannot hold the part (``"heads"``: at least two)."""
        if self.part == "heads" and heads < 2:
            raise ValueError(
                f"{self.name} backend: part='heads' needs at least 2 heads (even heads attend "
                f"the block, odd heads the summary positions), got {heads}"
            )

    def native_forward(self, q: Tensor, k: Tensor, v: Tensor, *,
                       key_padding_mask: Tensor | None, is_causal: bool,
                       dropout_p: float) -> Tensor:
        self.check_heads(q.shape[1])
        return fixed_pattern_attention(
            q, k, v, self.block, self.summary, default_scale(self.scale, q.shape[-1]),
            split_heads=self.split_heads, part=self.part, key_padding_mask=key_padding_mask,
            is_causal=is_causal, dropout_p=dropout_p,
        )

    def flex_forward(self, q: Tensor, k: Tensor, v: Tensor, *,
                     key_padding_mask: Tensor | None, is_causal: bool) -> Tensor:
        self.check_heads(q.shape[1])
        return super().flex_forward(q, k, v, key_padding_mask=key_padding_mask,
                                    is_causal=is_causal)
