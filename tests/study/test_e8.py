"""E8 (claims 11–17): the experiment runs in quick mode with one seed; the rank correlation it
uses for calibration is checked against a naive computation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from graded.study.core import Context
from graded.study.experiments._e_common import spearman
from graded.study.experiments.e8_morphic import MorphicExperiment, adder_run


@pytest.mark.slow  # a process or a whole run of tens of seconds: `pytest -m slow`
def test_morphic_experiment_quick_gives_findings_for_claims_11_to_17(tmp_path, check_findings):
    experiment = MorphicExperiment()
    findings = experiment.run(Context(out=tmp_path, quick=True, seeds=1, seeds_given=True))
    check_findings(findings, experiment, tmp_path, finite=False)
    by_claim = {f.claim: f for f in findings}
    # retrieval: the printed bound 1 − e^{−γ/σ²} is an exact statement checked cell by cell
    assert 0.0 <= by_claim["16"].estimate <= 1.0


def test_adder_run_measures_a_distractor_and_calibration_bins(tmp_path):
    run = adder_run("internal", 0, 30)
    assert run["calibration_bins"] == 10  # 44 tokens × 5 edges fill ten equal-count bins
    assert 0.0 <= run["held_routing"] <= 1.0 and 0.0 <= run["held_answer"] <= 1.0
    assert math.isfinite(run["ablation_distractor"])


def _naive_spearman(x, y) -> float:
    def ranks(v):
        return [sum(w < a for w in v) + (sum(w == a for w in v) - 1) / 2 for a in v]

    rx, ry = np.array(ranks(list(x))), np.array(ranks(list(y)))
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float((rx * ry).sum() / math.sqrt((rx * rx).sum() * (ry * ry).sum()))


def test_spearman_matches_a_naive_rank_correlation_with_ties():
    rng = np.random.default_rng(3)
    x = rng.integers(0, 5, size=12).astype(float)
    y = x + rng.normal(size=12)
    assert spearman(x, y) == pytest.approx(_naive_spearman(x, y), abs=1e-12)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))
    with pytest.raises(ValueError, match="equal-length"):
        spearman([1.0], [2.0])
