"""Hugging Face LLaMA (``LlamaForCausalLM``) to a :class:`~graded.transformer.TransformerLM`
and back.

Rotary positions with θ = ``rope_theta``, pre-norm RMSNorm, SwiGLU FFN
(``down(silu(gate(x)) ⊙ up(x))``), grouped-query attention, optional attention/MLP biases,
untied output layer unless ``tie_word_embeddings``. Hugging Face rotates dimension pairs
(m, m + D/2) of a head and this library pairs (2m, 2m+1) (Su et al.'s layout), so the rows of
each query and key head are permuted on the way in (and back on the way out); attention scores
are unchanged because queries and keys get the same permutation. The pad token's embedding row
gets no gradient, as LLaMA's (``padding_idx`` = ``pad_token_id``, where set), and goes back as
``pad_token_id``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from graded.interop._common import (
    _config_of,
    _dtype,
    _hf_model,
    _load,
    _only_buffers,
    _same_function,
    _tied,
    _ungraded,
)
from graded.transformer import TransformerConfig, TransformerLM

__all__ = ["from_llama", "llama_config", "to_llama"]


# our fields -> the Hugging Face options they come from (named when ours refuses a value)
_LLAMA_NAMES = {"vocab_size": "vocab_size", "d_model": "hidden_size",
                "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads",
                "n_layers": "num_hidden_layers", "d_ff": "intermediate_size",
                "max_len": "max_position_embeddings", "rope_base": "rope_parameters['rope_theta']",
                "norm_eps": "rms_norm_eps"}


def llama_config(hf: Any) -> TransformerConfig:
    """The :class:`TransformerConfig` of a Hugging Face ``LlamaConfig``."""
    rope = (getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None)
            or {})
    theta = rope.get("rope_theta", getattr(hf, "rope_theta", 10000.0))
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise ValueError(f"LLaMA rotary positions of type {kind!r} ({rope}) are not mapped; "
                         "only the default ones are")
    if hf.hidden_act not in ("silu", "swish"):  # Hugging Face's two names of one function
        raise ValueError(f"LlamaConfig.hidden_act={hf.hidden_act!r} is not mapped; expected "
                         "'silu' (or 'swish', the same function)")
    heads = hf.num_attention_heads
    if getattr(hf, "head_dim", None) not in (None, hf.hidden_size // heads):
        raise ValueError(f"LlamaConfig.head_dim={hf.head_dim!r} is not mapped; expected "
                         f"hidden_size / num_attention_heads = {hf.hidden_size // heads}")
    return _config_of(
        hf, _LLAMA_NAMES, vocab_size=hf.vocab_size, d_model=hf.hidden_size, n_heads=heads,
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
    kv_rows = _rope_rows(c.resolved("n_kv_heads"), d, to_interleaved=True)
    state = {"decoder.embed.tokens.weight": src["model.embed_tokens.weight"],
             "decoder.stack.final_norm.weight": src["model.norm.weight"],
             "head.proj.weight": src.get("lm_head.weight", src["model.embed_tokens.weight"])}
    for i in range(c.n_layers):
        t, o = f"model.layers.{i}.", f"decoder.stack.blocks.{i}."
        parts = [src[f"{t}self_attn.q_proj.weight"][q_rows],
                 src[f"{t}self_attn.k_proj.weight"][kv_rows], src[f"{t}self_attn.v_proj.weight"]]
        state[f"{o}self_attn.attn.in_proj_weight"] = torch.cat(parts)
        if c.resolved("qkv_bias"):
            state[f"{o}self_attn.attn.in_proj_bias"] = torch.cat([
                src[f"{t}self_attn.q_proj.bias"][q_rows], src[f"{t}self_attn.k_proj.bias"][kv_rows],
                src[f"{t}self_attn.v_proj.bias"]])
        for mine, theirs in _LLAMA_BLOCK.items():
            for kind in ("weight", "bias"):
                key = f"{t}{theirs}.{kind}"
                if key in src:
                    state[f"{o}{mine}.{kind}"] = src[key]
    lm.load_state_dict({k: v.contiguous() for k, v in state.items()}, strict=True)
    # the pad token's row gets no gradient, as in LLaMA's embedding (fine-tuning follows it)
    lm.decoder.embed.tokens.padding_idx = hf.model.embed_tokens.padding_idx
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
    qkv_bias, ffn_bias = c.resolved("qkv_bias"), c.resolved("ffn_bias")
    kv_heads = c.resolved("n_kv_heads")
    config = LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.ff_dim,
        num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
        num_key_value_heads=kv_heads, max_position_embeddings=c.max_len,
        rms_norm_eps=c.norm_eps, rope_theta=c.rope_base, attention_bias=qkv_bias,
        mlp_bias=ffn_bias, tie_word_embeddings=c.tie_embeddings, bos_token_id=None,
        eos_token_id=None, pad_token_id=lm.decoder.embed.tokens.padding_idx)
    _same_function(c, llama_config(config), "to_llama", "LLaMA")
    hf = _hf_model(LlamaForCausalLM, config, _dtype(lm))
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
