"""FlexAttention kernels for the positional-pattern backends (sliding_window, dilated,
sparse_fixed, block_sparse, bigbird).

FlexAttention (Dong et al. 2024, "Flex Attention: A Programming Model for Generating Optimized
Attention Kernels"; :mod:`torch.nn.attention.flex_attention`) computes softmax attention over a
keep-set given as a function of (query, key) positions and skips the tiles the set leaves
empty. A pattern backend already states its keep-set as an element-wise rule on absolute
positions (:meth:`FlexKernel.keep_rule`, by default its decoding rule ``keep``); here that rule
becomes

- the ``mask_mod``: ``keep(q_idx, kv_idx)``, and ``kv_idx <= q_idx`` when causal (a pattern
  that differs between heads, :attr:`FlexKernel.per_head_keep`, is ``keep(q_idx, kv_idx, h)``
  with tile lists per head);
- the ``BlockMask``: which 128×128 tiles hold some kept pair (partial tiles, where the kernel
  evaluates ``mask_mod``) and which hold only kept pairs (full tiles). It is computed tile row
  by tile row, in O(128·T) memory, not through ``create_block_mask``'s dense (T, T) mask, and
  cached per (length, causal, device) and the pattern's options
  (:meth:`FlexKernel.pattern_key`);
- key padding: a ``score_mod`` that sets the scores of padded keys to −∞. Padding changes with
  every batch, so it stays out of the cached BlockMask. A query with no admissible key returns
  zeros, FlexAttention's behaviour and the backends' convention.

On CUDA the call runs ``torch.compile(flex_attention)`` (the generated fused kernel); on CPU it
runs eager ``flex_attention``, which materialises the (T, T) scores and has no backward: it is
there to check exactness, not for speed. Departures from the native paths: FlexAttention has no
attention dropout, and torch's CPU FlexAttention is inference-only, so a call with
``dropout_p > 0`` or a CPU call that needs gradients runs the backend's native path
(:meth:`FlexKernel.uses_flex`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from graded.attention.backends.base import (
    check_inputs,
    check_kernel,
    check_self_attention,
    checked_option,
    default_scale,
    empty_output,
    reject_attn_mask,
)
from graded.attention.backends.blockwise import KeepRule
from graded.checks import check_bool

if TYPE_CHECKING:  # imported where used: torch's flex_attention module loads torch._dynamo
    # (about a second at every start of a process that imports graded)
    from torch.nn.attention.flex_attention import BlockMask

__all__ = [
    "FLEX_BLOCK",
    "PATTERN_KERNELS",
    "FlexKernel",
    "flex_pattern_attention",
    "layout_keep_rule",
    "pattern_block_mask",
]

PATTERN_KERNELS = ("auto", "flex", "native")
FLEX_BLOCK = 128  # FlexAttention's tile (its default BLOCK_SIZE)
CUDA_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_TILE_ELEMENTS = 2**22  # positions evaluated per step while building a BlockMask
_CACHED_MASKS = 8  # BlockMasks kept per backend, the oldest dropped first


def layout_keep_rule(layout: Tensor, block_size: int) -> KeepRule:
    """The keep rule of a block layout: query ``i`` sees key ``j`` iff
    ``layout[i // block_size, j // block_size]`` (a table lookup, so it also serves as a
    ``mask_mod`` on scalar positions)."""

    def keep(q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return layout[q_pos // block_size, k_pos // block_size]

    return keep


def pattern_block_mask(
    keep: KeepRule, t: int, causal: bool, device: torch.device | str,
    block_size: int = FLEX_BLOCK, heads: int | None = None,
) -> BlockMask:
    """The FlexAttention BlockMask of self-attention of length ``t`` restricted to ``keep``
    (and to ``j <= i`` when ``causal``).

    ``keep(q_pos, k_pos)`` takes broadcastable integer positions and must be element-wise
    (it becomes the ``mask_mod`` too). Equal to ``create_block_mask`` on the same mask_mod:
    tiles past ``t`` count as masked, so an edge tile is never full. With ``heads`` the
    pattern differs between heads: ``keep(q_pos, k_pos, head)`` also takes broadcastable head
    indices, and the tile lists are per head, (1, heads, ·). ``causal``: True or False only."""
    if type(causal) is not bool:  # the bool itself passes on one comparison
        causal = check_bool("pattern_block_mask: causal", causal)
    n = -(-t // block_size)
    span = n * block_size
    k_pos = torch.arange(span, device=device)[None, :]
    head = () if heads is None else (torch.arange(heads, device=device)[:, None, None],)
    step = max(1, _TILE_ELEMENTS // ((heads or 1) * block_size * span))  # query tiles per step
    partial, full = [], []
    for r0 in range(0, n, step):
        q_pos = torch.arange(r0 * block_size, min(r0 + step, n) * block_size,
                             device=device)[:, None]
        kept = (keep(q_pos.clamp(max=t - 1), k_pos.clamp(max=t - 1), *head)
                & (q_pos < t) & (k_pos < t))
        if causal:
            kept = kept & (k_pos <= q_pos)
        # ([heads,] query tiles, rows, key tiles, cols)
        tiles = kept.view(*kept.shape[:-2], -1, block_size, n, block_size)
        some = tiles.any(dim=-1).any(dim=-2)
        every = tiles.all(dim=-1).all(dim=-2)
        partial.append(some & ~every)
        full.append(every)

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        kept = keep(q_idx, kv_idx) if heads is None else keep(q_idx, kv_idx, h)
        return kept & (kv_idx <= q_idx) if causal else kept

    from torch.nn.attention.flex_attention import BlockMask

    return BlockMask.from_kv_blocks(
        *_ordered(torch.cat(partial, dim=-2)), *_ordered(torch.cat(full, dim=-2)),
        BLOCK_SIZE=block_size, mask_mod=mask_mod, seq_lengths=(t, t),
    )


def _ordered(tiles: Tensor) -> tuple[Tensor, Tensor]:
    """([H,] nQ, nK) bool tiles -> BlockMask's (1, H or 1, nQ) counts and (1, H or 1, nQ, nK)
    key-tile indices, the listed tiles first in ascending order."""
    counts = tiles.sum(dim=-1, dtype=torch.int32)
    order = torch.argsort(tiles.to(torch.int8), dim=-1, descending=True, stable=True)
    return (counts.view(1, -1, counts.shape[-1]),
            order.to(torch.int32).view(1, -1, *order.shape[-2:]))


def _flex(q: Tensor, k: Tensor, v: Tensor, block_mask: BlockMask, scale: float,
          key_padding_mask: Tensor | None) -> Tensor:
    from torch.nn.attention.flex_attention import flex_attention

    score_mod = None
    if key_padding_mask is not None:
        pad = key_padding_mask

        def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor,
                      kv_idx: Tensor) -> Tensor:
            return torch.where(pad[b, kv_idx], float("-inf"), score)

    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)


_compiled_flex: Callable[..., Tensor] | None = None
_FLEX_RECOMPILES = 256


def flex_pattern_attention(
    q: Tensor, k: Tensor, v: Tensor, block_mask: BlockMask, scale: float,
    key_padding_mask: Tensor | None = None,
) -> Tensor:
    """softmax(q kᵀ · scale) v over the keep-set of ``block_mask``, padded keys (True in
    ``key_padding_mask`` (B, Tk)) left out; (B, H, T, ·) tensors. Compiled off CPU; eager on
    CPU, where torch's FlexAttention is inference-only (inputs are detached when no gradient
    is recorded)."""
    global _compiled_flex
    if q.device.type == "cpu":
        if not torch.is_grad_enabled():  # torch refuses CPU inputs that require grad
            q, k, v = q.detach(), k.detach(), v.detach()
        with warnings.catch_warnings():  # eager on CPU on purpose: the unfused check path
            warnings.filterwarnings("ignore", message="flex_attention called without")
            return _flex(q, k, v, block_mask, scale, key_padding_mask)
    if torch.compiler.is_compiling():  # inside a compiled model: traced into its graph
        return _flex(q, k, v, block_mask, scale, key_padding_mask)
    if _compiled_flex is None:
        _compiled_flex = torch.compile(_flex)
    # dynamo's per-function recompile limit (named cache_size_limit before torch 2.6)
    limit = ("recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit")
             else "cache_size_limit")
    # One compiled kernel per pattern (its mask_mod), length, causality, padding and grad
    # mode: a model's layers and a benchmark's sweep need more than dynamo's default of 8
    # per function, past which it would fall back to the unfused, dense eager path.
    with torch._dynamo.config.patch(**{limit: _FLEX_RECOMPILES}):
        return _compiled_flex(q, k, v, block_mask, scale, key_padding_mask)


class FlexKernel:
    """The FlexAttention path of a pattern backend, chosen by its ``kernel`` option (a mixin
    for the :class:`~graded.attention.backends.base.PatternDecoding` backends).

    ``kernel="auto"`` runs FlexAttention on CUDA in float32, float16 or bfloat16 and the
    backend's native kernel otherwise; ``"flex"`` runs FlexAttention wherever it can compute
    the call (CPU included); ``"native"`` never. Either way, a call with attention dropout or a
    CPU call that needs gradients runs the native kernel (see :mod:`.flex`)."""

    name: str
    kernel = checked_option("kernel", partial(check_kernel, choices=PATTERN_KERNELS))
    scale: float | None
    keep: KeepRule
    per_head_keep: bool = False  # keep_rule's rule also takes the head: keep(q, k, head)

    def init_kernel(self, kernel: object) -> None:
        """Set the ``kernel`` option (checked when set, here and after construction); start an
        empty BlockMask cache."""
        self.kernel = kernel
        self._block_masks: dict[tuple, BlockMask] = {}

    def pattern_key(self) -> tuple:
        """What a cached BlockMask depends on beyond the length, causality, device and heads:
        nothing for a pattern whose options are fixed at construction."""
        return ()

    def keep_rule(self, t: int, causal: bool, device: torch.device) -> KeepRule:
        """The keep-set of a length-``t`` forward pass, before causality, as an element-wise
        rule on broadcastable positions that FlexAttention can also call on scalar positions
        (tensor operations only, no ``.item()``); with :attr:`per_head_keep` it takes the head
        index as a third argument. Default: :meth:`keep`."""
        return self.keep

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        dropout_p: float = 0.0,
    ) -> Tensor:
        """Self-attention over the pattern, the inputs checked (self-attention only, no
        ``attn_mask``, a length the pattern serves: :meth:`check_length`): FlexAttention where
        :meth:`uses_flex` says so, the backend's :meth:`native_forward` otherwise."""
        if type(is_causal) is not bool:
            is_causal = check_bool(f"{self.name} backend: is_causal", is_causal)
        check_inputs(self.name, q, k, v, key_padding_mask, attn_mask, dropout_p)
        check_self_attention(self.name, q, k)
        reject_attn_mask(self.name, attn_mask)
        self.check_length(q.shape[2])
        empty = empty_output(q, k, v)
        if empty is not None:
            return empty
        if self.uses_flex(q, k, v, dropout_p):
            return self.flex_forward(q, k, v, key_padding_mask=key_padding_mask,
                                     is_causal=is_causal)
        return self.native_forward(q, k, v, key_padding_mask=key_padding_mask,
                                   is_causal=is_causal, dropout_p=dropout_p)

    def check_length(self, t: int) -> None:
        """Refuse a sequence length ``t`` the pattern cannot serve (every length by default)."""

    def native_forward(self, q: Tensor, k: Tensor, v: Tensor, *,
                       key_padding_mask: Tensor | None, is_causal: bool,
                       dropout_p: float) -> Tensor:
        """The backend's own kernel (inputs already checked)."""
        raise NotImplementedError

    def uses_flex(self, q: Tensor, k: Tensor, v: Tensor, dropout_p: float) -> bool:
        """Whether a call on these inputs runs FlexAttention (see the class docstring)."""
        if self.kernel == "native" or dropout_p > 0.0 or q.shape[2] == 0:
            return False
        if self.kernel == "auto" and not (q.is_cuda and q.dtype in CUDA_DTYPES):
            return False
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        return not (q.device.type == "cpu" and needs_grad)

    def block_mask(self, t: int, causal: bool, device: torch.device | str,
                   heads: int | None = None) -> BlockMask:
        """The pattern's BlockMask for length ``t`` (cached per length, causal, device,
        :meth:`pattern_key` and, with :attr:`per_head_keep`, the number of ``heads``, which it
        then needs). ``causal``: True or False only."""
        if type(causal) is not bool:
            causal = check_bool(f"{self.name} backend: causal", causal)
        key = (t, causal, torch.device(device), heads if self.per_head_keep else None,
               *self.pattern_key())
        mask = self._block_masks.get(key)
        if mask is None:
            if len(self._block_masks) >= _CACHED_MASKS:
                self._block_masks.pop(next(iter(self._block_masks)))
            mask = pattern_block_mask(self.keep_rule(t, causal, key[2]), t, causal, key[2],
                                      heads=key[3])
            self._block_masks[key] = mask
        return mask

    def flex_forward(self, q: Tensor, k: Tensor, v: Tensor, *,
                     key_padding_mask: Tensor | None, is_causal: bool) -> Tensor:
        """The backend's attention through FlexAttention (inputs already checked)."""
        mask = self.block_mask(q.shape[2], is_causal, q.device, q.shape[1])
        return flex_pattern_attention(q, k, v, mask, default_scale(self.scale, q.shape[-1]),
                                      key_padding_mask)
