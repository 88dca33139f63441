"""Exact attention computed block by block with an online softmax (memory-efficient attention).

Rabe & Staats 2021, "Self-attention does not need O(n²) memory", and the tiling of FlashAttention
(Dao et al. 2022, Algorithm 1; seed_002 Appendix B.8): for each block of queries keep a running
row maximum ``m``, normaliser ``ℓ`` and unnormalised output ``O``; for each key block ``S_b``

    m' = max(m, rowmax(S_b)),  ℓ' = e^{m-m'} ℓ + rowsum(e^{S_b-m'}),
    O' = e^{m-m'} O + e^{S_b-m'} V_b,                 output O / ℓ.

This is 002 §4.3.2's "memory-efficient attention" and "gradient checkpointing" together: the
forward never holds a Tq×Tk matrix, and each query chunk is wrapped in
:func:`torch.utils.checkpoint.checkpoint`, so the backward recomputes one query chunk at a time.

The same computation exists as a fused kernel: :func:`fused_attention` hands the calls it can
compute exactly without a Tq×Tk mask to :func:`torch.nn.functional.scaled_dot_product_attention`
(its flash / memory-efficient kernels on CUDA); the backend's ``kernel`` option chooses.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from graded.attention.backends.base import (
    AttentionBackend,
    Capabilities,
    check_bool_option,
    check_inputs,
    check_int_option,
    check_kernel,
    checked_bool_option,
    checked_int_option,
    checked_option,
    compute_dtype,
    default_scale,
    empty_output,
)
from graded.attention.backends.dense import FullBackend
from graded.checks import check_bool

if TYPE_CHECKING:
    from graded.attention.scores import Score

__all__ = ["CHUNKED_KERNELS", "ChunkedBackend", "chunked_attention", "fusable",
           "fused_attention"]

CHUNKED_KERNELS = ("auto", "fused", "native")


def _query_chunk(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    pad: Tensor | None,
    mask: Tensor | None,
    q_offset: int,
    causal: bool,
    scale: float,
    key_chunk: int,
    dropout_p: float,
    score: Score | None = None,
) -> Tensor:
    """Online-softmax attention of one query chunk ``q`` (B, H, c, D) over all keys.

    ``q_offset`` is the absolute position of the chunk's first query (for the causal mask);
    ``pad`` is (B, Tk) True = padding; ``mask`` the rows of this chunk (B|1, H|1, c, Tk) of a
    keep-mask (bool) or an additive bias (float); ``score`` replaces ``q kᵀ · scale``.
    """
    b, h, c, _ = q.shape
    t_k = k.shape[2]
    # half-precision inputs are computed in float32 (as in FlashAttention and torch's math
    # SDPA): scores, running statistics and output; summed over many key blocks in bfloat16
    # they would drift far from the dense result. The output is rounded once, at the end.
    acc_dtype = compute_dtype(q.dtype)
    if score is None:  # a score module runs on the inputs as given (its parameters' dtype)
        q = q.to(acc_dtype)
    m = torch.full((b, h, c, 1), float("-inf"), dtype=acc_dtype, device=q.device)
    denom = torch.zeros((b, h, c, 1), dtype=acc_dtype, device=q.device)
    acc = torch.zeros((b, h, c, v.shape[-1]), dtype=acc_dtype, device=q.device)
    last_pos = q_offset + c - 1
    q_pos = torch.arange(q_offset, q_offset + c, device=q.device)[:, None]
    for k0 in range(0, t_k, key_chunk):
        if causal and k0 > last_pos:
            break
        k1 = min(k0 + key_chunk, t_k)
        k_b = k[:, :, k0:k1]
        if score is not None:
            s = score(q, k_b).to(acc_dtype)
        else:
            s = torch.matmul(q, k_b.to(acc_dtype).transpose(-2, -1)) * scale
        if mask is not None and mask.dtype != torch.bool:
            s = s + mask[..., k0:k1].to(s.dtype)
        keep = None
        if causal:
            keep = torch.arange(k0, k1, device=q.device)[None, :] <= q_pos
        if pad is not None:
            p_keep = ~pad[:, None, None, k0:k1]
            keep = p_keep if keep is None else keep & p_keep
        if mask is not None and mask.dtype == torch.bool:
            keep = mask[..., k0:k1] if keep is None else keep & mask[..., k0:k1]
        if keep is not None:
            s = s.masked_fill(~keep, float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        m_safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
        p = torch.exp(s - m_safe)
        alpha = torch.exp(m - m_safe)
        denom = alpha * denom + p.sum(dim=-1, keepdim=True)
        if dropout_p > 0.0:
            p = F.dropout(p, p=dropout_p)
        acc = alpha * acc + torch.matmul(p, v[:, :, k0:k1].to(acc_dtype))
        m = m_new
    return (acc / torch.where(denom > 0, denom, torch.ones_like(denom))).to(v.dtype)


def chunked_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    key_padding_mask: Tensor | None = None,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    query_chunk: int = 512,
    key_chunk: int = 512,
    checkpointing: bool = True,
    score: Score | None = None,
) -> Tensor:
    """Exact softmax attention in O(query_chunk · key_chunk) working memory per step.

    Per key block the scores are ``S_b = q k_bᵀ · scale`` or, with a ``score`` module,
    ``S_b = score(q, k_b)`` (002 §2.4: dot, bilinear q W kᵀ, additive vᵀ tanh(W q + U k));
    a float ``attn_mask`` is an additive bias added to ``S_b`` (ALiBi), a bool one a keep-mask.
    Every score acts on one (query, key) pair at a time, so blockwise evaluation is exact.
    Causal alignment is bottom-right. ``checkpointing`` recomputes each query chunk in backward
    (memory O(T·query_chunk) instead of O(Tq·Tk)); it is skipped when no input needs grad.
    ``query_chunk``, ``key_chunk`` and ``checkpointing`` are checked as the backend's options
    are: positive ints, a bool or a float refused with the value named; a bool. ``is_causal``
    takes True or False only.
    """
    if type(is_causal) is not bool:  # the bool itself passes on one comparison
        is_causal = check_bool("chunked_attention: is_causal", is_causal)
    query_chunk = check_int_option(ChunkedBackend.name, "query_chunk", query_chunk)
    key_chunk = check_int_option(ChunkedBackend.name, "key_chunk", key_chunk)
    checkpointing = check_bool_option(ChunkedBackend.name, "checkpointing", checkpointing)
    t_q, t_k = q.shape[2], k.shape[2]
    scale = default_scale(scale, q.shape[-1])
    if attn_mask is not None:
        attn_mask = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
        attn_mask = attn_mask.expand(*attn_mask.shape[:2], t_q, t_k)
    use_ckpt = checkpointing and torch.is_grad_enabled() and (
        q.requires_grad or k.requires_grad or v.requires_grad
    )
    outs = []
    for q0 in range(0, t_q, query_chunk):
        q1 = min(q0 + query_chunk, t_q)
        rows = None if attn_mask is None else attn_mask[..., q0:q1, :]
        args = (
            q[:, :, q0:q1], k, v, key_padding_mask, rows, t_k - t_q + q0, is_causal, scale,
            key_chunk, dropout_p, score,
        )
        if use_ckpt:
            outs.append(checkpoint(_query_chunk, *args, use_reentrant=False))
        else:
            outs.append(_query_chunk(*args))
    return torch.cat(outs, dim=2)


def fusable(
    q: Tensor,
    k: Tensor,
    *,
    key_padding_mask: Tensor | None = None,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    score: Score | None = None,
) -> bool:
    """Whether :func:`fused_attention` computes this call of :func:`chunked_attention` exactly:
    the scaled-dot score, no ``attn_mask`` (neither a keep-mask nor an additive bias), and
    causality only where it needs no Tq×Tk mask (with no key padding, and Tq <= Tk).
    ``is_causal``: True or False only."""
    if type(is_causal) is not bool:
        is_causal = check_bool("fusable: is_causal", is_causal)
    if score is not None or attn_mask is not None:
        return False
    causal = is_causal and q.shape[2] > 1  # a single bottom-right query sees every key
    return not causal or (key_padding_mask is None and q.shape[2] <= k.shape[2])


def fused_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    key_padding_mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> Tensor:
    """:func:`chunked_attention` through :func:`~torch.nn.functional.scaled_dot_product_attention`
    for the calls :func:`fusable` admits (the flash or memory-efficient kernel on CUDA).

    Causal attention is bottom-right aligned (``causal_lower_right`` when Tq < Tk); key padding
    is a (B, 1, 1, Tk) mask, never a Tq×Tk one, and a batch row whose keys are all padding
    returns zeros (the backends' convention, where the kernel would return NaN). Attention
    dropout is the kernel's: the same distribution as the chunk loop's, other random draws.
    ``is_causal``: True or False only."""
    if type(is_causal) is not bool:
        is_causal = check_bool("fused_attention: is_causal", is_causal)
    t_q, t_k = q.shape[2], k.shape[2]
    if is_causal and t_q > 1 and (key_padding_mask is not None or t_q > t_k):
        raise ValueError(
            "fused_attention cannot serve causal attention with a key_padding_mask or with more "
            f"queries than keys (Tq={t_q}, Tk={t_k}, padding "
            f"{'given' if key_padding_mask is not None else 'none'}): the kernel would need a "
            "Tq×Tk mask; call chunked_attention (fusable() names the calls it can serve)"
        )
    scale = default_scale(scale, q.shape[-1])
    if is_causal and t_q > 1:
        from torch.nn.attention.bias import causal_lower_right  # imports torch._dynamo: late

        mask = None if t_q == t_k else causal_lower_right(t_q, t_k)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                              is_causal=t_q == t_k, scale=scale)
    if key_padding_mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale)
    empty = key_padding_mask.all(dim=1)[:, None, None, None]  # (B, 1, 1, 1)
    keep = ~key_padding_mask[:, None, None, :] | empty  # empty rows attend anywhere, then 0
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=dropout_p,
                                         scale=scale)
    return out.masked_fill(empty, 0.0)


class ChunkedBackend(AttentionBackend):
    """Exact attention with an online softmax over key blocks, query block by query block.

    Rabe & Staats 2021 §2–3; Dao et al. 2022 Algorithm 1 (seed_002 B.8). Time O(B·H·Tq·Tk·D)
    (the same flops as full attention, plus a recomputation of the forward in backward); extra
    memory O(B·H·query_chunk·key_chunk) in the forward and O(B·H·query_chunk·Tk) while one
    checkpointed chunk is differentiated, never O(Tq·Tk). Honours every mask (general boolean
    ``attn_mask`` included) and attention dropout (applied to the unnormalised weights, as in
    FlashAttention; the normaliser uses the undropped sum). Half-precision inputs are computed
    in float32 (scores, running maximum, normaliser and output) and rounded once, as
    FlashAttention and torch's math SDPA do.

    Also takes an additive float ``attn_mask`` (ALiBi bias) and a ``score`` module, applied
    block by block (exact, see :func:`chunked_attention`). :meth:`forward_with_weights`
    returns the weights of this same attention, materialised densely, O(B·H·Tq·Tk), only
    when asked for.

    ``kernel="auto"`` hands the calls :func:`fusable` admits to the fused kernel
    (:func:`fused_attention`) on CUDA and keeps the chunk loop for the rest (a custom score, an
    additive bias such as ALiBi, a general ``attn_mask``, causal attention with key padding)
    and on every other device; ``"fused"`` does the same on every device (CPU included);
    ``"native"`` always runs the chunk loop.

    Options: ``scale`` (default 1/√D), ``query_chunk`` and ``key_chunk`` (block sizes, default
    512), ``checkpointing`` (default True), ``kernel`` (``"auto"``, ``"fused"``, ``"native"``).
    """

    name = "chunked"
    capabilities = Capabilities(
        causal=True, cross_attention=True, key_padding_mask=True, attn_bias=True,
        custom_score=True, attention_weights=True, incremental=True,
        shift_invariant=True,
    )
    # checked when set, in the constructor and after it (as ``scale``, see checked_option)
    query_chunk = checked_int_option("query_chunk")
    key_chunk = checked_int_option("key_chunk")
    kernel = checked_option("kernel", partial(check_kernel, choices=CHUNKED_KERNELS))
    checkpointing = checked_bool_option("checkpointing")

    def __init__(
        self,
        scale: float | None = None,
        query_chunk: int = 512,
        key_chunk: int = 512,
        checkpointing: bool = True,
        kernel: str = "auto",
    ) -> None:
        super().__init__()
        self.scale = scale  # each checked by its property, here and when set later
        self.query_chunk = query_chunk
        self.key_chunk = key_chunk
        self.checkpointing = checkpointing
        self.kernel = kernel

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
        check_inputs(self.name, q, k, v, key_padding_mask, attn_mask, dropout_p,
                     allow_bias=True)
        empty = empty_output(q, k, v)
        if empty is not None:
            return empty
        fused = self.kernel == "fused" or (self.kernel == "auto" and q.is_cuda)
        if fused and fusable(q, k, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                             is_causal=is_causal, score=score):
            return fused_attention(q, k, v, key_padding_mask=key_padding_mask,
                                   is_causal=is_causal, dropout_p=dropout_p, scale=self.scale)
        return chunked_attention(
            q, k, v, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
            is_causal=is_causal, dropout_p=dropout_p, scale=self.scale,
            query_chunk=self.query_chunk, key_chunk=self.key_chunk,
            checkpointing=self.checkpointing, score=score,
        )

    # Output and (B, H, Tq, Tk) weights of the same attention: asking for the weights
    # materialises them, so this path is dense (the output is weights @ v, not recomputed
    # chunk by chunk), the full backend's.
    forward_with_weights = FullBackend.forward_with_weights
