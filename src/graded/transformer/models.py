"""Transformer models: decoder-only LM, seq2seq, encoder classifier.

002 Ch. 3 (the encoder-decoder transformer), 003 §2 (the decoder-only model), 000 §4.
Every model takes integer token ids (B, T) — or, for encoder models with
``config.vocab_size=None``, real features (B, T, input_dim) — and an optional
``key_padding_mask`` (B, T) with ``True`` marking padding, as in ``torch.nn``.

The task models put an output head on the stacks of :mod:`graded.transformer.stacks` (the
encoder and decoder, also importable from here), which check their inputs at entry
(:mod:`graded.transformer.entry`) and embed them (:mod:`graded.transformer.embedding`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from graded.attention.graded import apply_grading
from graded.folding import graded_linear
from graded.transformer.cache import KVCache
from graded.transformer.config import TransformerConfig
from graded.transformer.embedding import InputEmbedding
from graded.transformer.entry import default_positions
from graded.transformer.graded import (
    GradingPlan,
    foldable_grading,
    graded_stage,
    hold_plan,
    per_token,
)
from graded.transformer.stacks import TransformerDecoder, TransformerEncoder, TransformerStack

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


def _init_weights(module: nn.Module, std: float) -> None:
    """GPT-style initialisation N(0, std) for linear and embedding weights, zero biases."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=std)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)


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
    are among the fields it does not read (:attr:`UNREAD_FIELDS`), and its output layer reads
    the pooled vector, which has no token grade (:attr:`UNAPPLIED_TOKEN_STAGES`).
    """

    #: The per-token grading stages (:data:`~graded.transformer.config.TOKEN_GRADE_STAGES`)
    #: this model does not apply, and why; a run config refuses them when written.
    UNAPPLIED_TOKEN_STAGES: ClassVar[dict[str, str]] = {
        "output": "its output layer reads the pooled vector, which has no token grade"}
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
