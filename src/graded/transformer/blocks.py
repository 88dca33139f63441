"""Encoder and decoder blocks (002 §3.2-3.6, 003 §2.4-2.5).

A block is attention then a feed-forward network, each wrapped in a residual connection with
normalisation before (pre-norm) or after (post-norm, Vaswani et al.) the sublayer, and dropout
on each sublayer's output before it is added to the residual stream (002 §6.3).
"""

from __future__ import annotations

from torch import Tensor, nn

from graded.attention.backends import check_capability, decodes_with_state
from graded.attention.graded import GradedMultiheadAttention
from graded.attention.multihead import MultiheadAttention
from graded.folding import folds_rows
from graded.grading import GradingMap
from graded.positional import RotaryEmbedding
from graded.transformer.cache import LayerCache
from graded.transformer.config import TransformerConfig
from graded.transformer.graded import (
    GradingPlan,
    foldable_grading,
    graded_stage,
    per_token,
    resolve_plan,
)
from graded.transformer.layers import FeedForward, make_norm

__all__ = [
    "AttentionSublayer",
    "DecoderBlock",
    "EncoderBlock",
    "FeedForwardSublayer",
    "make_attention",
    "require_backend",
]


def make_attention(config: TransformerConfig, grading: nn.Module | None = None, *,
                   cross: bool = False, qk_rotated: bool = False,
                   layer: int = 0) -> MultiheadAttention:
    """The attention module for a config: graded (000 Def 5.22) with ``grading`` over
    head_dim and the config's ``grade_attention_variant`` when a grading is given, plain
    otherwise; on ``cross_attn_backend`` for cross-attention, otherwise on the backend of
    self-attention layer ``layer`` (``attn_backend``, or its ``attn_backend_cycle`` entry:
    :meth:`TransformerConfig.layer_backend`).
    The grading is folded into the projections as ``fold_grading`` says, except on queries
    and keys that the caller rotates (``qk_rotated``: rotary positions)."""
    kwargs = dict(
        embed_dim=config.d_model, num_heads=config.n_heads,
        dropout=config.resolved("attn_dropout"), bias=config.resolved("qkv_bias"),
        out_bias=config.resolved("out_bias"), num_kv_heads=config.resolved("n_kv_heads"),
        batch_first=True, score=config.attn_score,
        backend=_backend(config, cross=cross, layer=layer),
    )
    if grading is not None:
        return GradedMultiheadAttention(grading=grading, variant=config.grade_attention_variant,
                                        fold_grading=config.fold_grading, qk_rotated=qk_rotated,
                                        **kwargs)
    return MultiheadAttention(**kwargs)


def _backend(config: TransformerConfig, *, cross: bool = False,
             layer: int = 0) -> str | nn.Module:
    if cross:
        name, options = config.cross_attn_backend, config.cross_attn_backend_options
    else:
        name, options = config.layer_backend(layer)
    if name in ("full", "explicit") and not options:
        return name
    from graded.attention.backends import get_backend

    return get_backend(name, **options)


def require_backend(config: TransformerConfig, feature: str, *, cross: bool = False,
                    layer: int = 0) -> None:
    """Refuse at build time a block whose backend cannot serve ``feature`` (a
    :class:`~graded.attention.backends.Capabilities` field), naming the config field: for
    self-attention the backend of layer ``layer`` (its ``attn_backend_cycle`` entry when
    there is a cycle)."""
    from graded.attention.backends import backend_capabilities, check_capability

    if cross:
        field, name = "cross_attn_backend", config.cross_attn_backend
    elif config.attn_backend_cycle:
        r = layer % len(config.attn_backend_cycle)
        field, name = f"attn_backend_cycle[{r}].backend", config.layer_backend(layer)[0]
    else:
        field, name = "attn_backend", config.attn_backend
    check_capability(backend_capabilities(name), name, feature,
                     f" (TransformerConfig.{field}={name!r})")


