"""Graded positional encodings of 000 Def 5.21 (Eq. 47) and §6.2 (Eq. 90 ff.) by hand.

Eq. 47 is Pe'(t, i) = (1 − αt) Pe(t, i), with one t in both factors, and 000 §4.2 defines
Pe on the positions {1, …, n_max}. The factor reads the position the table indexes: with
``positional="sinusoidal"`` row r holds (1 − αr)·Pe(r) (t = r, 0-based), with
``positional="sinusoidal1"`` (000's 1-based Pe) row r holds (1 − α(r+1))·Pe(r + 1).
"""

import math

import pytest
import torch

from graded import TransformerConfig, TransformerLM

F64 = torch.float64
D = 8


def _embedding(positional, grading, alpha):
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=11, d_model=D, n_heads=2, n_layers=1, max_len=16,
                            grading=grading, grade_position_alpha=alpha, grade_input=False,
                            positional=positional)
    return TransformerLM(cfg).double().decoder.embed


def _pe(t):
    """Pe(t, 2i) = sin(t/10000^{2i/d}), Pe(t, 2i+1) = cos(t/10000^{2i/d}), written out."""
    return torch.tensor([f(t / 10000 ** (2 * (c // 2) / D))
                         for c, f in zip(range(D), [math.sin, math.cos] * (D // 2))], dtype=F64)


def _factor(grading, alpha, t):
    return 1.0 - alpha * t if grading == "linear" else 2.0 ** (-alpha * t)


@pytest.mark.parametrize("grading", ["linear", "exponential"])
def test_zero_indexed_positions_give_eq_47_with_t_from_zero(grading):
    """positional="sinusoidal": row r holds (1 − αr)·Pe(r) (LGT) or λ^{−αr}·Pe(r) (EGT, λ = 2)."""
    alpha = 0.04
    emb = _embedding("sinusoidal", grading, alpha)
    pos = torch.arange(10)
    got = emb.position_grading(emb.positions(pos, dtype=F64), pos)
    for r in range(10):
        torch.testing.assert_close(got[r], _factor(grading, alpha, r) * _pe(r), rtol=1e-12,
                                   atol=1e-14)


@pytest.mark.parametrize("grading", ["linear", "exponential"])
def test_one_indexed_positions_scale_pe_t_by_the_factor_of_the_same_t(grading):
    alpha = 0.04
    emb = _embedding("sinusoidal1", grading, alpha)
    pos = torch.arange(10)
    got = emb.position_grading(emb.positions(pos, dtype=F64), pos)
    for r in range(10):
        t = r + 1
        torch.testing.assert_close(got[r], _factor(grading, alpha, t) * _pe(t), rtol=1e-12,
                                   atol=1e-14)


def test_the_lgt_bound_counts_the_last_one_indexed_position():
    """α·n_max < 1 with 1-based positions (the last is t = max_len), α·(max_len − 1) < 1 with
    0-based ones: α = 1/16 with max_len = 16 passes 0-based and is refused 1-based."""
    _embedding("sinusoidal", "linear", 1 / 16)
    with pytest.raises(ValueError, match="alpha\\*16 < 1"):
        _embedding("sinusoidal1", "linear", 1 / 16)
