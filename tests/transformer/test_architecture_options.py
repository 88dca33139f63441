"""Architecture switches that reference models need, each against its formula or torch.nn."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from graded import TransformerConfig
from graded.transformer import TransformerEncoder, TransformerLM
from graded.transformer.generation import decode
from graded.transformer.layers import FeedForward


def _cfg(**kw) -> TransformerConfig:
    base = {"vocab_size": 11, "d_model": 8, "n_heads": 2, "n_layers": 1, "d_ff": 16,
            "max_len": 12, "dropout": 0.0}
    return TransformerConfig(**{**base, **kw})


@pytest.mark.parametrize(("activation", "sigma"), [
    ("gelu_tanh", lambda h: 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi)
                                                       * (h + 0.044715 * h**3)))),
    ("silu", lambda h: h * torch.sigmoid(h)),
])
def test_elementwise_ffn_activations_follow_their_formulas(activation, sigma):
    torch.manual_seed(0)
    ffn = FeedForward(6, 10, activation).double()
    x = torch.randn(3, 6, dtype=torch.float64)
    expected = ffn.fc_out(sigma(ffn.fc_in(x)))
    assert torch.allclose(ffn(x), expected, atol=1e-12)
    assert ffn.fc_gate is None  # plain, not gated


def test_separate_bias_switches_drop_exactly_the_named_biases():
    model = TransformerLM(_cfg(bias=True, qkv_bias=False, out_bias=True, ffn_bias=False))
    attn = model.decoder.stack.blocks[0].self_attn.attn
    ffn = model.decoder.stack.blocks[0].ff.ffn
    assert attn.in_proj_bias is None and attn.out_proj.bias is not None
    assert ffn.fc_in.bias is None and ffn.fc_out.bias is None
    model = TransformerLM(_cfg(bias=False, out_bias=True))
    attn = model.decoder.stack.blocks[0].self_attn.attn
    assert attn.in_proj_bias is None and attn.out_proj.bias is not None


def test_final_norm_on_a_post_norm_stack_normalises_the_stack_output():
    torch.manual_seed(0)
    cfg = _cfg(norm_first=False, final_norm=True)
    enc = TransformerEncoder(cfg).eval()
    plain = TransformerEncoder(cfg.replace(final_norm=None)).eval()
    plain.load_state_dict(enc.state_dict(), strict=False)
    ids = torch.randint(0, 11, (2, 5))
    out, _ = enc(ids)
    ref, _ = plain(ids)
    assert isinstance(plain.stack.final_norm, torch.nn.Identity)
    assert torch.allclose(out, F.layer_norm(ref, (8,), enc.stack.final_norm.weight,
                                            enc.stack.final_norm.bias, 1e-5), atol=1e-6)


def test_embedding_scale_and_norm_follow_vaswani_and_bert():
    torch.manual_seed(0)
    cfg = _cfg(positional="learned", embed_scale=True, embed_norm=True)
    lm = TransformerLM(cfg).eval()
    emb = lm.decoder.embed
    ids = torch.randint(0, 11, (2, 5))
    pos = torch.arange(5).expand(2, 5)
    expected = F.layer_norm(emb.tokens(ids) * math.sqrt(8) + emb.positions(pos), (8,),
                            emb.norm.weight, emb.norm.bias, 1e-5)
    assert torch.allclose(emb(ids, pos), expected, atol=1e-6)


def test_logit_bias_is_added_to_the_tied_output_layer():
    torch.manual_seed(0)
    lm = TransformerLM(_cfg(logit_bias=True)).eval()
    with torch.no_grad():
        lm.head.proj.bias.copy_(torch.arange(11.0))
    ids = torch.randint(0, 11, (1, 4))
    h, _ = lm.decoder(ids)
    assert lm.head.proj.weight is lm.decoder.embed.tokens.weight
    assert torch.allclose(lm(ids), h @ lm.decoder.embed.tokens.weight.T + torch.arange(11.0),
                          atol=1e-5)


def test_sinusoidal_encodings_of_a_float64_model_are_float64_exact():
    lm = TransformerLM(_cfg(positional="sinusoidal")).double()
    pos = torch.arange(12.0, dtype=torch.float64)[:, None]
    freq = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    expected = torch.stack([(pos * freq).sin(), (pos * freq).cos()], -1).flatten(-2)
    table = lm.decoder.embed.positions(torch.arange(12), dtype=torch.float64)
    assert table.dtype == torch.float64 and torch.allclose(table, expected, atol=1e-15, rtol=0)


# ----------------------------------------------------------------------- beam early stopping
EOS, A, B, PROMPT = 0, 1, 2, 3


def _step(ids: torch.Tensor, mask: torch.Tensor, cache: object) -> torch.Tensor:
    """Next-token probabilities from the generated suffix: after the prompt, EOS is likely; a
    first A is almost surely followed by a second A, and two As by EOS."""
    rows = []
    for row in ids.tolist():
        gen = row[1:]
        if not gen:
            p = [0.5, 0.3, 0.2, 1e-9]
        elif gen[-1] == A and gen.count(A) == 1:
            p = [0.01, 0.98, 0.01, 1e-9]
        elif gen[-1] == A:
            p = [0.98, 0.01, 0.01, 1e-9]
        else:
            p = [0.6, 0.2, 0.2, 1e-9]
        rows.append(torch.tensor(p).log())
    return torch.stack(rows)[:, None, :].expand(-1, ids.shape[1], -1)


def _beam(early_stopping) -> list[int]:
    ids = torch.tensor([[PROMPT]])
    out = decode(_step, ids, torch.zeros_like(ids, dtype=torch.bool), 4, n_layers=0,
                 do_sample=False, temperature=1.0, top_k=None, top_p=None, num_beams=2,
                 eos_token_id=EOS, pad_token_id=EOS, use_cache=False, generator=None,
                 length_penalty=1.0, early_stopping=early_stopping, vocab_size=4)
    return out[0, 1:].tolist()


def test_beam_early_stopping_true_stops_at_num_beams_finished_hypotheses():
    # finished after two steps: [EOS] (mean log-prob log .5) and [B, EOS]; stops there
    assert _beam(True)[:1] == [EOS]


@pytest.mark.parametrize("mode", [False, "never"])
def test_beam_without_early_stopping_finds_the_better_longer_hypothesis(mode):
    # [A, A, EOS] scores (log .3 + log .98 + log .98) / 3 ≈ -0.415 > log .5 ≈ -0.693
    assert _beam(mode)[:3] == [A, A, EOS]


def test_early_stopping_must_be_one_of_the_three_modes():
    with pytest.raises(ValueError, match="early_stopping must be one of"):
        _beam("sometimes")


# ----------------------------------------------------------------------- grouped-query attention
def test_grouped_query_attention_equals_multi_head_attention_with_shared_key_value_heads():
    from graded.attention.multihead import MultiheadAttention

    torch.manual_seed(0)
    e, h, g = 12, 6, 2  # 6 query heads, 2 key/value groups of 3 heads
    hd = e // h
    gqa = MultiheadAttention(e, h, batch_first=True, num_kv_heads=g).double()
    mha = MultiheadAttention(e, h, batch_first=True).double()
    w, b = gqa.in_proj_weight, gqa.in_proj_bias
    with torch.no_grad():
        wq, wk, wv = w.split([e, g * hd, g * hd])
        bq, bk, bv = b.split([e, g * hd, g * hd])
        group_of = torch.arange(h) // (h // g)  # head i reads group i // 3
        rows = (group_of[:, None] * hd + torch.arange(hd)).flatten()
        mha.in_proj_weight.copy_(torch.cat([wq, wk[rows], wv[rows]]))
        mha.in_proj_bias.copy_(torch.cat([bq, bk[rows], bv[rows]]))
        mha.out_proj.load_state_dict(gqa.out_proj.state_dict())
    x = torch.randn(2, 5, e, dtype=torch.float64)
    out, _ = gqa(x, x, x, need_weights=False, is_causal=True)
    ref, _ = mha(x, x, x, need_weights=False, is_causal=True)
    assert torch.allclose(out, ref, atol=1e-12)
    assert gqa.in_proj_weight.shape == (e + 2 * g * hd, e)


def test_a_grouped_query_lm_caches_only_its_key_value_groups_and_generates_as_without_cache():
    torch.manual_seed(0)
    lm = TransformerLM(_cfg(d_model=12, n_heads=6, n_kv_heads=2, positional="rope")).eval()
    prompt = torch.randint(0, 11, (2, 3))
    cached = lm.generate(prompt, 5, use_cache=True)
    assert torch.equal(cached, lm.generate(prompt, 5, use_cache=False))
    cache = lm.new_cache()
    lm(prompt, cache=cache)
    assert cache.layers[0].k.shape[1] == 2  # (B, H_kv, T, head_dim)


def test_n_kv_heads_must_divide_n_heads():
    with pytest.raises(ValueError, match="n_kv_heads"):
        _cfg(n_heads=2, n_kv_heads=3)
