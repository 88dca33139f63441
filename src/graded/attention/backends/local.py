"""Local patterns: a sliding window (Longformer) and a dilated / strided window (Sparse
Transformer, Longformer's dilation).

Both are exact softmax attention restricted to a positional keep-set, computed without forming
the T×T matrix (seed_002 B.4, B.5).
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
    checked_int_option,
    default_scale,
)
from graded.attention.backends.blockwise import gathered_block_attention, pad_to_multiple
from graded.attention.backends.chunked import chunked_attention
from graded.attention.backends.flex import FlexKernel
from graded.checks import check_bool

__all__ = ["DilatedBackend", "SlidingWindowBackend", "sliding_window_attention"]


def sliding_window_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    scale: float,
    *,
    block: int,
    key_padding_mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
) -> Tensor:
    """Query ``i`` attends to keys ``j`` with ``|i - j| <= window`` (causal: ``0 <= i - j``
    ``<= window``).

    Blocks of size ``block >= window``: query block ``n`` needs key blocks ``n-1, n, n+1`` (causal:
    ``n-1, n``), so the cost is O(T·3·block·D), linear in T. ``is_causal``: True or False only.
    """
    if type(is_causal) is not bool:  # the bool itself passes on one comparison
        is_causal = check_bool("sliding_window_attention: is_causal", is_causal)
    t = q.shape[2]
    n_blocks = -(-t // block)
    rows = torch.arange(n_blocks, device=q.device)[:, None]
    shifts = torch.tensor([-1, 0] if is_causal else [-1, 0, 1], device=q.device)
    key_blocks = rows + shifts
    key_blocks = torch.where((key_blocks >= 0) & (key_blocks < n_blocks), key_blocks, -1)

    def keep(q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return (q_pos - k_pos).abs() <= window

    out = gathered_block_attention(
        q, k, v, key_blocks, block, scale, key_padding_mask=key_padding_mask,
        is_causal=is_causal, keep_rule=keep, dropout_p=dropout_p,
    )
    return out[:, :, :t]


class SlidingWindowBackend(FlexKernel, PatternDecoding, AttentionBackend):
    """Sliding-window (local) attention: query ``i`` sees keys with ``|i - j| <= window``, or
    ``0 <= i - j <= window`` when causal.

    Longformer (Beltagy et al. 2020, §3.1, "sliding window"; seed_002 B.5, where Longformer's
    ``w`` counts both sides, so its ``w`` is ``2·window``) and the local head of the Sparse
    Transformer (Child et al. 2019, §4.2). Time O(B·H·T·block·D) and memory O(B·H·T·block) with
    ``block >= window`` (default ``max(window, 32)``): linear in T, not a masked T×T product.

    Incremental decoding keeps a rolling window of the last ``window`` keys and values per
    layer: memory O(window), time per token O(window·D), whatever the length.

    Options: ``window`` (default 128), ``block_size``, ``scale`` (default 1/√D), ``kernel``
    (``"auto"``: FlexAttention on CUDA, the blocked kernel above elsewhere; ``"flex"``;
    ``"native"``; see :class:`~graded.attention.backends.flex.FlexKernel`).
    """

    name = "sliding_window"
    capabilities = Capabilities(causal=True, key_padding_mask=True, incremental=True,
                                shift_invariant=True)

    def __init__(
        self, window: int = 128, block_size: int | None = None, scale: float | None = None,
        kernel: str = "auto",
    ) -> None:
        super().__init__()
        self._block_option: int | None = None
        self.window = window  # each checked by its property, here and when set later
        self.block_size = block_size
        self.scale = scale
        self.init_kernel(kernel)

    def __setstate__(self, state: dict[str, object]) -> None:
        """A backend pickled when ``block_size`` was a plain attribute holds the block in
        force (``max(window, 32)`` when none was given): it becomes the explicit block option
        (None when it is that default), then the base class moves the other options."""
        if "block_size" in state and "_block_option" not in state:
            state = dict(state)
            block = state.pop("block_size")
            window = state.get("_window", state.get("window"))
            state["_block_option"] = None if block == max(window, 32) else block
        super().__setstate__(state)

    @property
    def window(self) -> int:
        """The ``window`` option (checked when set; at most an explicit ``block_size``)."""
        return self._window

    @window.setter
    def window(self, value: object) -> None:
        window = check_int_option(self.name, "window", value)
        self._check_block(window, self._block_option)
        self._window = window

    @property
    def block_size(self) -> int:
        """The block of the blocked kernel: the ``block_size`` option, or ``max(window, 32)``
        when it is None (so that it follows a window set later). Checked when set."""
        return max(self._window, 32) if self._block_option is None else self._block_option

    @block_size.setter
    def block_size(self, value: object) -> None:
        block = check_int_option(self.name, "block_size", value, optional=True)
        self._check_block(self._window, block)
        self._block_option = block

    def _check_block(self, window: int, block: int | None) -> None:
        """The blocked kernel reaches the neighbouring blocks only: block_size >= window."""
        if block is not None and block < window:
            raise ValueError(
                f"{self.name} backend: block_size ({block}) must be >= window ({window})"
            )

    @property
    def horizon(self) -> int:
        """The keys a later query can still see (decoding keeps them): the last ``window``."""
        return self._window

    def pattern_key(self) -> tuple[int]:
        """The window: a window set after construction is another pattern (BlockMasks)."""
        return (self._window,)

    def keep(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return (q_pos - k_pos).abs() <= self.window

    def native_forward(self, q: Tensor, k: Tensor, v: Tensor, *,
                       key_padding_mask: Tensor | None, is_causal: bool,
                       dropout_p: float) -> Tensor:
        return sliding_window_attention(
            q, k, v, self.window, default_scale(self.scale, q.shape[-1]),
            block=self.block_size, key_padding_mask=key_padding_mask, is_causal=is_causal,
            dropout_p=dropout_p,
        )


class DilatedBackend(FlexKernel, PatternDecoding, AttentionBackend):
    """Dilated (strided) attention: query ``i`` sees keys ``j`` with ``(i - j) mod dilation == 0``,
    and, when ``window`` is set, ``|i - j| <= window · dilation``.

    With ``window=None`` this is the strided head ``A²_i = {j : (i - j) mod l = 0}`` of the
    Sparse Transformer (Child et al. 2019, §4.2, Eq. for "strided attention"; seed_002 B.4) with
    stride ``l = dilation``; with a window it is Longformer's dilated sliding window (Beltagy et
    al. 2020, §3.1). The strided head's local partner ``A¹`` is the ``sliding_window`` backend
    (the Sparse Transformer gives the two sets to different heads or layers).

    Computation: positions of one residue class mod ``dilation`` form a subsequence, and the
    pattern is full (or windowed) attention inside each subsequence, so the sequence is
    reshaped to ``dilation`` interleaved subsequences folded into the batch. Time
    O(B·H·T²/dilation·D) without a window (O(T√T) at dilation ≈ √T) and O(B·H·T·window·D) with
    one; memory O(B·H·T²/dilation) (the fused kernel's mask and weights per subsequence) or
    O(B·H·T·window).

    Incremental decoding keeps the keys a later query can see: the last ``window·dilation``
    positions with a window, all of them without.

    Options: ``dilation`` (default 8), ``window`` (default None), ``scale``, ``kernel``
    (``"auto"``: FlexAttention on CUDA, the folded computation above elsewhere; ``"flex"``;
    ``"native"``; see :class:`~graded.attention.backends.flex.FlexKernel`).
    """

    name = "dilated"
    capabilities = Capabilities(causal=True, key_padding_mask=True, incremental=True,
                                shift_invariant=True)
    dilation = checked_int_option("dilation")
    window = checked_int_option("window", optional=True)

    def __init__(
        self, dilation: int = 8, window: int | None = None, scale: float | None = None,
        kernel: str = "auto",
    ) -> None:
        super().__init__()
        self.dilation = dilation  # each checked by its property, here and when set later
        self.window = window
        self.scale = scale
        self.init_kernel(kernel)

    @property
    def horizon(self) -> int | None:
        """The keys a later query can still see (decoding keeps them): the last
        ``window·dilation`` with a window, all of them without."""
        return None if self.window is None else self.window * self.dilation

    def pattern_key(self) -> tuple[int, int | None]:
        """The options: set after construction, they give another pattern (BlockMasks)."""
        return (self.dilation, self.window)

    def keep(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        gap = q_pos - k_pos
        keep = gap.remainder(self.dilation) == 0
        if self.window is not None:
            keep = keep & (gap.abs() <= self.window * self.dilation)
        return keep

    def native_forward(self, q: Tensor, k: Tensor, v: Tensor, *,
                       key_padding_mask: Tensor | None, is_causal: bool,
                       dropout_p: float) -> Tensor:
        b, h, t, _ = q.shape
        r = self.dilation
        pad = torch.zeros(b, t, dtype=torch.bool, device=q.device)
        if key_padding_mask is not None:
            pad = key_padding_mask
        pad = F.pad(pad, (0, (-t) % r), value=True)
        length = pad.shape[1] // r

        def fold(x: Tensor) -> Tensor:  # (B, H, L·r, E) -> (B·r, H, L, E), class c = pos mod r
            x = pad_to_multiple(x, r)
            x = x.view(b, h, length, r, x.shape[-1]).permute(0, 3, 1, 2, 4)
            return x.reshape(b * r, h, length, -1)

        qf, kf, vf = fold(q), fold(k), fold(v)
        pad_f = pad.view(b, length, r).permute(0, 2, 1).reshape(b * r, length)
        scale = default_scale(self.scale, q.shape[-1])
        if self.window is None:
            out = chunked_attention(
                qf, kf, vf, key_padding_mask=pad_f, is_causal=is_causal, dropout_p=dropout_p,
                scale=scale, query_chunk=max(length, 1), key_chunk=max(length, 1),
                checkpointing=False,
            )
        else:
            out = sliding_window_attention(
                qf, kf, vf, self.window, scale, block=max(self.window, 32),
                key_padding_mask=pad_f, is_causal=is_causal, dropout_p=dropout_p,
            )
        out = out.view(b, r, h, length, -1).permute(0, 2, 3, 1, 4).reshape(b, h, length * r, -1)
        return out[:, :, :t]
