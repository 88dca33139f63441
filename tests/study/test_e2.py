"""E2: the noise probe, the size split and the experiment's findings."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from graded.study.core import CLAIMS, Context
from graded.study.experiments.e2_robustness import (
    RobustnessExperiment,
    log_change_ratio,
    log_excess,
    output_change,
    size_split_data,
)


class Linear(nn.Module):
    """y = Σ_{t,f} w_f x_{t,f} over unpadded tokens."""

    def __init__(self, w: list[float]) -> None:
        super().__init__()
        self.w = torch.tensor(w)

    def forward(self, x, mask=None):
        keep = torch.ones(x.shape[:2]) if mask is None else (~mask).float()
        return ((x * self.w).sum(-1) * keep).sum(-1, keepdim=True)


def test_output_change_of_a_linear_model_against_a_direct_computation():
    x = torch.randn(6, 3, 4, generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(6, 3, dtype=torch.bool)
    mask[:, 2] = True
    model = Linear([1.0, 0.0, 2.0, 0.0])
    data = {"inputs": x, "key_padding_mask": mask}
    # the same noise the probe draws
    g = torch.Generator().manual_seed(9)
    noise = torch.zeros_like(x)
    noise[..., [0, 1]] = 0.5 * torch.randn(x[..., [0, 1]].shape, generator=g)
    noise = noise.masked_fill(mask[..., None], 0.0)
    expected = float((noise[..., 0] * 1.0).sum(-1).square().mean().sqrt())
    assert output_change(model, data, [0, 1], 0.5, seed=9) == pytest.approx(expected, rel=1e-5)
    # noise on features the model ignores changes nothing
    assert output_change(model, data, [1, 3], 0.5, seed=9) == 0.0
    with pytest.raises(ValueError, match="at least one feature column"):
        output_change(model, data, [], 0.5, seed=0)


def test_size_split_trains_short_and_tests_long():
    d = size_split_data(n_eval=50, pool=100)
    lengths = lambda s: (~s["key_padding_mask"]).sum(1)  # noqa: E731
    assert int(lengths(d.pool).max()) <= 6 and int(lengths(d.val).max()) <= 6
    assert int(lengths(d.test).min()) >= 7
    assert d.pool["inputs"].shape[1] == d.test["inputs"].shape[1] == 8


@pytest.mark.slow  # a process or a whole run of tens of seconds: `pytest -m slow`
def test_e2_runs_and_reports_its_claims(tmp_path):
    ctx = Context(out=tmp_path, quick=True, seeds=1, seeds_given=True)
    findings = RobustnessExperiment().run(ctx)
    assert {f.claim for f in findings} == {"3", "6", "000-R"}
    assert all(f.claim in CLAIMS and f.seeds >= 1 for f in findings)
    lip = next(f for f in findings if f.claim == "3")
    assert math.isfinite(lip.estimate)
    assert (tmp_path / "e2_noise.png").exists() and (tmp_path / "section.md").exists()


def test_the_lipschitz_bounds_are_read_per_model_not_as_a_mean(tmp_path):
    """The full study's claim-3 ratios (docs/study/report.md, E2 table): two EGT models lie
    above λ^{q_max} although the mean of log(ratio/λ^{q_max}) is well below 0. A bound that some
    model's estimate exceeds must not be reported as holding."""
    table = {0: (1.026, 8.00, 4.528, 4.34), 1: (2.717, 8.00, 3.751, 5.63),
             2: (3.889, 8.00, 2.988, 5.49), 3: (3.372, 8.00, 3.068, 5.86),
             4: (6.138, 8.00, 6.591, 6.24)}
    rows = []
    for seed, (r_fa, f_fa, r_egt, f_egt) in table.items():
        for arm in ("none", "fixed_aligned", "twin", "egt"):
            row = {"seed": seed, "arm": arm, "test": 0.2, "low": 0.04, "high": 0.4,
                   "size_split_test": 0.3}
            if arm in ("fixed_aligned", "egt"):
                r, f = (r_fa, f_fa) if arm == "fixed_aligned" else (r_egt, f_egt)
                row.update(lipschitz_ratio=r, factor_3_7=f, factor_5_12=1e4)
            rows.append(row)
    ctx = Context(out=tmp_path, quick=True, seeds=5, seeds_given=True)
    findings = RobustnessExperiment()._findings(ctx, rows, list(table), 800, {"steps": 300})
    claim3 = next(f for f in findings if f.claim == "3")
    assert claim3.verdict == "inconclusive"
    assert claim3.estimate == pytest.approx(math.log(6.591 / 6.24))
    claim6 = next(f for f in findings if f.claim == "6")
    assert claim6.verdict == "holds" and claim6.estimate < 0


