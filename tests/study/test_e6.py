"""E6 (claims 6, 7): the experiment runs in quick mode; its Jacobians and grade gradients are
checked against closed forms and finite differences."""

from __future__ import annotations

import math

import pytest
import torch
from torch.autograd.functional import jacobian
from torch.nn import functional as F

from graded.grading import ExponentialGrading
from graded.study.core import Context
from graded.study.experiments._e_common import (
    IGNORE,
    equivalence_verdict,
    lag_copy_batch,
    tiny_lm,
)
from graded.study.experiments.e6_gradients import (
    GradientsExperiment,
    _set_grading,
    grade_gradient_norm,
    jacobian_bound_ratios,
)
from graded.transformer.graded import GradedFeatures


def test_gradients_experiment_quick_gives_findings_for_claims_6_and_7(tmp_path, check_findings):
    experiment = GradientsExperiment()
    findings = experiment.run(Context(out=tmp_path, quick=True, seeds=1, seeds_given=True))
    check_findings(findings, experiment, tmp_path)


def test_grading_jacobian_ratio_is_exactly_one_lemma_4_3():
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        ratios = jacobian_bound_ratios(gen)
        assert ratios["lemma_4_3_grading"] == pytest.approx(1.0, abs=1e-12)
        assert ratios["thm_4_6_score"] == pytest.approx(ratios["score_printed"] / math.sqrt(2))


def test_normalized_input_jacobian_matches_the_closed_form():
    q = torch.tensor([0.0, 0.5, 1.0, 2.0], dtype=torch.float64)
    grading = ExponentialGrading(4, q, base=3.0, dtype=torch.float64)
    x = torch.tensor([0.7, -1.2, 0.4, 0.9], dtype=torch.float64)
    m = torch.diag(3.0 ** q)
    u = m @ x
    y = u / u.norm()
    closed = (torch.eye(4, dtype=torch.float64) - torch.outer(y, y)) @ m / u.norm()
    auto = jacobian(GradedFeatures(grading, normalize=True), x)
    assert torch.allclose(auto, closed, atol=1e-12)


def test_grade_gradient_norm_matches_central_finite_differences():
    model = tiny_lm(0, grading="exponential", learnable_grades=True, grade_init="zeros",
                    n_layers=1).double()
    ids, targets = lag_copy_batch(4, 8, 16, 2, torch.Generator().manual_seed(1))
    auto = grade_gradient_norm(model, ids, targets, 2.0, 1.0)
    params = _set_grading(model, 2.0, 1.0)

    def loss() -> float:
        with torch.no_grad():
            return float(F.cross_entropy(model(ids).flatten(0, 1), targets.flatten(),
                                         ignore_index=IGNORE))

    # central differences; forward ones at q = 0, where grades cannot go below 0
    h, total, center = 1e-6, 0.0, loss()
    for p in params:
        flat = p.data.view(-1)
        for i in range(flat.numel()):
            keep = float(flat[i])
            flat[i] = keep + h
            up = loss()
            if keep - h >= 0:
                flat[i] = keep - h
                slope = (up - loss()) / (2 * h)
            else:
                slope = (up - center) / h
            flat[i] = keep
            total += slope**2
    assert auto == pytest.approx(math.sqrt(total), rel=1e-4)


def test_equivalence_verdict_reads_an_interval_against_a_band():
    assert equivalence_verdict(0.9, 1.1, 0.8, 1.25) == "holds"
    assert equivalence_verdict(1.3, 1.5, 0.8, 1.25) == "fails"
    assert equivalence_verdict(1.0, 1.5, 0.8, 1.25) == "inconclusive"
    assert equivalence_verdict(float("nan"), 1.0, 0.8, 1.25) == "inconclusive"


@pytest.mark.parametrize("nan_at", [0, 3])
def test_a_ratio_that_is_nan_makes_claim_6_inconclusive_wherever_it_falls(nan_at, tmp_path,
                                                                          monkeypatch):
    """Python's ``max`` keeps a NaN in first place and drops it elsewhere: a NaN ratio made
    claim 6 "fails" or vanished from its worst ratio, by its position."""
    import graded.study.experiments.e6_gradients as e6

    calls = []

    def ratios(gen):
        out = jacobian_bound_ratios(gen)
        if len(calls) == nan_at:
            out["lemma_4_3_grading"] = math.nan
        calls.append(1)
        return out

    monkeypatch.setattr(e6, "jacobian_bound_ratios", ratios)
    finding = GradientsExperiment()._jacobians(Context(out=tmp_path, quick=True, seeds=1,
                                                       seeds_given=True))
    assert finding.verdict == "inconclusive" and math.isnan(finding.estimate)
