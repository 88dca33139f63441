"""Feature concentration of 000 Lemma 5.7, on hand-made vectors."""

from __future__ import annotations

import math

import pytest
import torch
from analysis_helpers import tiny_config

from graded import TransformerLM
from graded.analysis import feature_concentration, model_feature_concentration


def test_two_feature_example_by_hand():
    # x = (1, 1), M = diag(2, 1), grades (1, 0): ‖Mx‖² = 5.
    r = feature_concentration(torch.tensor([[1.0, 1.0]]), torch.tensor([2.0, 1.0]),
                              torch.tensor([1.0, 0.0]))
    assert r.d_eff == 1 and r.dim == 2
    assert r.high_grade_share == pytest.approx(4 / 5)
    assert r.ungraded_share == pytest.approx(1 / 2)
    # Lemma 5.7's inequality for j = 1: c_1 = 1/√5 ≈ 0.447 > (1/2)(1/√2) ≈ 0.354: fails
    assert 1 / math.sqrt(5) > 0.5 / math.sqrt(2)
    assert r.lemma_bound_fraction == 0.0


def test_lemma_inequality_holds_on_vectors_supported_on_the_top_feature():
    x = torch.tensor([[3.0, 0.0, 0.0], [-1.0, 0.0, 0.0]])
    r = feature_concentration(x, torch.tensor([4.0, 2.0, 1.0]), torch.tensor([3.0, 1.0, 0.0]))
    assert r.lemma_bound_fraction == 1.0
    assert r.high_grade_share == 1.0 and r.ungraded_share == 1.0


def test_delta_widens_the_high_grade_set():
    x = torch.ones(1, 3)
    s, q = torch.tensor([3.0, 2.0, 1.0]), torch.tensor([2.0, 1.0, 0.0])
    assert feature_concentration(x, s, q, delta=1.0).d_eff == 2
    assert feature_concentration(x, s, q, delta=1.0).high_grade_share == pytest.approx(13 / 14)


def test_feature_concentration_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="scales"):
        feature_concentration(torch.ones(2, 3), torch.ones(2), torch.ones(2))


def test_model_feature_concentration_uses_the_input_grading(tokens):
    torch.manual_seed(0)
    model = TransformerLM(tiny_config(grading="linear", grade_init="warm_start",
                                      grade_init_value=0.5))
    r = model_feature_concentration(model, tokens)
    x = model.decoder.embed.tokens(tokens)
    g = model.feature_grading
    want = feature_concentration(x, g.scales(), g.grades)
    assert r == want
    assert r.high_grade_share > r.ungraded_share  # the top feature has the largest scale
    with pytest.raises(ValueError, match="no feature grading"):
        model_feature_concentration(TransformerLM(tiny_config()), tokens)


def test_vectors_the_grading_maps_to_zero_are_skipped_not_nan():
    # LGT with f = identity gives scale 0 at grade 0: x = e_0 has M x = 0 and no shares
    x = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    scales = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64)
    grades = scales.clone()
    fc = feature_concentration(x, scales, grades)
    assert fc.high_grade_share == pytest.approx(4.0 / 5.0)  # of the second vector only
    assert fc.ungraded_share == pytest.approx(1.0 / 3.0)
    with pytest.raises(ValueError, match="M x ≠ 0"):
        feature_concentration(x[:1], scales, grades)
