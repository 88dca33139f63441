"""Linformer attention: learned low-rank projections along the sequence (Wang et al. 2020).

Their Eq. (7) (seed_002 B.3): with projections E, F ∈ R^{k×n} of the key and value sequences,

    head = softmax(Q (E K)ᵀ · scale) (F V),

so the score matrix is Tq×k instead of Tq×Tk.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from graded.attention.backends.base import (
    AttentionBackend,
    Capabilities,
    check_bool_option,
    check_inputs,
    check_int_option,
    compute_dtype,
    default_scale,
    fixed_option,
)
from graded.checks import check_bool

__all__ = ["LinformerBackend"]


class LinformerBackend(AttentionBackend):
    """Softmax attention over k projected keys and values (Wang et al. 2020, Eq. 7, §4).

    E and F are (rank, max_len) parameters initialised N(0, 1/rank) (the Johnson–Lindenstrauss
    projection of their Theorem 1); ``share_kv`` ties F = E (their "key-value sharing").
    The maximum length is fixed at construction: inputs of Tk ≤ max_len use the first Tk
    columns of E and F; longer inputs raise. Time O(B·H·Tk·rank·(D + Dv) + B·H·Tq·rank·(D + Dv)),
    memory O(B·H·Tq·rank): linear in the length for a fixed rank.

    Departures: the paper has no causal form (projecting the sequence mixes future positions),
    so ``is_causal`` raises, as does a general ``attn_mask``. Padded keys and values are zeroed
    before the projection, so they add nothing to E·K and F·V; with a real (mixing)
    projection this is the usual practice, not an exact masking. Half-precision inputs are
    computed in float32 (E and F not rounded to their dtype) and the output rounded once, as
    the other backends compute them.

    Options: ``max_len`` (required), ``rank`` (k, default 256), ``share_kv`` (False), ``scale``
    (default 1/√D). ``max_len``, ``rank`` and ``share_kv`` give E and F their shapes: they are
    fixed at construction (set to another value later, they are refused: resizing would
    discard the learned projections and the optimizer's references to them); ``scale`` may be
    set later.
    """

    name = "linformer"
    capabilities = Capabilities(cross_attention=True, key_padding_mask=True)
    # the shapes of the learned projections E and F, fixed when they are made
    max_len = fixed_option("max_len", lambda name, value: check_int_option(
        name, "max_len", value), "E and F are (rank, max_len) parameters")
    rank = fixed_option("rank", lambda name, value: check_int_option(
        name, "rank", value), "E and F are (rank, max_len) parameters")
    share_kv = fixed_option("share_kv", lambda name, value: check_bool_option(
        name, "share_kv", value), "F is E, or a parameter of its own")

    def __init__(
        self,
        max_len: int,
        rank: int = 256,
        share_kv: bool = False,
        scale: float | None = None,
    ) -> None:
        super().__init__()
        self.max_len = max_len  # each checked by its property, and fixed from here on
        self.rank = rank
        self.share_kv = share_kv
        self.scale = scale  # checked by its property (AttentionBackend.scale)
        rank, max_len = self.rank, self.max_len
        self.E = nn.Parameter(torch.randn(rank, max_len) / rank**0.5)
        self.F = None if self.share_kv else nn.Parameter(torch.randn(rank, max_len) / rank**0.5)

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
        if type(is_causal) is not bool:  # the bool itself passes on one comparison
            is_causal = check_bool(f"{self.name} backend: is_causal", is_causal)
        check_inputs(self.name, q, k, v, key_padding_mask, attn_mask, dropout_p)
        if is_causal:
            raise ValueError(
                "linformer backend has no causal form (the length projection mixes future "
                "positions into every projected key); use a causal backend such as 'linear', "
                "'performer' or 'chunked'"
            )
        if attn_mask is not None:
            raise ValueError(
                "linformer backend cannot honour a general attn_mask (scores are over projected "
                "keys, not positions); pass key_padding_mask only"
            )
        t_k = k.shape[2]
        if t_k > self.max_len:
            raise ValueError(
                f"linformer backend: key length {t_k} exceeds max_len={self.max_len} fixed at "
                "construction"
            )
        # half precision computed in float32, E and F unrounded, and the output rounded once
        out_dtype, acc = v.dtype, compute_dtype(q.dtype)
        q, k, v = q.to(acc), k.to(acc), v.to(acc)
        e = self.E[:, :t_k].to(acc)
        f = e if self.F is None else self.F[:, :t_k].to(acc)
        if key_padding_mask is not None:
            keep = (~key_padding_mask)[:, None, :, None].to(acc)
            k, v = k * keep, v * keep
        k_proj = torch.matmul(e, k)  # (B, H, rank, D)
        v_proj = torch.matmul(f, v)  # (B, H, rank, Dv)
        scale = default_scale(self.scale, q.shape[-1])
        return F.scaled_dot_product_attention(q, k_proj, v_proj, dropout_p=dropout_p,
                                              scale=scale).to(out_dtype)
