"""Attention-rank diagnostics: the checks no other test reaches, and an additive bias entering
the attention matrices, against ranks computed from the singular values directly."""

import pytest
import torch

from graded.analysis.rank import (
    compare_attention_rank,
    graded_score_matrices,
    random_rank_study,
    singular_values,
)


def _qk(d=4):
    g = torch.Generator().manual_seed(0)
    return torch.randn(1, 2, 5, d, generator=g), torch.randn(1, 2, 5, d, generator=g)


def test_singular_values_need_matrices():
    with pytest.raises(ValueError, match=r"expected matrices \(\.\.\., m, n\), got shape \(3,\)"):
        singular_values(torch.ones(3))


def test_score_matrix_checks_name_the_value():
    q, k = _qk()
    with pytest.raises(ValueError, match=r"variant must be one of .*, got 'keys'"):
        graded_score_matrices(q, k, None, "keys")
    with pytest.raises(ValueError, match=r"q and k must be \(B, H, T, D\) with equal D, got "
                                         r"\(1, 2, 5, 4\) and \(1, 2, 5, 3\)"):
        graded_score_matrices(q, k[..., :3], None)
    with pytest.raises(ValueError, match=r"scales have 3 entries, head_dim is 4"):
        graded_score_matrices(q, k, torch.ones(3))
    with pytest.raises(ValueError, match=r"scales must have shape \(head_dim,\) or \(heads, "
                                         r"head_dim\) = \(2, 4\), got \(3, 4\)"):
        graded_score_matrices(q, k, torch.ones(3, 4))


def test_a_bias_enters_every_attention_matrix():
    q, k = _qk()
    # a large bias on the diagonal (as ALiBi-like biases are added): the expected effective
    # rank is computed from the singular values of softmax(scores + bias) directly
    bias = torch.diag(torch.full((5,), 30.0))
    result = compare_attention_rank(q, k, None, bias=bias)
    s = q.double() @ k.double().transpose(-2, -1) / 2.0
    attn = torch.softmax(s + bias.double(), -1)
    sv = torch.linalg.svdvals(attn)
    p = sv / sv.sum(-1, keepdim=True)
    expected = float(torch.exp(-(p * p.log()).sum(-1)).mean())
    for cond in ("ungraded", "graded", "graded_matched"):  # no grading: all three equal
        assert result.attention[cond].effective_rank == pytest.approx(expected, rel=1e-9)
    assert expected > 4.9  # the bias pushes each row onto its diagonal: nearly the identity


def test_random_rank_study_needs_positive_sizes():
    with pytest.raises(ValueError, match=r"need positive n, d_k and trials, got n=0, d_k=4, "
                                         r"trials=1"):
        random_rank_study(n=0, d_k=4, trials=1)
