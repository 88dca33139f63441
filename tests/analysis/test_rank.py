"""Numerical and effective rank, and the scale-matched graded/ungraded comparison."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from analysis_helpers import tiny_config

from graded import TransformerLM
from graded.analysis import (
    attention_maps,
    attention_rank,
    compare_attention_rank,
    effective_rank,
    graded_score_matrices,
    numerical_rank,
    random_rank_study,
)
from graded.attention.graded import GradedMultiheadAttention
from graded.grading import ExponentialGrading


def test_effective_rank_of_identity_is_n_and_of_rank_one_is_one():
    assert effective_rank(torch.eye(6)).item() == pytest.approx(6.0)
    u, v = torch.randn(5, 1), torch.randn(1, 7)
    assert effective_rank(u @ v).item() == pytest.approx(1.0, abs=1e-6)
    assert effective_rank(torch.zeros(3, 3)).item() == 0.0


def test_effective_rank_of_a_diagonal_matrix_by_hand():
    sigma = [3.0, 2.0, 1.0, 0.5]
    p = [s / sum(sigma) for s in sigma]
    want = math.exp(-sum(x * math.log(x) for x in p))
    q, _ = torch.linalg.qr(torch.randn(4, 4, dtype=torch.float64))  # rotation-invariant
    assert effective_rank(q @ torch.diag(torch.tensor(sigma, dtype=torch.float64))).item() \
        == pytest.approx(want)


@pytest.mark.parametrize("rtol", [1e-1, 1e-3])
def test_numerical_rank_matches_torch_matrix_rank_with_the_same_relative_tolerance(rtol):
    g = torch.Generator().manual_seed(3)
    # singular values spread over six decades
    u, _ = torch.linalg.qr(torch.randn(2, 8, 8, dtype=torch.float64, generator=g))
    s = torch.logspace(0, -6, 8, dtype=torch.float64)
    a = u @ torch.diag(s) @ u.transpose(-1, -2)
    want = torch.linalg.matrix_rank(a, rtol=rtol).to(torch.float64)
    assert torch.equal(numerical_rank(a, rtol), want)
    assert numerical_rank(a, rtol)[0].item() == sum(1 for x in s if x > rtol * s[0])


def test_numerical_rank_rejects_a_bad_tolerance():
    with pytest.raises(ValueError, match="rtol"):
        numerical_rank(torch.eye(2), rtol=0.0)


def _qk(b=2, h=2, t=6, d=4, seed=4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, h, t, d, generator=g), torch.randn(b, h, t, d, generator=g)


def test_scale_matched_scores_have_the_ungraded_frobenius_norm():
    q, k = _qk()
    scales = torch.tensor([1.0, 2.0, 4.0, 8.0])
    s = graded_score_matrices(q, k, scales, "scores")
    n0 = torch.linalg.matrix_norm(s["ungraded"])
    assert not torch.allclose(torch.linalg.matrix_norm(s["graded"]), n0)
    assert torch.allclose(torch.linalg.matrix_norm(s["graded_matched"]), n0)
    # the matched matrix is the graded one times a positive number per matrix
    ratio = s["graded_matched"] / s["graded"]
    assert torch.allclose(ratio, ratio[..., :1, :1].expand_as(ratio))


def test_scale_matching_counts_only_the_entries_the_mask_keeps():
    q, k = _qk()
    keep = torch.ones(6, 6, dtype=torch.bool).tril()[None, None]
    s = graded_score_matrices(q, k, torch.tensor([1.0, 3.0, 5.0, 7.0]), keep=keep)
    for m in s.values():
        assert torch.equal(m.masked_select(~keep), torch.zeros(m.masked_select(~keep).shape,
                                                               dtype=m.dtype))
    assert torch.allclose(torch.linalg.matrix_norm(s["graded_matched"]),
                          torch.linalg.matrix_norm(s["ungraded"]))


def test_graded_scores_by_a_naive_loop():
    q, k = _qk(b=1, h=1, t=3, d=2)
    m = torch.tensor([2.0, 0.5])
    s = graded_score_matrices(q, k, m, "scores")
    qk = graded_score_matrices(q, k, m, "queries_keys")
    for i in range(3):
        for j in range(3):
            want = sum(q[0, 0, i, c] * m[c] * k[0, 0, j, c] for c in range(2)) / math.sqrt(2)
            want2 = sum(q[0, 0, i, c] * m[c] ** 2 * k[0, 0, j, c] for c in range(2)) / math.sqrt(2)
            assert s["graded"][0, 0, i, j].item() == pytest.approx(float(want), rel=1e-6)
            assert qk["graded"][0, 0, i, j].item() == pytest.approx(float(want2), rel=1e-6)


@pytest.mark.parametrize("variant,per_head", [("scores", False), ("queries_keys", False),
                                              ("multi_head", True), ("scores", True)])
def test_graded_condition_reproduces_graded_attention_weights(variant, per_head):
    torch.manual_seed(5)
    heads, d = 2, 4
    grades = torch.rand(heads, d) * 2 if per_head else torch.rand(d) * 2
    grading = ExponentialGrading(d, grades, base=2.0, num_heads=heads if per_head else None)
    mha = GradedMultiheadAttention(8, heads, grading=grading, variant=variant,
                                   batch_first=True, fold_grading=False)
    x = torch.randn(2, 5, 8)
    q, k, _ = mha.project(x, x, x)
    _, want = mha.attend(q, k, k, need_weights=True)
    keep = torch.ones(5, 5, dtype=torch.bool)
    s = graded_score_matrices(q, k, grading.scales(), variant, keep=keep)
    got = torch.softmax(s["graded"], -1)
    assert torch.allclose(got, want.double(), atol=1e-6)
    assert torch.allclose(torch.softmax(s["ungraded"], -1),
                          torch.softmax(q.double() @ k.double().transpose(-1, -2) / 2, -1))


def test_unit_scales_and_the_values_variant_leave_all_three_conditions_equal():
    q, k = _qk()
    for scales, variant in ((torch.ones(4), "scores"), (torch.rand(4) + 1, "values"),
                            (None, "scores")):
        r = compare_attention_rank(q, k, scales, variant)
        for kind in (r.scores, r.attention):
            assert kind["graded"].effective_rank == pytest.approx(kind["ungraded"].effective_rank)
            assert kind["graded_matched"].effective_rank == pytest.approx(
                kind["ungraded"].effective_rank)


def test_comparison_ranks_equal_direct_computation_on_the_softmax_matrices():
    q, k = _qk()
    scales = torch.tensor([1.0, 1.0, 4.0, 16.0])
    r = compare_attention_rank(q, k, scales, "scores", rtol=1e-2)
    s = graded_score_matrices(q, k, scales)
    for cond in ("ungraded", "graded", "graded_matched"):
        a = torch.softmax(s[cond], -1)
        assert r.attention[cond].effective_rank == pytest.approx(
            float(effective_rank(a).mean()))
        assert torch.equal(r.attention[cond].numerical_rank_per_matrix,
                           torch.linalg.matrix_rank(a, rtol=1e-2).double())
    assert r.frobenius["graded_matched"] == pytest.approx(r.frobenius["ungraded"])
    assert set(r.to_dict()) >= {"attention/graded_matched/effective_rank",
                                "scores/ungraded/frobenius"}


def test_attention_rank_of_a_model_has_one_comparison_per_layer(egt_lm, tokens):
    ranks = attention_rank(egt_lm, tokens)
    assert len(ranks) == 2
    for r in ranks.values():
        assert r.frobenius["graded_matched"] == pytest.approx(r.frobenius["ungraded"])
        assert r.frobenius["graded"] > r.frobenius["ungraded"]  # λ^q ≥ 1 with q > 0
        assert 1.0 <= r.attention["graded"].effective_rank <= 7.0


def test_attention_rank_of_an_ungraded_model_has_equal_conditions(tokens):
    torch.manual_seed(0)
    ranks = attention_rank(TransformerLM(tiny_config()), tokens)
    for r in ranks.values():
        assert r.attention["graded"].effective_rank == pytest.approx(
            r.attention["ungraded"].effective_rank)


def _effective_rank_by_hand(matrix):
    s = [x for x in torch.linalg.svdvals(matrix.double()).tolist() if x > 0]
    p = [x / sum(s) for x in s]
    return math.exp(-sum(x * math.log(x) for x in p))


@pytest.mark.parametrize("changes", [
    {"n_heads": 4, "n_kv_heads": 2},  # grouped-query keys: attention_rank used to crash
    {"attn_backend": "full", "attn_backend_options": {"scale": 0.9}},  # not 1/√d_k
    {"attn_backend": "sliding_window", "attn_backend_options": {"window": 2}},  # a pattern
], ids=["grouped-query", "backend scale", "sliding window"])
def test_graded_attention_rank_is_the_rank_of_the_maps_the_model_computes(changes, tokens):
    """The "graded" condition recomputes the layer's attention from its captured Q and K;
    it must be the attention the layer computes (its maps) in every configuration."""
    torch.manual_seed(0)
    model = TransformerLM(tiny_config(grading="exponential", grade_init="warm_start",
                                      grade_init_value=0.2, grades_per_head=True, **changes))
    ranks = attention_rank(model, tokens)
    maps = attention_maps(model, tokens)
    assert list(ranks) == list(maps)
    for name, w in maps.items():
        want = [_effective_rank_by_hand(w[b, h]) for b in range(w.shape[0])
                for h in range(w.shape[1])]
        got = ranks[name].attention["graded"].effective_rank_per_matrix.flatten().tolist()
        assert got == pytest.approx(want, rel=1e-4)


def test_random_study_reproduces_the_notes_numerical_check_of_001_prop_3_5():
    """notes/seeds_001_004 Part A, Prop 3.5: n=64, d_k=16, q = linspace(0, 2), 50 Gaussian
    draws. The notes' table (an independent numpy script): effective rank of S 14.86, 13.6,
    11.0; of softmax A 34.4, 36.2, 28.4; scale-matched A 34.4, 31.9, 26.9 for λ = 1, 2, 4."""
    study = random_rank_study()
    notes = {1.0: (14.86, 34.4, 34.4), 2.0: (13.6, 36.2, 31.9), 4.0: (11.0, 28.4, 26.9)}
    for lam, (s_rank, a_rank, matched) in notes.items():
        r = study[lam]
        assert r.scores["graded"].effective_rank == pytest.approx(s_rank, abs=0.3)
        assert r.attention["graded"].effective_rank == pytest.approx(a_rank, abs=0.6)
        assert r.attention["graded_matched"].effective_rank == pytest.approx(matched, abs=0.6)
    # what the control shows: at λ = 2 the raw graded rank rises (a temperature effect) but
    # the scale-matched rank falls below the ungraded one; at λ = 4 both fall.
    base = study[1.0].attention["ungraded"].effective_rank
    assert study[2.0].attention["graded"].effective_rank > base
    assert study[2.0].attention["graded_matched"].effective_rank < base
    assert study[4.0].attention["graded"].effective_rank < base


def _rank_by_loop(a: torch.Tensor, rtol: float) -> float:
    """#{σ_i > rtol·σ_1} from NumPy's float64 singular values, counted in a loop."""
    s = np.linalg.svd(a.double().numpy(), compute_uv=False)
    return float(sum(1 for x in s if x > rtol * s[0]))


