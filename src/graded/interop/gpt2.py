"""Hugging Face GPT-2 (``GPT2LMHeadModel``) to a :class:`~graded.transformer.TransformerLM`
and back.

Learned positions, pre-norm LayerNorm blocks with a final norm, tanh-approximate GELU (or the
exact GELU, ReLU or SiLU that ``activation_function`` names), biases everywhere, an output layer
tied to the token embeddings unless ``tie_word_embeddings`` is False. Its ``Conv1D`` weights are
stored (in, out) and are transposed; ``c_attn`` holds Q, K, V side by side as our
``in_proj_weight`` does.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from graded.interop._common import (
    _ACTIVATION_OF,
    _activation,
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

__all__ = ["from_gpt2", "gpt2_config", "to_gpt2"]


# our fields -> the Hugging Face options they come from (named when ours refuses a value)
_GPT2_NAMES = {"vocab_size": "vocab_size", "d_model": "n_embd", "n_heads": "n_head",
               "n_layers": "n_layer", "d_ff": "n_inner", "max_len": "n_positions",
               "norm_eps": "layer_norm_epsilon"}


def gpt2_config(hf: Any) -> TransformerConfig:
    """The :class:`TransformerConfig` of a Hugging Face ``GPT2Config``."""
    activation = _activation(hf, "activation_function")
    if hf.scale_attn_by_inverse_layer_idx or not hf.scale_attn_weights:
        raise ValueError(
            "GPT2Config.scale_attn_by_inverse_layer_idx="
            f"{hf.scale_attn_by_inverse_layer_idx!r}, scale_attn_weights="
            f"{hf.scale_attn_weights!r} is not mapped; expected False and True (scores scaled "
            "by 1/sqrt(head_dim) only)")
    if getattr(hf, "add_cross_attention", False):
        raise ValueError("GPT2Config.add_cross_attention=True is not mapped; expected False (a "
                         "TransformerLM has no cross-attention: its weights would be dropped)")
    return _config_of(
        hf, _GPT2_NAMES, vocab_size=hf.vocab_size, d_model=hf.n_embd, n_heads=hf.n_head,
        n_layers=hf.n_layer,
        d_ff=hf.n_inner or 4 * hf.n_embd, max_len=hf.n_positions, dropout=0.0,
        positional="learned", activation=activation,
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
    hf = _hf_model(GPT2LMHeadModel, config, _dtype(lm))
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
