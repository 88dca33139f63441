"""A comparison whose runs all diverged cannot be tested, but it was made: it stays in its Holm
family with p counted as 1 (docs/study.md), so the other comparisons are corrected for it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from graded.study.core import Context
from graded.study.experiments import e1_sample_efficiency as e1
from graded.study.learning import TASKS, arms_for


def test_a_comparison_whose_runs_all_diverged_still_counts_in_the_per_size_family():
    # aligned − none differs by [0.1, 0.3, 0.2, −0.02, 0.25] over 5 seeds: two-sided paired
    # t-test p = 0.043715 (scipy.stats.ttest_1samp). Alone in its family it would be rejected
    # at 0.05; beside an untested comparison (m = 2) Holm needs p ≤ 0.025, so it is not.
    diffs = [0.1, 0.3, 0.2, -0.02, 0.25]
    none = {s: 1.0 for s in range(5)}
    curves = {("poly_e5", "none"): {100: none},
              ("poly_e5", "fixed_aligned"): {100: {s: 1.0 + d for s, d in enumerate(diffs)}},
              ("poly_e5", "fixed_reversed"): {100: {s: math.inf for s in range(5)}}}
    family = e1.per_size_family({"tasks": ["poly_e5"], "sizes": [100]}, curves)
    by = {(f["arm"], f["control"]): f for f in family}
    assert set(by) == {("fixed_aligned", "none"), ("fixed_aligned", "fixed_reversed")}
    tested, untested = by[("fixed_aligned", "none")], by[("fixed_aligned", "fixed_reversed")]
    assert tested["p"] == pytest.approx(0.04371540576222025, abs=1e-12)
    assert math.isnan(untested["p"]) and untested["diffs"] == [] and not untested["holm"]
    assert tested["holm"] is False


def test_the_aulc_family_keeps_a_comparison_whose_arm_diverged_on_every_seed(tmp_path,
                                                                            monkeypatch):
    captured = {}
    monkeypatch.setattr(e1.SampleEfficiencyExperiment, "_plots", staticmethod(lambda *a: []))
    monkeypatch.setattr(e1.SampleEfficiencyExperiment, "_section",
                        staticmethod(lambda ctx, b, curves, family, *rest:
                                     captured.setdefault("family", family)))
    ctx = Context(out=tmp_path, quick=True, seeds=2)
    exp = e1.SampleEfficiencyExperiment()
    rng = np.random.default_rng(0)
    results = {}
    for job in exp.plan(ctx, 1, {}):
        diverged = job["task"] == "poly_e5" and job["arm"] == "fixed_reversed"
        first = float(rng.uniform(1.0, 2.0))
        results[job["key"]] = {**job, "val": 0.5,
                               "test": math.inf if diverged else float(rng.uniform(0.2, 1.0)),
                               "train_first": first, "train_last": first * 0.5,
                               "diverged": diverged}
    findings = exp.summarise(ctx, results)
    family = captured["family"]
    made = [(t, a, c) for t in e1.budget(True)["tasks"]
            for a, c in e1.comparisons(t, arms_for(TASKS[t]))]
    assert [(f["task"], f["arm"], f["control"]) for f in family] == made
    (gone,) = [f for f in family if f["task"] == "poly_e5" and f["control"] == "fixed_reversed"]
    assert math.isnan(gone["p"]) and gone["holm"] is False
    row = next(f for f in findings if f.quantity.endswith("fixed aligned − fixed reversed"))
    assert "poly_e5 not tested" in row.detail