@pytest.mark.parametrize("rtol", [np.float32(0.3), np.float64(0.3), torch.tensor(0.3),
                                  torch.tensor(0.3, dtype=torch.float64), 0.3],
                         ids=["np.float32", "np.float64", "tensor32", "tensor64", "float"])
def test_numerical_rank_takes_any_real_rtol(rtol):
    # a NumPy float32 or a 0-d tensor was refused by an isinstance(rtol, (int, float)) check
    a = torch.diag(torch.tensor([1.0, 0.5, 0.2, 1e-3]))
    assert numerical_rank(a, rtol).item() == _rank_by_loop(a, float(rtol)) == 2.0


@pytest.mark.parametrize(("rtol", "error", "message"), [
    (math.nan, ValueError, r"rtol must be a finite number, got nan"),
    (-0.1, ValueError, r"rtol must be a number in \(0, 1\), got -0\.1"),
    (np.float32(-0.5), ValueError, r"rtol must be a number in \(0, 1\), got -0\.5"),
    (torch.tensor(math.nan), ValueError, r"rtol must be a finite number, got nan"),
    (1.0, ValueError, r"rtol must be a number in \(0, 1\), got 1\.0"),
    (True, TypeError, r"rtol must be a number, got True \(bool\)"),
    (torch.tensor([0.1]), TypeError, r"rtol must be a number, got tensor"),
])
def test_numerical_rank_names_an_rtol_that_is_not_a_number_in_0_1(rtol, error, message):
    with pytest.raises(error, match=message):
        numerical_rank(torch.eye(2), rtol)
