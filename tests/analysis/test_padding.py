"""A sequence's diagnostics do not depend on the padding of its batch (and a sequence of one
token gets every diagnostic that is defined for it).

A padded query still attends (to the real keys), so its row used to enter every mean and every
matrix: a sequence's effective rank, entropy, head diversity, Lipschitz estimate and feature
concentration changed with the padding that followed it. The independent computation here is
the same sequence run alone, without padding.
"""

from __future__ import annotations

import pytest
import torch
from analysis_helpers import tiny_config

from graded import Seq2SeqTransformer, TransformerLM
from graded.analysis import (
    attention_rank,
    call_keys,
    capture_attention,
    diagnose,
    early_attention_mass,
    head_diversity,
    pairwise_head_js,
)

PAD = 3  # padding after the 5 real tokens


def _model() -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(tiny_config(grading="exponential", grade_init="warm_start",
                                     grade_init_value=0.5, grades_per_head=True,
                                     grade_attention_variant="multi_head"))


def _alone_and_padded() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids = torch.randint(1, 11, (1, 5), generator=torch.Generator().manual_seed(1))
    padded = torch.cat([ids, torch.zeros(1, PAD, dtype=torch.long)], dim=1)
    mask = torch.zeros(1, 5 + PAD, dtype=torch.bool)
    mask[:, 5:] = True
    return ids, padded, mask


