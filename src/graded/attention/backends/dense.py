"""Dense backends: the fused kernel (``full``) and materialised weights (``explicit``).

Both compute 002 Eq. (2.24), ``softmax(Q Kᵀ · scale) V``, exactly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from graded.attention.backends.base import (
    AttentionBackend,
    Capabilities,
    check_bool_option,
    check_inputs,
    checked_int_option,
    compute_dtype,
    default_scale,
    softmax_rows,
)
from graded.attention.functional import causal_mask
from graded.checks import check_bool

if TYPE_CHECKING:
    from graded.attention.scores import Score

__all__ = ["ExplicitBackend", "FullBackend", "dense_attention_weights", "dense_keep_mask"]


def dense_keep_mask(
    q: Tensor,
    k: Tensor,
    key_padding_mask: Tensor | None,
    attn_mask: Tensor | None,
    is_causal: bool,
) -> Tensor | None:
    """The combined keep-mask (``True`` = may attend), broadcastable to (B, H, Tq, Tk), or None.

    Causal alignment is bottom-right (query ``i`` at absolute position ``Tk - Tq + i``).
    ``is_causal``: True or False only."""
    if type(is_causal) is not bool:  # the bool itself passes on one comparison
        is_causal = check_bool("dense_keep_mask: is_causal", is_causal)
    keep = attn_mask
    if key_padding_mask is not None:
        pad_keep = ~key_padding_mask[:, None, None, :]
        keep = pad_keep if keep is None else keep & pad_keep
    if is_causal:
        causal = causal_mask(q.shape[2], k.shape[2], q.device)
        keep = causal if keep is None else keep & causal
    return keep


def dense_attention_weights(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scale: float | None = None,
    key_padding_mask: Tensor | None = None,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    score: Score | None = None,
) -> tuple[Tensor, Tensor]:
    """Output (B, H, Tq, Dv) and weights (B, H, Tq, Tk), after dropout, of
    softmax(S + bias) V with S = Q Kᵀ · scale (002 Eqs. 2.25–2.27) or ``score(q, k)``; a bool
    ``attn_mask`` is a keep-mask, a float one an additive bias. Materialises the weights.

    Half-precision inputs are computed in float32 (:func:`~.base.compute_dtype`), as torch's
    math SDPA computes them, and the output and weights rounded to the inputs' dtype once; a
    ``score`` module runs on the inputs as given (its parameters share their dtype) and its
    scores are upcast before the softmax. ``is_causal``: True or False only."""
    if type(is_causal) is not bool:
        is_causal = check_bool("dense_attention_weights: is_causal", is_causal)
    acc = compute_dtype(q.dtype)
    scores = (score(q, k).to(acc) if score is not None
              else torch.matmul(q.to(acc), k.to(acc).transpose(-2, -1))
              * default_scale(scale, q.shape[-1]))
    bias = attn_mask is not None and attn_mask.dtype != torch.bool
    if bias:
        scores = scores + attn_mask.to(scores.dtype)
    keep = dense_keep_mask(q, k, key_padding_mask, None if bias else attn_mask, is_causal)
    weights = softmax_rows(scores, keep)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return torch.matmul(weights, v.to(acc)).to(v.dtype), weights.to(v.dtype)


class FullBackend(AttentionBackend):
    """Exact attention through :func:`torch.nn.functional.scaled_dot_product_attention`.

    002 Eq. (2.24); the fused kernel picks a flash / memory-efficient / math implementation.
    Time O(B·H·Tq·Tk·D); memory O(B·H·Tq·Tk) for the mask when one is given, and whatever the
    chosen kernel holds (on CPU the math kernel holds the Tq×Tk weights). Departure: rows with
    no admissible key return zeros instead of the kernel's NaN.

    Also takes an additive float ``attn_mask`` (ALiBi bias) and a ``score`` module: one that
    is a dot product after a change of q and k (:meth:`~graded.attention.scores.Score.
    fused_inputs`) runs on the kernel, any other is materialised. :meth:`forward_with_weights`
    returns the weights, materialised.

    Options: ``scale`` (default 1/√D).
    """

    name = "full"
    capabilities = Capabilities(
        causal=True, cross_attention=True, key_padding_mask=True, attn_bias=True,
        custom_score=True, attention_weights=True, incremental=True,
        shift_invariant=True,
    )

    def __init__(self, scale: float | None = None) -> None:
        super().__init__()
        self.scale = scale  # checked by its property (AttentionBackend.scale)

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
        score: Score | None = None,
    ) -> Tensor:
        if type(is_causal) is not bool:
            is_causal = check_bool(f"{self.name} backend: is_causal", is_causal)
        check_inputs(self.name, q, k, v, key_padding_mask, attn_mask, dropout_p, allow_bias=True)
        scale = self.scale
        if score is not None:  # a dot product after a change of q and k runs fused
            fused = score.fused_inputs(q, k)
            if fused is None:  # e.g. the additive score: its weights are materialised
                return dense_attention_weights(
                    q, k, v, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                    is_causal=is_causal, dropout_p=dropout_p, score=score,
                )[0]
            q, k, scale = fused
        scale = default_scale(scale, q.shape[-1])
        plain_causal = is_causal and q.shape[2] == k.shape[2]
        if plain_causal and key_padding_mask is None and attn_mask is None:
            return F.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale
            )
        bias = attn_mask is not None and attn_mask.dtype != torch.bool
        keep = dense_keep_mask(q, k, key_padding_mask, None if bias else attn_mask, is_causal)
        mask = keep
        if bias:  # one additive mask for the kernel: the bias, -inf where not kept
            mask = attn_mask.to(q.dtype)
            if keep is not None:
                mask = mask.masked_fill(~keep, float("-inf"))
            keep = mask != float("-inf")
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale
        )
        if keep is None:
            return out
        has_key = keep.any(dim=-1, keepdim=True)
        return torch.where(has_key, out, torch.zeros((), dtype=out.dtype, device=out.device))

    def forward_with_weights(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        dropout_p: float = 0.0,
        score: Score | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Output (B, H, Tq, Dv) and weights (B, H, Tq, Tk), after dropout, of the same
        attention, softmax(S + bias) with S = q kᵀ · scale or ``score(q, k)``, materialised
        (:func:`dense_attention_weights`): the output is weights @ v."""
        if type(is_causal) is not bool:
            is_causal = check_bool(f"{self.name} backend: is_causal", is_causal)
        check_inputs(self.name, q, k, v, key_padding_mask, attn_mask, dropout_p, allow_bias=True)
        return dense_attention_weights(
            q, k, v, scale=self.scale, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
            is_causal=is_causal, dropout_p=dropout_p, score=score,
        )


