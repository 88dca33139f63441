"""E9 (claims 9, 10, 18–28): the experiment runs in quick mode; the independent computations
inside it (KL identity, Gibbs optimiser, simplex projection, Hessian, counts, chain example) are
checked against second computations."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from graded.morphic.banded import BandedBlocks
from graded.morphic.state import Grade, GradedStateSpace
from graded.study.core import Context
from graded.study.experiments import _e9_structure as structure
from graded.study.experiments import _e9_utility as utility
from graded.study.experiments.e9_numerics import NumericsExperiment, additivity_finding

DT = torch.float64




def test_numerics_experiment_quick_gives_findings_for_its_thirteen_claims(tmp_path, check_findings):
    experiment = NumericsExperiment()
    findings = experiment.run(Context(out=tmp_path, quick=True, seeds=1))
    check_findings(findings, experiment, tmp_path)


def test_kl_identity_sides_agree_with_a_per_target_loop():
    gen = torch.Generator().manual_seed(0)
    inst = utility.Instance(gen, n=3)
    cand = torch.randn(3, utility.D, generator=gen, dtype=DT)
    target = torch.softmax(torch.randn(3, utility.V, generator=gen, dtype=DT), -1)
    expected, kl_side = utility.kl_identity_sides(inst, cand, target)
    z_plus = inst.z.clone()
    z_plus[:, inst.slot("c")] = cand
    loop = torch.zeros(3, dtype=DT)
    for t in range(3):
        for y in range(utility.V):
            yy = torch.tensor([y])
            before = utility.loss_per_token(inst.weight, inst.bias, inst.z[t:t + 1], yy)
            after = utility.loss_per_token(inst.weight, inst.bias, z_plus[t:t + 1], yy)
            loop[t] += target[t, y] * (before - after)[0]
    assert torch.allclose(expected, loop, atol=1e-12)
    assert torch.allclose(kl_side, loop, atol=1e-12)


def test_gibbs_optimiser_finds_the_closed_form_softmax():
    gain = np.array([0.3, -0.2, 0.9, 0.1, -2.5])
    for temperature in (0.1, 0.25, 1.0, 3.0):
        closed = np.exp(gain / temperature) / np.exp(gain / temperature).sum()
        found = structure.gibbs_by_pairwise_ascent(gain, temperature)
        assert np.allclose(found, closed, atol=1e-7)
        value = structure.gibbs_objective(found, gain, temperature)
        # the optimum value is T·log Σ exp(gain/T)
        assert value == pytest.approx(temperature * np.log(np.exp(gain / temperature).sum()),
                                      abs=1e-12)


def test_hessian_helper_matches_autograd():
    gen = torch.Generator().manual_seed(2)
    w_h = torch.randn(utility.V, utility.D, generator=gen, dtype=DT)
    rest = torch.randn(utility.V, generator=gen, dtype=DT)
    x = torch.randn(utility.D, generator=gen, dtype=DT)
    y = torch.tensor(3)

    def loss(v):
        return F.cross_entropy((w_h @ v + rest)[None], y[None])

    auto = torch.autograd.functional.hessian(loss, x)
    p = torch.softmax(w_h @ x + rest, -1)
    assert torch.allclose(utility._hessian(w_h, p), auto, atol=1e-12)


def test_counts_follow_the_worked_example_of_prop_2_14():
    space = GradedStateSpace([Grade(f"g{i}", 5, i) for i in range(4)])
    blocks = BandedBlocks(space, (-1, 0, 1))
    assert sum(p.numel() for p in blocks.parameters()) == 3 * 5 * 5
    assert len(blocks.edge_set) == 3 + 4 + 3  # shifts −1, 0, +1 inside four grades
    assert structure.check_counts(d=3, tokens=4)["exact"]


def test_chain_shortfall_without_cross_term_in_a_worked_example():
    # z^(b) = 0: step 1 writes A₁z^(a) into b, step 2 then copies it into c, where the readout
    # punishes it; each step alone at z helps or is neutral, the path hurts.
    gen = torch.Generator().manual_seed(0)
    inst = utility.Instance(gen, n=1)
    inst.z.zero_()
    inst.z[0, :utility.D] = 1.0
    inst.y = torch.tensor([0])
    w = torch.zeros(utility.V, 3 * utility.D, dtype=DT)
    w[0, utility.D:2 * utility.D] = 1.0   # b votes for the target
    w[1, 2 * utility.D:] = 3.0            # c votes against it
    inst.weight, inst.bias = w, torch.zeros(utility.V, dtype=DT)
    eye = torch.eye(utility.D, dtype=DT)
    path, total, cross = utility.chain_terms(inst, eye, eye)
    assert float(cross) == 0.0
    assert float(total - path) > 0.5  # Σ step utilities exceeds the path utility


def test_an_additivity_gap_near_zero_is_cut_at_zero_and_holds():
    # relative gaps abs(·)/abs(·) ≥ 0 with one far instance: the t interval of the mean
    # (mean 0.012, s = 0.0213, 4 df: half-width 2.776 · 0.0213/√5 = 0.0264) reaches below 0,
    # which no gap can; uncut, the band [0, 0.05] read [−0.014, 0.038] as inconclusive
    gaps = [0.001, 0.002, 0.003, 0.004, 0.05]
    mean = sum(gaps) / 5
    s = (sum((g - mean) ** 2 for g in gaps) / 4) ** 0.5
    assert mean - 2.7764451051977987 * s / 5 ** 0.5 < 0
    f = additivity_finding({"orthogonal": gaps, "control": [0.2, 0.3, 0.25]}, seed=0)
    assert f.low == 0.0 and f.high == pytest.approx(mean + 2.7764451051977987 * s / 5 ** 0.5)
    assert f.verdict == "holds" and "cut to the quantity's range [0, inf]" in f.detail
