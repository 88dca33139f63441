"""Jensen–Shannon head divergence and the rank of concatenated heads."""

from __future__ import annotations

import math

import pytest
import torch

from graded.analysis import (
    concatenated_head_rank,
    effective_rank,
    head_diversity,
    js_divergence,
    pairwise_head_js,
)


def _js_by_hand(p, r):
    m = [(a + b) / 2 for a, b in zip(p, r)]
    kl = lambda x, y: sum(a * math.log(a / b) for a, b in zip(x, y) if a > 0)  # noqa: E731
    return 0.5 * kl(p, m) + 0.5 * kl(r, m)


def test_js_of_identical_maps_is_zero_and_of_disjoint_maps_is_log_two():
    p = torch.softmax(torch.randn(3, 5), -1)
    assert torch.allclose(js_divergence(p, p), torch.zeros(3), atol=1e-7)
    a, b = torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0.0, 0.5, 0.5])
    assert js_divergence(a, b).item() == pytest.approx(math.log(2))


def test_js_matches_a_python_loop_and_is_symmetric():
    g = torch.Generator().manual_seed(7)
    p = torch.softmax(torch.randn(4, 6, generator=g), -1)
    r = torch.softmax(torch.randn(4, 6, generator=g), -1)
    r[0, :2] = 0.0
    r[0] /= r[0].sum()
    got = js_divergence(p, r)
    for i in range(4):
        assert got[i].item() == pytest.approx(_js_by_hand(p[i].tolist(), r[i].tolist()),
                                              abs=1e-6)
    assert torch.allclose(got, js_divergence(r, p))


def test_js_rejects_negative_entries():
    with pytest.raises(ValueError, match=r"r must be finite and >= 0, got values in \[-0\.5"):
        js_divergence(torch.tensor([0.5, 0.5]), torch.tensor([1.5, -0.5]))


def test_pairwise_head_js_is_the_mean_over_batch_and_rows():
    g = torch.Generator().manual_seed(8)
    w = torch.softmax(torch.randn(2, 3, 4, 5, generator=g), -1)
    js = pairwise_head_js(w)
    assert js.shape == (3, 3)
    assert torch.allclose(js.diagonal(), torch.zeros(3, dtype=js.dtype), atol=1e-9)
    assert torch.allclose(js, js.T)
    want = sum(_js_by_hand(w[b, 0, i].tolist(), w[b, 2, i].tolist())
               for b in range(2) for i in range(4)) / 8
    assert js[0, 2].item() == pytest.approx(want, abs=1e-6)


def test_identical_heads_have_zero_diversity():
    w = torch.softmax(torch.randn(1, 1, 4, 4), -1).expand(1, 3, 4, 4)
    assert torch.allclose(pairwise_head_js(w), torch.zeros(3, 3, dtype=torch.float64),
                          atol=1e-9)


def test_concatenated_head_rank_by_hand():
    # two heads with the same output columns: the concatenation has rank 2, not 4
    base = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    heads = torch.stack([base, 2 * base])[None]  # (1, H=2, T=3, d_v=2)
    r = concatenated_head_rank(heads)
    assert r["numerical_rank"] == 2.0
    concat = torch.cat([base, 2 * base], dim=1)
    assert r["effective_rank"] == pytest.approx(effective_rank(concat).item())


def test_head_diversity_of_a_model(egt_lm, tokens):
    div = head_diversity(egt_lm, tokens)
    assert len(div) == 2
    for d in div.values():
        assert d["js_matrix"].shape == (2, 2)
        assert 0.0 <= d["mean_js"] <= math.log(2)
        assert 1.0 <= d["numerical_rank"] <= 7.0


def test_js_divergence_refuses_distributions_over_different_keys():
    p = torch.full((2, 5), 0.2)
    with pytest.raises(ValueError, match=r"same keys.*got 5 and 4 keys"):
        js_divergence(p, torch.full((2, 4), 0.25))
