"""The stacks of the transformer models: the blocks of a stack, and the encoder and decoder
that put the input embedding in front of one (002 Ch. 3, 003 §2).

:class:`TransformerStack` runs ``n_layers`` blocks; :class:`TransformerEncoder` (bidirectional)
and :class:`TransformerDecoder` (causal, optionally cross-attending to an encoder memory, with a
KV cache) check a call at their entry (:mod:`graded.transformer.entry`), embed it
(:class:`~graded.transformer.embedding.InputEmbedding`) and run their stack. The task models
of :mod:`graded.transformer.models` are built from them.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from graded.checks import check_bool, inputs_checked
from graded.folding import _autocast_on
from graded.positional import ALiBi
from graded.transformer.blocks import DecoderBlock, EncoderBlock
from graded.transformer.cache import KVCache
from graded.transformer.config import TransformerConfig
from graded.transformer.embedding import InputEmbedding
from graded.transformer.entry import (
    check_memory_shape,
    check_padding_mask,
    checked_entry,
    sequence_shape,
    trusted_inputs,
)
from graded.transformer.graded import GradingPlan, TokenGrading, hold_plan, resolve_plan
from graded.transformer.layers import make_norm

__all__ = ["TransformerDecoder", "TransformerEncoder", "TransformerStack", "token_scales"]

#: The dtypes autocast casts to its own (it leaves float64 and integer tensors as they are).
_AUTOCAST_CASTS = (torch.float16, torch.bfloat16, torch.float32)


class TransformerStack(nn.Module):
    """``n_layers`` blocks, graded as the plan says, and, for pre-norm, a final
    normalisation. Block r's self-attention runs on the config's backend of layer r
    (``attn_backend_cycle`` entry r mod its length, when set)."""

    def __init__(
        self, config: TransformerConfig, n_layers: int, *, causal: bool,
        cross_attention: bool = False, plan: GradingPlan | None = None,
    ) -> None:
        super().__init__()
        plan = resolve_plan(config, plan)
        self.causal = causal
        self.cross_attention = cross_attention
        if causal:
            self.blocks = nn.ModuleList(
                DecoderBlock(config, cross_attention=cross_attention, plan=plan, layer=r)
                for r in range(n_layers)
            )
        else:
            self.blocks = nn.ModuleList(EncoderBlock(config, plan=plan, layer=r)
                                        for r in range(n_layers))
        self.alibi = ALiBi(config.n_heads) if config.positional == "alibi" else None
        self.final_norm = (
            make_norm(config.norm, config.d_model, config.norm_eps)
            if config.resolved("final_norm") else nn.Identity()
        )

    def check_cached_step(self, need_weights: bool) -> bool:
        """Refuse, before a cached step changes the cache, what a layer's self-attention cannot
        do with it (:meth:`AttentionSublayer.check_cached_step`: refused in the layer's
        forward, a step stopped after the earlier layers had cached it); return whether the
        cache must keep the positions and padding of every cached token: unless every
        self-attention keeps a decoding state of its own (and there is no ALiBi)."""
        states = [block.self_attn.check_cached_step(need_weights) for block in self.blocks]
        return self.alibi is not None or not all(states)

    def forward(
        self,
        x: Tensor,
        positions: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        memory: Tensor | None = None,
        memory_key_padding_mask: Tensor | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
        token_scales: Tensor | None = None,
        who: str = "TransformerDecoder",
    ) -> tuple[Tensor, list[Tensor]]:
        """The blocks over ``x`` (B, T, d); ``need_weights`` takes True or False only, checked
        before a cached step changes the cache (its attention calls refuse another value);
        ``who`` names the caller in a refused cached step."""
        if type(need_weights) is not bool:  # the bool itself passes on one comparison
            need_weights = check_bool("need_weights", need_weights)
        key_positions, kpm = positions, key_padding_mask
        if cache is not None:  # the step's last refusals, before it changes the cache
            history = self.check_cached_step(need_weights)
            if self.cross_attention:
                cache.check_memory(memory, who)
            if kpm is None:
                kpm = torch.zeros(positions.shape, dtype=torch.bool, device=x.device)
            key_positions, kpm = cache.extend(positions, kpm, history=history)
        if (kpm is not None and not torch.compiler.is_compiling() and not inputs_checked()
                and not bool(kpm.any())):
            kpm = None  # no padding: the fused kernel's mask-free path (eager, values read)
        bias = self.alibi(positions, key_positions) if self.alibi is not None else None
        weights = []
        for i, block in enumerate(self.blocks):
            x, w = block(
                x, positions=positions, attn_bias=bias, key_padding_mask=kpm, memory=memory,
                memory_key_padding_mask=memory_key_padding_mask,
                cache=None if cache is None else cache.layers[i], need_weights=need_weights,
                token_scales=token_scales,
            )
            if w is not None:
                weights.append(w)
        return self.final_norm(x), weights


class TransformerEncoder(nn.Module):
    """Embedding + bidirectional stack: (B, T) ids or (B, T, F) features -> (B, T, d).

    Graded in every stage the config asks for: with the model's ``plan``, or, built on its
    own from a graded config, with a plan of its own (whose gradings it then holds)."""

    def __init__(self, config: TransformerConfig, *, plan: GradingPlan | None = None) -> None:
        super().__init__()
        owner = plan is None
        plan = resolve_plan(config, plan)
        self.config = config
        self.embed = InputEmbedding(config, plan=plan)
        self.stack = TransformerStack(config, config.n_layers, causal=False, plan=plan)
        self.token_grading = plan.token_grading() if plan is not None else None
        hold_plan(self, plan, register=owner)

    def forward(
        self, inputs: Tensor, key_padding_mask: Tensor | None = None, *,
        positions: Tensor | None = None, need_weights: bool = False,
        token_grades: Tensor | None = None,
    ) -> tuple[Tensor, list[Tensor]]:
        """Hidden states (B, T, d); ``token_grades`` (B, T) ≥ 0 are required when the model
        grades tokens (``TransformerConfig.token_grading``) and refused otherwise."""
        batch, length = sequence_shape(self.config, inputs)
        check_padding_mask(key_padding_mask, batch, length)
        scales = token_scales(self.token_grading, token_grades, batch, length)
        positions = checked_entry(self.config, inputs, positions, key_padding_mask, None,
                                  type(self).__name__)
        with trusted_inputs():
            x = self.embed(inputs, positions, scales)
            return self.stack(x, positions, key_padding_mask=key_padding_mask,
                              need_weights=need_weights, token_scales=scales)


class TransformerDecoder(nn.Module):
    """Embedding + causal stack, optionally cross-attending to an encoder memory; graded as
    :class:`TransformerEncoder` is.

    A step with a KV cache is checked whole before anything of it is cached: the cache
    (layers, rows), the memory's shape, dtype and device and the positions here, then, in the
    stack, what each layer's self-attention can do with a cache
    (:meth:`TransformerStack.check_cached_step`) and last the memory against the one the
    cached cross-attention keys were projected from (:meth:`KVCache.check_memory`). A refused
    step leaves the cache as it was, so the caller may correct the call and repeat the step."""

    def __init__(self, config: TransformerConfig, *, cross_attention: bool,
                 n_layers: int | None = None, plan: GradingPlan | None = None) -> None:
        super().__init__()
        owner = plan is None
        plan = resolve_plan(config, plan)
        self.config = config
        self.cross_attention = cross_attention
        self.n_layers = n_layers or config.n_layers
        self.embed = InputEmbedding(config, plan=plan)
        self.stack = TransformerStack(config, self.n_layers, causal=True,
                                      cross_attention=cross_attention, plan=plan)
        self.token_grading = plan.token_grading() if plan is not None else None
        hold_plan(self, plan, register=owner)

    def forward(
        self, input_ids: Tensor, key_padding_mask: Tensor | None = None, *,
        memory: Tensor | None = None, memory_key_padding_mask: Tensor | None = None,
        positions: Tensor | None = None, cache: KVCache | None = None,
        need_weights: bool = False, token_scales: Tensor | None = None,
    ) -> tuple[Tensor, list[Tensor]]:
        """Hidden states (B, T, d); ``token_scales`` (B, T, d) from :meth:`scales_for` when
        the model grades tokens; ``memory`` (B, S, d_model), or (1, S, d_model) for every
        row, with cross-attention."""
        who = type(self).__name__
        batch, length = sequence_shape(self.config, input_ids)
        check_padding_mask(key_padding_mask, batch, length)
        if cache is not None:
            cache.check(self.n_layers, batch, who)
        if self.cross_attention:
            check_memory_shape(memory, batch, self.config.d_model, who)
            self._check_memory_type(memory, who)
        if memory is not None:  # the source padding, over the memory's keys
            check_padding_mask(memory_key_padding_mask, memory.shape[0], memory.shape[1],
                               "memory_key_padding_mask (the source padding)")
        positions = checked_entry(self.config, input_ids, positions, key_padding_mask, cache,
                                  who)
        with trusted_inputs():
            x = self.embed(input_ids, positions, token_scales)
            return self.stack(
                x, positions, key_padding_mask=key_padding_mask, memory=memory,
                memory_key_padding_mask=memory_key_padding_mask, cache=cache,
                need_weights=need_weights, token_scales=token_scales, who=who,
            )

    def _check_memory_type(self, memory: Tensor, who: str) -> None:
        """Refuse an encoder memory that the cross-attention cannot project: on another device
        than its weights, or of another dtype, unless autocast casts both (float16, bfloat16
        and float32 tensors; ``F.linear`` takes one dtype). Its projection would fail, and in
        a cached step only after the step's positions and the earlier layers' keys were cached
        (the corrected step then failed as well). Dtypes and devices only: no value is read."""
        attn = self.stack.blocks[0].cross_attn.attn
        weight = attn.in_proj_weight if attn.in_proj_weight is not None else attn.k_proj_weight
        if memory.device != weight.device:
            raise ValueError(f"{who}: the encoder memory is on {memory.device}, the model on "
                             f"{weight.device}; expected memory.to({str(weight.device)!r})")
        cast = (_autocast_on(memory.device.type) is not None  # both cast to its dtype
                and all(t.dtype in _AUTOCAST_CASTS for t in (memory, weight)))
        if memory.dtype != weight.dtype and not cast:
            raise TypeError(f"{who}: the encoder memory is {memory.dtype}, the model's weights "
                            f"{weight.dtype}; expected the same dtype (what the model's encode "
                            f"returns, or memory.to({weight.dtype}))")

    def scales_for(self, input_ids: Tensor, token_grades: Tensor | None) -> Tensor | None:
        """The per-token M_{q_i} of ``token_grades`` (B, T), checked against the model."""
        return token_scales(self.token_grading, token_grades,
                            *sequence_shape(self.config, input_ids))


def token_scales(grading: TokenGrading | None, token_grades: Tensor | None, batch: int,
                 length: int) -> Tensor | None:
    """The per-token scales (B, T, d) of a model that grades tokens; None for one that does
    not. Missing grades on the first and grades given to the second are errors."""
    if grading is None:
        if token_grades is not None:
            raise ValueError("token_grades were given, but this model does not grade tokens "
                             "(TransformerConfig.token_grading=False)")
        return None
    if token_grades is None:
        raise ValueError("this model grades tokens (TransformerConfig.token_grading=True): pass "
                         f"token_grades of shape (batch, length) = ({batch}, {length})")
    return grading(token_grades, batch, length)
