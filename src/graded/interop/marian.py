"""Hugging Face Marian (``MarianMTModel``) to a :class:`~graded.transformer.Seq2SeqTransformer`
and back.

Marian is the post-norm encoder-decoder of Vaswani et al.: LayerNorm (ε = 1e-5) after each
residual sum and no final norm, biases everywhere, token embeddings scaled by √d_model when
``scale_embedding``, the activation ``activation_function`` names (SiLU for ``"swish"``, the
usual choice of Marian checkpoints), and a ``final_logits_bias`` added to the logits (our
``logit_bias``). Attention projections Q, K, V are stacked into our ``in_proj_weight``.

Positions. Marian adds fixed sinusoids, counted from 0, with all the sines of a vector first and
all the cosines after (column m holds sin(t·ω_m), column d/2 + m cos(t·ω_m)), where ours
interleave them (column 2m, 2m+1). Permuting the model dimension in every weight would map one
layout onto the other, but Hugging Face builds its table in float32 whatever the model's dtype,
so our float64 sinusoids would differ from it by float32 rounding (3e-7 in the float64 logits of
the tests' small model). The converted model therefore has ``positional="learned"`` tables
holding Marian's own table, copied unchanged: exact in every dtype, and no permutation anywhere.
What Marian holds fixed is frozen in the converted model (``requires_grad=False``): both
position tables and the logits bias (a buffer in Marian); token lookups give the pad row no
gradient, as Marian's ``padding_idx`` does. :func:`graft_grading` keeps these. These are
attributes of the converted model, not of its config: a model rebuilt from the config trains
them. :func:`to_marian` refuses position tables that are no longer Marian's sinusoids (Marian
neither saves nor learns them).

Embeddings. Marian shares one table between the encoder, the decoder and the output layer by
default (``share_encoder_decoder_embeddings``, ``tie_word_embeddings``); the converted model is
tied (``tie_embeddings``) when the three weights are one, and holds three copies otherwise (the
same function; a sharing of only two of them, which our config cannot express, is then trained
as separate weights).

Inputs. Marian counts encoder positions from each row's first slot, ours from its first unpadded
token: equal for right padding (Marian's tokenizers pad on the right). Marian starts decoding
from ``decoder_start_token_id`` (its pad token), unmasked, as ``Seq2SeqTransformer.generate``
does with ``bos_token_id``.

Generation. Hugging Face's ``generate`` reads its defaults from the model's generation config:
Marian's force EOS as the last token at the length limit (``forced_eos_token_id``) and
checkpoints ban the pad token (``bad_words_ids=[[pad_token_id]]``), besides the start, EOS and
pad ids, the beam options and any logits processor the config sets (a repetition penalty,
n-gram blocking, a sequence bias, a minimum length). :func:`marian_generation_options` turns
that config into the keyword arguments of :meth:`Seq2SeqTransformer.generate`, refusing by name
what it cannot apply, and :func:`from_marian` records them
on the converted model as ``generation_options``, so that
``model.generate(src, n, src_key_padding_mask=mask == 0, **model.generation_options)`` gives the
tokens of ``hf.generate(src, attention_mask=mask, max_new_tokens=n)``. They are passed, not
applied by default: ``generate`` keeps one meaning whatever built the model.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from graded.interop._common import (
    _ACTIVATION_OF,
    _activation,
    _config_of,
    _dtype,
    _hf_model,
    _load,
    _only_buffers,
    _same_function,
    _ungraded,
)
from graded.transformer import Seq2SeqTransformer, TransformerConfig

__all__ = ["from_marian", "marian_config", "marian_generation_options", "to_marian"]

# Options of BART-era Marian configs that Hugging Face's Marian ignores: any other value would
# mean a model it computes differently from what the checkpoint was trained as.
_IGNORED_OPTIONS = {"normalize_before": False, "normalize_embedding": False,
                    "add_final_layer_norm": False, "static_position_embeddings": True}
_MARIAN_ACTIVATION_OF = {**_ACTIVATION_OF, "silu": "swish"}


# our fields -> the Hugging Face options they come from (named when ours refuses a value)
_MARIAN_NAMES = {"vocab_size": "vocab_size", "d_model": "d_model",
                 "n_heads": "encoder_attention_heads", "n_layers": "encoder_layers",
                 "n_decoder_layers": "decoder_layers", "d_ff": "encoder_ffn_dim",
                 "max_len": "max_position_embeddings"}


def marian_config(hf: Any) -> TransformerConfig:
    """The :class:`TransformerConfig` of a Hugging Face ``MarianConfig``."""
    activation = _activation(hf, "activation_function")
    pairs = (("decoder_vocab_size", "vocab_size"),
             ("decoder_attention_heads", "encoder_attention_heads"),
             ("decoder_ffn_dim", "encoder_ffn_dim"))
    for name, same in pairs:
        if getattr(hf, name) not in (None, getattr(hf, same)):
            raise ValueError(f"MarianConfig.{name}={getattr(hf, name)!r} is not mapped; expected "
                             f"{same}={getattr(hf, same)!r} (one value for encoder and decoder)")
    for name, expected in _IGNORED_OPTIONS.items():
        value = getattr(hf, name, expected)
        if value != expected:
            raise ValueError(f"MarianConfig.{name}={value!r} is not mapped; expected "
                             f"{expected!r} (Hugging Face's Marian ignores it)")
    pad = hf.pad_token_id
    return _config_of(
        hf, _MARIAN_NAMES, vocab_size=hf.vocab_size, d_model=hf.d_model,
        n_heads=hf.encoder_attention_heads,
        n_layers=hf.encoder_layers, n_decoder_layers=hf.decoder_layers,
        d_ff=hf.encoder_ffn_dim, max_len=hf.max_position_embeddings, dropout=0.0,
        positional="learned", activation=activation, norm="layer",
        norm_eps=1e-5, norm_first=False, bias=True, embed_scale=bool(hf.scale_embedding),
        logit_bias=True, pad_id=pad if pad is not None and 0 <= pad < hf.vocab_size else None,
        tie_embeddings=bool(hf.share_encoder_decoder_embeddings and hf.tie_word_embeddings),
    )


_MARIAN_BLOCK = {  # ours <- theirs (same layouts), in encoder and decoder layers
    "self_attn.attn.out_proj": "self_attn.out_proj", "res_attn.norm": "self_attn_layer_norm",
    "ff.ffn.fc_in": "fc1", "ff.ffn.fc_out": "fc2", "res_ff.norm": "final_layer_norm",
}
_MARIAN_CROSS = {"cross_attn.attn.out_proj": "encoder_attn.out_proj",
                 "res_cross.norm": "encoder_attn_layer_norm"}
_QKV = ("q_proj", "k_proj", "v_proj")


def _layer_keys(side: str, n: int) -> Iterator[tuple[str, list[str]]]:
    """(our key, their keys) of every weight of the ``n`` layers of one side: our stacked
    attention in-projection is their Q, K, V projections in turn, anything else one weight."""
    attention = {"self_attn": "self_attn"}
    names = dict(_MARIAN_BLOCK)
    if side == "decoder":
        attention["cross_attn"] = "encoder_attn"
        names.update(_MARIAN_CROSS)
    for i in range(n):
        t, o = f"model.{side}.layers.{i}.", f"{side}.stack.blocks.{i}."
        for kind in ("weight", "bias"):
            for mine, theirs in attention.items():
                yield f"{o}{mine}.attn.in_proj_{kind}", [f"{t}{theirs}.{p}.{kind}" for p in _QKV]
            for mine, theirs in names.items():
                yield f"{o}{mine}.{kind}", [f"{t}{theirs}.{kind}"]


# Hugging Face generation-config fields -> our generate options, with Hugging Face's defaults
_GENERATION_OPTIONS = {"decoder_start_token_id": "bos_token_id", "eos_token_id": "eos_token_id",
                       "pad_token_id": "pad_token_id", "bad_words_ids": "bad_words_ids",
                       "forced_eos_token_id": "forced_eos_token_id", "num_beams": "num_beams",
                       "length_penalty": "length_penalty", "early_stopping": "early_stopping"}
_HF_DEFAULTS = {"num_beams": 1, "length_penalty": 1.0, "early_stopping": False}
# logits processors Hugging Face's generate applies where these differ from their neutral
# values (None is unset): ours carries them under the same names
_PROCESSORS = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "sequence_bias": None,
               "renormalize_logits": False}
# ... and where these do, tokens ours cannot give (refused by name rather than dropped)
_NOT_CARRIED = {"suppress_tokens": None, "begin_suppress_tokens": None,
                "forced_bos_token_id": None, "exponential_decay_length_penalty": None,
                "encoder_no_repeat_ngram_size": 0, "encoder_repetition_penalty": 1.0,
                "num_beam_groups": 1, "diversity_penalty": 0.0, "num_return_sequences": 1,
                "penalty_alpha": None, "constraints": None, "force_words_ids": None,
                "guidance_scale": 1.0, "watermarking_config": None}


def marian_generation_options(model_or_config: Any) -> dict[str, Any]:
    """The options of :meth:`Seq2SeqTransformer.generate` that decode as Hugging Face's
    ``generate`` does by default for a ``MarianMTModel`` (its ``generation_config``) or a
    ``GenerationConfig``: the start (``decoder_start_token_id``, as ``bos_token_id``), EOS and
    pad ids, ``bad_words_ids``, ``forced_eos_token_id``, beam search's ``num_beams``,
    ``length_penalty`` and ``early_stopping`` (Hugging Face's defaults 1, 1.0, False where unset;
    ours differ for ``early_stopping``), and the logits processors the config sets:
    ``repetition_penalty``, ``no_repeat_ngram_size``, ``sequence_bias``, ``renormalize_logits``,
    and ``min_new_tokens``
    from its ``min_new_tokens`` and ``min_length`` (which counts the start token: no EOS among
    the first ``min_length - 1`` new tokens), where there is an EOS id, as Hugging Face applies
    them. Sampling options are not carried: Marian decodes greedily or by beams. The EOS ids
    may be lists, as Hugging Face's; ValueError when the config samples (``do_sample``), has no
    start id, lists more than one start or pad id, or sets an option whose tokens ours cannot
    give (``suppress_tokens``, ``forced_bos_token_id``, ``num_return_sequences``, ...: those
    of ``_NOT_CARRIED``), naming it."""
    config = getattr(model_or_config, "generation_config", model_or_config)
    if getattr(config, "do_sample", False):
        raise ValueError("the generation config has do_sample=True; expected greedy or beam "
                         "decoding (pass the sampling options to generate yourself)")
    for name, neutral in _NOT_CARRIED.items():
        value = getattr(config, name, None)
        if value is not None and value != neutral:
            raise ValueError(f"the generation config has {name}={value!r}, which "
                             "Seq2SeqTransformer.generate cannot apply; expected it unset"
                             f"{'' if neutral is None else f' or {neutral!r}'} (Hugging Face's "
                             "generate would give other tokens than the options returned)")
    out: dict[str, Any] = {}
    for theirs, ours in _GENERATION_OPTIONS.items():
        value = getattr(config, theirs, None)
        if value is None:
            value = _HF_DEFAULTS.get(theirs)
        if value is None:
            continue
        if (isinstance(value, (list, tuple)) and theirs.endswith("token_id")
                and "eos" not in theirs):  # generate takes lists of EOS ids
            if len(value) != 1:
                raise ValueError(f"generation config {theirs}={value!r}: expected one token id")
            value = value[0]
        out[ours] = [list(w) for w in value] if theirs == "bad_words_ids" else value
    if "bos_token_id" not in out:
        raise ValueError("the generation config has no decoder_start_token_id; expected the id "
                         "decoding starts from (Marian's pad token)")
    for name, neutral in _PROCESSORS.items():
        value = getattr(config, name, None)
        if value is not None and value != neutral:
            out[name] = value
    if out.get("eos_token_id") is not None:  # without one Hugging Face applies no minimum
        least = max(getattr(config, "min_new_tokens", None) or 0,
                    (getattr(config, "min_length", None) or 0) - 1)
        if least > 0:
            out["min_new_tokens"] = least
    return out


def from_marian(model_or_path: Any) -> Seq2SeqTransformer:
    """A :class:`Seq2SeqTransformer` equal to a Hugging Face ``MarianMTModel`` (the same logits
    for the same ``input_ids``, ``attention_mask`` and ``decoder_input_ids``), with
    ``generation_options``: :func:`marian_generation_options` of its generation config."""
    hf = _load(model_or_path, "MarianMTModel", "marian")
    src = hf.state_dict()
    c = marian_config(hf.config)
    tokens = src["model.encoder.embed_tokens.weight"]
    tied = all(torch.equal(src[k], tokens) for k in ("model.decoder.embed_tokens.weight",
                                                    "lm_head.weight"))
    c = c.replace(tie_embeddings=c.tie_embeddings and tied)
    model = Seq2SeqTransformer(c).to(_dtype(hf))
    state = {"encoder.embed.tokens.weight": tokens,
             "decoder.embed.tokens.weight": src["model.decoder.embed_tokens.weight"],
             "head.proj.weight": src["lm_head.weight"],
             "head.proj.bias": src["final_logits_bias"][0]}
    for side, n in (("encoder", c.n_layers), ("decoder", c.n_decoder_layers)):
        state[f"{side}.embed.positions.embedding.weight"] = src[
            f"model.{side}.embed_positions.weight"]
        for ours, theirs in _layer_keys(side, n):
            state[ours] = torch.cat([src[k] for k in theirs])
    model.load_state_dict({k: v.contiguous() for k, v in state.items()}, strict=True)
    for side in ("encoder", "decoder"):  # what Marian holds fixed
        embed = getattr(model, side).embed
        embed.positions.embedding.weight.requires_grad_(False)
        embed.tokens.padding_idx = getattr(hf.model, side).embed_tokens.padding_idx
    model.head.proj.bias.requires_grad_(False)
    model.generation_options = marian_generation_options(hf)
    return model.eval()


def to_marian(model: Seq2SeqTransformer, *, pad_token_id: int | None = None,
              eos_token_id: int | list[int] | None = None,
              decoder_start_token_id: int | None = None) -> Any:
    """The Hugging Face ``MarianMTModel`` of a Marian-shaped, ungraded
    :class:`Seq2SeqTransformer` (as :func:`from_marian` builds). ``pad_token_id`` defaults to
    the config's ``pad_id`` (Marian needs one: it is also where decoding starts, unless
    ``decoder_start_token_id`` says otherwise); ``eos_token_id`` goes into its generation
    config (no EOS is forced at the length limit)."""
    from transformers import MarianConfig, MarianMTModel

    c = _ungraded(model, Seq2SeqTransformer)
    pad = c.pad_id if pad_token_id is None else pad_token_id
    if pad is None or not 0 <= pad < c.vocab_size:
        raise ValueError(f"to_marian: pad_token_id={pad!r} (TransformerConfig.pad_id="
                         f"{c.pad_id!r}); expected a token id in [0, {c.vocab_size}): Marian "
                         "pads with it and starts decoding from it")
    layers = c.n_decoder_layers or c.n_layers
    config = MarianConfig(
        vocab_size=c.vocab_size, decoder_vocab_size=c.vocab_size, d_model=c.d_model,
        encoder_layers=c.n_layers, decoder_layers=layers, encoder_attention_heads=c.n_heads,
        decoder_attention_heads=c.n_heads, encoder_ffn_dim=c.ff_dim, decoder_ffn_dim=c.ff_dim,
        max_position_embeddings=c.max_len,
        activation_function=_MARIAN_ACTIVATION_OF.get(c.activation, "swish"),
        scale_embedding=c.embed_scale, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, share_encoder_decoder_embeddings=c.tie_embeddings,
        tie_word_embeddings=c.tie_embeddings, pad_token_id=pad, eos_token_id=eos_token_id,
        forced_eos_token_id=None, bos_token_id=None,
        decoder_start_token_id=pad if decoder_start_token_id is None else decoder_start_token_id)
    # without a logits bias ours is Marian's with final_logits_bias = 0
    expected = marian_config(config).replace(logit_bias=c.logit_bias)
    _same_function(c, expected, "to_marian", "Marian", cross_attention=True)
    hf = _hf_model(MarianMTModel, config, _dtype(model))
    mine = model.state_dict()
    state = {"model.encoder.embed_tokens.weight": mine["encoder.embed.tokens.weight"],
             "model.decoder.embed_tokens.weight": mine["decoder.embed.tokens.weight"],
             "lm_head.weight": mine["head.proj.weight"],
             "final_logits_bias": mine["head.proj.bias"][None] if c.logit_bias
             else torch.zeros_like(hf.final_logits_bias)}
    if c.tie_embeddings:
        state["model.shared.weight"] = mine["encoder.embed.tokens.weight"]
    for side, n in (("encoder", c.n_layers), ("decoder", layers)):
        table = getattr(hf.model, side).embed_positions.weight
        if not torch.equal(mine[f"{side}.embed.positions.embedding.weight"], table):
            raise ValueError(f"to_marian: the {side}'s position table is not Marian's sinusoidal "
                             "one (changed since from_marian?); expected it unchanged: Marian's "
                             "positions are fixed, neither learned nor saved")
        state[f"model.{side}.embed_positions.weight"] = table
        for ours, theirs in _layer_keys(side, n):
            for key, part in zip(theirs, mine[ours].chunk(len(theirs)), strict=True):
                state[key] = part
    missing, unexpected = hf.load_state_dict({k: v.contiguous() for k, v in state.items()},
                                             strict=False)
    _only_buffers(hf, missing, unexpected)
    return hf.eval()
