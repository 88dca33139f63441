"""The checks of a backend call's tensors and masks, and the output of a call with nothing to
attend.

The shapes and mask conventions are those of :mod:`graded.attention.backends.base`: ``q``
(B, H, Tq, D), ``k`` (B, H, Tk, D), ``v`` (B, H, Tk, Dv); ``key_padding_mask`` (B, Tk) ``True``
at padding; ``attn_mask`` a bool keep-mask (``True`` = may attend) broadcastable to
(B, H, Tq, Tk), or an additive float bias for a backend that serves one. Every message names
the backend and the value.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["check_inputs", "check_self_attention", "empty_output", "reject_attn_mask"]


def check_inputs(
    name: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_padding_mask: Tensor | None,
    attn_mask: Tensor | None,
    dropout_p: float,
    *,
    allow_bias: bool = False,
) -> None:
    """Validate shapes, dtypes and masks of a backend call; messages name the backend and value.

    ``allow_bias``: the backend serves an additive float ``attn_mask`` (capability
    ``attn_bias``), which is then checked for its shape only; otherwise a mask must be a bool
    keep-mask."""
    for label, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} backend: {label} must be a Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(
                f"{name} backend: {label} must have shape (batch, heads, length, dim), "
                f"got {tuple(t.shape)}"
            )
        if not torch.is_floating_point(t):
            raise TypeError(f"{name} backend: {label} must be floating point, got {t.dtype}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(
            f"{name} backend: q, k and v must have one dtype, got {q.dtype}, {k.dtype}, "
            f"{v.dtype}"
        )
    if q.shape[:2] != k.shape[:2] or k.shape[:3] != v.shape[:3]:
        raise ValueError(
            f"{name} backend: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} must "
            "agree in batch and heads, and k and v in length"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"{name} backend: q and k head dims differ ({q.shape[-1]} vs {k.shape[-1]})"
        )
    if key_padding_mask is not None:
        expected = (q.shape[0], k.shape[2])
        if key_padding_mask.dtype != torch.bool or tuple(key_padding_mask.shape) != expected:
            raise ValueError(
                f"{name} backend: key_padding_mask must be a bool tensor of shape {expected} "
                f"(True = padding), got {key_padding_mask.dtype} {tuple(key_padding_mask.shape)}"
            )
    if attn_mask is not None:
        if attn_mask.dtype != torch.bool and not (allow_bias and attn_mask.is_floating_point()):
            raise ValueError(
                f"{name} backend: attn_mask must be a bool keep-mask (True = may attend)"
                f"{' or a float additive bias' if allow_bias else ''}, got dtype "
                f"{attn_mask.dtype}"
            )
        # broadcast *to* (B, H, Tq, Tk): a mask with more dimensions, or a size where the
        # call has 1 (a batch of 2 masks for one sequence), would widen the output instead
        full_shape = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        try:
            widened = torch.broadcast_shapes(attn_mask.shape, full_shape) != full_shape
        except RuntimeError:
            widened = True
        if widened:
            raise ValueError(
                f"{name} backend: attn_mask of shape {tuple(attn_mask.shape)} does not broadcast "
                f"to (B, H, Tq, Tk) = {full_shape}"
            )
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"{name} backend: dropout_p must be in [0, 1), got {dropout_p}")


def empty_output(q: Tensor, k: Tensor, v: Tensor) -> Tensor | None:
    """The output (B, H, Tq, Dv) of a call with nothing to attend, or None: zeros for an empty
    batch, no query, or no key (a query with no admissible key returns zeros). The blocked
    and kernel computations reshape by the length and cannot run on zero elements. The zeros
    are (Q Kᵀ) V over the empty dimension, so that q, k and v (and the parameters before them)
    get zero gradients, not none."""
    if q.shape[0] and q.shape[2] and k.shape[2]:
        return None
    return torch.matmul(torch.matmul(q, k.transpose(-2, -1)).to(v.dtype), v)


def check_self_attention(name: str, q: Tensor, k: Tensor) -> None:
    """Positional patterns (windows, strides, buckets) need queries and keys on one axis."""
    if q.shape[2] != k.shape[2]:
        raise ValueError(
            f"{name} backend needs self-attention lengths (Tq == Tk), got Tq={q.shape[2]}, "
            f"Tk={k.shape[2]}"
        )


def reject_attn_mask(name: str, attn_mask: Tensor | None) -> None:
    """Backends whose cost depends on never forming (Tq, Tk) cannot honour a general mask."""
    if attn_mask is not None:
        raise ValueError(
            f"{name} backend cannot honour a general attn_mask (it never forms the Tq×Tk score "
            "matrix); pass key_padding_mask / is_causal, or use the 'chunked' or 'full' backend"
        )
