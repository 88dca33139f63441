"""Pretrained models as graded ones: Hugging Face GPT-2, LLaMA and BERT to ours and back.

:func:`from_gpt2` and :func:`from_llama` build a :class:`~graded.transformer.TransformerLM`
with the same architecture and weights as a Hugging Face ``GPT2LMHeadModel`` or
``LlamaForCausalLM`` (a model object, or a local checkpoint folder: nothing is downloaded), so
that both compute the same logits; :func:`to_gpt2` and :func:`to_llama` go back.
:func:`from_bert` builds the :class:`~graded.transformer.models.TransformerEncoder` of a
``BertModel`` (same hidden states) and :func:`to_bert` goes back.
:func:`graft_grading` then turns the model into an LGT or EGT (000 §5-6) whose grades start
neutral, so that fine-tuning with learnable grades starts from the pretrained function itself.

The mappings:

- GPT-2: learned positions, pre-norm LayerNorm blocks with a final norm, tanh-approximate GELU
  (or the exact GELU, ReLU or SiLU that ``activation_function`` names), biases everywhere, an
  output layer tied to the token embeddings unless ``tie_word_embeddings`` is False. Its
  ``Conv1D`` weights are stored (in, out) and are transposed; ``c_attn`` holds Q, K, V side by
  side as our ``in_proj_weight`` does.
- BERT: learned positions, a LayerNorm of the summed embeddings, post-norm blocks without a final
  norm, biases everywhere. Ours has no segment (token type) embeddings: the row of type 0 is
  added to the position table, so inputs are one segment (``token_type_ids`` all 0, as Hugging
  Face's default). Positions count from the first slot of a row in BERT and from the first
  unpadded token in ours: equal for right padding, and for left padding given ``positions``.
  The pooler is not part of the encoder.
- LLaMA: rotary positions with θ = ``rope_theta``, pre-norm RMSNorm, SwiGLU FFN
  (``down(silu(gate(x)) ⊙ up(x))``), grouped-query attention, optional attention/MLP biases,
  untied output layer unless ``tie_word_embeddings``. Hugging Face rotates dimension pairs
  (m, m + D/2) of a head and this library pairs (2m, 2m+1) (Su et al.'s layout), so the rows of
  each query and key head are permuted on the way in (and back on the way out); attention
  scores are unchanged because queries and keys get the same permutation.

A checkpoint folder must hold the architecture asked for (its ``config.json`` names the
``model_type``) and every weight of it: Hugging Face would otherwise initialise what is missing at
random and only log it. Going back, every architecture field of the :class:`TransformerConfig`
must be one the Hugging Face model has (no ``embed_scale``, ``logit_bias``, unscaled scores, ...)
and the attention exact; anything else is refused, naming the field, rather than exported as a
different function.

``transformers`` is needed only for these functions (a test dependency of the project).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from graded.grading import GradingMap
from graded.transformer import Seq2SeqTransformer, TransformerConfig, TransformerLM
from graded.transformer.models import TransformerEncoder

__all__ = ["from_bert", "from_gpt2", "from_llama", "graft_grading", "to_bert", "to_gpt2",
           "to_llama"]


def _load(model_or_path: Any, cls_name: str, model_type: str, **init: Any) -> Any:
    """A Hugging Face model object as given, or loaded from a local folder that holds a
    ``model_type`` checkpoint with all of its weights."""
    import transformers

    cls = getattr(transformers, cls_name)
    if isinstance(model_or_path, (str, Path)):
        path = Path(model_or_path)
        if not path.is_dir():
            raise FileNotFoundError(f"{path} is not a local checkpoint folder of a {cls_name}")
        config_file = path / "config.json"
        if not config_file.is_file():
            raise FileNotFoundError(f"{path} has no config.json; expected a folder written by "
                                    f"{cls_name}.save_pretrained")
        try:
            found = json.loads(config_file.read_text()).get("model_type")
        except (json.JSONDecodeError, AttributeError) as error:
            raise ValueError(f"{config_file} is not a JSON object; expected the config of a "
                             f"{cls_name}") from error
        if found != model_type:
            raise ValueError(f"{path} holds a checkpoint of model_type={found!r}; expected "
                             f"model_type={model_type!r} (a {cls_name})")
        try:
            model, info = cls.from_pretrained(str(path), local_files_only=True,
                                              output_loading_info=True, **init)
        except RuntimeError as error:  # weights whose shapes contradict config.json
            raise ValueError(f"the weights in {path} do not fit its config.json: "
                             f"{error}") from error
        if info["missing_keys"]:
            raise ValueError(f"the checkpoint in {path} lacks weights of a {cls_name}: "
                             f"{sorted(info['missing_keys'])}; expected all of them (they would "
                             "be initialised at random)")
        return model
    if not isinstance(model_or_path, cls):
        raise TypeError(f"expected a transformers.{cls_name} or a folder holding one, got "
                        f"{type(model_or_path).__name__}")
    return model_or_path


def _dtype(model: Any) -> torch.dtype:
    return next(model.parameters()).dtype


def _tied(src: dict[str, Tensor], embedding: str) -> bool:
    """Whether the output layer a model computes with holds its token embedding. A model whose
    config ties them may still not (an output layer replaced after loading); its weights
    decide."""
    head = src.get("lm_head.weight")
    return head is None or torch.equal(head, src[embedding])


# --------------------------------------------------------------------------- GPT-2


# Hugging Face's activation names -> ours, for the ones computed by the same formula
_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu",
                "relu": "relu", "silu": "silu", "swish": "silu"}
_ACTIVATION_OF = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu"}


def gpt2_config(hf: Any) -> TransformerConfig:
    """The :class:`TransformerConfig` of a Hugging Face ``GPT2Config``."""
    if hf.activation_function not in _ACTIVATIONS:
        raise ValueError(f"GPT2Config.activation_function={hf.activation_function!r} is not "
                         f"mapped; expected one of {sorted(_ACTIVATIONS)}")
    if hf.scale_attn_by_inverse_layer_idx or not hf.scale_attn_weights:
        raise ValueError(
            "GPT2Config.scale_attn_by_inverse_layer_idx="
            f"{hf.scale_attn_by_inverse_layer_idx!r}, scale_attn_weights="
            f"{hf.scale_attn_weights!r} is not mapped; expected False and True (scores scaled "
            "by 1/sqrt(head_dim) only)")
    return TransformerConfig(
        vocab_size=hf.vocab_size, d_model=hf.n_embd, n_heads=hf.n_head, n_layers=hf.n_layer,
        d_ff=hf.n_inner or 4 * hf.n_embd, max_len=hf.n_positions, dropout=0.0,
        positional="learned", activation=_ACTIVATIONS[hf.activation_function],
        norm="layer", norm_eps=hf.layer_norm_epsilon, norm_first=True, bias=True,
        tie_embeddings=bool(hf.tie_word_embeddings),
    )


def from_gpt2(model_or_path: Any) -> TransformerLM:
    """A :class:`TransformerLM` equal to a Hugging Face ``GPT2LMHeadModel``."""
    hf = _load(model_or_path, "GPT2LMHeadModel", "gpt2")
    src = hf.state_dict()
    c = gpt2_config(hf.config)
    c = c.replace(tie_embeddings=c.tie_embeddings and _tied(src, "transformer.wte.weight"))
    lm = TransformerLM(c).to(_dtype(hf))
    state = {"decoder.embed.tokens.weight": src["transformer.wte.weight"],
             "decoder.embed.positions.embedding.weight": src["transformer.wpe.weight"],
             "decoder.stack.final_norm.weight": src["transformer.ln_f.weight"],
             "decoder.stack.final_norm.bias": src["transformer.ln_f.bias"]}
    for i in range(hf.config.n_layer):
        state.update(_block_from_gpt2(src, f"transformer.h.{i}.", f"decoder.stack.blocks.{i}."))
    state["head.proj.weight"] = (state["decoder.embed.tokens.weight"] if c.tie_embeddings
                                 else src["lm_head.weight"])
    lm.load_state_dict(state, strict=True)
    return lm.eval()


_GPT2_BLOCK = {  # ours <- theirs; Conv1D weights (in, out) are transposed
    "res_attn.norm": "ln_1", "self_attn.attn.out_proj": "attn.c_proj", "res_ff.norm": "ln_2",
    "ff.ffn.fc_in": "mlp.c_fc", "ff.ffn.fc_out": "mlp.c_proj",
}


def _block_from_gpt2(src: dict[str, Tensor], theirs: str, ours: str) -> dict[str, Tensor]:
    out = {f"{ours}self_attn.attn.in_proj_weight": src[f"{theirs}attn.c_attn.weight"].T,
           f"{ours}self_attn.attn.in_proj_bias": src[f"{theirs}attn.c_attn.bias"]}
    for mine, hf in _GPT2_BLOCK.items():
        weight = src[f"{theirs}{hf}.weight"]
        out[f"{ours}{mine}.weight"] = weight if "norm" in mine else weight.T
        out[f"{ours}{mine}.bias"] = src[f"{theirs}{hf}.bias"]
    return {k: v.contiguous() for k, v in out.items()}


def to_gpt2(lm: TransformerLM) -> Any:
    """The Hugging Face ``GPT2LMHeadModel`` of a GPT-2-shaped, ungraded :class:`TransformerLM`
    (as :func:`from_gpt2` builds)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    c = _ungraded(lm)
    config = GPT2Config(
        vocab_size=c.vocab_size, n_positions=c.max_len, n_embd=c.d_model, n_layer=c.n_layers,
        n_head=c.n_heads, n_inner=c.ff_dim,
        activation_function=_ACTIVATION_OF.get(c.activation, "gelu_new"),
        layer_norm_epsilon=c.norm_eps, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        tie_word_embeddings=c.tie_embeddings, bos_token_id=None, eos_token_id=None)
    _same_function(c, gpt2_config(config), "to_gpt2", "GPT-2")
    hf = GPT2LMHeadModel(config).to(_dtype(lm))
    mine = lm.state_dict()
    state = {"transformer.wte.weight": mine["decoder.embed.tokens.weight"],
             "transformer.wpe.weight": mine["decoder.embed.positions.embedding.weight"],
             "transformer.ln_f.weight": mine["decoder.stack.final_norm.weight"],
             "transformer.ln_f.bias": mine["decoder.stack.final_norm.bias"],
             "lm_head.weight": mine["head.proj.weight"]}
    for i in range(c.n_layers):
        ours, theirs = f"decoder.stack.blocks.{i}.", f"transformer.h.{i}."
        state[f"{theirs}attn.c_attn.weight"] = mine[f"{ours}self_attn.attn.in_proj_weight"].T
        state[f"{theirs}attn.c_attn.bias"] = mine[f"{ours}self_attn.attn.in_proj_bias"]
        for m, h in _GPT2_BLOCK.items():
            w = mine[f"{ours}{m}.weight"]
            state[f"{theirs}{h}.weight"] = w if "norm" in m else w.T
            state[f"{theirs}{h}.bias"] = mine[f"{ours}{m}.bias"]
    missing, unexpected = hf.load_state_dict({k: v.contiguous() for k, v in state.items()},
                                             strict=False)
    _only_buffers(hf, missing, unexpected)
    return hf.eval()