class AttentionSublayer(nn.Module):
    """Self- or cross-attention over batch-first (B, T, d) tensors, with rotary positions and a
    KV cache slotted between the projection and the attention of :class:`MultiheadAttention`.
    Graded (000 Def 5.22) with a head grading of its own from the plan when the config grades
    attention; the part of the grading folded into the projection (all of it without rotary
    positions, the values' with them) reaches the cache already applied. Cross-attention
    projects the memory into the cache at the first cached step and reuses its keys and values
    after it (the decoder refuses, before the step changes the cache, a memory that is not the
    one they came from: :meth:`KVCache.check_memory`). What a cached step of self-attention
    cannot do is refused by :meth:`check_cached_step`, which the stack calls for every layer
    before the cache changes. ``layer`` is the block's index in its stack."""

    def __init__(self, config: TransformerConfig, *, cross: bool = False,
                 plan: GradingPlan | None = None, layer: int = 0) -> None:
        super().__init__()
        plan = resolve_plan(config, plan)
        self.cross = cross
        self.layer = layer
        use_rope = config.positional == "rope" and not cross
        self.attn = make_attention(config, plan.head_grading() if plan is not None else None,
                                   cross=cross, qk_rotated=use_rope, layer=layer)
        if plan is not None and not cross:
            plan.self_attention.append(self.attn)
        self.rotary = (RotaryEmbedding(config.head_dim, base=config.rope_base) if use_rope
                       else None)

    def forward(
        self,
        x: Tensor,
        *,
        memory: Tensor | None = None,
        positions: Tensor | None = None,
        key_positions: Tensor | None = None,
        attn_bias: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        is_causal: bool = False,
        cache: LayerCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        if self.cross:
            if memory is None:
                raise ValueError("cross-attention needs the encoder memory")
            if cache is not None and cache.cross_k is not None:  # projected at the first step
                q, _, _ = self.attn.project(x, None, None)
                k, v = cache.cross_k, cache.cross_v
            else:
                q, k, v = self.attn.project(x, memory, memory)
                if cache is not None:
                    cache.cross_k, cache.cross_v = k, v
        else:
            q, k, v = self.attn.project(x, x, x)
            if self.rotary is not None:
                q = self.rotary(q, positions)
                k = self.rotary(k, positions)
            if cache is not None and decodes_with_state(self.attn.backend):
                return self._decode(q, k, v, cache, key_padding_mask), None
            if cache is not None:
                k, v = cache.append(k, v)
        heads, weights = self.attn.attend(
            q, k, v, attn_mask=attn_bias, key_padding_mask=key_padding_mask,
            is_causal=is_causal, need_weights=need_weights,
        )
        return self.attn.merge(heads), weights

    def check_cached_step(self, need_weights: bool) -> bool:
        """Refuse what a cached step of this self-attention cannot do, before the step changes
        the cache: a backend whose pattern a cache breaks (no ``incremental`` capability), or
        ``need_weights`` from a backend that decodes through a state of its own (it forms no
        weights over the cached keys); return whether it decodes so
        (:func:`~graded.attention.backends.decodes_with_state`)."""
        backend = self.attn.backend
        if backend is None:  # full attention over the cached keys
            return False
        if not decodes_with_state(backend):
            check_capability(backend, self.attn.backend_name, "incremental",
                             "; generate with use_cache=False or None")
            return False
        if need_weights:
            check_capability(backend, self.attn.backend_name, "attention_weights",
                             "; pass need_weights=False")
        return True

    def _decode(self, q: Tensor, k: Tensor, v: Tensor, cache: LayerCache,
                key_padding_mask: Tensor | None) -> Tensor:
        """Self-attention of the new positions through the backend's decoding state; the
        padding mask covers the whole cache, so its last Tn columns are the new positions'
        (:meth:`check_cached_step` has refused ``need_weights``)."""
        pad = None if key_padding_mask is None else key_padding_mask[:, -q.shape[2]:]
        heads, cache.state = self.attn.attend_incremental(q, k, v, cache.state,
                                                          key_padding_mask=pad)
        return self.attn.merge(heads)


class _Residual(nn.Module):
    """``x + dropout(f(norm(x)))`` (pre-norm) or ``norm(x + dropout(f(x)))`` (post-norm)."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.norm = make_norm(config.norm, config.d_model, config.norm_eps)
        self.dropout = nn.Dropout(config.dropout)
        self.norm_first = config.norm_first

    def pre(self, x: Tensor) -> Tensor:
        return self.norm(x) if self.norm_first else x

    def post(self, x: Tensor, out: Tensor) -> Tensor:
        y = x + self.dropout(out)
        return y if self.norm_first else self.norm(y)


class FeedForwardSublayer(nn.Module):
    """The block's FFN, graded M·Fnn(x) (000 Def 5.23 / 6.15) with the plan's shared feature
    grading when the config grades it, Fnn(x) otherwise. With ``config.fold_grading`` M is
    folded into the output layer: M (W_2 h + b_2) = (diag(m) W_2) h + m·b_2."""

    def __init__(self, config: TransformerConfig, *, plan: GradingPlan | None = None) -> None:
        super().__init__()
        plan = resolve_plan(config, plan)
        self.ffn = FeedForward(config.d_model, config.ff_dim, config.activation, config.dropout,
                               config.resolved("ffn_bias"))
        self.grading = graded_stage(plan, GradingPlan.ffn_stage)
        self.per_token = per_token(self.grading)
        self.fold_grading = config.fold_grading
        if plan is not None:
            plan.ffn_sublayers.append(self)

    def forward(self, x: Tensor, token_scales: Tensor | None = None) -> Tensor:
        """Fnn(x), graded; ``token_scales`` (B, T, d) are the per-token M_{q_i} when this stage
        is graded per token."""
        grading = foldable_grading(self.grading) if self.fold_grading else None
        if grading is None:
            y = self.ffn(x)
            return self.grading(y, token_scales) if self.per_token else self.grading(y)
        held = self.__dict__.get("_held_fold")  # folded with other layers'
        if held is not None and folds_rows(self.ffn.fc_out.weight, x):
            y = self.ffn(x, folded=held)
        else:
            y = self.ffn(x, out_scales=grading.scales())
        stage = self.grading  # a GradedFeatures (ffn_stage): what remains after the fold
        if not (self.per_token or stage.normalize):
            return y
        return stage(y, token_scales, folded=True)

    def folded_output(self) -> tuple[nn.Linear, GradingMap] | None:
        """The output layer and the grading folded into its rows, or None where there is no
        fold (what a model folds for all its layers at once,
        :class:`graded.folding.FoldedLinears`)."""
        grading = foldable_grading(self.grading) if self.fold_grading else None
        return None if grading is None else (self.ffn.fc_out, grading)


class EncoderBlock(nn.Module):
    """Bidirectional self-attention then FFN, graded as the plan says; ``layer`` is the
    block's index in its stack (it picks the ``attn_backend_cycle`` entry)."""

    def __init__(self, config: TransformerConfig, *, plan: GradingPlan | None = None,
                 layer: int = 0) -> None:
        super().__init__()
        plan = resolve_plan(config, plan)
        self.self_attn = AttentionSublayer(config, plan=plan, layer=layer)
        self.res_attn = _Residual(config)
        self.ff = FeedForwardSublayer(config, plan=plan)
        self.res_ff = _Residual(config)

    def forward(
        self, x: Tensor, *, positions: Tensor | None = None, attn_bias: Tensor | None = None,
        key_padding_mask: Tensor | None = None, need_weights: bool = False,
        token_scales: Tensor | None = None, **_: object,
    ) -> tuple[Tensor, Tensor | None]:
        out, w = self.self_attn(
            self.res_attn.pre(x), positions=positions, attn_bias=attn_bias,
            key_padding_mask=key_padding_mask, need_weights=need_weights,
        )
        x = self.res_attn.post(x, out)
        x = self.res_ff.post(x, self.ff(self.res_ff.pre(x), token_scales))
        return x, w


class DecoderBlock(nn.Module):
    """Causal self-attention, optional cross-attention to an encoder memory, then FFN, graded
    as the plan says (each attention layer with a head grading of its own); ``layer`` is the
    block's index in its stack (it picks the ``attn_backend_cycle`` entry)."""

    def __init__(self, config: TransformerConfig, *, cross_attention: bool = False,
                 plan: GradingPlan | None = None, layer: int = 0) -> None:
        super().__init__()
        plan = resolve_plan(config, plan)
        require_backend(config, "causal", layer=layer)
        if cross_attention:
            require_backend(config, "cross_attention", cross=True)
        self.self_attn = AttentionSublayer(config, plan=plan, layer=layer)
        self.res_attn = _Residual(config)
        self.cross_attn = (AttentionSublayer(config, cross=True, plan=plan, layer=layer)
                           if cross_attention else None)
        self.res_cross = _Residual(config) if cross_attention else None
        self.ff = FeedForwardSublayer(config, plan=plan)
        self.res_ff = _Residual(config)

    def forward(
        self,
        x: Tensor,
        *,
        positions: Tensor | None = None,
        attn_bias: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        memory: Tensor | None = None,
        memory_key_padding_mask: Tensor | None = None,
        cache: LayerCache | None = None,
        need_weights: bool = False,
        token_scales: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        out, w = self.self_attn(
            self.res_attn.pre(x), positions=positions, attn_bias=attn_bias,
            key_padding_mask=key_padding_mask, is_causal=True, cache=cache,
            need_weights=need_weights,
        )
        x = self.res_attn.post(x, out)
        if self.cross_attn is not None:
            out, _ = self.cross_attn(
                self.res_cross.pre(x), memory=memory, key_padding_mask=memory_key_padding_mask,
                cache=cache,
            )
            x = self.res_cross.post(x, out)
        x = self.res_ff.post(x, self.ff(self.res_ff.pre(x), token_scales))
        return x, w
