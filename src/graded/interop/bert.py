"""Hugging Face BERT (``BertModel``) to a
:class:`~graded.transformer.models.TransformerEncoder` and back.

Learned positions, a LayerNorm of the summed embeddings, post-norm blocks without a final norm,
biases everywhere. Ours has no segment (token type) embeddings: the row of type 0 is added to
the position table, so inputs are one segment (``token_type_ids`` all 0, as Hugging Face's
default). Positions count from the first slot of a row in BERT and from the first unpadded
token in ours: equal for right padding, and for left padding given ``positions``. The pooler is
not part of the encoder. The pad token's embedding row gets no gradient, as BERT's
(``padding_idx`` = ``pad_token_id``), and goes back as ``pad_token_id``.
"""

from __future__ import annotations

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
from graded.transformer import TransformerConfig
from graded.transformer.models import TransformerEncoder

__all__ = ["bert_config", "from_bert", "to_bert"]


# our fields -> the Hugging Face options they come from (named when ours refuses a value)
_BERT_NAMES = {"vocab_size": "vocab_size", "d_model": "hidden_size",
               "n_heads": "num_attention_heads", "n_layers": "num_hidden_layers",
               "d_ff": "intermediate_size", "max_len": "max_position_embeddings",
               "norm_eps": "layer_norm_eps"}


def bert_config(hf: Any) -> TransformerConfig:
    """The :class:`TransformerConfig` of a Hugging Face ``BertConfig`` (the encoder)."""
    activation = _activation(hf, "hidden_act")
    kind = getattr(hf, "position_embedding_type", "absolute")
    if kind != "absolute":
        raise ValueError(f"BertConfig.position_embedding_type={kind!r} is not mapped; expected "
                         "'absolute'")
    if hf.is_decoder:
        raise ValueError("BertConfig.is_decoder=True is not mapped; expected False (the "
                         "bidirectional encoder)")
    return _config_of(
        hf, _BERT_NAMES, vocab_size=hf.vocab_size, d_model=hf.hidden_size,
        n_heads=hf.num_attention_heads,
        n_layers=hf.num_hidden_layers, d_ff=hf.intermediate_size,
        max_len=hf.max_position_embeddings, dropout=0.0, positional="learned",
        activation=activation, norm="layer", norm_eps=hf.layer_norm_eps,
        norm_first=False, bias=True, embed_norm=True,
    )


_BERT_BLOCK = {  # ours <- theirs (same layouts)
    "self_attn.attn.out_proj": "attention.output.dense",
    "res_attn.norm": "attention.output.LayerNorm", "ff.ffn.fc_in": "intermediate.dense",
    "ff.ffn.fc_out": "output.dense", "res_ff.norm": "output.LayerNorm",
}


def from_bert(model_or_path: Any) -> TransformerEncoder:
    """A :class:`TransformerEncoder` whose hidden states equal a Hugging Face ``BertModel``'s
    ``last_hidden_state`` (one segment; the pooler is left out)."""
    hf = _load(model_or_path, "BertModel", "bert", add_pooling_layer=False)
    encoder = TransformerEncoder(bert_config(hf.config)).to(_dtype(hf))
    src = hf.state_dict()
    state = {"embed.tokens.weight": src["embeddings.word_embeddings.weight"],
             "embed.positions.embedding.weight": src["embeddings.position_embeddings.weight"]
             + src["embeddings.token_type_embeddings.weight"][0],
             "embed.norm.weight": src["embeddings.LayerNorm.weight"],
             "embed.norm.bias": src["embeddings.LayerNorm.bias"]}
    for i in range(hf.config.num_hidden_layers):
        t, o = f"encoder.layer.{i}.", f"stack.blocks.{i}."
        for kind in ("weight", "bias"):
            state[f"{o}self_attn.attn.in_proj_{kind}"] = torch.cat(
                [src[f"{t}attention.self.{name}.{kind}"] for name in ("query", "key", "value")])
            for mine, theirs in _BERT_BLOCK.items():
                state[f"{o}{mine}.{kind}"] = src[f"{t}{theirs}.{kind}"]
    encoder.load_state_dict({k: v.contiguous() for k, v in state.items()}, strict=True)
    # the pad token's row gets no gradient, as in BERT's embedding (fine-tuning follows it)
    encoder.embed.tokens.padding_idx = hf.embeddings.word_embeddings.padding_idx
    return encoder.eval()


def to_bert(encoder: TransformerEncoder) -> Any:
    """The Hugging Face ``BertModel`` (without pooler) of a BERT-shaped, ungraded
    :class:`TransformerEncoder` (as :func:`from_bert` builds); its segment embeddings are zero,
    the position table holds what :func:`from_bert` folded into it."""
    from transformers import BertConfig, BertModel

    c = _ungraded(encoder, TransformerEncoder)
    config = BertConfig(
        vocab_size=c.vocab_size, hidden_size=c.d_model, num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads, intermediate_size=c.ff_dim,
        hidden_act=_ACTIVATION_OF.get(c.activation, "gelu"), max_position_embeddings=c.max_len,
        layer_norm_eps=c.norm_eps, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        pad_token_id=encoder.embed.tokens.padding_idx)
    _same_function(c, bert_config(config), "to_bert", "BERT",
                   unused=("tie_embeddings", "logit_bias"))
    hf = _hf_model(BertModel, config, _dtype(encoder), add_pooling_layer=False)
    mine = encoder.state_dict()
    state = {"embeddings.word_embeddings.weight": mine["embed.tokens.weight"],
             "embeddings.position_embeddings.weight": mine["embed.positions.embedding.weight"],
             "embeddings.token_type_embeddings.weight":
                 torch.zeros_like(hf.embeddings.token_type_embeddings.weight),
             "embeddings.LayerNorm.weight": mine["embed.norm.weight"],
             "embeddings.LayerNorm.bias": mine["embed.norm.bias"]}
    for i in range(c.n_layers):
        t, o = f"encoder.layer.{i}.", f"stack.blocks.{i}."
        for kind in ("weight", "bias"):
            parts = mine[f"{o}self_attn.attn.in_proj_{kind}"].chunk(3)
            for name, part in zip(("query", "key", "value"), parts, strict=True):
                state[f"{t}attention.self.{name}.{kind}"] = part
            for m, h in _BERT_BLOCK.items():
                state[f"{t}{h}.{kind}"] = mine[f"{o}{m}.{kind}"]
    missing, unexpected = hf.load_state_dict({k: v.contiguous() for k, v in state.items()},
                                             strict=False)
    _only_buffers(hf, missing, unexpected)
    return hf.eval()