# --------------------------------------------------------------------------- LLaMA


def llama_config(hf: Any) -> TransformerConfig:
    """The :class:`TransformerConfig` of a Hugging Face ``LlamaConfig``."""
    rope = (getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None)
            or {})
    theta = rope.get("rope_theta", getattr(hf, "rope_theta", 10000.0))
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise ValueError(f"LLaMA rotary positions of type {kind!r} ({rope}) are not mapped; "
                         "only the default ones are")
    if hf.hidden_act != "silu":
        raise ValueError(f"LlamaConfig.hidden_act={hf.hidden_act!r} is not mapped; expected "
                         "'silu'")
    heads = hf.num_attention_heads
    if getattr(hf, "head_dim", None) not in (None, hf.hidden_size // heads):
        raise ValueError(f"LlamaConfig.head_dim={hf.head_dim!r} is not mapped; expected "
                         f"hidden_size / num_attention_heads = {hf.hidden_size // heads}")
    return TransformerConfig(
        vocab_size=hf.vocab_size, d_model=hf.hidden_size, n_heads=heads,
        n_kv_heads=hf.num_key_value_heads or heads, n_layers=hf.num_hidden_layers,
        d_ff=hf.intermediate_size, max_len=hf.max_position_embeddings, dropout=0.0,
        positional="rope", rope_base=float(theta), activation="swiglu", norm="rms",
        norm_eps=hf.rms_norm_eps, norm_first=True, bias=False, qkv_bias=hf.attention_bias,
        out_bias=hf.attention_bias, ffn_bias=hf.mlp_bias,
        tie_embeddings=bool(hf.tie_word_embeddings),
    )


def _rope_rows(heads: int, head_dim: int, *, to_interleaved: bool) -> Tensor:
    """Row order taking Hugging Face's half-split rotary layout to the interleaved one (or
    back): within a head, our dim 2m is their m and our 2m+1 is their m + D/2."""
    half = torch.arange(head_dim // 2)
    interleaved = torch.stack([half, half + head_dim // 2], dim=1).flatten()  # ours <- theirs
    order = interleaved if to_interleaved else torch.argsort(interleaved)
    return (torch.arange(heads)[:, None] * head_dim + order).flatten()


def from_llama(model_or_path: Any) -> TransformerLM:
    """A :class:`TransformerLM` equal to a Hugging Face ``LlamaForCausalLM``."""
    hf = _load(model_or_path, "LlamaForCausalLM", "llama")
    src = hf.state_dict()
    c = llama_config(hf.config)
    c = c.replace(tie_embeddings=c.tie_embeddings and _tied(src, "model.embed_tokens.weight"))
    lm = TransformerLM(c).to(_dtype(hf))
    d = c.head_dim
    q_rows = _rope_rows(c.n_heads, d, to_interleaved=True)
    kv_rows = _rope_rows(c.n_kv_heads or c.n_heads, d, to_interleaved=True)
    state = {"decoder.embed.tokens.weight": src["model.embed_tokens.weight"],
             "decoder.stack.final_norm.weight": src["model.norm.weight"],
             "head.proj.weight": src.get("lm_head.weight", src["model.embed_tokens.weight"])}
    for i in range(c.n_layers):
        t, o = f"model.layers.{i}.", f"decoder.stack.blocks.{i}."
        parts = [src[f"{t}self_attn.q_proj.weight"][q_rows],
                 src[f"{t}self_attn.k_proj.weight"][kv_rows], src[f"{t}self_attn.v_proj.weight"]]
        state[f"{o}self_attn.attn.in_proj_weight"] = torch.cat(parts)
        if c.qkv_bias:
            state[f"{o}self_attn.attn.in_proj_bias"] = torch.cat([
                src[f"{t}self_attn.q_proj.bias"][q_rows], src[f"{t}self_attn.k_proj.bias"][kv_rows],
                src[f"{t}self_attn.v_proj.bias"]])
        for mine, theirs in _LLAMA_BLOCK.items():
            for kind in ("weight", "bias"):
                key = f"{t}{theirs}.{kind}"
                if key in src:
                    state[f"{o}{mine}.{kind}"] = src[key]
    lm.load_state_dict({k: v.contiguous() for k, v in state.items()}, strict=True)
    return lm.eval()


_LLAMA_BLOCK = {  # ours <- theirs (same layouts)
    "self_attn.attn.out_proj": "self_attn.o_proj", "res_attn.norm": "input_layernorm",
    "res_ff.norm": "post_attention_layernorm", "ff.ffn.fc_in": "mlp.gate_proj",
    "ff.ffn.fc_gate": "mlp.up_proj", "ff.ffn.fc_out": "mlp.down_proj",
}


def to_llama(lm: TransformerLM) -> Any:
    """The Hugging Face ``LlamaForCausalLM`` of a LLaMA-shaped, ungraded :class:`TransformerLM`
    (as :func:`from_llama` builds)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    c = _ungraded(lm)
    qkv_bias = c.bias if c.qkv_bias is None else c.qkv_bias
    ffn_bias = c.bias if c.ffn_bias is None else c.ffn_bias
    kv_heads = c.n_kv_heads or c.n_heads
    config = LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.ff_dim,
        num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
        num_key_value_heads=kv_heads, max_position_embeddings=c.max_len,
        rms_norm_eps=c.norm_eps, rope_theta=c.rope_base, attention_bias=qkv_bias,
        mlp_bias=ffn_bias, tie_word_embeddings=c.tie_embeddings, bos_token_id=None,
        eos_token_id=None, pad_token_id=None)
    _same_function(c, llama_config(config), "to_llama", "LLaMA")
    hf = LlamaForCausalLM(config).to(_dtype(lm))
    mine = lm.state_dict()
    d = c.head_dim
    q_rows = _rope_rows(c.n_heads, d, to_interleaved=False)
    kv_rows = _rope_rows(kv_heads, d, to_interleaved=False)
    state = {"model.embed_tokens.weight": mine["decoder.embed.tokens.weight"],
             "model.norm.weight": mine["decoder.stack.final_norm.weight"],
             "lm_head.weight": mine["head.proj.weight"]}
    split = [c.d_model, kv_heads * d, kv_heads * d]
    for i in range(c.n_layers):
        t, o = f"model.layers.{i}.", f"decoder.stack.blocks.{i}."
        wq, wk, wv = mine[f"{o}self_attn.attn.in_proj_weight"].split(split)
        state.update({f"{t}self_attn.q_proj.weight": wq[q_rows],
                      f"{t}self_attn.k_proj.weight": wk[kv_rows],
                      f"{t}self_attn.v_proj.weight": wv})
        if qkv_bias:
            bq, bk, bv = mine[f"{o}self_attn.attn.in_proj_bias"].split(split)
            state.update({f"{t}self_attn.q_proj.bias": bq[q_rows],
                          f"{t}self_attn.k_proj.bias": bk[kv_rows],
                          f"{t}self_attn.v_proj.bias": bv})
        for m, h in _LLAMA_BLOCK.items():
            for kind in ("weight", "bias"):
                if f"{o}{m}.{kind}" in mine:
                    state[f"{t}{h}.{kind}"] = mine[f"{o}{m}.{kind}"]
    missing, unexpected = hf.load_state_dict({k: v.contiguous() for k, v in state.items()},
                                             strict=False)
    _only_buffers(hf, missing, unexpected)
    return hf.eval()


# --------------------------------------------------------------------------- BERT


def bert_config(hf: Any) -> TransformerConfig:
    """The :class:`TransformerConfig` of a Hugging Face ``BertConfig`` (the encoder)."""
    if hf.hidden_act not in _ACTIVATIONS:
        raise ValueError(f"BertConfig.hidden_act={hf.hidden_act!r} is not mapped; expected one "
                         f"of {sorted(_ACTIVATIONS)}")
    kind = getattr(hf, "position_embedding_type", "absolute")
    if kind != "absolute":
        raise ValueError(f"BertConfig.position_embedding_type={kind!r} is not mapped; expected "
                         "'absolute'")
    if hf.is_decoder:
        raise ValueError("BertConfig.is_decoder=True is not mapped; expected False (the "
                         "bidirectional encoder)")
    return TransformerConfig(
        vocab_size=hf.vocab_size, d_model=hf.hidden_size, n_heads=hf.num_attention_heads,
        n_layers=hf.num_hidden_layers, d_ff=hf.intermediate_size,
        max_len=hf.max_position_embeddings, dropout=0.0, positional="learned",
        activation=_ACTIVATIONS[hf.hidden_act], norm="layer", norm_eps=hf.layer_norm_eps,
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
        pad_token_id=None)
    _same_function(c, bert_config(config), "to_bert", "BERT",
                   unused=("tie_embeddings", "logit_bias"))
    hf = BertModel(config, add_pooling_layer=False).to(_dtype(encoder))
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


# --------------------------------------------------------------------------- grading


_GRAFTABLE = (TransformerLM, TransformerEncoder, Seq2SeqTransformer)


def graft_grading(lm: nn.Module, grading: str, **options: Any) -> nn.Module:
    """An LGT (``grading="linear"``) or EGT (``"exponential"``) with ``lm``'s weights and
    neutral grades (M = I), so that it computes the same outputs until its grades move.
    ``lm`` is a :class:`TransformerLM`, a :class:`TransformerEncoder` (as :func:`from_bert`
    builds) or a :class:`~graded.Seq2SeqTransformer`; the graded model is of the same class.

    ``options`` are the other grading fields of :class:`TransformerConfig`
    (``learnable_grades``, ``grade_attention_variant``, ``grade_ffn``, ...); ``grade_init``
    other than ``"neutral"`` or ``grade_normalize`` change the function on purpose. Any other
    field would change the architecture the weights belong to and is refused.
    """
    if not isinstance(lm, _GRAFTABLE):
        raise TypeError(f"expected one of {[cls.__name__ for cls in _GRAFTABLE]}, got "
                        f"{type(lm).__name__}")
    not_grading = sorted(set(options) - _GRADING_FIELDS)
    if not_grading:
        raise ValueError(f"graft_grading sets grading fields only; got {not_grading}, expected "
                         f"names among {sorted(_GRADING_FIELDS)}")
    config = lm.config.replace(grading=grading, **options)
    weight = next(lm.parameters())
    graded = type(lm)(config).to(device=weight.device, dtype=weight.dtype)
    missing, unexpected = graded.load_state_dict(lm.state_dict(), strict=False)
    grading_maps = {name for name, m in graded.named_modules(remove_duplicate=False)
                    if isinstance(m, GradingMap)}
    not_grading = [k for k in missing if k.rpartition(".")[0] not in grading_maps]
    if unexpected or not_grading:
        raise ValueError(f"the model's weights do not fit its graded form: unexpected "
                         f"{unexpected}, missing {not_grading}")
    return graded.train(lm.training)


# Fields that do not change what an ungraded model computes in eval mode: regularisation,
# initialisation, padding, seq2seq-only fields, and the grading fields (the model is ungraded).
_GRADING_FIELDS = frozenset(
    name for name in TransformerConfig.model_fields
    if name.startswith(("grade_", "grading_", "token_grad"))
    or name in ("learnable_grades", "grades_per_head", "fold_grading", "input_grades"))
_NOT_FUNCTION = _GRADING_FIELDS | {
    "dropout", "attn_dropout", "init_std", "pad_id", "attn_backend", "attn_backend_options",
    "cross_attn_backend", "cross_attn_backend_options", "n_decoder_layers"}
# attention backends that compute softmax(Q Kᵀ / √d) V exactly, as Hugging Face's models do
_EXACT_BACKENDS = ("full", "explicit", "chunked")


def _architecture(c: TransformerConfig) -> dict[str, Any]:
    """The fields that fix what an ungraded ``c`` computes, with their defaults resolved."""
    fields = {name: getattr(c, name) for name in TransformerConfig.model_fields
              if name not in _NOT_FUNCTION}
    fields.update(
        d_ff=c.ff_dim, n_kv_heads=c.n_kv_heads or c.n_heads,
        qkv_bias=c.bias if c.qkv_bias is None else c.qkv_bias,
        out_bias=c.bias if c.out_bias is None else c.out_bias,
        ffn_bias=c.bias if c.ffn_bias is None else c.ffn_bias,
        final_norm=c.norm_first if c.final_norm is None else c.final_norm,
        rope_base=c.rope_base if c.positional == "rope" else None)
    del fields["bias"]  # an LM's biases are the three switches above
    return fields


def _same_function(c: TransformerConfig, expected: TransformerConfig, caller: str,
                   reference: str, unused: tuple[str, ...] = ()) -> None:
    """Refuse an export whose Hugging Face model would compute something other than ``c``;
    ``unused`` fields do not act in the model exported."""
    if c.attn_backend not in _EXACT_BACKENDS:
        raise ValueError(f"{caller}: TransformerConfig.attn_backend={c.attn_backend!r} is not "
                         f"exact attention; expected one of {_EXACT_BACKENDS}")
    ours, theirs = _architecture(c), _architecture(expected)
    for name in unused:
        del ours[name], theirs[name]
    differ = [f"{name}={ours[name]!r} (expected {theirs[name]!r})" for name in ours
              if ours[name] != theirs[name]]
    if differ:
        raise ValueError(f"{caller}: {reference} cannot express TransformerConfig."
                         f"{', '.join(differ)}")


def _ungraded(model: nn.Module, cls: type[nn.Module] = TransformerLM) -> TransformerConfig:
    if not isinstance(model, cls):
        raise TypeError(f"expected a {cls.__name__}, got {type(model).__name__}")
    if model.config.grading is not None:
        raise ValueError(f"TransformerConfig.grading={model.config.grading!r}: a graded model "
                         "has no Hugging Face counterpart; expected an ungraded model (export "
                         "it before graft_grading)")
    return model.config


def _only_buffers(hf: Any, missing: list[str], unexpected: list[str]) -> None:
    """Keys a Hugging Face model may lack in a state dict are its non-parameter buffers."""
    params = {n for n, _ in hf.named_parameters()}
    if unexpected or any(k in params for k in missing):
        raise ValueError(f"weights do not fit the Hugging Face model: missing "
                         f"{[k for k in missing if k in params]}, unexpected {unexpected}")
