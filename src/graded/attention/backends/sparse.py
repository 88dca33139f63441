"""Block-sparse patterns: an arbitrary block layout, and BigBird's window + global + random.

Exact softmax attention restricted to the keep-set the pattern defines (seed_002 B.4, B.6),
computed with the block-gather kernel of :mod:`.blockwise`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from graded.attention.backends.base import (
    AttentionBackend,
    Capabilities,
    PatternDecoding,
    check_seed,
    checked_int_option,
    checked_option,
    default_scale,
)
from graded.attention.backends.blockwise import KeepRule, gathered_block_attention
from graded.attention.backends.chunked import chunked_attention
from graded.attention.backends.flex import FlexKernel, layout_keep_rule
from graded.checks import check_bool

__all__ = ["BigBirdBackend", "BlockSparseBackend", "check_layout", "layout_to_key_blocks"]


def layout_to_key_blocks(layout: Tensor) -> Tensor:
    """(nQ, nK) bool block layout -> (nQ, s) long key-block lists padded with -1, s = max row."""
    n_k = layout.shape[1]
    cols = torch.arange(n_k, device=layout.device).expand_as(layout)
    ranked = torch.where(layout, cols, n_k).sort(dim=1).values
    width = max(int(layout.sum(dim=1).max().item()) if layout.numel() else 0, 1)
    ranked = ranked[:, :width]
    return torch.where(ranked < n_k, ranked, -1)


def check_layout(name: str, layout: object) -> Tensor:
    """A block layout: a square (blocks, blocks) matrix of bools (or of 0 and 1, a tensor or
    a nested list), as a bool tensor; anything else refused with the value named."""
    try:
        layout_t = torch.as_tensor(layout)
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"{name} backend: layout must be a square (blocks, blocks) bool "
                         f"matrix, got {layout!r}") from err
    if layout_t.dtype != torch.bool:  # 0/1 only: a weight such as 0.5 would become True
        stray = layout_t[(layout_t != 0) & (layout_t != 1)]
        if stray.numel():
            raise ValueError(
                f"{name} backend: layout must hold bools (or 0 and 1), got the value "
                f"{stray[0].item()!r}"
            )
        layout_t = layout_t.to(torch.bool)
    if layout_t.dim() != 2 or layout_t.shape[0] != layout_t.shape[1]:
        raise ValueError(
            f"{name} backend: layout must be a square (blocks, blocks) bool matrix, got "
            f"shape {tuple(layout_t.shape)}"
        )
    return layout_t


class BlockSparseBackend(FlexKernel, PatternDecoding, AttentionBackend):
    """Attention restricted by a block layout: query block ``n`` sees key block ``m`` iff
    ``layout[n, m]``.

    The block-sparse formulation of the Sparse Transformer (Child et al. 2019, §5.5, the
    "block-sparse" kernels; seed_002 B.4). Time O(B·H·T·s·block·D), memory O(B·H·T·s·block)
    where ``s`` is the largest number of blocks in a layout row. The layout fixes the maximum
    length ``nQ·block_size``; shorter sequences use the top-left part of the layout.

    Incremental decoding keeps every key and attends each new query over its layout row.

    Options: ``layout`` ((nQ, nK) bool tensor or nested list, square), ``block_size`` (default
    64), ``scale``, ``kernel`` (``"auto"``: FlexAttention on CUDA, the block gather elsewhere;
    ``"flex"``; ``"native"``; see :class:`~graded.attention.backends.flex.FlexKernel`). A
    layout set later (``backend.layout = ...``) is checked as the constructor checks it and
    moved to the device of the one it replaces.
    """

    name = "block_sparse"
    capabilities = Capabilities(causal=True, key_padding_mask=True, incremental=True)
    block_size = checked_int_option("block_size", 1)

    def __init__(
        self, layout: Tensor | list[list[bool]], block_size: int = 64, scale: float | None = None,
        kernel: str = "auto",
    ) -> None:
        super().__init__()
        self.register_buffer("layout", check_layout(self.name, layout), persistent=False)
        self.block_size = block_size
        self.scale = scale  # checked by its property (AttentionBackend.scale)
        self._key_block_cache: dict[tuple, Tensor] = {}  # as BigBird's, see _key_blocks
        self.init_kernel(kernel)

    def __setattr__(self, name: str, value: object) -> None:
        if name == "layout" and "layout" in self.__dict__.get("_buffers", {}):
            value = check_layout(self.name, value).to(self.layout.device)
        super().__setattr__(name, value)

    def _check_length(self, t: int) -> int:
        n_blocks = -(-t // self.block_size)
        if n_blocks > self.layout.shape[0]:
            raise ValueError(
                f"block_sparse backend: length {t} needs {n_blocks} blocks of {self.block_size}, "
                f"but the layout has {self.layout.shape[0]}"
            )
        return n_blocks

    def check_length(self, t: int) -> None:
        self._check_length(t)

    def keep(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        self._check_length(int(q_pos.max()) + 1)
        return self.layout[q_pos // self.block_size, k_pos // self.block_size]

    def pattern_key(self) -> tuple[Tensor, int, int]:
        """The layout, its version and the block size: a layout changed in place or replaced
        (``backend.layout = ...``), or a block size set after construction, is another
        pattern, for the cached key blocks and BlockMasks alike. The tensor itself is the key
        (not its ``id``, which a new layout could reuse once the old one is freed)."""
        return self.layout, self.layout._version, self.block_size

    def _key_blocks(self, n_blocks: int, device: torch.device) -> Tensor:
        """:func:`layout_to_key_blocks` of the layout's first ``n_blocks`` blocks on
        ``device``, kept per length and device while the layout is unchanged: the lists are
        sized by the layout's values, and reading them from a GPU in every forward pass would
        wait for it."""
        key = (n_blocks, device, *self.pattern_key())
        cached = self._key_block_cache.get(key)
        if cached is None:
            self._key_block_cache.clear()  # an older layout's or length's
            cached = layout_to_key_blocks(self.layout[:n_blocks, :n_blocks].cpu()).to(device)
            self._key_block_cache[key] = cached
        return cached

    def keep_rule(self, t: int, causal: bool, device: torch.device) -> KeepRule:
        n_blocks = self._check_length(t)
        return layout_keep_rule(self.layout[:n_blocks, :n_blocks].to(device), self.block_size)

    def native_forward(self, q: Tensor, k: Tensor, v: Tensor, *,
                       key_padding_mask: Tensor | None, is_causal: bool,
                       dropout_p: float) -> Tensor:
        t = q.shape[2]
        n_blocks = -(-t // self.block_size)  # checked by check_length
        key_blocks = self._key_blocks(n_blocks, q.device)
        out = gathered_block_attention(
            q, k, v, key_blocks, self.block_size, default_scale(self.scale, q.shape[-1]),
            key_padding_mask=key_padding_mask, is_causal=is_causal, dropout_p=dropout_p,
        )
        return out[:, :, :t]


class BigBirdBackend(FlexKernel, PatternDecoding, AttentionBackend):
    """BigBird attention: each query block sees a window of blocks, the global blocks and a few
    random blocks; global query blocks see everything.

    Zaheer et al. 2020, §2 and App. D (BIGBIRD-ITC, the blockified form; seed_002 B.6): global
    tokens are the first ``num_global_blocks`` blocks (existing tokens, ITC), the window is
    ``window_blocks`` blocks centred on the query block (3 in the paper), and
    ``num_random_blocks`` random key blocks, drawn once per (length, seed) outside window and
    global blocks (when causal, among past blocks). Time O(B·H·T·(w+g+r)·block·D) for ordinary
    rows plus O(B·H·g·block·T·D) for the global rows; memory the same without the D.

    Incremental decoding keeps every key and attends each new query over its row of the
    pattern. The causal random blocks of a row depend only on earlier rows' draws, so a
    position's pattern does not change as the sequence grows.

    Options: ``block_size`` (default 64), ``num_global_blocks`` (1), ``num_random_blocks`` (3),
    ``window_blocks`` (odd, 3), ``seed`` (0), ``scale``, ``kernel`` (``"auto"``: FlexAttention
    on CUDA, the block gather elsewhere; ``"flex"``; ``"native"``; see
    :class:`~graded.attention.backends.flex.FlexKernel`). :meth:`random_blocks` returns the
    drawn random blocks, so the pattern can be rebuilt independently. An option set after
    construction (``backend.block_size = 32``) is checked as the constructor checks it and
    takes effect at the next call: the cached random blocks, key blocks and BlockMasks are kept
    per :meth:`pattern_key`.
    """

    name = "bigbird"
    capabilities = Capabilities(causal=True, key_padding_mask=True, incremental=True)
    block_size = checked_int_option("block_size", 1)
    num_global_blocks = checked_int_option("num_global_blocks", 0)
    num_random_blocks = checked_int_option("num_random_blocks", 0)
    window_blocks = checked_int_option("window_blocks", 1, odd=True)
    seed = checked_option("seed", check_seed)  # an int the generator takes

    def __init__(
        self,
        block_size: int = 64,
        num_global_blocks: int = 1,
        num_random_blocks: int = 3,
        window_blocks: int = 3,
        seed: int = 0,
        scale: float | None = None,
        kernel: str = "auto",
    ) -> None:
        super().__init__()
        self.block_size = block_size  # each checked by its property, here and when set later
        self.num_global_blocks = num_global_blocks
        self.num_random_blocks = num_random_blocks
        self.window_blocks = window_blocks
        self.seed = seed
        self.scale = scale  # checked by its property (AttentionBackend.scale)
        self._key_block_cache: dict[tuple, Tensor] = {}  # per (rows, causal, pattern_key)
        self.init_kernel(kernel)

    def pattern_key(self) -> tuple[int, ...]:
        """The options the pattern depends on, part of the key of its cached random blocks,
        key blocks and BlockMasks: an option set after construction gives another pattern."""
        return (self.block_size, self.num_global_blocks, self.num_random_blocks,
                self.window_blocks, self.seed)

    def random_blocks(self, n_blocks: int, causal: bool = False) -> Tensor:
        """(n_blocks, num_random_blocks) long, -1 where fewer candidates exist; rows of global
        query blocks are all -1. Deterministic in (n_blocks, causal, seed). ``causal``: True
        or False only."""
        causal = check_bool(f"{self.name} backend: causal", causal)
        gen = torch.Generator().manual_seed(self.seed)
        half = self.window_blocks // 2
        out = torch.full((n_blocks, self.num_random_blocks), -1, dtype=torch.long)
        for i in range(self.num_global_blocks, n_blocks):
            hi = i - half if causal else n_blocks
            cand = [
                j for j in range(self.num_global_blocks, hi) if abs(j - i) > half
            ]
            if not cand or self.num_random_blocks == 0:
                continue
            pick = torch.randperm(len(cand), generator=gen)[: self.num_random_blocks]
            chosen = torch.tensor(cand)[pick].sort().values
            out[i, : chosen.numel()] = chosen
        return out

    def keep(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The causal pattern on absolute positions: global query blocks see every key, the
        others their window, the global blocks and their random blocks."""
        qb, kb = q_pos // self.block_size, k_pos // self.block_size
        rand = self._causal_random_rows(int(qb.max()) + 1).to(q_pos.device)
        g, half = self.num_global_blocks, self.window_blocks // 2
        keep = (qb < g) | ((qb - kb).abs() <= half) | (kb < g)
        chosen = (rand[qb.squeeze(-1)][:, :, None] == kb.reshape(1, 1, -1)).any(dim=1)
        return keep | chosen

    def _causal_random_rows(self, n_blocks: int) -> Tensor:
        """The first ``n_blocks`` rows of the causal random blocks (equal for every longer
        length), drawn for a doubling number of rows and kept."""
        key = (-1, True, *self.pattern_key())
        rows = self._key_block_cache.get(key)
        if rows is None or rows.shape[0] < n_blocks:
            size = max(n_blocks, 2 * (0 if rows is None else rows.shape[0]), 8)
            rows = self.random_blocks(size, causal=True)
            self._key_block_cache[key] = rows
        return rows[:n_blocks]

    def block_layout(self, n_blocks: int, causal: bool = False) -> Tensor:
        """(n_blocks, n_blocks) bool, before causality: global query blocks see every block,
        the others their window, the global blocks and their random blocks. ``causal``: True or
        False only."""
        causal = check_bool(f"{self.name} backend: causal", causal)
        g, half = self.num_global_blocks, self.window_blocks // 2
        rand = self.random_blocks(n_blocks, causal)
        rows = torch.arange(n_blocks)[:, None]
        cols = torch.arange(n_blocks)[None, :]
        layout = (rows - cols).abs() <= half
        layout[:, :g] = True
        layout[:g] = True
        r_rows = rows.expand_as(rand)[rand >= 0]
        layout[r_rows, rand[rand >= 0]] = True
        return layout

    def key_blocks(self, n_blocks: int, causal: bool = False) -> Tensor:
        """Key-block lists of the non-global query blocks (window ∪ global ∪ random).
        ``causal``: True or False only."""
        if type(causal) is not bool:  # the bool itself passes on one comparison
            causal = check_bool(f"{self.name} backend: causal", causal)
        key = (n_blocks, causal, *self.pattern_key())
        cached = self._key_block_cache.get(key)
        if cached is not None:
            return cached
        blocks = layout_to_key_blocks(self.block_layout(n_blocks, causal)[self.num_global_blocks:])
        self._key_block_cache[key] = blocks
        return blocks

    def pattern_keep(self, t: int, is_causal: bool, device: torch.device | None = None,
                     heads: int | None = None) -> Tensor:
        """The (T, T) keep-set of a call of length ``t`` (its random blocks are drawn for the
        non-causal and the causal pattern apart), causality included; the heads share it
        (``heads`` is ignored). ``is_causal``: True or False only."""
        is_causal = check_bool(f"{self.name} backend: is_causal", is_causal)
        blocks = torch.arange(t) // self.block_size
        layout = self.block_layout(-(-t // self.block_size), is_causal)
        keep = layout[blocks[:, None], blocks[None, :]]
        if is_causal:
            keep = keep & torch.ones(t, t, dtype=torch.bool).tril()
        return keep.to(device)

    def keep_rule(self, t: int, causal: bool, device: torch.device) -> KeepRule:
        layout = self.block_layout(-(-t // self.block_size), causal).to(device)
        return layout_keep_rule(layout, self.block_size)

    def native_forward(self, q: Tensor, k: Tensor, v: Tensor, *,
                       key_padding_mask: Tensor | None, is_causal: bool,
                       dropout_p: float) -> Tensor:
        t = q.shape[2]
        scale = default_scale(self.scale, q.shape[-1])
        n_blocks = -(-t // self.block_size)
        n_glob = min(self.num_global_blocks * self.block_size, t)
        parts = []
        if n_glob > 0:  # global query rows attend to every key (to the past when causal)
            t_keys = n_glob if is_causal else t
            pad = None if key_padding_mask is None else key_padding_mask[:, :t_keys]
            parts.append(chunked_attention(
                q[:, :, :n_glob], k[:, :, :t_keys], v[:, :, :t_keys], key_padding_mask=pad,
                is_causal=is_causal, dropout_p=dropout_p, scale=scale, checkpointing=False,
            ))
        if n_blocks > self.num_global_blocks:
            query_blocks = torch.arange(self.num_global_blocks, n_blocks, device=q.device)
            parts.append(gathered_block_attention(
                q, k, v, self.key_blocks(n_blocks, is_causal).to(q.device), self.block_size,
                scale, query_blocks=query_blocks, key_padding_mask=key_padding_mask,
                is_causal=is_causal, dropout_p=dropout_p,
            ))
        return torch.cat(parts, dim=2)[:, :, :t]
