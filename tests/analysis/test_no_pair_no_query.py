"""Means over nothing in the diagnostics: the attention rank of a batch of padding only and the
pairwise head divergence of a one-head layer are NaN (as ``torch.mean`` of an empty tensor);
diagnose reports a one-head model without the pairwise metric, saying why."""

from __future__ import annotations

import math

import pytest
import torch
from analysis_helpers import is_png, tiny_config

from graded import TransformerLM
from graded.analysis import attention_rank, diagnose, head_diversity
from graded.analysis.diagnose import _head_metrics

OPTIONS = dict(lipschitz_steps=1, n_random=1)


def _model(**changes) -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(tiny_config(grading="exponential", grade_init="warm_start",
                                     grade_init_value=0.5, **changes))


def _ids(batch=2, length=5, seed=1):
    return torch.randint(1, 11, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_attention_rank_of_a_batch_of_padding_only_is_nan_over_no_matrix():
    """Every query is padding: no matrix to take the rank of. The ranks used to be those of
    every row, padding included, where each sibling diagnostic gives NaN."""
    model = _model()
    ranks = attention_rank(model, _ids(), key_padding_mask=torch.ones(2, 5, dtype=torch.bool))
    nothing = float(torch.empty(0, dtype=torch.float64).mean())  # torch's mean of nothing
    assert math.isnan(nothing)
    assert ranks
    for key, r in ranks.items():
        assert all(math.isnan(v) for v in r.to_dict().values()), key
        for stats in (*r.scores.values(), *r.attention.values()):
            assert stats.numerical_rank_per_matrix.shape == (0, 2), key
            assert stats.effective_rank_per_matrix.shape == (0, 2), key


def test_attention_rank_leaves_out_a_sequence_of_padding_only():
    """A batch of a real sequence and a sequence of padding only has the ranks of the real one
    alone."""
    model = _model()
    ids = _ids(batch=1)
    batch = torch.cat([ids, torch.zeros_like(ids)])
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[1] = True
    alone, got = attention_rank(model, ids), attention_rank(model, batch, key_padding_mask=mask)
    for key, want in alone.items():
        for name, value in want.to_dict().items():
            assert got[key].to_dict()[name] == pytest.approx(value, rel=1e-5), (key, name)


def test_mean_js_of_one_head_is_nan_the_mean_over_no_pair():
    """It used to be 0, the value of two identical heads."""
    out = head_diversity(_model(n_heads=1), _ids())
    assert out
    for key, d in out.items():
        js = d["js_matrix"]
        assert js.shape == (1, 1) and float(js[0, 0]) == pytest.approx(0.0, abs=1e-12), key
        off_diagonal = js[~torch.eye(1, dtype=torch.bool)]  # the pairs h != h': none
        assert off_diagonal.numel() == 0 and math.isnan(float(off_diagonal.mean()))
        assert math.isnan(d["mean_js"]), key
        assert not math.isnan(d["effective_rank"]), key


def test_mean_js_of_two_heads_is_the_mean_of_the_off_diagonal():
    for key, d in head_diversity(_model(n_heads=2), _ids()).items():
        js = d["js_matrix"]
        assert d["mean_js"] == pytest.approx(float((js[0, 1] + js[1, 0]) / 2)), key


def test_diagnose_reports_a_one_head_model_without_the_pairwise_metric(tmp_path):
    """A one-head model is diagnosed; heads/mean_js (and its twin's) is absent, with a note.
    The one-head metric used to be reported as 0."""
    model, ids = _model(n_heads=1), _ids()
    report = diagnose(model, ids, tmp_path, **OPTIONS)
    for name in ("heads/mean_js", "heads/ungraded/mean_js"):
        assert name not in report.metrics
        assert "not applicable" in report.notes[name] and "one head" in report.notes[name]
    assert not any(math.isnan(v) for k, v in report.metrics.items()
                   if k != "concentration/lemma_bound_fraction")
    diversity = head_diversity(model, ids)
    want = sum(d["effective_rank"] for d in diversity.values()) / len(diversity)
    assert report.metrics["heads/concat_effective_rank"] == pytest.approx(want)
    assert is_png(report.plots["head_diversity"])


def test_diagnose_of_a_model_of_several_heads_has_the_metric_and_no_note():
    model, ids = _model(n_heads=2), _ids()
    report = diagnose(model, ids, **OPTIONS)
    diversity = head_diversity(model, ids)
    want = sum(d["mean_js"] for d in diversity.values()) / len(diversity)
    assert report.metrics["heads/mean_js"] == pytest.approx(want)
    assert report.notes == {}


def test_diagnose_still_refuses_a_batch_of_padding_only():
    """NaN from no real query stays an error (the rank metrics now among them)."""
    with pytest.raises(RuntimeError, match=r"produced NaN for \[.*'rank/.*'heads/mean_js'"):
        diagnose(_model(n_heads=2), _ids(), key_padding_mask=torch.ones(2, 5, dtype=torch.bool),
                 **OPTIONS)


def test_head_metrics_average_mean_js_over_the_layers_that_have_pairs():
    """Layers of one and of three heads: the mean JS is the three-head layer's, and the note
    names the layer left out."""
    def layer(heads, mean_js):
        return {"js_matrix": torch.zeros(heads, heads), "mean_js": mean_js,
                "numerical_rank": 2.0, "effective_rank": 1.5}

    notes: dict[str, str] = {}
    metrics = _head_metrics({"a": layer(1, float("nan")), "b": layer(3, 0.25),
                             "c": layer(2, 0.75)}, "heads/", notes)
    assert metrics["heads/mean_js"] == pytest.approx((0.25 + 0.75) / 2)
    assert metrics["heads/concat_effective_rank"] == 1.5
    assert "['a']" in notes["heads/mean_js"] and "one head" in notes["heads/mean_js"]


def test_feature_concentration_of_a_batch_of_padding_only_is_nan():
    """No real token, no vector: the shares are NaN (it used to raise that no vector has
    M x ≠ 0, which does not say that every token is padding); d_eff and d stay the grading's."""
    from graded.analysis import model_feature_concentration

    model = _model()
    mask = torch.ones(2, 5, dtype=torch.bool)
    got = model_feature_concentration(model, _ids(), key_padding_mask=mask)
    full = model_feature_concentration(model, _ids())
    assert (got.d_eff, got.dim) == (full.d_eff, full.dim)
    assert all(math.isnan(v) for v in (got.high_grade_share, got.ungraded_share,
                                       got.lemma_bound_fraction))
