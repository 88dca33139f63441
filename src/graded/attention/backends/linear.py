"""Kernel (linear) attention: Katharopoulos et al. 2020, "Transformers are RNNs".

With a feature map φ the similarity is φ(q)ᵀφ(k) and (their Eq. 6, seed_002 B.1)

    y_i = φ(q_i)ᵀ (Σ_j φ(k_j) v_jᵀ) / (φ(q_i)ᵀ Σ_j φ(k_j)),

computed right to left as φ(Q)(φ(K)ᵀV) in O(T·F·Dv). The causal form (their Eqs. 8–11) uses the
prefix sums S_i = Σ_{j≤i} φ(k_j)v_jᵀ and z_i = Σ_{j≤i} φ(k_j). Here the prefix sums are taken
chunk by chunk: inside a chunk of C positions the masked quadratic form, across chunks an
exclusive cumulative sum of per-chunk states, so time is O(T·C·F + T·F·Dv) and memory
O(T·C + (T/C)·F·Dv): linear in T, without the per-position (T, F, Dv) states a plain cumsum
would store.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from graded.attention.backends.base import (
    AttentionBackend,
    Capabilities,
    DecodeState,
    check_inputs,
    check_self_attention,
    checked_bool_option,
    checked_int_option,
    checked_option,
    compute_dtype,
    empty_output,
    reject_attn_mask,
)
from graded.attention.backends.blockwise import pad_to_multiple
from graded.checks import check_bool, check_float

__all__ = ["LinearBackend", "check_dropout", "elu_feature_map", "kernel_attention",
           "kernel_decode"]


def elu_feature_map(x: Tensor) -> Tensor:
    """φ(x) = elu(x) + 1 (Katharopoulos et al. 2020, §3.2.1), positive everywhere."""
    return F.elu(x) + 1.0


def check_dropout(name: str, dropout_p: float, ignore_dropout: bool) -> None:
    """Kernel attention never forms the weights, so attention dropout has nothing to act on.
    ``ignore_dropout``: True or False only."""
    if type(ignore_dropout) is not bool:  # the bool itself passes on one comparison
        ignore_dropout = check_bool(f"{name} backend: ignore_dropout", ignore_dropout)
    if dropout_p > 0.0 and not ignore_dropout:
        raise ValueError(
            f"{name} backend never materialises attention weights, so attention dropout "
            f"(dropout_p={dropout_p}) cannot be applied; construct it with ignore_dropout=True "
            "to run without attention dropout, or set the attention dropout to 0"
        )


def kernel_attention(
    phi_q: Tensor, phi_k: Tensor, v: Tensor, *, causal: bool, chunk: int = 64,
    eps: float | Tensor = 1e-6,
) -> Tensor:
    """φ(Q)(φ(K)ᵀV) normalised by φ(Q)Σφ(K) + eps; features (B, H, T, F), values (B, H, Tk, Dv).

    Causal needs Tq == Tk and is computed chunkwise (module docstring). Zero rows of ``phi_k``
    drop keys (padding). ``eps`` is a number or a per-query tensor broadcastable to
    (B, H, Tq, 1) (features rescaled per query carry their guard rescaled alike). ``causal``:
    True or False only."""
    if type(causal) is not bool:
        causal = check_bool("kernel_attention: causal", causal)
    if not causal:
        kv = torch.matmul(phi_k.transpose(-2, -1), v)  # (B, H, F, Dv)
        z = phi_k.sum(dim=-2)  # (B, H, F)
        num = torch.matmul(phi_q, kv)
        den = torch.matmul(phi_q, z.unsqueeze(-1))
        return num / (den + eps)
    b, h, t, f = phi_q.shape
    qc, kc, vc = (pad_to_multiple(x, chunk) for x in (phi_q, phi_k, v))
    n = qc.shape[2] // chunk
    qc = qc.view(b, h, n, chunk, f)
    kc = kc.view(b, h, n, chunk, f)
    vc = vc.view(b, h, n, chunk, -1)
    kv = torch.matmul(kc.transpose(-2, -1), vc)  # (B, H, n, F, Dv) per-chunk states
    state = kv.cumsum(dim=2) - kv  # exclusive prefix: keys of earlier chunks
    z_chunk = kc.sum(dim=-2)  # (B, H, n, F)
    z_prev = z_chunk.cumsum(dim=2) - z_chunk
    scores = torch.matmul(qc, kc.transpose(-2, -1))  # (B, H, n, C, C)
    scores = scores * torch.ones(chunk, chunk, dtype=torch.bool, device=qc.device).tril()
    num = torch.matmul(qc, state) + torch.matmul(scores, vc)
    den = torch.matmul(qc, z_prev.unsqueeze(-1)) + scores.sum(dim=-1, keepdim=True)
    if isinstance(eps, Tensor):  # per query: into chunks, 1 on the padded rows (no 0/0)
        eps = F.pad(eps.expand(b, h, t, 1), (0, 0, 0, n * chunk - t), value=1.0)
        eps = eps.view(b, h, n, chunk, 1)
    out = num / (den + eps)
    return out.reshape(b, h, n * chunk, -1)[:, :, :t]


def kernel_decode(
    phi_q: Tensor, phi_k: Tensor, v: Tensor, state: DecodeState | None, *, chunk: int,
    eps: float | Tensor, extra: dict[str, Tensor] | None = None,
) -> tuple[Tensor, DecodeState]:
    """Causal kernel attention of new positions against the running sums of the earlier ones
    (Katharopoulos et al. 2020, Eqs. 8–11: the transformer as an RNN), the state being
    S = Σ_j φ(k_j)v_jᵀ (B, H, F, Dv) and z = Σ_j φ(k_j) (B, H, F): O(1) memory and O(F·Dv)
    time per token. The first call (no state) is :func:`kernel_attention`'s causal pass over
    the prompt. ``extra`` tensors are carried in the returned state."""
    t_new = phi_q.shape[2]
    if state is None or state.length == 0:
        out = kernel_attention(phi_q, phi_k, v, causal=True, chunk=chunk, eps=eps)
        kv = torch.matmul(phi_k.transpose(-2, -1), v)
        z = phi_k.sum(dim=-2)
        length = t_new
    else:
        kv, z = state.tensors["kv"], state.tensors["z"]
        scores = torch.matmul(phi_q, phi_k.transpose(-2, -1))
        scores = scores * torch.ones(t_new, t_new, dtype=torch.bool,
                                     device=phi_q.device).tril()
        num = torch.matmul(phi_q, kv) + torch.matmul(scores, v)
        den = torch.matmul(phi_q, z.unsqueeze(-1)) + scores.sum(dim=-1, keepdim=True)
        out = num / (den + eps)
        kv = kv + torch.matmul(phi_k.transpose(-2, -1), v)
        z = z + phi_k.sum(dim=-2)
        length = state.length + t_new
    return out, DecodeState(length, {"kv": kv, "z": z, **(extra or {})})


class LinearBackend(AttentionBackend):
    """Linear attention with the elu+1 feature map (Katharopoulos et al. 2020, Eqs. 6 and 8–11).

    Not softmax attention: it is attention with the kernel φ(q)ᵀφ(k), φ = elu + 1, applied to
    the unscaled q and k as in the paper (so no ``scale`` option; a grading that scales q acts
    before φ). Non-causal: time O(B·H·(Tq + Tk)·D·Dv), memory O(B·H·D·Dv) beyond inputs and
    outputs. Causal (Tq == Tk): chunked prefix sums, time O(B·H·T·(C·D + D·Dv)), memory
    O(B·H·(T·C + (T/C)·D·Dv)). Padded keys get φ(k) = 0. No general ``attn_mask``.
    Incremental decoding keeps the running sums (:func:`kernel_decode`): memory O(D·Dv) per
    layer and head, whatever the length. Half-precision inputs are computed in float32 and the
    output rounded once (in float16 the normaliser passes 65504 near D·T = 5·10⁴, and the
    output collapses); float32 and float64 as given.

    Options: ``chunk_size`` (C, default 64), ``eps`` (denominator guard, default 1e-6, as in
    the paper's code), ``ignore_dropout`` (default False: a positive ``dropout_p`` raises);
    each checked when set, here and after construction, and read at the next call.
    """

    name = "linear"
    capabilities = Capabilities(causal=True, cross_attention=True, key_padding_mask=True,
                                incremental=True, shift_invariant=True)
    chunk_size = checked_int_option("chunk_size")
    eps = checked_option("eps", lambda name, value: check_float(
        f"{name} backend: eps", value, minimum=0, strict_min=True))
    ignore_dropout = checked_bool_option("ignore_dropout")

    def __init__(
        self, chunk_size: int = 64, eps: float = 1e-6, ignore_dropout: bool = False
    ) -> None:
        super().__init__()
        self.chunk_size = chunk_size  # each checked by its property
        self.eps = eps
        self.ignore_dropout = ignore_dropout

    def check_attention_dropout(self, dropout_p: float) -> None:
        check_dropout(self.name, dropout_p, self.ignore_dropout)

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
        if type(is_causal) is not bool:
            is_causal = check_bool(f"{self.name} backend: is_causal", is_causal)
        check_inputs(self.name, q, k, v, key_padding_mask, attn_mask, dropout_p)
        reject_attn_mask(self.name, attn_mask)
        self.check_attention_dropout(dropout_p)
        if is_causal:
            check_self_attention(self.name, q, k)
        empty = empty_output(q, k, v)
        if empty is not None:
            return empty
        # half precision computed in float32 and rounded once (float32 and float64 as given):
        # the normaliser φ(q)ᵀΣφ(k) grows as D·T and passes float16's 65504 near D·T = 5·10⁴
        acc, out_dtype = compute_dtype(q.dtype), v.dtype
        phi_q, phi_k = elu_feature_map(q.to(acc)), elu_feature_map(k.to(acc))
        if key_padding_mask is not None:
            phi_k = phi_k.masked_fill(key_padding_mask[:, None, :, None], 0.0)
        return kernel_attention(
            phi_q, phi_k, v.to(acc), causal=is_causal, chunk=self.chunk_size, eps=self.eps
        ).to(out_dtype)

    def decode(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        state: DecodeState | None,
        *,
        key_padding_mask: Tensor | None = None,
        dropout_p: float = 0.0,
    ) -> tuple[Tensor, DecodeState]:
        check_inputs(self.name, q, k, v, key_padding_mask, None, dropout_p)
        self.check_attention_dropout(dropout_p)
        acc, out_dtype = compute_dtype(q.dtype), v.dtype  # as forward: half in float32
        phi_q, phi_k = elu_feature_map(q.to(acc)), elu_feature_map(k.to(acc))
        if key_padding_mask is not None:
            phi_k = phi_k.masked_fill(key_padding_mask[:, None, :, None], 0.0)
        out, state = kernel_decode(phi_q, phi_k, v.to(acc), state, chunk=self.chunk_size,
                                   eps=self.eps)
        return out.to(out_dtype), state
