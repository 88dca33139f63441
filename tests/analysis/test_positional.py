"""Early attention mass and the positional-bias sweep over α."""

from __future__ import annotations

import pytest
import torch
from analysis_helpers import is_png, tiny_config

from graded import Seq2SeqTransformer, TransformerLM
from graded.analysis import (
    attention_maps,
    early_attention_mass,
    plot_positional_bias,
    positional_bias_sweep,
    uniform_early_mass,
)
from graded.transformer.blocks import AttentionSublayer


def test_early_mass_matches_a_loop():
    g = torch.Generator().manual_seed(9)
    w = torch.softmax(torch.randn(2, 3, 6, 6, generator=g), -1)
    k = 2
    vals = [float(w[b, h, i, :k].sum()) for b in range(2) for h in range(3) for i in range(k, 6)]
    assert early_attention_mass(w, k) == pytest.approx(sum(vals) / len(vals))


@pytest.mark.parametrize("causal", [True, False])
def test_uniform_attention_has_the_uniform_reference_mass(causal):
    t, k = 7, 3
    keep = torch.ones(t, t).tril() if causal else torch.ones(t, t)
    w = (keep / keep.sum(-1, keepdim=True))[None, None]
    assert early_attention_mass(w, k) == pytest.approx(uniform_early_mass(t, k, causal=causal))
    if not causal:
        assert uniform_early_mass(t, k, causal=False) == pytest.approx(k / t)


def test_early_mass_rejects_k_without_later_queries():
    with pytest.raises(ValueError, match="k=4"):
        early_attention_mass(torch.full((1, 4, 4), 0.25), 4)


def test_a_single_position_is_refused_without_suggesting_an_impossible_k():
    """With T = 1 no k >= 1 leaves a later query: the error says the sequence is too short
    (it used to advise "use k < 1", which no valid k satisfies)."""
    for call in (lambda: early_attention_mass(torch.ones(1, 1, 1, 1), 1),
                 lambda: uniform_early_mass(1, 1, causal=True)):
        with pytest.raises(ValueError, match="at least 2 positions") as err:
            call()
        assert "k < 1" not in str(err.value)
    with pytest.raises(ValueError, match=r"use 1 <= k < 4"):
        early_attention_mass(torch.full((1, 4, 4), 0.25), 4)


@pytest.mark.parametrize("grading", ["linear", "exponential"])
def test_sweep_at_the_models_own_alpha_reproduces_its_maps_and_restores_it(grading, tokens):
    torch.manual_seed(0)
    alpha = 0.05
    model = TransformerLM(tiny_config(grading=grading, grade_position_alpha=alpha,
                                      grade_init="constant", grade_init_value=0.3))
    own = attention_maps(model, tokens)
    before = model.decoder.embed.position_grading
    sweep = positional_bias_sweep(model, tokens, [0.0, alpha], k=2)
    assert model.decoder.embed.position_grading is before
    for name, w in own.items():
        assert sweep["layers"][name][1] == pytest.approx(early_attention_mass(w, 2), abs=1e-6)
    assert sweep["uniform"] == pytest.approx(uniform_early_mass(7, 2, causal=True))
    assert len(sweep["mean"]) == 2


def test_sweep_uniform_reference_is_uniform_over_the_keys_each_query_sees(tokens):
    """The reference used to assume every earlier key visible: with a sliding window and
    padding it must be uniform attention over the window's unpadded keys. Positions count the
    real tokens, as the model's do: sequence 0, left-padded by one, has its early keys at
    indices 1 and 2 and its queries from index 3."""
    torch.manual_seed(0)
    window, k = 2, 2
    model = TransformerLM(tiny_config(grading="exponential", grade_init="constant",
                                      grade_init_value=0.3, attn_backend="sliding_window",
                                      attn_backend_options={"window": window}))
    pad = torch.zeros(tokens.shape, dtype=torch.bool)
    pad[0, 0] = True  # the first key of sequence 0 is padding
    sweep = positional_bias_sweep(model, tokens, [0.0, 0.2], k=k, key_padding_mask=pad)
    t = tokens.shape[1]
    shares = []
    for b in range(tokens.shape[0]):
        real = [j for j in range(t) if not pad[b, j]]
        position = {j: p for p, j in enumerate(real)}
        for i in real[k:]:
            seen = [j for j in range(max(0, i - window), i + 1) if not pad[b, j]]
            shares.append(sum(1 for j in seen if position[j] < k) / len(seen))
    want = sum(shares) / len(shares)  # every head alike
    for name, reference in sweep["uniform_by_layer"].items():
        assert reference == pytest.approx(want), name
    # and the masses are those of the maps the model computes
    for name, w in attention_maps(model, tokens, key_padding_mask=pad).items():
        assert sweep["layers"][name][0] == pytest.approx(early_attention_mass(w, k, ~pad),
                                                         abs=1e-6)


