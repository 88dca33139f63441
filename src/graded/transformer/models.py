"""Transformer models: encoder, decoder, decoder-only LM, seq2seq, encoder classifier.

002 Ch. 3 (the encoder-decoder transformer), 003 §2 (the decoder-only model), 000 §4.
Every model takes integer token ids (B, T) — or, for encoder models with
``config.vocab_size=None``, real features (B, T, input_dim) — and an optional
``key_padding_mask`` (B, T) with ``True`` marking padding, as in ``torch.nn``.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from graded.attention.graded import apply_grading
from graded.checks import check_token_ids, checked_inputs, inputs_checked
from graded.folding import graded_linear
from graded.positional import (
    TABLE_POSITIONAL,
    ALiBi,
    LearnedPositions,
    SinusoidalPositions,
    check_position_range,
    check_positions,
    position_start,
)
from graded.transformer.blocks import DecoderBlock, EncoderBlock
from graded.transformer.cache import KVCache
from graded.transformer.config import TransformerConfig
from graded.transformer.graded import (
    GradingPlan,
    TokenGrading,
    foldable_grading,
    graded_stage,
    hold_plan,
    normalize_rows,
    per_token,
    resolve_plan,
)
from graded.transformer.layers import make_norm

__all__ = [
    "POOLINGS",
    "InputEmbedding",
    "Seq2SeqTransformer",
    "TransformerClassifier",
    "TransformerDecoder",
    "TransformerEncoder",
    "TransformerLM",
    "TransformerStack",
    "default_positions",
    "unread_fields",
]

# The weights tie_embeddings ties, as state-dict keys.
_LM_TIED = ("decoder.embed.tokens.weight", "head.proj.weight")
_SEQ2SEQ_TIED = ("encoder.embed.tokens.weight", "decoder.embed.tokens.weight",
                 "head.proj.weight")

# How an encoder classifier/regressor reduces (B, T, d) to (B, d): see TransformerClassifier.
POOLINGS = ("mean", "first", "last")

_ONE_STACK = ("has one stack, of n_layers layers (n_decoder_layers sizes the decoder of an "
              "encoder-decoder, Seq2SeqTransformer)")


def unread_fields(model: type[nn.Module], config: TransformerConfig
                  ) -> list[tuple[str, Any, Any, str]]:
    """The fields of ``config`` that the model class ``model`` does not read (its
    ``UNREAD_FIELDS``) set away from their defaults, as (field, value, default, why): a run
    config refuses them (:func:`graded.config.compose.dry_build`), as each would change
    nothing without a word (``n_decoder_layers`` of an LM, ``tie_embeddings`` of a
    classifier). The fields a config leaves unread whatever the model are refused by
    :class:`TransformerConfig` itself."""
    found = []
    for name, why in getattr(model, "UNREAD_FIELDS", {}).items():
        default = TransformerConfig.model_fields[name].get_default(call_default_factory=True)
        value = getattr(config, name)
        if value != default:
            found.append((name, value, default, why))
    return found


def default_positions(
    length: int, key_padding_mask: Tensor | None, cache: KVCache | None, batch: int,
    device: torch.device,
) -> Tensor:
    """Absolute positions (B, T) of new tokens: consecutive after the cached ones, skipping
    left padding (a padded row's first real token is at position 0). After the cached tokens
    means after their real ones: a step without a mask that follows a padded one continues
    each row from its own count."""
    if key_padding_mask is None:
        if cache is not None and cache.real is not None:
            return (cache.real + torch.arange(length, device=device)).expand(batch, length)
        start = cache.length if cache is not None else 0
        return torch.arange(start, start + length, device=device).expand(batch, length)
    real = (~key_padding_mask).long()
    pos = real.cumsum(dim=1) - 1
    if cache is not None and cache.real is not None:
        pos = pos + cache.real
    return pos.clamp(min=0)


def checked_entry(
    config: TransformerConfig, inputs: Tensor, positions: Tensor | None,
    key_padding_mask: Tensor | None, cache: KVCache | None, who: str,
) -> Tensor:
    """A model's entry check: the token ids against the vocabulary, and the positions of the
    pass (``positions``, or :func:`default_positions`), which it returns, against
    ``config.max_len`` where the model adds positions from a table of that many rows (against
    0 otherwise); given positions are (B, T), or (1, T) or (T,) for every row. Consecutive
    default positions are checked from the shapes; ids and other positions are read once each
    (one host–device synchronisation on a GPU; none inside
    :func:`graded.checks.checked_inputs`). The model then runs its layers inside
    :func:`trusted_inputs`, where they read no values again."""
    batch, length = inputs.shape[:2]
    if config.vocab_size is not None and inputs.dtype in (torch.int64, torch.int32):
        check_token_ids(inputs, config.vocab_size)  # other dtypes: the embedding's error
    max_len = config.max_len if config.positional in TABLE_POSITIONAL else None
    if positions is None and key_padding_mask is None:
        start = cache.length if cache is not None else 0
        if length:  # start .. start + length - 1, known from the shapes
            high = start + length - 1
            if max_len is not None and high >= max_len and cache is not None \
                    and cache.real is not None:
                # each row goes on from its own real tokens (default_positions), fewer than
                # the cache's width where it holds padding: read their count only here
                high = int(cache.real.max()) + length - 1
            check_position_range(start, high, max_len, who)
        return default_positions(length, None, cache, batch, inputs.device)
    if positions is None:
        positions = default_positions(length, key_padding_mask, cache, batch, inputs.device)
    elif positions.shape not in ((batch, length), (1, length), (length,)):
        raise ValueError(f"{who}: positions have shape {tuple(positions.shape)}; expected "
                         f"(batch, length) = ({batch}, {length}), (1, {length}) or ({length},)")
    check_positions(positions, max_len, who)
    return positions


def sequence_shape(config: TransformerConfig, inputs: Tensor) -> tuple[int, int]:
    """(batch, length) of a model's inputs: integer token ids (B, T), or for a feature model
    (``vocab_size=None``) floating features (B, T, input_dim), checked from the dtype and
    shape alone (no value is read) and refused naming what was expected."""
    if config.vocab_size is not None:
        if inputs.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"token ids must be an integer tensor of dtype torch.int64 or "
                            f"torch.int32 (what the embedding takes), got {inputs.dtype}")
        if inputs.dim() != 2:
            raise ValueError(f"token ids must have shape (batch, length), got "
                             f"{tuple(inputs.shape)}")
    elif inputs.dim() != 3 or inputs.shape[-1] != config.input_dim:
        raise ValueError(f"features must have shape (batch, length, {config.input_dim}), got "
                         f"{tuple(inputs.shape)}")
    elif not inputs.is_floating_point():
        raise TypeError(f"features must be a floating tensor, got {inputs.dtype}")
    return inputs.shape[0], inputs.shape[1]


def trusted_inputs() -> contextlib.AbstractContextManager:
    """:func:`graded.checks.checked_inputs` in eager calls; nothing under the compiler (which
    reads no values)."""
    return checked_inputs(not torch.compiler.is_compiling())


class InputEmbedding(nn.Module):
    """Tokens (or features) to vectors, plus additive positions, then dropout.

    ``sinusoidal``/``sinusoidal1``/``learned`` positions are added here; ``rope`` and ``alibi``
    act inside attention; ``none`` adds nothing (the model is then permutation-equivariant,
    000 Lemma 4.17). Graded stages, from the plan when the config grades them:
    ``input_grading`` (000 Def 5.19) acts on the token embedding, or on the raw features before
    their projection, and ``position_grading`` (000 Def 5.21) on the position vectors.

    In order: token ids x' = M_{q_i} M E[t] (per-token and feature grading), x'' = x'/‖x'‖
    (``grade_normalize``), h = ReLU(W x'' + b) with ``input_map`` W
    (``grade_input_activation``); features x'' = M_in x normalised, h = W_in x'' + b_in, its
    ReLU, then M_{q_i} h (``projected_grading``). Then √d (``embed_scale``), z = h + Pe'(t)
    and z' = z/‖z‖ (000 Eq. 48, ``grade_position_normalize``), ``embed_norm``, dropout.

    The input grading is not folded into the embedding (``config.fold_grading`` leaves it on
    the activations): it costs one product per forward pass, not one per layer, and the
    embedding's output X (ungraded for token inputs) is what :mod:`graded.analysis` perturbs
    through a hook on ``tokens``, which a folded lookup would bypass.
    """

    def __init__(self, config: TransformerConfig, *, plan: GradingPlan | None = None) -> None:
        super().__init__()
        plan = resolve_plan(config, plan)
        self.config = config
        if config.vocab_size is not None:
            self.tokens: nn.Module = nn.Embedding(config.vocab_size, config.d_model)
        else:
            self.tokens = nn.Linear(config.input_dim, config.d_model, bias=config.bias)
        if config.positional in ("sinusoidal", "sinusoidal1"):
            start = position_start(config.positional)
            self.positions: nn.Module | None = SinusoidalPositions(
                config.d_model, config.max_len, start=start
            )
        elif config.positional == "learned":
            self.positions = LearnedPositions(config.d_model, config.max_len)
        else:
            self.positions = None
        self.input_grading = graded_stage(plan, GradingPlan.input_stage)
        self.projected_grading = graded_stage(plan, GradingPlan.projected_input_stage)
        self.position_grading: nn.Module | None = (
            plan.position_stage() if plan is not None else None
        )
        # 000 Def 5.19: h = ReLU(W x'' + b); token inputs get a map W of their own
        self.input_map: nn.Module | None = None
        self.input_activation = config.grade_input_activation is not None
        if self.input_activation and config.vocab_size is not None:
            self.input_map = nn.Linear(config.d_model, config.d_model, bias=config.bias)
        self.position_normalize = config.grade_position_normalize
        # √d_model on token embeddings (Vaswani et al. §3.4); a norm of the sum (BERT)
        self.scale = math.sqrt(config.d_model) if config.embed_scale else 1.0
        self.norm = (make_norm(config.norm, config.d_model, config.norm_eps)
                     if config.embed_norm else nn.Identity())
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, inputs: Tensor, positions: Tensor,
                token_scales: Tensor | None = None) -> Tensor:
        """Embedded inputs (B, T, d); ``token_scales`` (B, T, d) are the per-token M_{q_i} when
        the model grades tokens. Inputs a model checked at its entry (inside
        :func:`graded.checks.checked_inputs`) are not checked again."""
        if torch.compiler.is_compiling() or not inputs_checked():  # shapes only: traceable
            sequence_shape(self.config, inputs)
        if self.config.vocab_size is not None:
            check_token_ids(inputs, self.config.vocab_size)
            x = self._stage(self.input_grading, self.tokens(inputs), token_scales)
            if self.input_map is not None:
                x = torch.relu(self.input_map(x))
        else:  # 000 Def 5.19: the grading acts on the raw features, before the projection
            weight = self.tokens.weight
            if not isinstance(self.input_grading, nn.Identity):
                # graded in the wider of the features' and the model's dtypes, as a grading in
                # the model's dtype promotes them (whatever the grading's own dtype)
                inputs = inputs.to(torch.promote_types(inputs.dtype, weight.dtype))
            graded = self.input_grading(inputs)
            if graded.dtype != weight.dtype and not torch.is_autocast_enabled(
                    inputs.device.type):  # the projection's error would not name the features
                raise TypeError(f"features are {inputs.dtype}, the model's weights "
                                f"{weight.dtype}; expected the same dtype (e.g. "
                                f"features.to({weight.dtype}))")
            x = self.tokens(graded)
            if self.input_activation:
                x = torch.relu(x)
            x = self._stage(self.projected_grading, x, token_scales)
        if self.scale != 1.0:
            x = x * self.scale
        if self.positions is not None:
            pe = self.positions(positions, dtype=x.dtype)
            if self.position_grading is not None:
                pe = self.position_grading(pe, positions)
            x = x + pe
        if self.position_normalize:  # 000 Eq. 48: z' = z / ‖z‖
            x = normalize_rows(x)
        return self.dropout(self.norm(x))

    @staticmethod
    def _stage(stage: nn.Module, x: Tensor, token_scales: Tensor | None) -> Tensor:
        return stage(x, token_scales) if per_token(stage) else stage(x)


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
        final = config.norm_first if config.final_norm is None else config.final_norm
        self.final_norm = (
            make_norm(config.norm, config.d_model, config.norm_eps) if final else nn.Identity()
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
    ) -> tuple[Tensor, list[Tensor]]:
        key_positions, kpm = positions, key_padding_mask
        if cache is not None:  # the step's last refusals, before it changes the cache
            history = self.check_cached_step(need_weights)
            if self.cross_attention:
                cache.check_memory(memory, "TransformerDecoder")
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


def _init_weights(module: nn.Module, std: float) -> None:
    """GPT-style initialisation N(0, std) for linear and embedding weights, zero biases."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=std)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)


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
        _check_padding(key_padding_mask, batch, length)
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
    (layers, rows), the memory's shape and the positions here, then, in the stack, what each
    layer's self-attention can do with a cache (:meth:`TransformerStack.check_cached_step`)
    and last the memory against the one the cached cross-attention keys were projected from
    (:meth:`KVCache.check_memory`). A refused step leaves the cache as it was, so the caller
    may correct the call and repeat the step."""

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
        _check_padding(key_padding_mask, batch, length)
        if cache is not None:
            cache.check(self.n_layers, batch, who)
        if self.cross_attention:
            _check_memory(memory, batch, self.config.d_model, who)
        if memory is not None:  # the source padding, over the memory's keys
            _check_padding(memory_key_padding_mask, memory.shape[0], memory.shape[1],
                           "memory_key_padding_mask (the source padding)")
        positions = checked_entry(self.config, input_ids, positions, key_padding_mask, cache,
                                  who)
        with trusted_inputs():
            x = self.embed(input_ids, positions, token_scales)
            return self.stack(
                x, positions, key_padding_mask=key_padding_mask, memory=memory,
                memory_key_padding_mask=memory_key_padding_mask, cache=cache,
                need_weights=need_weights, token_scales=token_scales,
            )

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


def _check_memory(memory: Tensor | None, batch: int, d_model: int, who: str) -> None:
    """Refuse, naming its shape, an encoder memory that is not (B, S, d_model) with B the
    ``batch`` of the decoder's input, or 1 (one memory for every row, as attention broadcasts
    it). Shapes only: no value is read."""
    if memory is None:
        raise ValueError(f"{who}: cross-attention needs the encoder memory (B, S, d_model)")
    if not isinstance(memory, Tensor):
        raise TypeError(f"{who}: the encoder memory must be a tensor (B, S, d_model), got "
                        f"{type(memory).__name__}")
    if memory.dim() != 3 or memory.shape[0] not in (1, batch) or memory.shape[2] != d_model:
        raise ValueError(f"{who}: the encoder memory has shape {tuple(memory.shape)}; expected "
                         f"(batch, source length, d_model) = ({batch}, S, {d_model}), or 1 "
                         "row for every input row")


def _check_padding(mask: Tensor | None, batch: int, length: int,
                   name: str = "key_padding_mask") -> None:
    if mask is None:
        return
    if mask.dtype != torch.bool:
        raise TypeError(f"{name} must be bool (True = padding), got {mask.dtype}")
    if mask.shape != (batch, length):
        raise ValueError(
            f"{name} has shape {tuple(mask.shape)}; expected (batch, length) = "
            f"({batch}, {length})"
        )


class _OutputHead(nn.Module):
    """Final linear readout z = W_out (M h) + b, with the plan's feature grading M when the
    output is graded (000 Def 5.23, 6.15) and M = I otherwise; with the config's
    ``fold_grading``, z = (W_out diag(m)) h + b."""

    def __init__(self, d_model: int, n_out: int, bias: bool, *,
                 plan: GradingPlan | None = None) -> None:
        super().__init__()
        self.grading = graded_stage(plan, GradingPlan.output_stage)
        self.per_token = per_token(self.grading)
        self.fold_grading = plan is not None and plan.config.fold_grading
        self.proj = nn.Linear(d_model, n_out, bias=bias)

    def forward(self, x: Tensor, token_scales: Tensor | None = None) -> Tensor:
        folded = foldable_grading(self.grading) if self.fold_grading else None
        if self.per_token and token_scales is not None:
            x = self.grading(x, token_scales, folded=folded is not None)
        elif folded is None:  # a pooled vector has no token: its stage is M alone
            grading = self.grading.grading if self.per_token else self.grading
            x = x if grading is None else apply_grading(grading, x)  # in x's dtype
        return graded_linear(x, self.proj.weight, self.proj.bias,
                             in_scales=None if folded is None else folded.scales())


def _check_tied(module: nn.Module, state_dict: dict, prefix: str, keys: tuple[str, ...],
                error_msgs: list[str]) -> None:
    """Refuse a state dict that holds different tensors for weights that ``module`` ties
    (``tie_embeddings``): loading it would leave every tied name holding the one loaded last,
    the embedding silently replaced by the output layer (or the reverse). The error names the
    keys; a state dict of an untied model loads into a model built with
    ``tie_embeddings=False``."""
    if not module.config.tie_embeddings:
        return
    given = [(k, state_dict[prefix + k]) for k in keys if prefix + k in state_dict]
    first_key, first = given[0] if given else (None, None)
    for key, t in given[1:]:
        if (isinstance(t, Tensor) and isinstance(first, Tensor) and not t.is_meta
                and not first.is_meta and t is not first
                and (t.shape != first.shape or not torch.equal(t, first.to(t)))):
            error_msgs.append(
                f"{prefix}{key} differs from {prefix}{first_key}, which this model ties to it "
                "(TransformerConfig.tie_embeddings=True); a state dict of an untied model "
                "loads into a model built with tie_embeddings=False")
            return


class TransformerLM(nn.Module):
    """Decoder-only language model (003 §2): ``forward(input_ids) -> logits (B, T, V)``.
    Reads every config field but those of :attr:`UNREAD_FIELDS`."""

    #: The config fields this model does not read, and why (:func:`unread_fields`).
    UNREAD_FIELDS: ClassVar[dict[str, str]] = {
        "n_decoder_layers": f"a decoder-only model {_ONE_STACK}",
        "cross_attn_backend": "a decoder-only model has no cross-attention",
        "cross_attn_backend_options": "a decoder-only model has no cross-attention",
    }

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        if config.vocab_size is None:
            raise ValueError("TransformerLM needs config.vocab_size, got None")
        self.config = config
        plan = GradingPlan.from_config(config)
        self.decoder = TransformerDecoder(config, cross_attention=False, plan=plan)
        self.head = _OutputHead(config.d_model, config.vocab_size, bias=config.logit_bias,
                                plan=plan)
        _init_weights(self, config.init_std)
        if config.tie_embeddings:
            self.head.proj.weight = self.decoder.embed.tokens.weight
        hold_plan(self, plan, register=True)

    def forward(
        self, input_ids: Tensor, key_padding_mask: Tensor | None = None, *,
        positions: Tensor | None = None, cache: KVCache | None = None,
        need_weights: bool = False, token_grades: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Logits (B, T, V); with ``need_weights`` also the per-layer (B, H, T, S) weights.
        ``token_grades`` (B, T) ≥ 0: each token's grade, required when the model grades tokens
        (``TransformerConfig.token_grading``) and refused otherwise."""
        scales = self.decoder.scales_for(input_ids, token_grades)
        h, weights = self.decoder(input_ids, key_padding_mask, positions=positions, cache=cache,
                                  need_weights=need_weights, token_scales=scales)
        logits = self.head(h, scales)
        return (logits, weights) if need_weights else logits

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
        _check_tied(self, state_dict, prefix, _LM_TIED, args[-1])
        super()._load_from_state_dict(state_dict, prefix, *args)

    def new_cache(self) -> KVCache:
        return KVCache.empty(self.decoder.n_layers)

    @torch.no_grad()
    def generate(self, input_ids: Tensor, max_new_tokens: int, **kwargs: object) -> Tensor:
        """Continue ``input_ids``; see :func:`graded.transformer.generation.generate`."""
        from graded.transformer.generation import generate

        return generate(self, input_ids, max_new_tokens, **kwargs)


