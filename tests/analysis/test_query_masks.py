"""Means over the queries a mask selects: NaN over none (the mean of nothing, as torch's mean
of an empty tensor), not 0; and positions counted over each row's real tokens, so that a
left-padded sequence has the early attention mass it has alone."""

from __future__ import annotations

import math

import pytest
import torch
from analysis_helpers import tiny_config

from graded import TransformerLM
from graded.analysis import (
    concatenated_head_rank,
    diagnose,
    early_attention_mass,
    head_diversity,
    js_divergence,
    pairwise_head_js,
    positional_bias_sweep,
)


def _weights(b=2, h=3, t=6, seed=3):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(b, h, t, t, generator=g, dtype=torch.float64), -1)


def _model() -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(tiny_config(grading="exponential", grade_init="warm_start",
                                     grade_init_value=0.5, grades_per_head=True))


def test_early_mass_over_no_later_query_is_nan_and_over_some_the_mean_of_a_loop():
    """Real tokens only at positions 0 and 1 with k = 2: no query beyond the early keys. The
    mean used to be 0 / max(0, 1) = 0, a mass that reads as "no attention on early keys"."""
    w = _weights()
    none_late = torch.zeros(2, 6, dtype=torch.bool)
    none_late[:, :2] = True
    assert math.isnan(early_attention_mass(w, 2, none_late))
    assert math.isnan(early_attention_mass(w, 2, torch.zeros(2, 6, dtype=torch.bool)))
    some = none_late.clone()
    some[1, 2:4] = True  # row 1 has two queries beyond the first two keys
    vals = [float(w[1, h, i, :2].sum()) for h in range(3) for i in (2, 3)]
    assert early_attention_mass(w, 2, some) == pytest.approx(sum(vals) / len(vals))


def test_early_mass_of_a_left_padded_row_counts_its_real_tokens_as_positions():
    """Row 0 is left-padded by 2: its early keys (k = 2) are indices 2 and 3, its queries
    4 and 5 (the model's positions skip left padding). Index k used to be taken as position k,
    so the padding keys (attention 0) were the early ones."""
    w = _weights()
    real = torch.ones(2, 6, dtype=torch.bool)
    real[0, :2] = False
    vals = [float(w[0, h, i, 2:4].sum()) for h in range(3) for i in (4, 5)]
    vals += [float(w[1, h, i, :2].sum()) for h in range(3) for i in range(2, 6)]
    assert early_attention_mass(w, 2, real) == pytest.approx(sum(vals) / len(vals))


def test_head_js_and_concatenated_rank_over_no_query_are_nan():
    """Both used to report 0 (no divergence, rank 0) for a batch of padding only."""
    w = _weights()
    none = torch.zeros(2, 6, dtype=torch.bool)
    assert torch.isnan(pairwise_head_js(w, none)).all()
    ranks = concatenated_head_rank(torch.randn(2, 3, 6, 4), queries=none)
    assert math.isnan(ranks["numerical_rank"]) and math.isnan(ranks["effective_rank"])
    one = none.clone()
    one[1, 0] = True  # one query: the JS matrix of that row alone
    want = js_divergence(w[1, :, None, 0], w[1, None, :, 0])
    torch.testing.assert_close(pairwise_head_js(w, one), want)


def test_head_diversity_of_a_batch_of_padding_only_is_nan():
    model = _model()
    ids = torch.randint(1, 11, (2, 5), generator=torch.Generator().manual_seed(1))
    out = head_diversity(model, ids, key_padding_mask=torch.ones(2, 5, dtype=torch.bool))
    for key, d in out.items():
        assert math.isnan(d["mean_js"]) and torch.isnan(d["js_matrix"]).all(), key
        assert math.isnan(d["numerical_rank"]) and math.isnan(d["effective_rank"]), key


def _short_right_padded():
    """Two sequences of 2 real tokens, right-padded to 6: no real query at position >= 2."""
    ids = torch.randint(1, 11, (2, 6), generator=torch.Generator().manual_seed(2))
    mask = torch.zeros(2, 6, dtype=torch.bool)
    mask[:, 2:] = True
    return ids.masked_fill(mask, 0), mask


def test_sweep_with_no_real_query_beyond_k_gives_nan_and_diagnose_names_it():
    """The sweep used to give masses of 0 and a uniform reference of 0, which diagnose
    reported as measured values."""
    model = _model()
    ids, mask = _short_right_padded()
    sweep = positional_bias_sweep(model, ids, [0.0, 0.3], k=2, key_padding_mask=mask)
    assert all(math.isnan(v) for masses in sweep["layers"].values() for v in masses)
    assert math.isnan(sweep["uniform"]) and all(math.isnan(v) for v in sweep["mean"])
    with pytest.raises(RuntimeError, match=r"produced NaN for \['positional/early_mass/"
                                           r"alpha=0', .*no real query beyond the first k=2"):
        diagnose(model, ids, k=2, alphas=[0.0, 0.3], lipschitz_steps=1, n_random=1,
                 key_padding_mask=mask)


def test_sweep_of_a_sequence_is_the_same_alone_and_left_padded():
    """The model's logits of a left-padded sequence are its own; so are now its early masses
    and the uniform reference (both were 0: the first k indices are padding)."""
    model = _model()
    ids = torch.randint(1, 11, (1, 5), generator=torch.Generator().manual_seed(1))
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], 1)
    mask = torch.zeros(1, 8, dtype=torch.bool)
    mask[:, :3] = True
    torch.testing.assert_close(model(padded, mask)[:, 3:], model(ids), atol=1e-5, rtol=1e-5)
    alone = positional_bias_sweep(model, ids, [0.0, 0.3], k=2)
    left = positional_bias_sweep(model, padded, [0.0, 0.3], k=2, key_padding_mask=mask)
    for name, masses in alone["layers"].items():
        assert left["layers"][name] == pytest.approx(masses, rel=1e-5), name
    assert left["uniform"] == pytest.approx(alone["uniform"])