def test_sweep_rejects_models_where_alpha_is_undefined(tokens):
    with pytest.raises(ValueError, match="graded model"):
        positional_bias_sweep(TransformerLM(tiny_config()), tokens, [0.1])
    rope = TransformerLM(tiny_config(grading="exponential", positional="rope"))
    with pytest.raises(ValueError, match="additive positions"):
        positional_bias_sweep(rope, tokens, [0.1])
    lgt = TransformerLM(tiny_config(grading="linear"))
    with pytest.raises(ValueError, match="positive"):  # 1 − α t must stay positive
        positional_bias_sweep(lgt, tokens, [0.5])


@pytest.mark.parametrize(("alphas", "message"), [
    (["x"], r"alphas\[0\] must be a number, got 'x'"),
    ([0.1, float("nan")], r"alphas\[1\] must be a finite number, got nan"),
    ([0.1, True], r"alphas\[1\] must be a number, got True"),
])
def test_sweep_names_an_alpha_that_is_not_a_number(egt_lm, tokens, alphas, message):
    """``alphas=['x']`` raised "could not convert string to float: 'x'", naming no option, and
    True was taken as α = 1."""
    with pytest.raises(ValueError, match=message):
        positional_bias_sweep(egt_lm, tokens, alphas)


def test_plot_positional_bias_writes_a_png(tmp_path, egt_lm, tokens):
    sweep = positional_bias_sweep(egt_lm, tokens, [0.0, 0.5, 1.0], k=1)
    assert is_png(plot_positional_bias(sweep, tmp_path))


def test_seq2seq_sweep_covers_every_self_attention_layer_and_no_cross_attention():
    torch.manual_seed(0)
    model = Seq2SeqTransformer(tiny_config(grading="linear", n_decoder_layers=1))
    src, tgt = torch.randint(0, 11, (2, 6)), torch.randint(0, 11, (2, 5))
    sweep = positional_bias_sweep(model, (src, tgt), [0.0, 0.1], k=1)
    self_attention = [n for n, m in model.named_modules() if isinstance(m, AttentionSublayer)
                      and not m.cross]
    assert sorted(sweep["layers"]) == sorted(f"{n}.attn" for n in self_attention)
    assert len(sweep["layers"]) == model.config.n_layers + 1


def test_early_mass_refuses_weights_that_are_not_square():
    # (1, 1, 3, 1): one key, so "the first k=2 keys" do not exist; the sum would cover one
    with pytest.raises(ValueError, match=r"square self-attention .* got shape \(1, 1, 3, 1\)"):
        early_attention_mass(torch.ones(1, 1, 3, 1), 2)


def test_sweep_takes_positions_given_beyond_the_input_length(tokens):
    """Positions passed to the model past the input length (a continued sequence) get graded
    positions too: the kept factor table covered the input length only, and the lookup
    failed with an IndexError. At α = 0 the masses are those of the maps the model computes
    with those positions."""
    torch.manual_seed(0)
    model = TransformerLM(tiny_config(grading="exponential", grade_init="constant",
                                      grade_init_value=0.3))
    t = tokens.shape[1]
    positions = torch.arange(5, 5 + t).expand(tokens.shape[0], t)
    sweep = positional_bias_sweep(model, tokens, [0.0, 0.1], k=2, positions=positions)
    for name, w in attention_maps(model, tokens, positions=positions).items():
        assert sweep["layers"][name][0] == pytest.approx(early_attention_mass(w, 2), abs=1e-6)
    assert all(m == m for m in sweep["mean"])