def test_every_diagnostic_of_a_sequence_is_the_same_alone_and_right_padded():
    model = _model()
    ids, padded, mask = _alone_and_padded()
    options = dict(k=2, alphas=[0.0, 0.3], lipschitz_steps=2, n_random=2)
    alone = diagnose(model, ids, **options).metrics
    with_padding = diagnose(model, padded, key_padding_mask=mask, **options).metrics
    assert alone.keys() == with_padding.keys()
    for key, value in alone.items():
        assert with_padding[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def test_padded_rank_is_the_mean_of_each_sequence_alone():
    """Two sequences of lengths 5 and 8 in one padded batch: every per-matrix rank is the
    sequence's own, so the layer mean is the mean of the two runs alone."""
    model = _model()
    ids, _, _ = _alone_and_padded()
    full = torch.randint(1, 11, (1, 5 + PAD), generator=torch.Generator().manual_seed(2))
    batch = torch.cat([torch.cat([ids, torch.zeros(1, PAD, dtype=torch.long)], 1), full])
    mask = torch.zeros(2, 5 + PAD, dtype=torch.bool)
    mask[0, 5:] = True
    ranks = attention_rank(model, batch, key_padding_mask=mask)
    first, second = attention_rank(model, ids), attention_rank(model, full)
    for key, got in ranks.items():
        for cond, stats in got.attention.items():
            want = torch.cat([first[key].attention[cond].effective_rank_per_matrix,
                              second[key].attention[cond].effective_rank_per_matrix])
            torch.testing.assert_close(stats.effective_rank_per_matrix, want, rtol=1e-5,
                                       atol=1e-6)
            assert stats.effective_rank == pytest.approx(float(want.mean()), rel=1e-5)
    diversity = head_diversity(model, batch, key_padding_mask=mask)
    alone = (head_diversity(model, ids), head_diversity(model, full))
    for key, got in diversity.items():
        # JS: a mean over the 5 + 8 real query rows, weighted by rows
        want = (5 * alone[0][key]["js_matrix"] + 8 * alone[1][key]["js_matrix"]) / 13
        torch.testing.assert_close(got["js_matrix"], want, rtol=1e-5, atol=1e-7)
        want_rank = (alone[0][key]["effective_rank"] + alone[1][key]["effective_rank"]) / 2
        assert got["effective_rank"] == pytest.approx(want_rank, rel=1e-5)


def test_query_masks_of_the_averaging_functions_match_a_loop_over_real_rows():
    g = torch.Generator().manual_seed(3)
    w = torch.softmax(torch.randn(2, 3, 6, 6, generator=g), -1)
    real = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    k = 2
    vals = [float(w[b, h, i, :k].sum()) for b in range(2) for h in range(3) for i in range(k, 6)
            if real[b, i]]
    assert early_attention_mass(w, k, real) == pytest.approx(sum(vals) / len(vals))
    js = pairwise_head_js(w, real)
    p, r = w[:, 0].double(), w[:, 1].double()
    m = (p + r) / 2
    row = 0.5 * (p * (p / m).log()).sum(-1) + 0.5 * (r * (r / m).log()).sum(-1)  # (2, 6)
    assert float(js[0, 1]) == pytest.approx(float(row[real].mean()), rel=1e-9)
    with pytest.raises(ValueError, match=r"queries must be a bool \(B, Tq\) = \(2, 6\)"):
        pairwise_head_js(w, real[:, :5])


def test_a_pooled_classifier_is_measured_on_its_real_tokens_with_as_many_classes_as_tokens():
    """The classifier's output (B, C) is pooled: it is compared whole, even when C equals the
    padded length T (8 here), and the perturbation reaches the real tokens only."""
    from graded import TransformerClassifier, TransformerConfig
    from graded.analysis import model_lipschitz

    torch.manual_seed(0)
    model = TransformerClassifier(
        TransformerConfig(vocab_size=None, input_dim=4, d_model=16, n_heads=2, n_layers=1,
                          max_len=16, grading="exponential", grade_init="warm_start",
                          grade_init_value=0.3), num_outputs=5 + PAD)
    x = torch.randn(1, 5, 4, generator=torch.Generator().manual_seed(4))
    padded = torch.cat([x, torch.randn(1, PAD, 4)], dim=1)
    mask = torch.zeros(1, 5 + PAD, dtype=torch.bool)
    mask[:, 5:] = True
    alone = model_lipschitz(model, x, n_random=2, steps=2)
    with_padding = model_lipschitz(model, padded, key_padding_mask=mask, n_random=2, steps=2)
    positional = model_lipschitz(model, (padded, mask), n_random=2, steps=2)  # mask by position
    for key, value in alone.items():
        assert with_padding[key] == pytest.approx(value, rel=1e-3), key
        assert positional[key] == pytest.approx(value, rel=1e-3), key


def test_diagnose_runs_on_a_single_token_and_leaves_out_only_the_positional_sweep():
    """One position has no query beyond the first k >= 1 keys; every other diagnostic is
    defined. diagnose used to fail as a whole, advising "use k < 1"."""
    model = _model()
    ids = torch.tensor([[3]])
    metrics = diagnose(model, ids, lipschitz_steps=1, n_random=1).metrics
    assert not any(key.startswith("positional/") for key in metrics)
    assert metrics["entropy/mean"] == 0.0  # one key: a one-hot row
    assert metrics["rank/attention/graded/numerical_rank"] == 1.0
    longer = diagnose(model, torch.tensor([[3, 4]]), lipschitz_steps=1, n_random=1).metrics
    assert "positional/uniform" in longer


def _seq2seq() -> Seq2SeqTransformer:
    torch.manual_seed(0)
    return Seq2SeqTransformer(tiny_config(grading="exponential", grade_init="warm_start",
                                          grade_init_value=0.5, grades_per_head=True,
                                          grade_attention_variant="multi_head"))


def _source_and_targets() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A source, a target of 4 tokens, a batch of that target right-padded by PAD beside a
    full target of 4 + PAD tokens (same source for both), and the batch's target padding."""
    g = torch.Generator().manual_seed(5)
    src = torch.randint(1, 11, (1, 6), generator=g)
    tgt = torch.randint(1, 11, (1, 4), generator=g)
    full = torch.randint(1, 11, (1, 4 + PAD), generator=g)
    batch = torch.cat([torch.cat([tgt, torch.zeros(1, PAD, dtype=torch.long)], 1), full])
    mask = torch.zeros(2, 4 + PAD, dtype=torch.bool)
    mask[0, 4:] = True
    return src, tgt, batch, mask


def test_seq2seq_cross_attention_diagnostics_of_a_target_are_the_same_alone_and_right_padded():
    """Cross-attention queries are the target's tokens: its padded rows used to enter the
    ranks, head diversity and entropy, as the target mask reached only the self-attention."""
    model = _seq2seq()
    src, tgt, _, _ = _source_and_targets()
    padded = torch.cat([tgt, torch.zeros(1, PAD, dtype=torch.long)], 1)
    mask = torch.zeros(1, 4 + PAD, dtype=torch.bool)
    mask[:, 4:] = True
    alone, with_padding = (src, tgt), (src, padded)
    cross = [key for key in attention_rank(model, alone) if ".cross_attn." in key]
    assert len(cross) == 2
    ranks = attention_rank(model, with_padding, tgt_key_padding_mask=mask)
    diversity = head_diversity(model, with_padding, tgt_key_padding_mask=mask)
    for key in cross:
        want, got = attention_rank(model, alone)[key], ranks[key]
        for cond in want.attention:
            assert got.attention[cond].effective_rank == pytest.approx(
                want.attention[cond].effective_rank, rel=1e-5)
            assert got.scores[cond].numerical_rank == want.scores[cond].numerical_rank
            assert got.frobenius[cond] == pytest.approx(want.frobenius[cond], rel=1e-5)
        want_d = head_diversity(model, alone)[key]
        torch.testing.assert_close(diversity[key]["js_matrix"], want_d["js_matrix"],
                                   rtol=1e-5, atol=1e-7)
        assert diversity[key]["effective_rank"] == pytest.approx(want_d["effective_rank"],
                                                                 rel=1e-5)
    options = dict(k=2, alphas=[0.0, 0.3], lipschitz_steps=2, n_random=2)
    metrics = diagnose(model, alone, **options).metrics
    padded_metrics = diagnose(model, with_padding, tgt_key_padding_mask=mask, **options).metrics
    for key, value in metrics.items():  # the Lipschitz estimate reads the real target rows
        assert padded_metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    # the source's padding too: the perturbation reaches the real source tokens only
    src_padded = torch.cat([src, torch.zeros(1, 2, dtype=torch.long)], 1)
    src_mask = torch.zeros(1, src_padded.shape[1], dtype=torch.bool)
    src_mask[:, src.shape[1]:] = True
    from graded.analysis import model_lipschitz

    lip = dict(n_random=2, steps=2)
    want = model_lipschitz(model, alone, **lip)
    both = model_lipschitz(model, (src_padded, padded, src_mask, mask), **lip)  # by position
    for key, value in want.items():
        assert both[key] == pytest.approx(value, rel=1e-3), key  # float32 finite differences


def test_seq2seq_cross_attention_averages_over_the_real_target_rows_of_a_naive_loop():
    model = _seq2seq()
    src, _, batch, mask = _source_and_targets()
    with capture_attention(model.eval()) as calls:
        model(src.expand(2, -1), batch, tgt_key_padding_mask=mask)
    keys = call_keys(calls)
    cross = [(key, c) for key, c in zip(keys, calls) if ".cross_attn." in key]
    assert cross and all(torch.equal(c.query_padding_mask, mask) for _, c in cross)
    real_rows = [(b, i) for b in range(2) for i in range(4 + PAD) if not mask[b, i]]
    diversity = head_diversity(model, (src.expand(2, -1), batch), tgt_key_padding_mask=mask)
    for key, call in cross:
        p, r = call.weights[:, 0].double(), call.weights[:, 1].double()
        js = []
        for b, i in real_rows:
            m = (p[b, i] + r[b, i]) / 2
            js.append(0.5 * float((p[b, i] * (p[b, i] / m).log()).sum())
                      + 0.5 * float((r[b, i] * (r[b, i] / m).log()).sum()))
        assert float(diversity[key]["js_matrix"][0, 1]) == pytest.approx(
            sum(js) / len(js), rel=1e-5)
    # entropy/mean: per call, the mean entropy of its real query rows (all source rows are
    # real; the decoder's self- and cross-attention rows are the target's)
    per_call = []
    for key, call in zip(keys, calls):
        rows = ([(b, i) for b in range(2) for i in range(call.q.shape[-2])]
                if key.startswith("encoder.") else real_rows)
        w = call.weights.double()
        per_call.append(sum(float(-(w[b, h, i] * w[b, h, i].clamp_min(1e-300).log()).sum())
                            for b, i in rows for h in range(w.shape[1]))
                        / (len(rows) * w.shape[1]))
    metrics = diagnose(model, (src.expand(2, -1), batch), tgt_key_padding_mask=mask,
                       lipschitz_steps=1, n_random=1, alphas=[0.0]).metrics
    assert metrics["entropy/mean"] == pytest.approx(sum(per_call) / len(per_call), rel=1e-5)
