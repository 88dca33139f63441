"""The additive (Bahdanau) score of 002 §2.4.1 Eq 2.12 as printed, against a per-pair loop.

The module has no bias term, as the formula (an earlier version gave W_k one).
"""

import torch

from graded.attention.scores import AdditiveScore


def test_additive_score_is_eq_2_12_with_no_bias_term():
    """002 §2.4.1 Eq 2.12 (Bahdanau et al. 2015): e(q, k) = v_aᵀ tanh(W_q q + W_k k) with
    W_q ∈ R^{d_a×d_q}, W_k ∈ R^{d_a×d_k}, v_a ∈ R^{d_a} and no bias, d_a(d_q + d_k + 1)
    parameters; computed pair by pair from the module's weight matrices."""
    torch.manual_seed(0)
    d, d_a = 8, 6
    score = AdditiveScore(d, hidden_dim=d_a).double()
    q = torch.randn(1, 2, 3, d, dtype=torch.float64)
    k = torch.randn(1, 2, 4, d, dtype=torch.float64)
    w_q, w_k, v_a = score.query.weight, score.key.weight, score.v.weight[0]
    expected = torch.empty(1, 2, 3, 4, dtype=torch.float64)
    for h in range(2):
        for i in range(3):
            for j in range(4):
                expected[0, h, i, j] = v_a @ torch.tanh(w_q @ q[0, h, i] + w_k @ k[0, h, j])
    assert sum(p.numel() for p in score.parameters()) == d_a * (d + d + 1)
    torch.testing.assert_close(score(q, k), expected)
