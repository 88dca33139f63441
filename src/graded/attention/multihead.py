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
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from graded.attention.functional import (
    DEFAULT_MAX_EXPLICIT_ELEMENTS,
    attention,
    causal_mask,
    check_explicit_size,
    merge_masks,
    safe_softmax,
    to_additive_mask,
)
from graded.attention.scores import ScaledDotScore, Score, make_score
from graded.checks import check_bool, check_float
from graded.folding import folds_rows, graded_linear

__all__ = ["MultiheadAttention"]

_BUILTIN_BACKENDS = ("full", "explicit")


def _unbind_blocks(packed: Tensor, blocks: int, heads: int) -> tuple[Tensor, ...]:
    """The ``blocks`` projections of a packed (B, T, blocks·heads·head_dim) tensor, each
    (B, T, heads, head_dim): views, taken with ``unbind`` so that the backward writes their
    gradients into one (B, T, blocks, heads, head_dim) tensor in one kernel. Indexing the
    blocks (torch's module does) costs a zero-filled tensor of the packed size per block and
    their sums, some five passes over it more."""
    return packed.unflatten(-1, (blocks, heads, -1)).unbind(2)


def _check_mask_dtype(name: str, mask: Tensor) -> None:
    if mask.dtype != torch.bool and not torch.is_floating_point(mask):
        raise TypeError(f"{name} must be a bool or floating tensor, got dtype {mask.dtype}")