def test_log_change_ratio_spells_out_zero_changes():
    assert log_change_ratio(0.5, 2.0) == pytest.approx(math.log(0.25))
    assert log_change_ratio(0.0, 2.0) == -math.inf
    assert log_change_ratio(2.0, 0.0) == math.inf
    assert math.isnan(log_change_ratio(0.0, 0.0))
    assert math.isnan(log_change_ratio(math.nan, 1.0))
    with pytest.raises(ValueError, match="RMS values >= 0"):
        log_change_ratio(-1.0, 1.0)


def test_a_model_whose_output_does_not_change_is_left_out_and_counted(tmp_path):
    """A graded model whose output ignores the low-grade features (change 0) gave log(0), and
    an unchanged ungraded output a division by 0: the study stopped. Such seeds are left out of
    the interval, and the detail says how many and in which direction."""
    low = {0: (0.0, 0.2, 0.3, 0.1), 1: (0.1, 0.2, 0.2, 0.3), 2: (0.05, 0.0, 0.1, 0.2),
           3: (0.1, 0.4, 0.2, 0.2)}  # (egt, none, fixed_aligned, twin) per seed
    rows = []
    for seed, changes in low.items():
        for arm, change in zip(("egt", "none", "fixed_aligned", "twin"), changes):
            row = {"seed": seed, "arm": arm, "test": 0.2, "low": change, "high": 0.4,
                   "size_split_test": 0.3}
            if arm in ("fixed_aligned", "egt"):
                row.update(lipschitz_ratio=2.0, factor_3_7=8.0, factor_5_12=1e4)
            rows.append(row)
    ctx = Context(out=tmp_path, quick=True, seeds=4, seeds_given=True)
    findings = RobustnessExperiment()._findings(ctx, rows, list(low), 800, {"steps": 300})
    egt = findings[0]
    assert egt.quantity.startswith("log(output change EGT")
    # seed 0: graded unchanged (−∞), seed 2: ungraded unchanged (+∞); the mean of the others
    assert egt.estimate == pytest.approx((math.log(0.1 / 0.2) + math.log(0.1 / 0.4)) / 2)
    assert egt.seeds == 2
    assert ("2 of 4 seeds whose log ratio is −∞ (graded output unchanged): 1, "
            "+∞ (control output unchanged): 1") in egt.detail
    aligned = findings[1]  # fixed-aligned / ungraded: seed 2's ungraded change is 0
    assert aligned.seeds == 3 and "+∞ (control output unchanged): 1" in aligned.detail
    twin = findings[2]  # no zero change: nothing left out
    assert twin.seeds == 4 and "Left out" not in twin.detail


def test_log_excess_of_a_ratio_over_a_bound_factor():
    assert log_excess(2.0, 8.0) == pytest.approx(math.log(0.25))
    assert log_excess(0.0, 8.0) == -math.inf  # a graded constant of 0 lies within the bound
    assert log_excess(3.0, math.inf) == -math.inf
    assert log_excess(math.inf, 8.0) == math.inf
    assert math.isnan(log_excess(math.nan, 8.0)) and math.isnan(log_excess(math.inf, math.inf))


def test_a_model_whose_lipschitz_ratio_was_not_measured_leaves_the_bound_unchecked(tmp_path):
    """A NaN ratio was dropped before the bound was read, so the other models' "holds" stood
    for every model. The bound is about every model: one not measured makes it inconclusive;
    a measured ratio of 0 lies within the bound and counts."""
    rows = []
    for seed, (r_fa, r_egt) in enumerate([(2.0, math.nan), (1.5, 0.0)]):
        for arm in ("none", "fixed_aligned", "twin", "egt"):
            row = {"seed": seed, "arm": arm, "test": 0.2, "low": 0.1, "high": 0.4,
                   "size_split_test": 0.3}
            if arm in ("fixed_aligned", "egt"):
                row.update(lipschitz_ratio=r_fa if arm == "fixed_aligned" else r_egt,
                           factor_3_7=8.0, factor_5_12=1e4)
            rows.append(row)
    ctx = Context(out=tmp_path, quick=True, seeds=2, seeds_given=True)
    findings = RobustnessExperiment()._findings(ctx, rows, [0, 1], 800, {"steps": 300})
    claim3 = next(f for f in findings if f.claim == "3")
    assert claim3.verdict == "inconclusive" and claim3.seeds == 3
    assert claim3.estimate == pytest.approx(math.log(2.0 / 8.0))
    assert "1 model(s) not measured (NaN)" in claim3.detail
