"""Block maps of 004 (§2.1.2 FFN, §5.3.2 retrieval, Props 2.14/2.15, Cor 2.17) by hand."""

import math

import pytest
import torch

from graded.morphic import (
    BandedBlocks,
    ConjugatedBlocks,
    FFNBlock,
    Grade,
    GradedStateSpace,
    RetrievalBlock,
)

F64 = torch.float64

_ACT = {
    "relu": lambda x: max(x, 0.0),
    "gelu": lambda x: 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0))),
    "silu": lambda x: x / (1.0 + math.exp(-x)),
    "tanh": math.tanh,
}


@pytest.mark.parametrize("activation", sorted(_ACT))
@pytest.mark.parametrize("bias", [False, True])
def test_ffn_block_is_w2_sigma_w1_of_section_2_1_2(activation, bias):
    """004 §2.1.2 / §4.1.3: φ^{ff}_{h←g}(x) = W_2 σ(W_1 x) (+ biases when asked), σ pointwise."""
    torch.manual_seed(0)
    blk = FFNBlock(3, 2, 4, activation=activation, bias=bias).double()
    x = torch.randn(2, 3, 3, dtype=F64)
    got = blk(x).detach()
    w1, w2 = blk.w1.weight.detach(), blk.w2.weight.detach()
    b1 = blk.w1.bias.detach() if bias else torch.zeros(4, dtype=F64)
    b2 = blk.w2.bias.detach() if bias else torch.zeros(2, dtype=F64)
    act = _ACT[activation]
    for b in range(2):
        for t in range(3):
            hidden = [act(sum(float(w1[k, i]) * float(x[b, t, i]) for i in range(3)) + float(b1[k]))
                      for k in range(4)]
            for j in range(2):
                want = sum(float(w2[j, k]) * hidden[k] for k in range(4)) + float(b2[j])
                assert math.isclose(float(got[b, t, j]), want, rel_tol=1e-12, abs_tol=1e-14)


def test_retrieval_block_is_the_softmax_of_key_scores_of_section_5_3_2():
    """004 §5.3.2: φ_{ret←sem}(z) = softmax(Qᵀ W_q z / σ²), r_i ∝ exp(⟨Q_i, W_q z⟩/σ²)."""
    torch.manual_seed(1)
    keys = torch.randn(5, 3, dtype=F64)
    blk = RetrievalBlock(keys, 4, temperature=0.6).double()
    z = torch.randn(2, 4, dtype=F64)
    got = blk(z).detach()
    wq = blk.query.weight.detach()
    for n in range(2):
        q = [sum(float(wq[a, i]) * float(z[n, i]) for i in range(4)) for a in range(3)]
        s = [sum(float(keys[i, a]) * q[a] for a in range(3)) / 0.6 for i in range(5)]
        den = sum(math.exp(v) for v in s)
        for i in range(5):
            assert math.isclose(float(got[n, i]), math.exp(s[i]) / den, rel_tol=1e-12)


def test_retrieval_mass_bound_needs_the_factor_k_minus_1_prop_5_7():
    """004 Prop 5.7 prints r_{i*} ≥ 1 − e^{−γ/σ²} for a key margin γ at i*; the correct bound is
    r_{i*} ≥ 1/(1 + (k−1)e^{−γ/σ²}) (notes C2, G9). Worst case (all other keys exactly γ below
    i*) with k = 100, γ/σ² = 1: r_{i*} = e/(e + 99) = 0.0267, far below the printed 0.632. The
    library's docstring states the corrected bound; it holds with equality at the worst case and
    on random keys."""
    k, gamma, sigma2 = 100, 1.0, 1.0
    keys = torch.zeros(k, 3, dtype=F64)
    keys[0, 0] = gamma  # score γ for i* = 0, 0 for the 99 others
    blk = RetrievalBlock(keys, 3, temperature=sigma2, learn_query=False).double()
    r = float(blk(torch.tensor([[1.0, 0.0, 0.0]], dtype=F64))[0, 0])
    corrected = 1.0 / (1.0 + (k - 1) * math.exp(-gamma / sigma2))
    printed = 1.0 - math.exp(-gamma / sigma2)
    assert math.isclose(r, math.e / (math.e + 99), rel_tol=1e-12)
    assert math.isclose(r, corrected, rel_tol=1e-12)
    assert r < printed  # the printed bound fails: 0.0267 < 0.632
    gen = torch.Generator().manual_seed(2)
    for _ in range(20):
        keys = torch.randn(7, 3, generator=gen, dtype=F64)
        blk = RetrievalBlock(keys, 3, temperature=0.5, learn_query=False).double()
        z = torch.randn(1, 3, generator=gen, dtype=F64)
        scores = (keys @ z[0]).tolist()
        top = max(range(7), key=lambda i: scores[i])
        margin = scores[top] - max(s for i, s in enumerate(scores) if i != top)
        r = float(blk(z)[0, top])
        assert r >= 1.0 / (1.0 + 6 * math.exp(-margin / 0.5)) - 1e-12


def _space(n=4, d=3):
    return GradedStateSpace([Grade(f"g{i}", d, i) for i in range(n)])


@pytest.mark.parametrize("shifts, n_shifts", [([0, 1], 2), ([-1, 0, 1], 3), ([2], 1)])
def test_banded_parameter_counts_are_those_of_props_2_14_and_2_15(shifts, n_shifts):
    """004 Prop 2.14: param(LGT layer) = Σ_δ d_g d_{g+δ} = |Δ| d² for equal d_g (linear kernels,
    no bias). Prop 2.15: param_ff = 2d Σ_δ m_δ (FFN kernels of width m, no biases).
    Cor 2.17: the conjugated ("EGT") operator has the same trainable count (D is fixed)."""
    d, m = 3, 5
    sp = _space(d=d)

    def count(module):
        return sum(p.numel() for p in module.parameters() if p.requires_grad)

    assert count(BandedBlocks(sp, shifts)) == n_shifts * d * d
    assert count(BandedBlocks(sp, shifts, kind="ffn", hidden=m)) == 2 * d * n_shifts * m
    assert count(ConjugatedBlocks(sp, shifts, base=1.5)) == n_shifts * d * d