class ExplicitBackend(AttentionBackend):
    """Exact attention with the (B, H, Tq, Tk) weight matrix materialised and kept.

    002 Eqs. (2.25)–(2.27) step by step. Time O(B·H·Tq·Tk·D); memory O(B·H·Tq·Tk) (the scores
    and the weights, 002 Eq. 4.9), which is why it refuses, with a ``MemoryError`` naming the
    bytes it would need, whenever B·H·Tq·Tk exceeds ``max_elements``.

    Options: ``scale`` (default 1/√D), ``max_elements`` (default 2**27, i.e. 512 MiB of float32
    weights), ``store_weights`` (keep the last weights, detached, in ``last_weights``).
    :meth:`forward_with_weights` returns the weights alongside the output, with gradient.
    """

    name = "explicit"
    capabilities = Capabilities(
        causal=True, cross_attention=True, key_padding_mask=True, attn_bias=True,
        custom_score=True, attention_weights=True, incremental=True,
        shift_invariant=True,
    )
    max_elements = checked_int_option("max_elements")  # checked when set, as ``scale``

    def __init__(
        self, scale: float | None = None, max_elements: int = 2**27, store_weights: bool = True
    ) -> None:
        super().__init__()
        self.scale = scale  # checked by its property (AttentionBackend.scale)
        self.max_elements = max_elements
        self.store_weights = store_weights
        self.last_weights: Tensor | None = None

    @property
    def store_weights(self) -> bool:
        """The ``store_weights`` option (checked when set: a bool)."""
        return self._store_weights

    @store_weights.setter
    def store_weights(self, value: object) -> None:
        self._store_weights = check_bool_option(self.name, "store_weights", value)
        if not self._store_weights:  # no stale weights of earlier calls, nor their memory
            self.last_weights = None

    def check_size(self, shape: tuple[int, int, int, int], dtype: torch.dtype) -> None:
        """Raise ``MemoryError`` naming the bytes needed if ``shape`` exceeds ``max_elements``."""
        n = shape[0] * shape[1] * shape[2] * shape[3]
        if n > self.max_elements:
            dtype = compute_dtype(dtype)  # half precision: scores and weights in float32
            size = torch.empty((), dtype=dtype).element_size()
            need = 2 * n * size
            raise MemoryError(
                f"explicit backend refuses to materialise a {shape} attention matrix: "
                f"{n} elements > max_elements={self.max_elements}; it would need {need} bytes "
                f"({need / 2**20:.1f} MiB) for scores and weights in {dtype}. Use the 'chunked' "
                "backend for exact attention in O(T·chunk) memory, or raise max_elements"
            )

    def forward_with_weights(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        dropout_p: float = 0.0,
        score: Score | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Output (B, H, Tq, Dv) and weights (B, H, Tq, Tk) after dropout."""
        if type(is_causal) is not bool:
            is_causal = check_bool(f"{self.name} backend: is_causal", is_causal)
        check_inputs(self.name, q, k, v, key_padding_mask, attn_mask, dropout_p, allow_bias=True)
        self.check_size((q.shape[0], q.shape[1], q.shape[2], k.shape[2]), q.dtype)
        out, weights = dense_attention_weights(
            q, k, v, scale=self.scale, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
            is_causal=is_causal, dropout_p=dropout_p, score=score,
        )
        if self.store_weights:
            self.last_weights = weights.detach()
        return out, weights

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
        score: Score | None = None,
    ) -> Tensor:
        out, _ = self.forward_with_weights(
            q, k, v, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
            is_causal=is_causal, dropout_p=dropout_p, score=score,
        )
        return out
