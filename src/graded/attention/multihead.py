"""Multi-head attention, a drop-in for :class:`torch.nn.MultiheadAttention` (002 §3, 000 §4).

``MultiheadAttention`` has torch's constructor, parameter names and ``forward`` signature, so a
state dict moves between the two and outputs agree. It runs the fused
``scaled_dot_product_attention`` kernel when weights are not requested and an explicit softmax
when they are. Beyond torch's module it accepts a pluggable score (002 §2.4) and an attention
backend by name (the efficient variants of 002 §4.3), and it exposes its three stages
(:meth:`project`, :meth:`attend`, :meth:`merge`) so that models can insert rotary positions, a
KV cache or a grading between them.

Mask conventions are torch's at this public boundary: a boolean ``attn_mask`` or
``key_padding_mask`` is ``True`` where attention is *not* allowed; a float mask is added.
Internally masks are converted to SDPA's convention (``True`` = may attend).

The projections around attention are :class:`~graded.attention.projections.HeadProjections`,
this module's base; the checks of its arguments and the conversion of its masks are in
:mod:`graded.attention.mha_checks`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from graded.attention.backends.softmax import compute_dtype
from graded.attention.functional import (
    DEFAULT_MAX_EXPLICIT_ELEMENTS,
    attention,
    causal_mask,
    check_explicit_size,
    merge_masks,
    safe_softmax,
    to_additive_mask,
)
from graded.attention.mha_checks import (
    canonical_attn_mask,
    canonical_padding_mask,
    check_backend,
    check_inputs,
    check_kv_heads,
    check_shared_qk,
    check_sizes,
    pad_masks,
)
from graded.attention.projections import HeadProjections
from graded.attention.scores import ScaledDotScore, Score, make_score
from graded.checks import check_bool

__all__ = ["MultiheadAttention"]

_BUILTIN_BACKENDS = ("full", "explicit")


class MultiheadAttention(HeadProjections):
    """Multi-head attention with the interface of :class:`torch.nn.MultiheadAttention`.

    Args mirror torch's (``embed_dim, num_heads, dropout, bias, add_bias_kv, add_zero_attn,
    kdim, vdim, batch_first``). Extra keyword-only arguments:

    - ``backend``: ``"full"`` (fused SDPA, default), ``"explicit"`` (always materialises the
      weights), a name from :mod:`graded.attention.backends`, or a backend module;
      ``backend_options`` are passed to the named backend. What a backend cannot serve (its
      :class:`~graded.attention.backends.Capabilities`) is refused, never replaced by dense
      attention: a custom ``score`` at build time; an additive ``attn_mask`` or
      ``need_weights=True`` at the call (``need_weights`` defaults to True, as in torch: pass
      False for the backends that cannot return weights).
    - ``score``: ``"scaled_dot"`` (default), ``"dot"``, ``"bilinear"``, ``"additive"`` or a
      :class:`~graded.attention.scores.Score`.
    - ``max_explicit_elements``: the explicit path refuses larger (B, H, Tq, Tk) tensors.
    - ``num_kv_heads``: grouped-query attention (Ainslie et al. 2023): keys and values are
      projected to ``num_kv_heads`` heads, each shared by ``num_heads / num_kv_heads`` query
      heads (default: ``num_heads``, ordinary multi-head attention; 1 is multi-query).
    - ``out_bias``: a bias on the output projection (default: as ``bias``, which then covers
      the Q/K/V projections only when ``out_bias`` is given; torch ties the two).

    With ``backend="lsh"`` and ``backend_options={"shared_qk": True}`` the module is Reformer's
    shared-QK attention: no key projection (``in_proj_weight`` is (2E, E): queries, values),
    keys the normalised queries; self-attention only.

    With ``attn_mask``, ``is_causal=True`` is what torch documents it to be, a hint that the
    mask is causal: the mask alone decides, as in torch's module wherever it applies the mask
    (weights requested, or a ``key_padding_mask`` given). Torch's fused path (neither) drops
    the mask for the kernel's top-left causal mask; the two agree where the hint is true.

    Departure from torch: ``is_causal=True`` without ``attn_mask`` builds the causal mask
    instead of raising, aligned bottom-right (:func:`~graded.attention.functional.causal_mask`:
    query i sees the keys up to S - L + i, as after a cache of earlier keys; the same as
    torch's top-left mask when L = S). It is causal over the real keys: the key that
    ``add_bias_kv`` or ``add_zero_attn`` appends is visible to every query, as torch's padded
    mask makes it (torch's fused path with ``need_weights=False`` and no
    ``key_padding_mask`` hides it from every query, with or without ``attn_mask``).

    Departure from torch: the switches ``bias``, ``add_bias_kv``, ``add_zero_attn`` and
    ``batch_first`` take True or False only, ``out_bias`` also None (``TypeError`` otherwise).
    torch reads them truthily, so ``batch_first="false"`` there means batch first; code that
    passes such values to torch's module is refused here rather than silently read. So are
    the per-call switches of :meth:`forward` (``need_weights``, ``average_attn_weights``,
    ``is_causal``) and :meth:`attend` (``need_weights``, ``is_causal``): ``need_weights="no"``
    asks torch's module for the weights. A NumPy bool is taken, a 0-d tensor is not; the
    check of a Python bool is one type comparison (a constant under ``torch.compile``).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        backend: str | nn.Module = "full",
        backend_options: dict | None = None,
        score: str | Score = "scaled_dot",
        max_explicit_elements: int = DEFAULT_MAX_EXPLICIT_ELEMENTS,
        out_bias: bool | None = None,
        num_kv_heads: int | None = None,
    ) -> None:
        super().__init__()
        bias, add_bias_kv, add_zero_attn, batch_first = (
            check_bool(name, value) for name, value in (
                ("bias", bias), ("add_bias_kv", add_bias_kv), ("add_zero_attn", add_zero_attn),
                ("batch_first", batch_first)))
        if out_bias is not None:
            out_bias = check_bool("out_bias", out_bias)  # None: as bias
        dropout = check_sizes(embed_dim, num_heads, dropout, kdim, vdim)
        factory = {"device": device, "dtype": dtype}
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        kv_heads = check_kv_heads(num_kv_heads, num_heads, self._qkv_same_embed_dim,
                                  add_bias_kv)
        self.num_kv_heads = kv_heads
        self.kv_dim = kv_heads * self.head_dim
        self.dropout = dropout
        self.batch_first = batch_first
        self.add_zero_attn = add_zero_attn
        self.max_explicit_elements = max_explicit_elements

        # the backend is registered after the parameters below (their order is the optimizer
        # state's), but whether it shares queries and keys decides their shape
        self.backend_name, resolved = self._resolve_backend(backend, backend_options or {})
        self.shared_qk = bool(getattr(resolved, "shared_qk", False))
        if self.shared_qk:
            check_shared_qk(self, add_bias_kv)
        self._make_projections(bias, out_bias, factory)
        if add_bias_kv:
            self.bias_k = nn.Parameter(torch.empty(1, 1, embed_dim, **factory))
            self.bias_v = nn.Parameter(torch.empty(1, 1, embed_dim, **factory))
        else:
            self.bias_k = self.bias_v = None

        self.score = make_score(score, num_heads, self.head_dim)
        if not isinstance(score, Score):  # a score built here takes the module's device, dtype
            self.score.to(**factory)
        self.backend = resolved
        check_backend(self)
        self._reset_parameters()

    @staticmethod
    def _resolve_backend(
        backend: str | nn.Module, options: dict
    ) -> tuple[str, nn.Module | None]:
        if isinstance(backend, nn.Module):
            return getattr(backend, "name", type(backend).__name__), backend
        if backend in _BUILTIN_BACKENDS and not options:
            return backend, None
        from graded.attention.backends import get_backend

        return backend, get_backend(backend, **options)

    def _reset_parameters(self) -> None:
        # The same initialisation as torch.nn.MultiheadAttention.
        if self._qkv_same_embed_dim:
            nn.init.xavier_uniform_(self.in_proj_weight)
        else:
            nn.init.xavier_uniform_(self.q_proj_weight)
            nn.init.xavier_uniform_(self.k_proj_weight)
            nn.init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            nn.init.constant_(self.in_proj_bias, 0.0)
        if self.out_proj.bias is not None:
            nn.init.constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None:
            nn.init.xavier_normal_(self.bias_k)
            nn.init.xavier_normal_(self.bias_v)

    # ------------------------------------------------------------------ stages
    def transform_heads(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Hook applied to per-head q, k, v just before attention; identity here.

        Graded attention overrides it to scale queries, keys or values by the part of its
        grading (000 Def 5.22) that :meth:`projection_scales` does not fold into the projection.
        """
        return q, k, v

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        attn_mask: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attention of per-head tensors. ``attn_mask`` is a keep-mask (``True`` = attend) or an
        additive float mask broadcastable to (B, H, Tq, Tk); ``key_padding_mask`` is (B, Tk)
        with ``True`` = padding. Returns per-head outputs (B, H, Tq, Dv) and optional weights.
        Keys and values of grouped-query attention come in per group and are repeated here.
        A backend gets the custom score and an additive mask only if its capabilities say it
        serves them, and returns weights only through its ``forward_with_weights``; otherwise
        this raises (naming the backends that can). A dense backend module (``full``,
        ``explicit``, or either named with options) computes the call itself, weights included,
        as it does when called alone (its ``scale``, half precision in float32, ``explicit``'s
        ``max_elements`` and ``last_weights``), under this module's ``max_explicit_elements``
        wherever it materialises the weights.
        ``is_causal`` and ``need_weights`` take True or False only (class docstring)."""
        if type(is_causal) is not bool:  # the bool itself passes on one comparison
            is_causal = check_bool("is_causal", is_causal)
        if type(need_weights) is not bool:
            need_weights = check_bool("need_weights", need_weights)
        q, k, v = self.transform_heads(q, self.expand_kv(k), self.expand_kv(v))
        dropout_p = self.dropout if self.training else 0.0
        backend = self.backend
        bias = attn_mask is not None and attn_mask.dtype != torch.bool
        custom = not isinstance(self.score, ScaledDotScore)
        if backend is not None:
            from graded.attention.backends import ExplicitBackend, FullBackend, check_capability

            if isinstance(backend, (FullBackend, ExplicitBackend)) and (
                    need_weights or isinstance(backend, ExplicitBackend)
                    or type(self.score).fused_inputs is Score.fused_inputs):
                # the dense backends materialise the weights here: this module's limit holds
                check_explicit_size((q.shape[0], q.shape[1], q.shape[2], k.shape[2]), q.dtype,
                                    self.max_explicit_elements)
            if bias:
                check_capability(backend, self.backend_name, "attn_bias",
                                 f" (an additive attn_mask of dtype {attn_mask.dtype})")
            if need_weights:
                check_capability(backend, self.backend_name, "attention_weights",
                                 "; pass need_weights=False")
            extra = {"score": self.score} if custom else {}
            call = backend.forward_with_weights if need_weights else backend
            out = call(q, k, v, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                       is_causal=is_causal, dropout_p=dropout_p, **extra)
            return out if need_weights else (out, None)
        if key_padding_mask is not None:
            attn_mask = merge_masks(attn_mask, ~key_padding_mask[:, None, None, :], q.dtype)
        need_weights = need_weights or self.backend_name == "explicit"
        if isinstance(self.score, ScaledDotScore):
            return attention(
                q, k, v, attn_mask, is_causal=is_causal, dropout_p=dropout_p,
                need_weights=need_weights, max_explicit_elements=self.max_explicit_elements,
            )
        fused = self.score.fused_inputs(q, k)
        if fused is not None:
            q2, k2, scale = fused
            return attention(
                q2, k2, v, attn_mask, is_causal=is_causal, dropout_p=dropout_p, scale=scale,
                need_weights=need_weights, max_explicit_elements=self.max_explicit_elements,
            )
        return self._attend_explicit_score(q, k, v, attn_mask, is_causal, dropout_p)

    def attend_incremental(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        state: object | None,
        *,
        key_padding_mask: Tensor | None = None,
    ) -> tuple[Tensor, object]:
        """Causal self-attention of the newest positions through the backend's own decoding
        state (:meth:`graded.attention.backends.AttentionBackend.decode`): ``q, k, v``
        (B, H(kv), Tn, head_dim) and ``key_padding_mask`` (B, Tn) are the new positions only,
        ``state`` the previous call's (None at the start). Returns per-head outputs and the
        next state."""
        from graded.attention.backends import decodes_with_state

        if not decodes_with_state(self.backend):
            raise ValueError(f"attention backend {self.backend_name!r} keeps no decoding state; "
                             "cache its keys and values and call attend instead")
        q, k, v = self.transform_heads(q, self.expand_kv(k), self.expand_kv(v))
        dropout_p = self.dropout if self.training else 0.0
        return self.backend.decode(q, k, v, state, key_padding_mask=key_padding_mask,
                                   dropout_p=dropout_p)

    def _attend_explicit_score(
        self, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, is_causal: bool,
        dropout_p: float,
    ) -> tuple[Tensor, Tensor]:
        t_q, t_k = q.shape[-2], k.shape[-2]
        check_explicit_size(
            (q.shape[0], q.shape[1], t_q, t_k), q.dtype, self.max_explicit_elements
        )
        if is_causal:
            attn_mask = merge_masks(attn_mask, causal_mask(t_q, t_k, q.device), q.dtype)
        acc = compute_dtype(q.dtype)  # the score module runs on the inputs as given
        scores = self.score(q, k).to(acc)
        if attn_mask is not None:
            scores = scores + to_additive_mask(attn_mask, scores.dtype)
        weights = safe_softmax(scores)
        if dropout_p > 0.0:
            weights = F.dropout(weights, p=dropout_p)
        return torch.matmul(weights, v.to(acc)).to(v.dtype), weights.to(v.dtype)

    # ------------------------------------------------------------------ torch API
    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Same contract as :meth:`torch.nn.MultiheadAttention.forward`, but for the
        switches ``need_weights``, ``average_attn_weights`` and ``is_causal``, which take True
        or False only (class docstring)."""
        if type(need_weights) is not bool:  # the bool itself passes on one comparison
            need_weights = check_bool("need_weights", need_weights)
        if type(average_attn_weights) is not bool:
            average_attn_weights = check_bool("average_attn_weights", average_attn_weights)
        if type(is_causal) is not bool:
            is_causal = check_bool("is_causal", is_causal)
        batched = check_inputs(self, query, key, value)
        self_attention = query is key and key is value
        if not batched:
            query, key, value = (x.unsqueeze(0) for x in (query, key, value))
            if key_padding_mask is not None:
                if key_padding_mask.shape != key.shape[1:2]:  # named as given, not unsqueezed
                    raise ValueError(
                        f"key_padding_mask has shape {tuple(key_padding_mask.shape)}; expected "
                        f"(source length,) = ({key.shape[1]},) for an unbatched (2-D) query")
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not self.batch_first:
            query, key, value = (x.transpose(0, 1) for x in (query, key, value))
        if self_attention:
            key = value = query
        bsz, t_q, _ = query.shape
        t_k = key.shape[1]

        q, k, v = self.project(query, key, value)
        mask = canonical_attn_mask(attn_mask, bsz, self.num_heads, t_q, t_k, batched)
        kpm = canonical_padding_mask(key_padding_mask, bsz, t_k)
        if mask is not None:
            # a hint that the mask is causal (torch's contract): the mask decides, not its
            # intersection with the bottom-right causal mask (a top-left causal mask of more
            # queries than keys would lose its first rows)
            is_causal = False
        if is_causal and (self.bias_k is not None or self.add_zero_attn):
            # causal over the real keys only: the appended bias / zero key is visible to every
            # query (as torch's padded causal mask); a causal mask on the extended length
            # would let query i see key i + 1 and hide the extra key from the first queries
            mask = merge_masks(mask, causal_mask(t_q, t_k, q.device), q.dtype)
            is_causal = False
        if self.bias_k is not None:
            k = torch.cat([k, self.split_heads(self.bias_k.expand(bsz, 1, -1))], dim=2)
            v = torch.cat([v, self.split_heads(self.bias_v.expand(bsz, 1, -1))], dim=2)
            mask, kpm = pad_masks(mask, kpm)
        if self.add_zero_attn:
            k = torch.cat([k, k.new_zeros(*k.shape[:2], 1, k.shape[-1])], dim=2)
            v = torch.cat([v, v.new_zeros(*v.shape[:2], 1, v.shape[-1])], dim=2)
            mask, kpm = pad_masks(mask, kpm)
        if kpm is not None and kpm.dtype != torch.bool:
            mask = merge_masks(mask, kpm[:, None, None, :], q.dtype)
            kpm = None

        heads, weights = self.attend(
            q, k, v, attn_mask=mask, key_padding_mask=kpm, is_causal=is_causal,
            need_weights=need_weights,
        )
        out = self.merge(heads)
        if not batched:
            out = out.squeeze(0)
        elif not self.batch_first:
            out = out.transpose(0, 1)
        if not need_weights or weights is None:
            return out, None
        if average_attn_weights:
            weights = weights.mean(dim=1)
        if not batched:
            weights = weights.squeeze(0)
        return out, weights
