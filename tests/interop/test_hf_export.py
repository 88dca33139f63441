"""Exports to Hugging Face and back, beyond the float64 references of ``test_hf_reference``:
half precision, odd shapes, options a converter must refuse by name, and checkpoints saved
with ``save_pretrained`` and loaded offline with ``from_pretrained``.

Models are built from configs with random weights (nothing is downloaded)."""

from __future__ import annotations

import math
import re

import pytest
import torch

transformers = pytest.importorskip("transformers")

from graded.interop import (  # noqa: E402
    from_bert,
    from_gpt2,
    from_llama,
    from_marian,
    to_bert,
    to_gpt2,
    to_llama,
    to_marian,
)

torch.set_default_dtype(torch.float32)


def _llama(**kw):
    base = {"vocab_size": 41, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 2048,
            "rope_theta": 10000.0, "bos_token_id": None, "eos_token_id": None,
            "pad_token_id": None}
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**base, **kw})).eval()


def _ids(vocab: int, shape: tuple[int, int]) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_an_exported_half_precision_llama_keeps_float32_rotary_angles(dtype, tmp_path):
    """LLaMA computes its rotary angles from float32 frequencies whatever its dtype (as
    ``from_pretrained`` builds it). The export used to cast a float32 model to half precision,
    frequencies included: angles off by 0.2 radian (bfloat16; float16 0.05) at position 2047
    here, and logits other than those of the same checkpoint saved and loaded again."""
    lm = from_llama(_llama()).to(dtype)
    exported = to_llama(lm)
    rotary = exported.model.rotary_emb
    assert rotary.inv_freq.dtype == torch.float32
    positions = torch.arange(2048)[None]
    cos, sin = rotary(torch.zeros(1, dtype=dtype), positions)
    # independently: angle p · θ^(-2m/d) of the pairs (m, m + d/2), in float64
    head_dim = 8
    freqs = 10000.0 ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = positions[0, :, None].double() * freqs
    angles = torch.cat([angles, angles], dim=-1)
    # half-precision rounding of cos/sin (2^-8 for float16's 2^-11 too) and float32 angles
    # (p · ulp ≈ 2048 · 6e-8 ≈ 1e-4)
    for ours, theirs in ((cos[0], angles.cos()), (sin[0], angles.sin())):
        torch.testing.assert_close(ours.double(), theirs, atol=5e-3, rtol=0)
    exported.save_pretrained(tmp_path / "llama")
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "llama",
                                                           local_files_only=True)
    assert next(loaded.parameters()).dtype == dtype
    ids = _ids(41, (2, 300))
    with torch.no_grad():
        assert torch.equal(exported(ids).logits, loaded(ids).logits)


def test_gpt2_with_cross_attention_is_refused_by_name():
    """A GPT-2 built as a seq2seq decoder (``add_cross_attention=True``) holds cross-attention
    weights a TransformerLM has no place for; they used to be dropped without a word (the
    logits without encoder states agreed, the decoder was lost)."""
    cfg = transformers.GPT2Config(vocab_size=37, n_positions=24, n_embd=16, n_layer=1, n_head=4,
                                  add_cross_attention=True, bos_token_id=None,
                                  eos_token_id=None)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    assert any("crossattention" in name for name, _ in hf.named_parameters())
    with pytest.raises(ValueError, match=r"GPT2Config\.add_cross_attention=True is not mapped; "
                                         r"expected False"):
        from_gpt2(hf)


