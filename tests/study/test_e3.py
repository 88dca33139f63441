"""E3 (claim 1): the experiment runs in quick mode and reports the random instances and the
trained models as two findings, each with its own replicates; its random-instance differences
match an independent NumPy computation of softmax attention ranks, and each finding's estimate
and interval are those of its own population alone."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from graded.study.core import Context
from graded.study.experiments.e3_rank import BASES, RankExperiment, random_rank_differences
from graded.study.statistics import mean_interval


@pytest.mark.slow  # the quick experiment (4 s on 2 cores): `pytest -m slow`
def test_rank_experiment_reports_random_and_trained_populations_as_separate_findings(
    tmp_path, check_findings, monkeypatch
):
    """Claim 1 twice: the random instances first (the summary row; replicates: the 16 quick
    draws), then the trained models (replicates: the 2 quick seeds). Each estimate and interval
    is recomputed from that population's values alone; pooled, the 16 draws outweighed the 2
    seeds and one finding with 18 replicates stood for both."""
    import graded.study.experiments.e3_rank as e3

    seen: dict[str, tuple] = {}
    real = e3.finding_from_values

    def spy(**kw):
        seen[kw["quantity"]] = (list(kw["values"]), list(kw["clusters"]))
        return real(**kw)

    monkeypatch.setattr(e3, "finding_from_values", spy)
    experiment = RankExperiment()
    findings = experiment.run(Context(out=tmp_path, quick=True, seeds=1))
    check_findings(findings, SimpleNamespace(name=experiment.name, claims=("1", "1")),
                   tmp_path)
    random, trained = findings
    assert "scale-matched" in random.quantity and "scale-matched" in trained.quantity
    assert "random Gaussian Q, K" in random.quantity
    assert "trained EGT language models" in trained.quantity
    assert random.seeds == 16 and trained.seeds == 2  # quick: 16 draws, 2 models
    assert "summary row" in random.detail and "first finding" in trained.detail
    assert random.figures == trained.figures == ["e3_rank.png"]
    # the random population: the quick study's draws, recomputed independently of the run
    rows, _ = random_rank_differences(n=32, trials=16, seed=0)
    values, clusters = seen[random.quantity]
    assert values == rows["eff_matched"]
    assert clusters == [f"draw {t}" for _ in BASES for t in range(16)]
    # the trained population: its own (seed, layer) instances, two layers per seed
    t_values, t_clusters = seen[trained.quantity]
    assert t_clusters == ["seed 0", "seed 0", "seed 1", "seed 1"]
    for finding, (vals, labels) in ((random, (values, clusters)),
                                    (trained, (t_values, t_clusters))):
        iv = mean_interval(vals, labels, seed=0)
        assert finding.estimate == pytest.approx(float(np.mean(vals)), abs=1e-12)
        assert (finding.low, finding.high) == pytest.approx((iv.low, iv.high), abs=1e-12)


def _np_effective_rank(a: np.ndarray) -> float:
    s = np.linalg.svd(a, compute_uv=False)
    p = s / s.sum()
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


def _np_softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_random_rank_differences_match_a_numpy_recomputation():
    n, d_k, trials, seed = 12, 16, 3, 7
    rows, _ = random_rank_differences(n=n, trials=trials, seed=seed)
    gen = torch.Generator().manual_seed(seed)  # the draws of random_rank_study, in its order
    q = torch.randn(trials, 1, n, d_k, generator=gen, dtype=torch.float64).numpy()[:, 0]
    k = torch.randn(trials, 1, n, d_k, generator=gen, dtype=torch.float64).numpy()[:, 0]
    grades = np.linspace(0.0, 2.0, d_k)
    expected_matched, expected_raw = [], []
    for lam in BASES:
        for t in range(trials):
            s0 = q[t] @ k[t].T / math.sqrt(d_k)
            sg = (q[t] * lam ** grades) @ k[t].T / math.sqrt(d_k)
            sm = sg * np.linalg.norm(s0) / np.linalg.norm(sg)
            base = _np_effective_rank(_np_softmax(s0))
            expected_matched.append(_np_effective_rank(_np_softmax(sm)) - base)
            expected_raw.append(_np_effective_rank(_np_softmax(sg)) - base)
    assert rows["eff_matched"] == pytest.approx(expected_matched, abs=1e-9)
    assert rows["eff_raw"] == pytest.approx(expected_raw, abs=1e-9)
    assert len(rows["matched"]) == len(BASES) * trials