class Seq2SeqTransformer(nn.Module):
    """Encoder-decoder transformer (002 Ch. 3, Vaswani et al.)."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        if config.vocab_size is None:
            raise ValueError("Seq2SeqTransformer needs config.vocab_size, got None")
        self.config = config
        plan = GradingPlan.from_config(config)
        self.encoder = TransformerEncoder(config, plan=plan)
        self.decoder = TransformerDecoder(config, cross_attention=True,
                                          n_layers=config.n_decoder_layers, plan=plan)
        self.head = _OutputHead(config.d_model, config.vocab_size, bias=config.logit_bias,
                                plan=plan)
        _init_weights(self, config.init_std)
        if config.tie_embeddings:
            self.decoder.embed.tokens.weight = self.encoder.embed.tokens.weight
            self.head.proj.weight = self.encoder.embed.tokens.weight
        hold_plan(self, plan, register=True)

    def encode(self, src_ids: Tensor, src_key_padding_mask: Tensor | None = None, *,
               token_grades: Tensor | None = None) -> Tensor:
        return self.encoder(src_ids, src_key_padding_mask, token_grades=token_grades)[0]

    def decode(
        self, tgt_ids: Tensor, memory: Tensor, *, tgt_key_padding_mask: Tensor | None = None,
        src_key_padding_mask: Tensor | None = None, cache: KVCache | None = None,
        positions: Tensor | None = None, token_grades: Tensor | None = None,
    ) -> Tensor:
        scales = self.decoder.scales_for(tgt_ids, token_grades)
        h, _ = self.decoder(tgt_ids, tgt_key_padding_mask, memory=memory,
                            memory_key_padding_mask=src_key_padding_mask, cache=cache,
                            positions=positions, token_scales=scales)
        return self.head(h, scales)

    def forward(
        self, src_ids: Tensor, tgt_ids: Tensor, src_key_padding_mask: Tensor | None = None,
        tgt_key_padding_mask: Tensor | None = None, *, token_grades: Tensor | None = None,
        decoder_token_grades: Tensor | None = None,
    ) -> Tensor:
        """Logits (B, Tt, V). With per-token grading, ``token_grades`` (B, Ts) grade the
        source tokens and ``decoder_token_grades`` (B, Tt) the target tokens."""
        memory = self.encode(src_ids, src_key_padding_mask, token_grades=token_grades)
        return self.decode(tgt_ids, memory, tgt_key_padding_mask=tgt_key_padding_mask,
                           src_key_padding_mask=src_key_padding_mask,
                           token_grades=decoder_token_grades)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
        _check_tied(self, state_dict, prefix, _SEQ2SEQ_TIED, args[-1])
        super()._load_from_state_dict(state_dict, prefix, *args)

    def new_cache(self) -> KVCache:
        return KVCache.empty(self.decoder.n_layers)

    @torch.no_grad()
    def generate(
        self, src_ids: Tensor, max_new_tokens: int, *, bos_token_id: int,
        src_key_padding_mask: Tensor | None = None, **kwargs: object,
    ) -> Tensor:
        """Decode from ``bos_token_id``; returns (B, 1 + new) target ids."""
        from graded.transformer.generation import generate_seq2seq

        return generate_seq2seq(self, src_ids, max_new_tokens, bos_token_id=bos_token_id,
                                src_key_padding_mask=src_key_padding_mask, **kwargs)


class TransformerClassifier(nn.Module):
    """Encoder with pooling and a linear head: (B, T) ids or (B, T, F) features ->
    (B, num_outputs), for classification (logits) or regression (values).

    ``pooling``: ``"mean"`` over non-padding positions, ``"first"`` (first non-padding token:
    a CLS-style first token, wherever the padding is) or ``"last"`` (last non-padding token).
    The head is a linear layer with a bias onto ``num_outputs``: the config's
    ``tie_embeddings`` and ``logit_bias`` (of the LM and seq2seq heads onto the vocabulary)
    are among the fields it does not read (:attr:`UNREAD_FIELDS`).
    """

    #: The config fields this model does not read, and why (:func:`unread_fields`).
    UNREAD_FIELDS: ClassVar[dict[str, str]] = {
        "n_decoder_layers": f"an encoder model {_ONE_STACK}",
        "cross_attn_backend": "an encoder model has no cross-attention",
        "cross_attn_backend_options": "an encoder model has no cross-attention",
        "tie_embeddings": "its output layer maps to num_outputs classes or values, not to the "
                          "vocabulary, so there is no output embedding to tie (the head is "
                          "never tied)",
        "logit_bias": "its output layer always has a bias (logit_bias is the LM and seq2seq "
                      "output layer's)",
    }

    def __init__(self, config: TransformerConfig, num_outputs: int, pooling: str = "mean"):
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        if isinstance(num_outputs, bool) or not isinstance(num_outputs, int) or num_outputs <= 0:
            raise ValueError(f"num_outputs must be a positive int, got {num_outputs!r}")
        self.config = config
        self.pooling = pooling
        plan = GradingPlan.from_config(config)
        self.encoder = TransformerEncoder(config, plan=plan)
        self.head = _OutputHead(config.d_model, num_outputs, bias=True,
                                plan=plan)
        _init_weights(self, config.init_std)
        hold_plan(self, plan, register=True)

    def forward(
        self, inputs: Tensor, key_padding_mask: Tensor | None = None, *,
        need_weights: bool = False, token_grades: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Outputs (B, num_outputs). ``token_grades`` as :class:`TransformerEncoder`'s; the
        output stage acts on the pooled vector, which has no token grade, so per-token grading
        reaches it through the input and feed-forward stages only."""
        h, weights = self.encoder(inputs, key_padding_mask, need_weights=need_weights,
                                  token_grades=token_grades)
        if key_padding_mask is None:
            index = {"first": 0, "last": -1}.get(self.pooling)
            pooled = h.mean(dim=1) if index is None else h[:, index]
        elif self.pooling == "mean":
            keep = (~key_padding_mask).unsqueeze(-1).to(h.dtype)
            pooled = (h * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1.0)
        else:  # argmax gives the first maximum: the first real token, or the last one's count
            real = (~key_padding_mask).long()
            index = real.argmax(dim=1) if self.pooling == "first" else real.cumsum(1).argmax(1)
            pooled = h[torch.arange(h.shape[0], device=h.device), index]
        out = self.head(pooled)
        return (out, weights) if need_weights else out