def _randomised(model, seed: int = 0):
    """Fan-in scaled weights, norms and biases away from 1 and 0 (a wrong mapping of any of
    them shows in the logits); Marian's fixed sinusoids stay."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name:
                continue
            std = 0.5 if p.dim() == 1 else 1.5 / math.sqrt(p.shape[-1])
            centre = 1.0 if p.dim() == 1 and "norm" in name.lower() else 0.0
            p.copy_(centre + std * torch.randn(p.shape, generator=g, dtype=torch.float64))
    return model.eval()


_SHAPES = {  # odd shapes: one head or one layer, head_dim 6 or 12, vocab sizes not multiples of 8
    "gpt2_untied_head_dim_6": ("gpt2", {"n_embd": 18, "n_head": 3, "n_layer": 1,
                                        "tie_word_embeddings": False}),
    "gpt2_one_head": ("gpt2", {"n_embd": 12, "n_head": 1, "vocab_size": 13}),
    "llama_gqa_head_dim_12": ("llama", {"hidden_size": 36, "num_attention_heads": 3,
                                        "num_key_value_heads": 1, "vocab_size": 43}),
    "llama_tied_one_head_biases": ("llama", {"hidden_size": 12, "num_attention_heads": 1,
                                             "num_key_value_heads": 1, "num_hidden_layers": 1,
                                             "tie_word_embeddings": True, "attention_bias": True,
                                             "mlp_bias": True}),
    "bert_head_dim_6": ("bert", {"hidden_size": 18, "num_attention_heads": 3,
                                 "num_hidden_layers": 1, "vocab_size": 29}),
    "marian_head_dim_6": ("marian", {"d_model": 18, "encoder_attention_heads": 3,
                                     "decoder_attention_heads": 3, "encoder_layers": 1}),
}


def _hugging_face(kind: str, **kw):
    if kind == "gpt2":
        cfg = transformers.GPT2Config(**{"vocab_size": 37, "n_positions": 16, "n_embd": 16,
                                         "n_layer": 2, "n_head": 4, "bos_token_id": None,
                                         "eos_token_id": None, **kw})
        return transformers.GPT2LMHeadModel(cfg)
    if kind == "llama":
        return _llama(**{"max_position_embeddings": 16, **kw})
    if kind == "bert":
        cfg = transformers.BertConfig(**{"vocab_size": 31, "hidden_size": 16,
                                         "num_hidden_layers": 2, "num_attention_heads": 4,
                                         "intermediate_size": 20, "max_position_embeddings": 16,
                                         "pad_token_id": 1, **kw})
        return transformers.BertModel(cfg, add_pooling_layer=False)
    cfg = transformers.MarianConfig(**{"vocab_size": 23, "d_model": 16, "encoder_layers": 2,
                                       "decoder_layers": 2, "encoder_attention_heads": 4,
                                       "decoder_attention_heads": 4, "encoder_ffn_dim": 20,
                                       "decoder_ffn_dim": 20, "max_position_embeddings": 16,
                                       "pad_token_id": 22, "decoder_start_token_id": 22,
                                       "eos_token_id": 0, **kw})
    return transformers.MarianMTModel(cfg)


_CONVERT = {"gpt2": (from_gpt2, to_gpt2), "llama": (from_llama, to_llama),
            "bert": (from_bert, to_bert), "marian": (from_marian, to_marian)}


def _outputs(kind: str, hf, ours, dtype):
    """Theirs and ours on a batch of 3 rows, the second right-padded: next-token logits (BERT:
    hidden states; Marian: logits for right-padded sources and 5 target tokens), real tokens
    only."""
    vocab = hf.config.vocab_size
    ids = _ids(vocab - 1, (3, 9))  # no pad id (Marian's and BERT's below the last)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    keep = mask.bool()
    with torch.no_grad():
        if kind == "marian":
            tgt = _ids(vocab, (3, 5))
            tgt[:, 0] = hf.config.decoder_start_token_id
            theirs = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=tgt).logits
            return theirs, ours(ids, tgt, mask == 0)
        if kind == "bert":
            theirs = hf(ids, attention_mask=mask).last_hidden_state
            return theirs[keep], ours(ids, mask == 0)[0][keep]
        return hf(ids, attention_mask=mask).logits[keep], ours(ids, mask == 0)[keep]


def _floor(kind: str) -> float:
    """What two exact float64 implementations may differ by: summation order only (~1e-14
    here), except LLaMA, whose RMSNorm and rotary angles Hugging Face computes in float32 even
    in float64 (~2e-6 on logits of size ~5)."""
    return 1e-5 if kind == "llama" else 1e-10


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16],
                         ids=["float64", "float32", "bfloat16"])
@pytest.mark.parametrize("case", list(_SHAPES))
def test_an_export_saved_and_loaded_offline_computes_what_ours_does(case, dtype, tmp_path,
                                                                    monkeypatch):
    """Hugging Face model -> ours -> Hugging Face -> ``save_pretrained`` -> ``from_pretrained``
    (local files, hub offline) -> ours again, on a right-padded batch, the weights coming back
    bit for bit. Tolerance: Hugging Face's own rounding in ``dtype`` (its distance e to its
    float64 outputs; 0.02 to 0.4 in bfloat16 here, 1e-6 in float32): ours must be within 2e of
    the float64 outputs (no less accurate than Hugging Face, with margin) and so within 3e of
    Hugging Face's, plus the float64 floor."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    kind, options = _SHAPES[case]
    there, back = _CONVERT[kind]
    torch.manual_seed(0)
    reference = _randomised(_hugging_face(kind, **options).double())
    exact, _ = _outputs(kind, reference, there(reference), torch.float64)
    hf = reference.to(dtype)
    ours = there(hf)
    theirs, mine = _outputs(kind, hf, ours, dtype)
    rounding = float((theirs.double() - exact).abs().max())
    floor = _floor(kind)
    torch.testing.assert_close(mine.double(), exact, atol=2 * rounding + floor, rtol=0)
    torch.testing.assert_close(mine, theirs, atol=3 * rounding + floor, rtol=0)
    exported = back(ours)
    exported.save_pretrained(tmp_path / kind)
    init = {"add_pooling_layer": False} if kind == "bert" else {}
    loaded = type(hf).from_pretrained(tmp_path / kind, local_files_only=True, **init).eval()
    assert next(loaded.parameters()).dtype == dtype
    # the checkpoint holds the export: the same weights and buffers (LLaMA's rotary frequencies
    # in float32 in every dtype), so the same outputs up to the kernels' summation order
    saved = {**dict(exported.named_parameters()), **dict(exported.named_buffers())}
    for name, value in [*loaded.named_parameters(), *loaded.named_buffers()]:
        assert value.dtype == saved[name].dtype and torch.equal(value, saved[name]), name
    reloaded, mine = _outputs(kind, loaded, ours, dtype)
    torch.testing.assert_close(reloaded, _outputs(kind, exported, ours, dtype)[0],
                               atol=1e-12 if dtype == torch.float64 else 0, rtol=0)
    torch.testing.assert_close(mine, reloaded, atol=3 * rounding + floor, rtol=0)
    again = there(tmp_path / kind)
    assert again.config == ours.config
    for key, value in ours.state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("case", [c for c in _SHAPES if _SHAPES[c][0] in ("gpt2", "llama")])
