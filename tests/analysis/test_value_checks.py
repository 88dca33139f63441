"""Inputs that are not what the diagnostics measure are refused, naming the bad value."""

from __future__ import annotations

import math

import pytest
import torch
from analysis_helpers import tiny_config

from graded import TransformerClassifier
from graded.analysis import (
    attention_entropy,
    diagnose,
    effective_rank,
    grade_trajectories,
    js_divergence,
    model_feature_concentration,
    numerical_rank,
    uniform_early_mass,
)
from graded.analysis.rank import compare_attention_rank


def test_js_divergence_of_rows_that_are_not_distributions_is_refused():
    # [1, 1] and [2, 2] are not distributions; taken as they are, the "divergence" of [10, 0]
    # and [0, 10] would be 10·ln 2, past the bound ln 2 of the JS divergence
    with pytest.raises(ValueError, match=r"p must be distributions.*summing to 10"):
        js_divergence(torch.tensor([10.0, 0.0]), torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"r must be distributions.*summing to 4"):
        js_divergence(torch.tensor([0.5, 0.5]), torch.tensor([2.0, 2.0]))


def test_js_divergence_still_takes_distributions_and_masked_rows():
    # hand value: p = (1, 0), r = (½, ½), m = (¾, ¼): ½·ln(4/3) + ½·(½ ln(2/3) + ½ ln 2)
    want = 0.5 * math.log(4 / 3) + 0.25 * (math.log(2 / 3) + math.log(2))
    got = js_divergence(torch.tensor([[1.0, 0.0], [0.0, 0.0]], dtype=torch.float64),
                        torch.tensor([[0.5, 0.5], [0.0, 0.0]], dtype=torch.float64))
    assert got.tolist() == pytest.approx([want, 0.0], abs=1e-12)
    # bfloat16 softmax rows (sums off 1 by rounding) are distributions
    w = torch.softmax(torch.randn(8, 300, generator=torch.Generator().manual_seed(0)), -1)
    assert torch.isfinite(js_divergence(w.bfloat16(), w.flip(-1).bfloat16())).all()


def test_attention_entropy_of_rows_that_are_not_distributions_is_refused():
    # uniform weights 1/n have entropy ln n; rows of 1s would give 0 instead of ln n
    assert attention_entropy(torch.full((1, 4), 0.25)).item() == pytest.approx(math.log(4))
    with pytest.raises(ValueError, match=r"attention weights must be distributions.*summing "
                                         r"to 4 at index \(0,\)"):
        attention_entropy(torch.ones(1, 4))


@pytest.mark.parametrize("rank", [effective_rank, numerical_rank])
def test_ranks_of_a_matrix_with_an_infinite_entry_are_refused(rank):
    # an ∞ entry has no SVD: the ranks read 0 for a matrix with a nonzero entry
    with pytest.raises(ValueError, match=r"matrices must be finite.*inf"):
        rank(torch.tensor([[math.inf, 1.0], [0.0, 1.0]]))
    with pytest.raises(ValueError, match=r"matrices must be finite.*nan"):
        rank(torch.tensor([[math.nan, 1.0], [0.0, 1.0]]))


def test_compare_attention_rank_refuses_a_non_finite_scale_or_scales():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 4, 3, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 1, 4, 3, generator=gen, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"scale must be a finite number, got nan"):
        compare_attention_rank(q, k, torch.ones(3), scale=math.nan)
    with pytest.raises(ValueError, match=r"scale must be > 0, got -1"):
        compare_attention_rank(q, k, torch.ones(3), scale=-1.0)
    with pytest.raises(ValueError, match=r"scales must be finite.*nan"):
        compare_attention_rank(q, k, torch.tensor([1.0, math.nan, 2.0]))


def test_uniform_early_mass_refuses_a_causal_flag_that_is_not_a_bool():
    # hand values, T = 5, k = 1: k/T = 0.2 without a mask; mean over i = 1..4 of 1/(i+1) with one
    assert uniform_early_mass(5, 1, causal=False) == pytest.approx(0.2)
    assert uniform_early_mass(5, 1, causal=True) == pytest.approx((1/2 + 1/3 + 1/4 + 1/5) / 4)
    # "no" is truthy: it used to give the causal reference 0.3208 without a word
    with pytest.raises(TypeError, match=r"causal must be True or False, got 'no'"):
        uniform_early_mass(5, 1, causal="no")
    with pytest.raises(TypeError, match=r"length must be an int, got 5.0"):
        uniform_early_mass(5.0, 1, causal=True)


def test_grade_trajectories_name_the_steps_where_a_module_changes_its_number_of_grades():
    records = [{"step": 1, "grades": {"attn": [0.0, 0.5]}},
               {"step": 2, "grades": {"attn": [0.1, 0.6]}},
               {"step": 3, "grades": {"attn": [0.2, 0.7, 0.9]}}]
    with pytest.raises(ValueError, match=r"'attn' changes its number of grades between "
                                         r"snapshots: 2 at step 1, 3 at step 3"):
        grade_trajectories(records)
    # the steps that agree give a (steps, grades) series, steps in order
    t = grade_trajectories(records[1::-1])["attn"]
    assert t.steps.tolist() == [1, 2]
    assert t.grades.tolist() == [[0.0, 0.5], [0.1, 0.6]]


def test_feature_concentration_of_a_feature_model_measures_its_raw_features():
    # 000 Def 5.19 grades a feature model's raw features (F = 5) before the projection to
    # d_model = 16; the projection's output was measured instead (dim 16, graded twice)
    torch.manual_seed(0)
    model = TransformerClassifier(tiny_config(vocab_size=None, input_dim=5, grading="exponential",
                                              grade_init="warm_start", grade_init_value=0.3),
                                  num_outputs=3).double()
    grading = model.encoder.embed.input_grading.grading
    with torch.no_grad():
        grading.set_grades(torch.tensor([0.0, 0.2, 0.4, 0.6, 1.0], dtype=torch.float64))
    x = torch.randn(2, 4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    pad = torch.tensor([[True, False, False, False], [False, False, False, False]])
    got = model_feature_concentration(model, x, key_padding_mask=pad)
    s = grading.scales().detach()
    real = x[~pad]  # the 7 real tokens' raw features
    graded = [((s[4] * v[4]) ** 2 / (s * v).pow(2).sum()).item() for v in real]
    plain = [(v[4] ** 2 / v.pow(2).sum()).item() for v in real]
    assert (got.d_eff, got.dim) == (1, 5)
    assert got.high_grade_share == pytest.approx(sum(graded) / 7, rel=1e-12)
    assert got.ungraded_share == pytest.approx(sum(plain) / 7, rel=1e-12)


def test_a_feature_model_without_an_input_grading_has_no_concentration_to_measure():
    model = TransformerClassifier(tiny_config(vocab_size=None, input_dim=5, grading="exponential",
                                              grade_input=False), num_outputs=3)
    x = torch.randn(2, 4, 5, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"without an input grading \(config.grade_input is "
                                         r"False\)"):
        model_feature_concentration(model, x)
    report = diagnose(model, x, lipschitz_steps=1, n_random=1)
    assert not [key for key in report.metrics if key.startswith("concentration/")]
    assert report.metrics["entropy/mean"] >= 0.0
