"""Per-token, per-edge utilities ΔL_t(h←g) in one batched pass (004 §3.2, §4.2.3; notes B7).

ΔL_t(e) = L(z_t) − L(z_t^+), z_t^+ = z_t − ι_h z_t^{(h)} + ι_h φ_e(z_t^{(g)}), L the next-token
cross-entropy of a linear readout (W_o, b). Because the readout is linear,
logits(z^+) = logits(z) + W_o[:, h] δ_e with δ_e = φ_e − z^{(h)}, so every edge costs one
(N, d_h) × (d_h, V) product on its destination slice (fused with the addition of ℓ) and one
log-sum-exp (``_EdgeUtility``, with a hand-written backward pass), instead of the full readout
pass per edge of 004 App. B:
ΔL_t(e) = log softmax(ℓ + W_o[:, h] δ_e)[y_t] − log softmax(ℓ)[y_t].
The first-order surrogate is −⟨∇_{z^{(h)}} L, δ_e⟩ with ∇_z L = W_oᵀ(p − e_y) (Lemma 3.10).

Gradient: by default (``attach="phi"``) only the block outputs φ_e carry gradient, as in the
gradient of 004 Prop 4.8 (∇_φ L_GT); the state z and the readout are detached, so the utility
penalty cannot lower L_GT by making the current state worse or by bending the readout.
``attach="all"`` keeps every dependency (used by the gradcheck test).
Positions whose target is ``ignore_index`` get utility 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from graded.checks import check_id_range, inputs_checked
from graded.morphic.edges import EdgeSet
from graded.morphic.state import GradedStateSpace

UTILITY_KINDS = ("exact", "first_order")
ATTACHES = ("phi", "all")  # what carries the utilities' gradient (module doc)


def _prepare(z, candidates, edges, space, weight, bias, targets, ignore_index, attach):
    if attach not in ATTACHES:
        raise ValueError(f"attach must be one of {ATTACHES}, got {attach!r}")
    if len(candidates) != len(edges):
        raise ValueError(f"got {len(candidates)} candidates for {len(edges)} edges")
    if not isinstance(targets, Tensor) or targets.dtype != torch.long:
        raise TypeError(f"targets must be a LongTensor of class ids, got "
                        f"{getattr(targets, 'dtype', type(targets).__name__)}")
    if targets.shape != z.shape[:-1]:
        raise ValueError(f"targets shape {tuple(targets.shape)} must equal state batch shape "
                         f"{tuple(z.shape[:-1])}")
    for e, c in zip(edges, candidates):  # a narrower φ_e would broadcast against z^{(h)}
        if c.shape != (*z.shape[:-1], space.dim(e.dest)):
            raise ValueError(f"candidate of edge {e.name!r} ({e.dest} <- {e.source}) has shape "
                             f"{tuple(c.shape)}; expected {(*z.shape[:-1], space.dim(e.dest))} "
                             f"(the state's batch shape, d_{e.dest})")
    if weight.shape[1] != space.total_dim:
        raise ValueError(
            f"readout weight is {tuple(weight.shape)}, expected (V, {space.total_dim})")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"readout bias has shape {tuple(bias.shape)}; expected "
                         f"({weight.shape[0]},), one per row of the readout weight")
    valid = targets != ignore_index
    if attach == "phi":
        z, weight = z.detach(), weight.detach()
        bias = None if bias is None else bias.detach()
    if torch.compiler.is_compiling():  # every row, no value reads: ignored targets read class 0
        yv = torch.where(valid, targets, torch.zeros_like(targets)).reshape(-1)
        return (valid, z.reshape(-1, z.shape[-1]), [c.reshape(-1, c.shape[-1]) for c in candidates],
                yv, weight, bias)
    # the scored rows' indices: the one read of the targets here (a wait on a GPU), then
    # gathers by index (boolean indexing would wait in every gather and in its backward pass)
    rows: Tensor | None = valid.reshape(-1).nonzero().squeeze(-1)
    zv = z.reshape(-1, z.shape[-1])
    cands = [c.reshape(-1, c.shape[-1]) for c in candidates]
    yv = targets.reshape(-1)
    if rows.numel() == yv.numel():  # every row: views, no copies
        rows = None
    else:
        zv, yv = zv.index_select(0, rows), yv.index_select(0, rows)  # (N, D), (N,)
        cands = [c.index_select(0, rows) for c in cands]  # (N, d_h)
    if not inputs_checked():  # the trainer checked its targets once (TaskKind.check_data)
        check_id_range(yv, weight.shape[0], f"targets other than {ignore_index}")
    return rows, zv, cands, yv, weight, bias


# The fast path exponentiates ℓ⁺ without a per-row shift (the caller shifts ℓ so that its row
# maxima are 0); rows whose sum of exponentials leaves [_LOW, _HIGH] are redone with their own
# maxima, so the result is exact whatever ℓ⁺ is.
_LOW, _HIGH = 2.0**-40, 2.0**100


# Memory limits: the exponentials e of all edges are saved for the backward pass (when it needs
# them) up to SAVED_BYTES_LIMIT bytes, and recomputed there in row chunks above it; a temporary
# e larger than _TEMP_BYTES_LIMIT is formed in row chunks. A chunk holds about _CHUNK_ELEMENTS.
SAVED_BYTES_LIMIT = 1 << 30
_TEMP_BYTES_LIMIT = 1 << 28
_CHUNK_ELEMENTS = 1 << 22


def _edge_rows(base: Tensor, delta: Tensor, w_h: Tensor, yy: Tensor
               ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """For rows of one edge: e = exp(ℓ⁺ − c) with ℓ⁺ = ℓ + δ W_hᵀ in one (rows, V) buffer, s = Σ e,
    the row shifts c (0 on the fast path) and log softmax(ℓ⁺)[y] = ℓ⁺_y − c − log s."""
    plus = torch.addmm(base, delta, w_h.T)
    num = plus.gather(-1, yy)
    e = plus.exp_()
    s = e.sum(dim=-1, keepdim=True)
    shift = torch.zeros_like(s)
    bad = ~((s >= _LOW) & (s <= _HIGH))  # also catches inf and nan
    if bool(bad.any()):
        rows = bad.squeeze(-1).nonzero().squeeze(-1)
        again = torch.addmm(base[rows], delta[rows], w_h.T)
        c = again.amax(dim=-1, keepdim=True)
        again.sub_(c).exp_()
        e[rows], s[rows], shift[rows] = again, again.sum(dim=-1, keepdim=True), c
    return e, s, shift, num - shift - s.log()


def _chunks(n: int, rows: int):
    return (slice(i, i + rows) for i in range(0, n, rows))


class _EdgeUtility(torch.autograd.Function):
    """u = log softmax(ℓ + δ W_hᵀ)[y] − log softmax(ℓ)[y] for one edge, fused.

    Forward: one ``addmm`` forms ℓ⁺ = ℓ + Δ; e = exp(ℓ⁺) in place and s = Σ e, so
    log softmax(ℓ⁺)[y] = ℓ⁺_y − log s. ``exact_utilities`` passes ℓ with row maxima 0, so this is
    safe unless Δ moves a row by tens of nats; such rows (s outside [2⁻⁴⁰, 2¹⁰⁰]) are recomputed
    shifted by their own maxima c, and then log softmax(ℓ⁺)[y] = ℓ⁺_y − c − log s. The only
    (N, V) buffer is e: on CPU fresh (N, V) buffers cost more than the arithmetic done in them.

    Backward, with p⁺ = e / s and p = softmax(ℓ): ∂u/∂ℓ⁺ = e_y − p⁺, so
    ∂u/∂δ = g ⊙ (W_h[y] − p⁺W_h). When only δ needs a gradient (``attach="phi"``, the default)
    the forward pass computes m = p⁺W_h (N, d_h) while e is still in cache and frees e: the
    backward pass is then one gather. Otherwise ∂u/∂W_h = g-weighted (e_y − p⁺)ᵀδ and
    ∂u/∂ℓ = g (p − p⁺) need e itself, which is saved, or recomputed in row chunks when the saved
    buffers would pass ``budget`` bytes (or when ``chunk`` rows are forced).
    """

    @staticmethod
    def forward(ctx, base, lse_base, delta, w_h, y, chunk, budget):
        n, row_bytes = base.shape[0], base.shape[1] * base.element_size()
        need_base, _, need_delta, need_w, _, _, _ = ctx.needs_input_grad
        light = not (need_base or need_w)
        if chunk is None and n * row_bytes > (_TEMP_BYTES_LIMIT if light else budget):
            chunk = max(1, _CHUNK_ELEMENTS // base.shape[1])
        rows = chunk or n
        yy = y.unsqueeze(-1)
        s, shift, log_p_plus = (base.new_empty(n, 1) for _ in range(3))
        m = base.new_empty(n, w_h.shape[1]) if light and need_delta else None
        saved = ()
        for r in _chunks(n, rows):
            e, s[r], shift[r], log_p_plus[r] = _edge_rows(base[r], delta[r], w_h, yy[r])
            if m is not None:
                torch.mm(e, w_h, out=m[r]).div_(s[r])  # p⁺ W_h
            elif not light and chunk is None:
                saved = (e,)
        u = log_p_plus - (base.gather(-1, yy) - lse_base)
        ctx.light, ctx.rows = light, rows
        if light:
            ctx.save_for_backward(w_h, y, m)
        else:
            ctx.save_for_backward(base, lse_base, delta, w_h, y, s, shift, *saved)
        return u.squeeze(-1)

    @staticmethod
    def backward(ctx, grad):
        g = grad.unsqueeze(-1)  # (N, 1)
        if ctx.light:
            w_h, y, m = ctx.saved_tensors
            grad_delta = None if m is None else g * (w_h[y] - m)
            return None, None, grad_delta, None, None, None, None
        base, lse_base, delta, w_h, y, s, shift, *saved = ctx.saved_tensors
        need_base, _, need_delta, need_w, _, _, _ = ctx.needs_input_grad
        grad_base = torch.empty_like(base) if need_base else None
        grad_delta = torch.empty_like(delta) if need_delta else None
        grad_w = torch.zeros_like(w_h) if need_w else None
        for r in _chunks(base.shape[0], ctx.rows):
            e = saved[0] if saved else torch.addmm(base[r], delta[r], w_h.T).sub_(shift[r]).exp_()
            scale = -g[r] / s[r]  # ∂u/∂ℓ⁺ = scale ⊙ e + g e_y
            if need_base:  # g (p − p⁺)
                torch.addcmul(base[r].sub(lse_base[r]).exp_().mul_(g[r]), e, scale,
                              out=grad_base[r])
            if need_delta:
                torch.addcmul(g[r] * w_h[y[r]], e @ w_h, scale, out=grad_delta[r])
            if need_w:
                grad_w.addmm_(e.T, delta[r] * scale).index_add_(0, y[r], g[r] * delta[r])
        return grad_base, None, grad_delta, grad_w, None, None, None


def exact_utilities(
    z: Tensor, candidates: Sequence[Tensor], edges: EdgeSet, space: GradedStateSpace,
    weight: Tensor, bias: Tensor | None, targets: Tensor, *, ignore_index: int = -100,
    attach: str = "phi", chunk_rows: int | None = None,
) -> Tensor:
    """ΔL (B, T, |E|), exact, for every token and edge at once.

    Memory: with ``attach="phi"`` nothing of size (N, V) outlives an edge's forward pass. With
    ``attach="all"`` the exponentials of every edge (|E|·N·V floats) are saved for the backward
    pass up to ``SAVED_BYTES_LIMIT`` bytes and recomputed there in row chunks above it.
    ``chunk_rows`` forces row chunks of that size everywhere (tests, tight memory).

    ΔL is a difference of log-probabilities: it is computed in at least float32, with autocast
    off, whatever the dtype of ``z`` (bf16 or fp16 under mixed precision).
    """
    if chunk_rows is not None and (not isinstance(chunk_rows, int) or chunk_rows <= 0):
        raise ValueError(f"chunk_rows must be a positive int or None, got {chunk_rows!r}")
    with torch.autocast(z.device.type, enabled=False):
        z, candidates, weight, bias = _at_least_float32(z, candidates, weight, bias)
        return _exact_utilities(z, candidates, edges, space, weight, bias, targets,
                                ignore_index, attach, chunk_rows)


def _at_least_float32(z: Tensor, candidates: Sequence[Tensor], weight: Tensor,
                      bias: Tensor | None) -> tuple[Tensor, list[Tensor], Tensor, Tensor | None]:
    """The utilities' inputs in at least float32 (bf16 / fp16 states of mixed precision are
    cast; float32 and float64 ones are left as they are)."""
    dtype = torch.promote_types(z.dtype, torch.float32)
    return (z.to(dtype), [c.to(dtype) for c in candidates], weight.to(dtype),
            None if bias is None else bias.to(dtype))


def _exact_utilities(z: Tensor, candidates: Sequence[Tensor], edges: EdgeSet,
                     space: GradedStateSpace, weight: Tensor, bias: Tensor | None,
                     targets: Tensor, ignore_index: int, attach: str,
                     chunk_rows: int | None) -> Tensor:
    valid, zv, cands, yv, weight, bias = _prepare(
        z, candidates, edges, space, weight, bias, targets, ignore_index, attach)
    if zv.shape[0] == 0:
        return z.new_zeros(*z.shape[:-1], len(edges))
    base = zv @ weight.T if bias is None else torch.addmm(bias, zv, weight.T)  # (N, V)
    with torch.no_grad():  # row maxima to 0: log softmax is shift-invariant, see _EdgeUtility
        base.sub_(base.amax(dim=-1, keepdim=True))
        lse_base = base.exp().sum(dim=-1, keepdim=True).log_()
    if torch.compiler.is_compiling():
        return _scatter_valid(_traced_exact(base, zv, cands, edges, space, weight, yv), valid, z)
    budget = SAVED_BYTES_LIMIT // len(edges)
    cols = []
    for e, cand in zip(edges, cands):
        s = space.slices[e.dest]
        cols.append(_EdgeUtility.apply(base, lse_base, cand - zv[:, s], weight[:, s], yv,
                                       chunk_rows, budget))
    return _scatter_valid(torch.stack(cols, dim=1), valid, z)


def _traced_exact(base: Tensor, zv: Tensor, cands: Sequence[Tensor], edges: EdgeSet,
                  space: GradedStateSpace, weight: Tensor, yv: Tensor) -> Tensor:
    """The utilities of ``_EdgeUtility`` written with plain tensor operations (autograd does
    the backward pass): what ``torch.compile`` traces, as one graph the compiler fuses.
    ``base`` has row maxima 0 (as in ``exact_utilities``); log-sum-exp shifts each row itself."""
    yy = yv.unsqueeze(-1)
    ref = (base.gather(-1, yy) - base.logsumexp(-1, keepdim=True)).squeeze(-1)
    cols = []
    for e, cand in zip(edges, cands):
        s = space.slices[e.dest]
        plus = torch.addmm(base, cand - zv[:, s], weight[:, s].T)
        cols.append(plus.gather(-1, yy).squeeze(-1) - plus.logsumexp(-1) - ref)
    return torch.stack(cols, dim=1)


def _scatter_valid(util: Tensor, rows: Tensor | None, z: Tensor) -> Tensor:
    """The utilities of the scored rows placed in (…, |E|), 0 at the ignored ones. ``rows``
    as ``_prepare`` returns it: the scored rows' indices, None when every row is scored, and
    under the compiler the mask of scored positions (every row was computed)."""
    if torch.compiler.is_compiling():  # every row was computed: zero the ignored ones
        util = util * rows.reshape(-1, 1).to(util.dtype)
        return util.view(*z.shape[:-1], util.shape[-1]).to(z.dtype)
    if rows is None:
        return util.view(*z.shape[:-1], util.shape[-1]).to(z.dtype)
    out = z.new_zeros(z.shape[:-1].numel(), util.shape[-1])
    return out.index_copy(0, rows, util.to(out.dtype)).view(*z.shape[:-1], util.shape[-1])


def first_order_utilities(
    z: Tensor, candidates: Sequence[Tensor], edges: EdgeSet, space: GradedStateSpace,
    weight: Tensor, bias: Tensor | None, targets: Tensor, *, ignore_index: int = -100,
    attach: str = "phi",
) -> Tensor:
    """−⟨∇_{z^{(h)}} L, δ_e⟩ (B, T, |E|): one readout gradient per token (004 Lemma 3.10), in
    at least float32 with autocast off, as :func:`exact_utilities`."""
    with torch.autocast(z.device.type, enabled=False):
        z, candidates, weight, bias = _at_least_float32(z, candidates, weight, bias)
        valid, zv, cands, yv, weight, bias = _prepare(
            z, candidates, edges, space, weight, bias, targets, ignore_index, attach)
        if zv.shape[0] == 0:
            return z.new_zeros(*z.shape[:-1], len(edges))
        base = zv @ weight.T if bias is None else torch.addmm(bias, zv, weight.T)
        resid = torch.softmax(base, dim=-1)
        minus_one = torch.full((yv.shape[0], 1), -1.0, dtype=resid.dtype, device=resid.device)
        resid = resid.scatter_add(-1, yv.unsqueeze(-1), minus_one)  # p − e_y (one_hot reads y)
        grad_z = resid @ weight  # (N, D) = ∇_z L
        util = torch.stack([
            -((cands[i] - zv[:, space.slices[e.dest]]) * grad_z[:, space.slices[e.dest]]).sum(-1)
            for i, e in enumerate(edges)
        ], dim=1)
        return _scatter_valid(util, valid, z)


def compute_utilities(kind: str, *args, **kwargs) -> Tensor:
    if kind == "exact":
        return exact_utilities(*args, **kwargs)
    if kind == "first_order":
        return first_order_utilities(*args, **kwargs)
    raise ValueError(f"utility kind must be one of {UTILITY_KINDS}, got {kind!r}")
