"""E3 (claim 1): the experiment runs in quick mode, and its random-instance differences match an
independent NumPy computation of softmax attention ranks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from graded.study.core import Context
from graded.study.experiments.e3_rank import BASES, RankExperiment, random_rank_differences


def test_rank_experiment_quick_gives_one_well_formed_finding(tmp_path, check_findings):
    experiment = RankExperiment()
    findings = experiment.run(Context(out=tmp_path, quick=True, seeds=1))
    check_findings(findings, experiment, tmp_path)
    assert "scale-matched" in findings[0].quantity


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
