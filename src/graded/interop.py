"""Pretrained language models as graded ones: Hugging Face GPT-2 and LLaMA to ``TransformerLM``.

:func:`from_gpt2` and :func:`from_llama` build a :class:`~graded.transformer.TransformerLM`
with the same architecture and weights as a Hugging Face ``GPT2LMHeadModel`` or
``LlamaForCausalLM`` (a model object, or a local checkpoint folder: nothing is downloaded), so
that both compute the same logits; :func:`to_gpt2` and :func:`to_llama` go back.
:func:`graft_grading` then turns the model into an LGT or EGT (000 §5-6) whose grades start
neutral, so that fine-tuning with learnable grades starts from the pretrained function itself.

The mappings:

- GPT-2: learned positions, pre-norm LayerNorm blocks with a final norm, tanh-approximate GELU,
  biases everywhere, tied output layer. Its ``Conv1D`` weights are stored (in, out) and are
  transposed; ``c_attn`` holds Q, K, V side by side as our ``in_proj_weight`` does.
- LLaMA: rotary positions with θ = ``rope_theta``, pre-norm RMSNorm, SwiGLU FFN
  (``down(silu(gate(x)) ⊙ up(x))``), grouped-query attention, optional attention/MLP biases,
  untied output layer unless ``tie_word_embeddings``. Hugging Face rotates dimension pairs
  (m, m + D/2) of a head and this library pairs (2m, 2m+1) (Su et al.'s layout), so the rows of
  each query and key head are permuted on the way in (and back on the way out); attention
  scores are unchanged because queries and keys get the same permutation.

``transformers`` is needed only for these functions (a test dependency of the project).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from graded.grading import GradingMap
from graded.transformer import TransformerConfig, TransformerLM

__all__ = ["from_gpt2", "from_llama", "graft_grading", "to_gpt2", "to_llama"]


def _load(model_or_path: Any, cls_name: str) -> Any:
    """A Hugging Face model object as given, or loaded from a local folder."""
    import transformers

    cls = getattr(transformers, cls_name)
    if isinstance(model_or_path, (str, Path)):
        path = Path(model_or_path)
        if not path.is_dir():
            raise FileNotFoundError(f"{path} is not a local checkpoint folder of a {cls_name}")
        return cls.from_pretrained(str(path), local_files_only=True)
    if not isinstance(model_or_path, cls):
        raise TypeError(f"expected a transformers.{cls_name} or a folder holding one, got "
                        f"{type(model_or_path).__name__}")
    return model_or_path


def _dtype(model: Any) -> torch.dtype:
    return next(model.parameters()).dtype


# --------------------------------------------------------------------------- GPT-2


def gpt2_config(hf: Any) -> TransformerConfig:
    """The :class:`TransformerConfig` of a Hugging Face ``GPT2Config``."""
    if hf.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(f"GPT-2 activation {hf.activation_function!r} is not mapped; expected "
                         "'gelu_new' (the tanh approximation)")
    if hf.scale_attn_by_inverse_layer_idx or not hf.scale_attn_weights:
        raise ValueError("GPT-2 models with scale_attn_by_inverse_layer_idx or without "
                         "scale_attn_weights are not mapped")
    return TransformerConfig(
        vocab_size=hf.vocab_size, d_model=hf.n_embd, n_heads=hf.n_head, n_layers=hf.n_layer,
        d_ff=hf.n_inner or 4 * hf.n_embd, max_len=hf.n_positions, dropout=0.0,
        positional="learned", activation="gelu_tanh", norm="layer",
        norm_eps=hf.layer_norm_epsilon, norm_first=True, bias=True, tie_embeddings=True,
    )


def from_gpt2(model_or_path: Any) -> TransformerLM:
    """A :class:`TransformerLM` equal to a Hugging Face ``GPT2LMHeadModel``."""
    hf = _load(model_or_path, "GPT2LMHeadModel")
    lm = TransformerLM(gpt2_config(hf.config)).to(_dtype(hf))
    src = hf.state_dict()
    state = {"decoder.embed.tokens.weight": src["transformer.wte.weight"],
             "decoder.embed.positions.embedding.weight": src["transformer.wpe.weight"],
             "decoder.stack.final_norm.weight": src["transformer.ln_f.weight"],
             "decoder.stack.final_norm.bias": src["transformer.ln_f.bias"]}
    for i in range(hf.config.n_layer):
        state.update(_block_from_gpt2(src, f"transformer.h.{i}.", f"decoder.stack.blocks.{i}."))
    state["head.proj.weight"] = state["decoder.embed.tokens.weight"]
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
    if (c.positional, c.activation, c.norm, c.norm_first, c.tie_embeddings) != (
            "learned", "gelu_tanh", "layer", True, True) or not c.bias:
        raise ValueError("to_gpt2 needs learned positions, gelu_tanh, pre-norm LayerNorm, "
                         "biases and tied embeddings (a model from from_gpt2)")
    hf = GPT2LMHeadModel(GPT2Config(
        vocab_size=c.vocab_size, n_positions=c.max_len, n_embd=c.d_model, n_layer=c.n_layers,
        n_head=c.n_heads, n_inner=c.ff_dim, activation_function="gelu_new",
        layer_norm_epsilon=c.norm_eps, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=None, eos_token_id=None)).to(_dtype(lm))
    mine = lm.state_dict()
    state = {"transformer.wte.weight": mine["decoder.embed.tokens.weight"],
             "transformer.wpe.weight": mine["decoder.embed.positions.embedding.weight"],
             "transformer.ln_f.weight": mine["decoder.stack.final_norm.weight"],
             "transformer.ln_f.bias": mine["decoder.stack.final_norm.bias"],
             "lm_head.weight": mine["decoder.embed.tokens.weight"]}
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
        raise ValueError(f"LLaMA activation {hf.hidden_act!r} is not mapped; expected 'silu'")
    heads = hf.num_attention_heads
    if getattr(hf, "head_dim", None) not in (None, hf.hidden_size // heads):
        raise ValueError("LLaMA models whose head_dim is not hidden_size / heads are not mapped")
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
    hf = _load(model_or_path, "LlamaForCausalLM")
    c = llama_config(hf.config)
    lm = TransformerLM(c).to(_dtype(hf))
    src = hf.state_dict()
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
    if (c.positional, c.activation, c.norm, c.norm_first) != ("rope", "swiglu", "rms", True):
        raise ValueError("to_llama needs rotary positions, SwiGLU and pre-norm RMSNorm (a model "
                         "from from_llama)")
    qkv_bias = c.bias if c.qkv_bias is None else c.qkv_bias
    out_bias = c.bias if c.out_bias is None else c.out_bias
    ffn_bias = c.bias if c.ffn_bias is None else c.ffn_bias
    if qkv_bias != out_bias:
        raise ValueError("LLaMA has one attention_bias switch; qkv_bias and out_bias differ")
    kv_heads = c.n_kv_heads or c.n_heads
    hf = LlamaForCausalLM(LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.ff_dim,
        num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
        num_key_value_heads=kv_heads, max_position_embeddings=c.max_len,
        rms_norm_eps=c.norm_eps, rope_theta=c.rope_base, attention_bias=qkv_bias,
        mlp_bias=ffn_bias, tie_word_embeddings=c.tie_embeddings, bos_token_id=None,
        eos_token_id=None, pad_token_id=None)).to(_dtype(lm))
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


# --------------------------------------------------------------------------- grading


def graft_grading(lm: TransformerLM, grading: str, **options: Any) -> TransformerLM:
    """An LGT (``grading="linear"``) or EGT (``"exponential"``) with ``lm``'s weights and
    neutral grades (M = I), so that it computes the same logits until its grades move.

    ``options`` are the other grading fields of :class:`TransformerConfig`
    (``learnable_grades``, ``grade_attention_variant``, ``grade_ffn``, ...); ``grade_init``
    other than ``"neutral"`` or ``grade_normalize`` change the function on purpose.
    """
    config = lm.config.replace(grading=grading, **options)
    graded = TransformerLM(config).to(next(lm.parameters()).dtype)
    missing, unexpected = graded.load_state_dict(lm.state_dict(), strict=False)
    grading_maps = {name for name, m in graded.named_modules(remove_duplicate=False)
                    if isinstance(m, GradingMap)}
    not_grading = [k for k in missing if k.rpartition(".")[0] not in grading_maps]
    if unexpected or not_grading:
        raise ValueError(f"the model's weights do not fit its graded form: unexpected "
                         f"{unexpected}, missing {not_grading}")
    return graded.train(lm.training)


def _ungraded(lm: TransformerLM) -> TransformerConfig:
    if not isinstance(lm, TransformerLM):
        raise TypeError(f"expected a TransformerLM, got {type(lm).__name__}")
    if lm.config.grading is not None:
        raise ValueError("a graded model has no Hugging Face counterpart; export the model "
                         "before graft_grading, or fold the grades into the weights first")
    return lm.config


def _only_buffers(hf: Any, missing: list[str], unexpected: list[str]) -> None:
    """Keys a Hugging Face model may lack in a state dict are its non-parameter buffers."""
    params = {n for n, _ in hf.named_parameters()}
    if unexpected or any(k in params for k in missing):
        raise ValueError(f"weights do not fit the Hugging Face model: missing "
                         f"{[k for k in missing if k in params]}, unexpected {unexpected}")
