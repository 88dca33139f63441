"""Scoring functions (002 §2.4) against naive per-pair loops."""

import math

import pytest
import torch

from graded.attention import MultiheadAttention
from graded.attention.scores import AdditiveScore, BilinearScore, DotScore, ScaledDotScore


def naive_scores(fn, q, k):
    b, h, tq, _ = q.shape
    tk = k.shape[2]
    out = torch.empty(b, h, tq, tk, dtype=q.dtype)
    for bi in range(b):
        for hi in range(h):
            for i in range(tq):
                for j in range(tk):
                    out[bi, hi, i, j] = fn(hi, q[bi, hi, i], k[bi, hi, j])
    return out


@pytest.fixture
def qk():
    torch.manual_seed(0)
    q = torch.randn(2, 3, 4, 8, dtype=torch.float64)
    return q, torch.randn(2, 3, 5, 8, dtype=torch.float64)


def test_scaled_dot_and_dot_scores_equal_loops(qk):
    q, k = qk
    expected = naive_scores(lambda h, a, b: a @ b / math.sqrt(8), q, k)
    torch.testing.assert_close(ScaledDotScore()(q, k), expected)
    torch.testing.assert_close(DotScore()(q, k), naive_scores(lambda h, a, b: a @ b, q, k))


def test_bilinear_score_equals_loop(qk):
    q, k = qk
    score = BilinearScore(3, 8).double()
    with torch.no_grad():
        score.weight.copy_(torch.randn(3, 8, 8))
    expected = naive_scores(lambda h, a, b: a @ score.weight[h] @ b, q, k)
    torch.testing.assert_close(score(q, k), expected)
    q2, k2, scale = score.fused_inputs(q, k)
    torch.testing.assert_close(q2 @ k2.transpose(-2, -1) * scale, expected)


@pytest.mark.parametrize("name", ["dot", "bilinear", "additive"])
def test_fused_and_explicit_paths_agree_for_every_score(name):
    torch.manual_seed(1)
    m = MultiheadAttention(16, 4, batch_first=True, score=name)
    x = torch.randn(2, 6, 16)
    mask = torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1)
    fast, _ = m(x, x, x, attn_mask=mask, need_weights=False)
    slow, w = m(x, x, x, attn_mask=mask, need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-4)
    assert torch.all(w.masked_select(mask.expand_as(w)) == 0)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 6))


@pytest.mark.parametrize("name", ["bilinear", "additive"])
def test_score_built_by_name_takes_the_module_dtype_and_equals_a_loop(name):
    """MultiheadAttention(dtype=float64, score=name): the score's parameters are float64 as the
    projections are (they were float32 and the call failed), and the output equals softmax
    over the scores written out pair by pair."""
    torch.manual_seed(0)
    m = MultiheadAttention(8, 2, batch_first=True, score=name, dtype=torch.float64)
    assert {p.dtype for p in m.parameters()} == {torch.float64}
    with torch.no_grad():
        for p in m.score.parameters():
            p.normal_()
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    out, _ = m(x, x, x, need_weights=False)
    q, k, v = (t.view(2, 4, 2, 4).transpose(1, 2) for t in
               torch.nn.functional.linear(x, m.in_proj_weight, m.in_proj_bias).split(8, -1))
    s = m.score

    def pair_score(h, a, b):
        if name == "bilinear":
            return a @ s.weight[h] @ b
        return s.v.weight[0] @ torch.tanh(s.query.weight @ a + s.key.weight @ b)

    heads = torch.softmax(naive_scores(pair_score, q, k), -1) @ v
    expected = m.out_proj(heads.transpose(1, 2).flatten(-2))
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)


def test_additive_score_sizes_are_checked_and_named():
    """hidden_dim=0 silently became head_dim (``hidden_dim or head_dim``); negative, float or
    bool sizes failed inside torch ("Trying to create tensor with negative dimension")."""
    assert AdditiveScore(4, 3).query.out_features == 3
    assert AdditiveScore(4).query.out_features == 4
    for hidden in (0, -1):
        with pytest.raises(ValueError, match=rf"AdditiveScore: hidden_dim must be >= 1, got "
                                             rf"{hidden}"):
            AdditiveScore(4, hidden)
    for hidden in (2.5, True):
        with pytest.raises(TypeError, match=rf"AdditiveScore: hidden_dim must be an int, got "
                                            rf"{hidden!r}"):
            AdditiveScore(4, hidden)
    with pytest.raises(ValueError, match=r"AdditiveScore: head_dim must be >= 1, got 0"):
        AdditiveScore(0)