def test_an_exported_language_model_generates_our_tokens(case, dtype):
    """Greedy and 3-beam decoding of the export (Hugging Face's ``generate``) give our tokens
    on a left-padded batch with a stop token (Marian's decoding: ``test_marian_reference``).
    Half precision is left out: there the two roundings may break near-ties differently."""
    kind, options = _SHAPES[case]
    there, back = _CONVERT[kind]
    torch.manual_seed(0)
    ours = there(_randomised(_hugging_face(kind, **options).double()).to(dtype))
    exported = back(ours)
    ids = _ids(ours.config.vocab_size, (3, 6))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    ids = ids.masked_fill(mask == 0, 1)
    new = 16 - ids.shape[1]  # GPT-2: up to n_positions
    stop = ours.config.vocab_size - 1
    for num_beams in (1, 3):
        theirs = exported.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                                   num_beams=num_beams, eos_token_id=stop, pad_token_id=1)
        mine = ours.generate(ids, new, key_padding_mask=mask == 0, num_beams=num_beams,
                             eos_token_id=stop, pad_token_id=1)
        if num_beams == 1:  # not one token over and over
            assert len(set(mine[:, 6:].flatten().tolist())) > 2
        assert torch.equal(mine, theirs), num_beams


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_left_padded_logits_equal_hugging_faces_given_its_positions(kind):
    """A forward call of GPT-2 counts positions from each row's first slot, ours from its first
    real token: given ``position_ids`` counted from ``attention_mask`` (as its ``generate``
    does) the logits agree. LLaMA's rotary scores depend on position differences only, so its
    logits agree without them."""
    torch.manual_seed(0)
    hf = _randomised(_hugging_face(kind).double())
    ours = _CONVERT[kind][0](hf)
    ids = _ids(hf.config.vocab_size, (3, 9))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    mask[2, :1] = 0
    keep = mask.bool()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    mine = ours(ids, mask == 0)[keep]
    with torch.no_grad():
        given = hf(ids, attention_mask=mask, position_ids=positions).logits[keep]
        from_slots = hf(ids, attention_mask=mask).logits[keep]
    torch.testing.assert_close(mine, given, atol=_floor(kind), rtol=0)
    if kind == "gpt2":
        assert not torch.allclose(mine, from_slots, atol=1e-3)
    else:
        torch.testing.assert_close(mine, from_slots, atol=_floor(kind), rtol=0)


@pytest.mark.parametrize(("kind", "option", "value", "ours"), [
    ("gpt2", "layer_norm_epsilon", 0.0, "norm_eps"),
    ("llama", "rms_norm_eps", 0.0, "norm_eps"),
    ("llama", "rope_parameters['rope_theta']", 1.0, "rope_base"),
    ("bert", "layer_norm_eps", 0.0, "norm_eps"),
])
def test_a_value_our_config_refuses_is_named_as_the_hugging_face_option(kind, option, value,
                                                                      ours):
    """Hugging Face builds these (LayerNorm with ε = 0 runs); our config refuses them. The
    refusal used to name our field only (``TransformerConfig.norm_eps=0.0``), not the option of
    the model being converted."""
    if option.startswith("rope_parameters"):
        hf = _llama(rope_parameters={"rope_type": "default", "rope_theta": value})
    else:
        hf = _hugging_face(kind, **{option: value})
    name = type(hf.config).__name__
    with pytest.raises(ValueError, match=re.escape(f"{name}.{option}={value!r} is not mapped: "
                                                   f"TransformerConfig.{ours}=")):
        _CONVERT[kind][0](hf)


def test_a_llama_with_swish_the_other_name_of_silu_is_taken_as_silu():
    swish, silu = _llama(hidden_act="swish").double(), _llama(hidden_act="silu").double()
    ids = _ids(41, (2, 7))
    with torch.no_grad():  # the same weights (one seed): Hugging Face computes the same
        assert torch.equal(swish(ids).logits, silu(ids).logits)
        assert torch.equal(from_llama(swish)(ids), from_llama(silu)(ids))
    with pytest.raises(ValueError, match=r"LlamaConfig.hidden_act='gelu' is not mapped"):
        from_llama(_llama(hidden_act="gelu"))
