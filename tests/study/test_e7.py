"""E7: timing of graded vs ungraded passes and the verdict against the 10% margin."""

from __future__ import annotations

import math

import pytest
import torch

import graded.study.experiments.e7_overhead as e7
from graded.study.core import Context, verdict


def test_time_pass_times_a_forward_and_backward_and_clears_gradients():
    model = e7._model(16, 1, 2, 9, graded=True)
    ids = torch.randint(0, 64, (2, 9))
    assert e7.time_pass(model, ids, 2) > 0
    assert all(p.grad is None for p in model.parameters())


def test_graded_and_ungraded_models_differ_only_by_grading_parameters():
    plain, graded = e7._model(16, 1, 2, 9, False), e7._model(16, 1, 2, 9, True)
    extra = {n for n, _ in graded.named_parameters()} - {n for n, _ in plain.named_parameters()}
    assert extra and all("grad" in n for n in extra)  # grades (and nothing else) are added
    assert graded.config.grades_per_head and graded.config.grade_position_alpha > 0


def test_e7_finding_follows_the_margin_rule(tmp_path, monkeypatch):
    monkeypatch.setattr(e7, "SIZES", ((16, 1, 2, 8, 2), (16, 1, 2, 8, 2)))
    (f,) = e7.OverheadExperiment().run(Context(out=tmp_path, quick=True, seeds=1))
    assert f.claim == "8" and f.seeds == 12  # 6 rounds × 2 sizes
    assert f.verdict == verdict(f.low - e7.MARGIN, f.high - e7.MARGIN, predicted="negative")
    assert (tmp_path / "section.md").read_text().count("| 16 |") == 2


def test_overhead_is_the_geometric_mean_ratio_and_the_margin_rule_by_hand():
    # ratios 1.02 and 1.08: geometric mean sqrt(1.02 · 1.08) − 1; two rounds give the t
    # interval of 1 degree of freedom (Cauchy quantile tan(0.475π) = 12.7), far wider than
    # the bootstrap's [2%, 8%]
    logs = [math.log(1.02), math.log(1.08)]
    est, lo, hi = e7._overhead(logs)
    assert est == pytest.approx(math.sqrt(1.02 * 1.08) - 1)
    half = math.tan(0.475 * math.pi) * abs(logs[1] - logs[0]) / 2
    assert (lo, hi) == pytest.approx((math.exp(sum(logs) / 2 - half) - 1,
                                      math.exp(sum(logs) / 2 + half) - 1))
    assert verdict(lo - e7.MARGIN, hi - e7.MARGIN, predicted="negative") == "inconclusive"
    _, lo, hi = e7._overhead([math.log(r) for r in (1.02, 1.03, 1.04, 1.05, 1.06)])
    assert verdict(lo - e7.MARGIN, hi - e7.MARGIN, predicted="negative") == "holds"
    _, lo, hi = e7._overhead([math.log(r) for r in (1.3, 1.35, 1.4, 1.45, 1.5)])
    assert verdict(lo - e7.MARGIN, hi - e7.MARGIN, predicted="negative") == "fails"
