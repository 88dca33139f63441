"""Reformer attention: shared-QK attention restricted by locality-sensitive hashing.

Kitaev, Kaiser & Levskaya 2020, "Reformer: The Efficient Transformer", §2 (seed_002 B.7):

- shared QK: keys are the unit-normalised queries, k_j = q_j / ‖q_j‖;
- angular LSH: h(x) = argmax([xR; −xR]) for a random rotation R ∈ R^{D×b/2}, b buckets;
- sort positions by (bucket, position), cut the sorted sequence into chunks of m, and let each
  query attend within its chunk and the previous one, only to keys of its own bucket;
- a position may not attend to itself unless it has no other admissible key;
- n_rounds independent hashings; round r gives an output o^(r) and log-normaliser z^(r), and
  the rounds are combined as Σ_r exp(z^(r) − logsumexp_r z) o^(r) (their Eq. for multi-round
  attention), with each score lowered by log N_ij, N_ij = the number of rounds in which i and
  j share a bucket, so that a pair found by several rounds is not counted several times.
"""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor

from graded.attention.backends.base import (
    AttentionBackend,
    Capabilities,
    check_bool_option,
    check_inputs,
    check_seed,
    check_self_attention,
    checked_int_option,
    checked_option,
    compute_dtype,
    default_scale,
    empty_output,
    fixed_option,
    reject_attn_mask,
)
from graded.checks import check_bool

__all__ = ["LSHBackend", "hash_buckets"]


def hash_buckets(x: Tensor, rotations: Tensor) -> Tensor:
    """Angular LSH buckets (Reformer §2, Eq. for h(x)): x (B, H, T, D), rotations (R, D, b/2) ->
    (B, H, R, T) long in [0, b). With b = 1 every position is in bucket 0.

    The projection xR is computed in float32 for half-precision x (:func:`compute_dtype`; float32
    and float64 as given), R, drawn in float32, not rounded to x's dtype: bfloat16 and float16
    inputs fall in the buckets of their float32 values (in their own precision, R rounded to
    8 or 11 bits and the sums accumulated there moved near-ties to other buckets)."""
    if rotations.shape[-1] == 0:
        return torch.zeros(*x.shape[:2], rotations.shape[0], x.shape[2], dtype=torch.long,
                           device=x.device)
    dtype = compute_dtype(x.dtype)
    proj = torch.einsum("bhtd,rdk->bhrtk", x.to(dtype), rotations.to(dtype))
    return torch.cat([proj, -proj], dim=-1).argmax(dim=-1)


def _gather_t(x: Tensor, index: Tensor) -> Tensor:
    """x (B, H, T', E), index (B, H, R, N) -> (B, H, R, N, E) along positions."""
    b, h, r, n = index.shape
    src = x.unsqueeze(2).expand(b, h, r, x.shape[2], x.shape[3])
    return torch.gather(src, 3, index.unsqueeze(-1).expand(b, h, r, n, x.shape[3]))


def _check_buckets(name: str, n_buckets: object) -> int | None:
    """The ``n_buckets`` option: None (from the length), 1, or a positive even int."""
    if n_buckets is not None and (
        isinstance(n_buckets, bool) or not isinstance(n_buckets, int) or n_buckets <= 0
        or (n_buckets > 1 and n_buckets % 2)
    ):
        raise ValueError(
            f"{name} backend: n_buckets must be 1 or a positive even int, got {n_buckets!r}"
        )
    return n_buckets