class MultiheadAttention(nn.Module):
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

    Departure from torch: ``is_causal=True`` without ``attn_mask`` builds the causal mask
    instead of raising. It is causal over the real keys: the key that ``add_bias_kv`` or
    ``add_zero_attn`` appends is visible to every query, as torch's padded mask makes it
    (torch's own fused path with ``need_weights=False`` hides it from every query).

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
        if not isinstance(embed_dim, int) or isinstance(embed_dim, bool) or embed_dim <= 0:
            raise ValueError(f"embed_dim must be a positive int, got {embed_dim!r}")
        if not isinstance(num_heads, int) or isinstance(num_heads, bool) or num_heads <= 0:
            raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
        if embed_dim % num_heads != 0:
            raise ValueError(
                f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})"
            )
        dropout = check_float("dropout", dropout, minimum=0.0)  # no bool, NaN or string
        if not dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        for name, dim in (("kdim", kdim), ("vdim", vdim)):
            if dim is not None and (not isinstance(dim, int) or isinstance(dim, bool)
                                    or dim <= 0):
                raise ValueError(f"{name} must be None (embed_dim) or a positive int, got "
                                 f"{dim!r}")
        factory = {"device": device, "dtype": dtype}
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if (not isinstance(kv_heads, int) or isinstance(kv_heads, bool) or kv_heads < 1
                or num_heads % kv_heads):
            raise ValueError(f"num_kv_heads must be a positive divisor of num_heads={num_heads}, "
                             f"got {num_kv_heads!r}")
        if kv_heads != num_heads and (not self._qkv_same_embed_dim or add_bias_kv):
            raise ValueError("grouped-query attention (num_kv_heads < num_heads) needs "
                             "kdim = vdim = embed_dim and add_bias_kv=False")
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
            self._check_shared_qk(add_bias_kv)
        # rows: queries (E), keys, values (kv_dim each); no keys with shared QK
        self._proj_rows = [embed_dim] + ([] if self.shared_qk else [self.kv_dim]) + [self.kv_dim]
        if self._qkv_same_embed_dim:
            self.in_proj_weight = nn.Parameter(
                torch.empty(sum(self._proj_rows), embed_dim, **factory))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.q_proj_weight = nn.Parameter(torch.empty(embed_dim, embed_dim, **factory))
            self.k_proj_weight = nn.Parameter(torch.empty(embed_dim, self.kdim, **factory))
            self.v_proj_weight = nn.Parameter(torch.empty(embed_dim, self.vdim, **factory))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = nn.Parameter(torch.empty(sum(self._proj_rows), **factory))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = nn.modules.linear.NonDynamicallyQuantizableLinear(
            embed_dim, embed_dim, bias=bias if out_bias is None else out_bias, **factory
        )
        if add_bias_kv:
            self.bias_k = nn.Parameter(torch.empty(1, 1, embed_dim, **factory))
            self.bias_v = nn.Parameter(torch.empty(1, 1, embed_dim, **factory))
        else:
            self.bias_k = self.bias_v = None

        self.score = make_score(score, num_heads, self.head_dim)
        if not isinstance(score, Score):  # a score built here takes the module's device, dtype
            self.score.to(**factory)
        self.backend = resolved
        self._check_backend()
        self._reset_parameters()

    def _check_shared_qk(self, add_bias_kv: bool) -> None:
        """Reformer's shared-QK attention (Kitaev et al. 2020, §2): the backend takes its keys
        from the queries (normalised), so the module has no key projection: the packed
        ``in_proj_weight`` (and bias) holds the query rows, then the value rows."""
        if not self._qkv_same_embed_dim or self.num_kv_heads != self.num_heads or add_bias_kv:
            raise ValueError(
                f"attention backend {self.backend_name!r} with shared_qk=True needs kdim = vdim "
                f"= embed_dim, num_kv_heads = num_heads and add_bias_kv=False (its keys are "
                f"its queries), got kdim={self.kdim}, vdim={self.vdim}, num_kv_heads="
                f"{self.num_kv_heads}, add_bias_kv={add_bias_kv}")

    def _check_backend(self) -> None:
        """Refuse at build time what the backend cannot serve (its declared capabilities)."""
        if self.backend is None:
            return
        from graded.attention.backends import check_capability

        if not isinstance(self.score, ScaledDotScore):
            check_capability(self.backend, self.backend_name, "custom_score",
                             f" (score={type(self.score).__name__})")

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
    def project(
        self, query: Tensor, key: Tensor | None, value: Tensor | None
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Batch-first (B, T, ·) inputs to per-head (B, H, T, head_dim) queries, keys, values,
        each projection's rows scaled by :meth:`projection_scales` (folded into the weight).

        ``key``/``value`` may be None to project the queries only (cached cross-attention).
        """
        e, kv = self.embed_dim, self.kv_dim
        b = self.in_proj_bias
        held = self.__dict__.get("_held_fold")  # the packed weight folded with other layers'
        if (held is not None and query is key and key is value
                and folds_rows(self.in_proj_weight, query)):
            return self._packed_heads(F.linear(query, *held()))
        grouped = self.num_kv_heads != self.num_heads
        if (not self.shared_qk and self._qkv_same_embed_dim and query is key and key is value
                and not grouped):
            return self._packed_heads(graded_linear(query, self.in_proj_weight, b,
                                                    out_scales=self.packed_projection_rows()))
        if self.shared_qk:
            return self._project_shared_qk(query, key, value)
        s_q, s_k, s_v = self.projection_scales()
        if self._qkv_same_embed_dim:
            w_q, w_k, w_v = self.in_proj_weight.split([e, kv, kv])
        else:
            w_q, w_k, w_v = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        b_q, b_k, b_v = (None, None, None) if b is None else b.split([e, kv, kv])
        s_q, s_k, s_v = (None if s is None else s.reshape(-1) for s in (s_q, s_k, s_v))
        q = self.split_heads(graded_linear(query, w_q, b_q, out_scales=s_q))
        k = None if key is None else self.split_heads(
            graded_linear(key, w_k, b_k, out_scales=s_k), self.num_kv_heads)
        v = None if value is None else self.split_heads(
            graded_linear(value, w_v, b_v, out_scales=s_v), self.num_kv_heads)
        return q, k, v

    def _packed_heads(self, qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(B, T, 3E) packed projections -> per-head (B, H, T, head_dim) q, k, v."""
        q, k, v = (x.transpose(1, 2) for x in _unbind_blocks(qkv, 3, self.num_heads))
        return q, k, v

    def packs_folded_rows(self) -> bool:
        """Whether self-attention projects through the packed ``in_proj_weight`` with a
        grading folded into its rows (:meth:`projection_scales`): never here, see graded
        attention."""
        return False

    def _project_shared_qk(self, query: Tensor, key: Tensor | None, value: Tensor | None
                           ) -> tuple[Tensor, Tensor, Tensor]:
        """Shared-QK projection: queries and values from the packed (2E, E) weight; the keys
        passed on are the queries (the backend normalises them)."""
        if key is not query or value is not query:
            raise ValueError(
                f"attention backend {self.backend_name!r} with shared_qk=True attends a "
                "sequence to itself: query, key and value must be the same tensor")
        qv = graded_linear(query, self.in_proj_weight, self.in_proj_bias,
                           out_scales=self.packed_projection_rows())
        q, v = (x.transpose(1, 2) for x in _unbind_blocks(qv, 2, self.num_heads))
        return q, q, v

    def packed_projection_rows(self) -> Tensor | None:
        """The row scales of the packed ``in_proj_weight`` (its blocks: query, key and value;
        query and value with ``shared_qk``) from :meth:`projection_scales`, or None when no
        block is scaled."""
        s_q, s_k, s_v = self.projection_scales()
        return self._packed_row_scales((s_q, s_v) if self.shared_qk else (s_q, s_k, s_v))

    def _packed_row_scales(self, scales: tuple[Tensor | None, ...]) -> Tensor | None:
        """The row scales of the packed ``in_proj_weight`` from one (heads, head_dim) scale
        tensor (or None: 1) per block of rows (``_proj_rows``), in one concatenation; None
        when every block is unscaled."""
        if all(s is None for s in scales):
            return None
        return self._packed_rows(scales)

    def _packed_rows(self, scales: tuple[Tensor | None, ...]) -> Tensor:
        """The rows of the packed ``in_proj_weight`` from one (…, heads, head_dim) scale tensor
        (or None: 1) per block of rows, in one concatenation: (…, rows), leading axes (layers
        stacked) kept. At least one block is scaled."""
        weight = self.in_proj_weight
        one = self._one
        if one is None or one.dtype != weight.dtype or one.device != weight.device:
            one = weight.new_ones(())
            if not (torch.compiler.is_compiling() or torch.is_inference_mode_enabled()):
                self._one = one  # a constant, made once per dtype and device (not an
                # inference tensor: a later pass with autograd could not save it)
        lead = next(s.shape[:-2] for s in scales if s is not None)
        blocks = [one.expand(*lead, n // self.head_dim, self.head_dim) if s is None
                  else s.to(one) for s, n in zip(scales, self._proj_rows, strict=True)]
        return torch.cat(blocks, dim=-2).flatten(-2)

    _one: Tensor | None = None

    def projection_scales(self) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """Scales of the output rows of the query, key and value projections, shapes
        (H, head_dim), (H_kv, head_dim), (H_kv, head_dim), or None for none: a diagonal map
        after a projection, folded into it (:func:`graded.folding.graded_linear`). None here;
        graded attention folds its grading in (000 Def 5.22)."""
        return None, None, None

    def split_heads(self, x: Tensor, heads: int | None = None) -> Tensor:
        """(B, T, heads·head_dim) -> (B, heads, T, head_dim); ``heads`` defaults to H."""
        heads = self.num_heads if heads is None else heads
        return x.unflatten(-1, (heads, self.head_dim)).transpose(1, 2)

    def expand_kv(self, x: Tensor) -> Tensor:
        """Keys or values of the ``num_kv_heads`` groups, (B, H_kv, T, d), repeated for the
        heads of each group: (B, H, T, d), head i using group i // (H / H_kv) (Ainslie et al.
        2023, as LLaMA's ``repeat_kv``). The identity without grouping."""
        if x.shape[1] == self.num_heads:
            return x
        return x.repeat_interleave(self.num_heads // x.shape[1], dim=1)

    def merge(self, heads: Tensor) -> Tensor:
        """(B, H, T, head_dim) -> output projection of the concatenated heads, (B, T, E)."""
        return self.out_proj(heads.transpose(1, 2).flatten(-2))

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
        this raises (naming the backends that can). The dense backends with options run this
        module's exact path, with their ``scale``, for weights, a bias or a custom score.
        ``is_causal`` and ``need_weights`` take True or False only (class docstring)."""
        if type(is_causal) is not bool:  # the bool itself passes on one comparison
            is_causal = check_bool("is_causal", is_causal)
        if type(need_weights) is not bool:
            need_weights = check_bool("need_weights", need_weights)
        q, k, v = self.transform_heads(q, self.expand_kv(k), self.expand_kv(v))
        dropout_p = self.dropout if self.training else 0.0
        backend, scale = self.backend, None
        bias = attn_mask is not None and attn_mask.dtype != torch.bool
        custom = not isinstance(self.score, ScaledDotScore)
        from graded.attention.backends import ExplicitBackend, FullBackend, check_capability

        if isinstance(backend, (FullBackend, ExplicitBackend)) and (need_weights or bias
                                                                     or custom):
            # the dense backends are served by this module's own exact path, their scale kept
            scale = backend.scale
            need_weights = need_weights or isinstance(backend, ExplicitBackend)
            backend = None
        if backend is not None:
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
                q, k, v, attn_mask, is_causal=is_causal, dropout_p=dropout_p, scale=scale,
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
        scores = self.score(q, k)
        if attn_mask is not None:
            scores = scores + to_additive_mask(attn_mask, scores.dtype)
        weights = safe_softmax(scores)
        if dropout_p > 0.0:
            weights = F.dropout(weights, p=dropout_p)
        return torch.matmul(weights, v), weights

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
        batched = self._check_inputs(query, key, value)
        self_attention = query is key and key is value
        if not batched:
            query, key, value = (x.unsqueeze(0) for x in (query, key, value))
            if key_padding_mask is not None:
                if key_padding_mask.dim() != 1:
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
        mask = self._canonical_attn_mask(attn_mask, bsz, t_q, t_k)
        kpm = self._canonical_padding_mask(key_padding_mask, bsz, t_k)
        if is_causal and (self.bias_k is not None or self.add_zero_attn):
            # causal over the real keys only: the appended bias / zero key is visible to every
            # query (as torch's padded causal mask); a causal mask on the extended length
            # would let query i see key i + 1 and hide the extra key from the first queries
            mask = merge_masks(mask, causal_mask(t_q, t_k, q.device), q.dtype)
            is_causal = False
        if self.bias_k is not None:
            k = torch.cat([k, self.split_heads(self.bias_k.expand(bsz, 1, -1))], dim=2)
            v = torch.cat([v, self.split_heads(self.bias_v.expand(bsz, 1, -1))], dim=2)
            mask, kpm = self._pad_masks(mask, kpm)
        if self.add_zero_attn:
            k = torch.cat([k, k.new_zeros(*k.shape[:2], 1, k.shape[-1])], dim=2)
            v = torch.cat([v, v.new_zeros(*v.shape[:2], 1, v.shape[-1])], dim=2)
            mask, kpm = self._pad_masks(mask, kpm)
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

    # ------------------------------------------------------------------ validation
    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> bool:
        if query.dim() not in (2, 3):
            raise ValueError(
                "query must be 2-D (length, embed_dim) or 3-D "
                f"({'batch, length' if self.batch_first else 'length, batch'}, embed_dim); "
                f"got shape {tuple(query.shape)}"
            )
        if key.dim() != query.dim() or value.dim() != query.dim():
            raise ValueError(
                f"query, key and value must have the same number of dimensions; got shapes "
                f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
            )
        for name, x, dim in (("query", query, self.embed_dim), ("key", key, self.kdim),
                             ("value", value, self.vdim)):
            if x.shape[-1] != dim:
                raise ValueError(
                    f"{name} has feature size {x.shape[-1]} (shape {tuple(x.shape)}), "
                    f"expected {dim}"
                )
        seq = 1 if (query.dim() == 3 and self.batch_first) else 0
        if key.shape[seq] != value.shape[seq]:
            raise ValueError(
                f"key and value must have the same length; got shapes {tuple(key.shape)} and "
                f"{tuple(value.shape)}"
            )
        if query.dim() == 3:
            bdim = 0 if self.batch_first else 1
            if not query.shape[bdim] == key.shape[bdim] == value.shape[bdim]:
                raise ValueError(
                    f"query, key and value batch sizes differ: {tuple(query.shape)}, "
                    f"{tuple(key.shape)}, {tuple(value.shape)} (batch_first={self.batch_first})"
                )
        return query.dim() == 3

    def _canonical_attn_mask(
        self, attn_mask: Tensor | None, bsz: int, t_q: int, t_k: int
    ) -> Tensor | None:
        """torch's (Tq, Tk) or (B·H, Tq, Tk) mask -> keep or additive mask (B|1, H|1, Tq, Tk)."""
        if attn_mask is None:
            return None
        _check_mask_dtype("attn_mask", attn_mask)
        if attn_mask.dim() == 2 and attn_mask.shape == (t_q, t_k):
            mask = attn_mask[None, None]
        elif attn_mask.dim() == 3 and attn_mask.shape == (bsz * self.num_heads, t_q, t_k):
            mask = attn_mask.view(bsz, self.num_heads, t_q, t_k)
        else:
            raise ValueError(
                f"attn_mask has shape {tuple(attn_mask.shape)}; expected ({t_q}, {t_k}) or "
                f"({bsz * self.num_heads}, {t_q}, {t_k}) (batch*num_heads, target, source)"
            )
        return ~mask if mask.dtype == torch.bool else mask

    @staticmethod
    def _canonical_padding_mask(kpm: Tensor | None, bsz: int, t_k: int) -> Tensor | None:
        """torch's key_padding_mask (B, T_k): bool ``True`` = ignore, or additive float."""
        if kpm is None:
            return None
        _check_mask_dtype("key_padding_mask", kpm)
        if kpm.shape != (bsz, t_k):
            raise ValueError(
                f"key_padding_mask has shape {tuple(kpm.shape)}; expected (batch, source "
                f"length) = ({bsz}, {t_k})"
            )
        return kpm

    @staticmethod
    def _pad_masks(
        mask: Tensor | None, kpm: Tensor | None
    ) -> tuple[Tensor | None, Tensor | None]:
        """Extend masks by one attendable key column (for bias_k/zero attention)."""
        if mask is not None:
            fill = True if mask.dtype == torch.bool else 0.0
            mask = F.pad(mask, (0, 1), value=fill)
        if kpm is not None:
            fill = False if kpm.dtype == torch.bool else 0.0
            kpm = F.pad(kpm, (0, 1), value=fill)
        return mask, kpm