class LSHBackend(AttentionBackend):
    """Reformer LSH attention (Kitaev et al. 2020, §2–3).

    With ``shared_qk=True`` (Reformer's design, their §2) keys are q/‖q‖ and the ``k`` argument
    is not used: :class:`~graded.attention.MultiheadAttention` (and so every model) refuses it,
    since its key projection would get no gradient; call the backend on per-head tensors.
    With ``shared_qk=False`` (default) keys are the given k/‖k‖: positions are still bucketed
    and sorted by the hash of their *query* (one sort for both, as the chunked scheme needs),
    and within the admissible pairs the score is q_i·k_j/‖k_j‖ · scale, a departure from the
    paper that keeps the key projection in use (its gradient is non-zero). Scores are scaled by
    ``scale`` (default 1/√D). Time O(B·H·R·T·(m·(D + Dv) + log T)), memory O(B·H·R·T·m·R)
    for R rounds and chunk size m (the last R for the duplicate counts; O(B·H·R·T·m) with one
    round). Departures: the first chunk does not wrap around to look at the last one; N_ij
    counts rounds by bucket equality, ignoring chunk boundaries (as the reference code does).
    Half-precision inputs are hashed and attended in float32 and the output rounded once, so
    they fall in the buckets of their float32 values (:func:`hash_buckets`).
    Self-attention only (Tq == Tk); no general ``attn_mask``.

    Options: ``n_buckets`` (even, or 1; default max(2, T/chunk_size rounded up to even)),
    ``n_rounds`` (default 2), ``chunk_size`` (m, default 64), ``seed`` (fixed rotations drawn
    from this seed at every call; None = fresh rotations from torch's generator each call, as in
    the paper), ``scale``, ``shared_qk`` (default False). ``shared_qk`` is fixed at
    construction: :class:`~graded.attention.MultiheadAttention` shapes its projections by it
    when it is built (no key projection with shared QK), so a later change would leave its key
    projection unused or keep passing queries as keys; set to another value, it is refused.
    """

    name = "lsh"
    capabilities = Capabilities(causal=True, key_padding_mask=True)
    # read at every call, so checked whenever set (checked_option), as the constructor does
    n_buckets = checked_option("n_buckets", _check_buckets)
    n_rounds = checked_int_option("n_rounds")
    chunk_size = checked_int_option("chunk_size")
    seed = checked_option("seed", partial(check_seed, optional=True))
    shared_qk = fixed_option("shared_qk", lambda name, value: check_bool_option(
        name, "shared_qk", value), "MultiheadAttention builds its key projection, or none, by it")

    def __init__(
        self,
        n_buckets: int | None = None,
        n_rounds: int = 2,
        chunk_size: int = 64,
        seed: int | None = None,
        scale: float | None = None,
        shared_qk: bool = False,
    ) -> None:
        super().__init__()
        self.shared_qk = shared_qk  # checked by its property, and fixed from here on
        self.n_buckets = n_buckets  # each checked by its property, here and when set later
        self.n_rounds = n_rounds
        self.chunk_size = chunk_size
        self.seed = seed
        self.scale = scale

    def extra_repr(self) -> str:
        return f"name={self.name!r}, shared_qk={self.shared_qk}"

    def rotations(self, dim: int, n_buckets: int, device: torch.device) -> Tensor:
        """(n_rounds, dim, n_buckets // 2) Gaussian random rotations."""
        gen = None if self.seed is None else torch.Generator().manual_seed(self.seed)
        rot = torch.randn(self.n_rounds, dim, n_buckets // 2, generator=gen)
        return rot.to(device)

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
        check_self_attention(self.name, q, k)
        reject_attn_mask(self.name, attn_mask)
        empty = empty_output(q, k, v)
        if empty is not None:
            return empty
        # half precision computed in float32 and the output rounded once (float32 and float64
        # as given): hashing, scores, the per-round softmax and the combination of rounds
        out_dtype = v.dtype
        q, k, v = (x.to(compute_dtype(q.dtype)) for x in (q, k, v))
        b, h, t, d = q.shape
        m, r = self.chunk_size, self.n_rounds
        n_buckets = self.n_buckets
        if n_buckets is None:
            n_buckets = max(2, 2 * math.ceil(t / (2 * m)))
        buckets = hash_buckets(q, self.rotations(d, n_buckets, q.device))  # (B, H, R, T)
        pos = torch.arange(t, device=q.device)
        perm = torch.argsort(buckets * t + pos, dim=-1)  # (B, H, R, T)
        n_chunks = -(-t // m)
        pad = n_chunks * m - t
        perm = F.pad(perm, (0, pad), value=t)  # sentinel t = an invalid slot
        src = q if self.shared_qk else k
        keys = src / src.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        # one zero row at index t stands for the sentinel slots
        sq, sk, sv = (_gather_t(F.pad(x, (0, 0, 0, 1)), perm) for x in (q, keys, v))
        all_buckets = F.pad(buckets.transpose(-1, -2), (0, 0, 0, 1), value=-1)  # (B, H, T+1, R)
        s_bkt = torch.gather(buckets, 3, perm.clamp(max=t - 1))  # bucket of each sorted slot

        def chunks(x: Tensor) -> Tensor:  # (B, H, R, N, ·) -> (B, H, R, n, m, ·)
            return x.reshape(b, h, r, n_chunks, m, *x.shape[4:])

        def window(x: Tensor) -> Tensor:  # this chunk and the previous one (none for chunk 0)
            if n_chunks == 1:
                return x
            prev = torch.cat([torch.zeros_like(x[:, :, :, :1]), x[:, :, :, :-1]], dim=3)
            return torch.cat([prev, x], dim=4)

        q_pos = chunks(perm)
        k_pos = window(chunks(perm).unsqueeze(-1)).squeeze(-1)
        if n_chunks > 1:  # slots of the missing chunk before chunk 0 are invalid
            k_pos[:, :, :, 0, :m] = t
        scores = torch.matmul(chunks(sq), window(chunks(sk)).transpose(-2, -1))
        scores = scores * default_scale(self.scale, d)  # (B, H, R, n, m, W)
        q_b = chunks(s_bkt).unsqueeze(-1)
        k_b = window(chunks(s_bkt).unsqueeze(-1)).squeeze(-1).unsqueeze(-2)
        base = (k_pos < t).unsqueeze(-2) & (q_b == k_b)
        qp, kp = q_pos.unsqueeze(-1), k_pos.unsqueeze(-2)
        if is_causal:
            base = base & (kp <= qp)
        if key_padding_mask is not None:
            pad_t = F.pad(key_padding_mask, (0, 1), value=True)  # (B, T+1)
            kp_pad = torch.gather(pad_t[:, None, None, None, :].expand(
                b, h, r, n_chunks, t + 1), 4, k_pos)
            base = base & ~kp_pad.unsqueeze(-2)
        is_self = kp == qp
        others = base & ~is_self
        keep = others | (base & is_self & ~others.any(dim=-1, keepdim=True))
        if r > 1:  # log N_ij: rounds in which i and j share a bucket
            bq = _gather_t(all_buckets, perm).reshape(b, h, r, n_chunks, m, 1, r)
            bk = window(chunks(_gather_t(all_buckets, perm))).unsqueeze(-3)
            counts = (bq == bk).sum(dim=-1).clamp_min(1)
            scores = scores - torch.log(counts.to(scores.dtype))
        scores = scores.masked_fill(~keep, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1, keepdim=True)  # (B, H, R, n, m, 1)
        lse_safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
        weights = torch.exp(scores - lse_safe)
        if dropout_p > 0.0:
            weights = F.dropout(weights, p=dropout_p)
        out = torch.matmul(weights, window(chunks(sv)))  # (B, H, R, n, m, Dv)
        out = out.reshape(b, h, r, n_chunks * m, -1)
        lse = lse.reshape(b, h, r, n_chunks * m, 1)
        # undo the sort: slot p holds position perm[p]; sentinel slots go to a scratch row t
        dv = out.shape[-1]
        unsorted = out.new_zeros(b, h, r, t + 1, dv).scatter(
            3, perm.unsqueeze(-1).expand(b, h, r, n_chunks * m, dv), out)[:, :, :, :t]
        lse_u = lse.new_full((b, h, r, t + 1, 1), float("-inf")).scatter(
            3, perm.unsqueeze(-1), lse)[:, :, :, :t]
        total = torch.logsumexp(lse_u, dim=2, keepdim=True)
        total = torch.where(torch.isfinite(total), total, torch.zeros_like(total))
        round_w = torch.exp(lse_u - total)  # (B, H, R, T, 1), zero for rounds with no key
        return (round_w * unsorted).sum(dim=2).to(out_dtype)
