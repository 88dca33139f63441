"""E9's per-instance checks (claims 9, 10, 18, 19, 22): an instance whose comparison involves a
NaN could not be measured. It is no counterexample (a comparison with NaN is False, which read
every unmeasured instance as a violation) and no success either (claim 22's "no shortfall" was
the negation of a NaN comparison): with no measured counterexample the check is inconclusive."""

from __future__ import annotations

import math

import pytest
import torch

from graded.study.experiments import _e9_utility as utility
from graded.study.experiments.e9_numerics import _fraction


def _fraction_verdict(holds) -> str:
    return _fraction("9", "fraction", "control", holds, "", seed=0).verdict


@pytest.fixture
def nan_utilities(monkeypatch):
    """The library's exact utilities replaced by NaN of the right shape (N, |E|)."""
    def nan(z, candidates, edges, space, weight, bias, targets, attach="all"):
        return torch.full((z.shape[0], z.shape[1], len(candidates)), math.nan,
                          dtype=torch.float64)

    monkeypatch.setattr(utility, "exact_utilities", nan)


def test_outcome_is_one_zero_or_nan_as_a_hand_made_table():
    ok = torch.tensor([True, False, True, False])
    value = torch.tensor([0.0, 1.0, math.nan, math.nan])
    got = utility.outcome(ok, value)
    assert got[:2] == [1.0, 0.0] and math.isnan(got[2]) and math.isnan(got[3])
    assert utility.outcome(True, 0.5) == [1.0]
    assert math.isnan(utility.outcome(False, math.nan)[0])
    assert utility.count_holding([1.0, 0.0, math.nan, 1.0]) == 2


@pytest.mark.parametrize(("check", "n"), [(utility.check_utility_bounds, 1),
                                          (utility.check_first_order, 1),
                                          (utility.check_usefulness, 1)])
def test_checks_with_unmeasured_utilities_are_inconclusive_not_failed(nan_utilities, check, n):
    r = check(torch.Generator().manual_seed(0), n)
    assert r["holds"] and all(math.isnan(h) for h in r["holds"])
    f = _fraction("9", "fraction", "control", r["holds"], "", seed=0)
    assert f.verdict == "inconclusive" and f.seeds == 0
    assert f"{len(r['holds'])}/{len(r['holds'])} instances could not be measured" in f.detail


def test_chain_states_with_unmeasured_utilities_are_not_counted_as_holding(nan_utilities):
    r = utility.check_chain(torch.Generator().manual_seed(0), 1)
    # the experiment's claim-22 list: generic states and states with z^(b) = 0
    holds = r["holds"] + r["zero_b_holds"]
    assert len(holds) == 32 and all(math.isnan(h) for h in holds)
    assert _fraction_verdict(holds) == "inconclusive"


def test_selectivity_with_an_unmeasured_routing_mass_is_inconclusive(monkeypatch):
    def nan_probabilities(self, logits):
        return torch.full_like(logits, math.nan)

    monkeypatch.setattr(utility.Router, "probabilities", nan_probabilities)
    r = utility.check_selectivity(torch.Generator().manual_seed(0), 3)
    assert len(r["holds"]) == 3 and all(math.isnan(h) for h in r["holds"])
    assert _fraction_verdict(r["holds"]) == "inconclusive"


def test_a_measured_counterexample_fails_whatever_the_unmeasured_instances():
    assert _fraction_verdict([1.0, 0.0, math.nan]) == "fails"
    assert _fraction_verdict([1.0, math.nan, 1.0]) == "inconclusive"
    assert _fraction_verdict([1.0, 1.0]) == "holds"
    f = _fraction("9", "fraction", "control", [1.0, 0.0, math.nan, 1.0], "", seed=0)
    assert f.seeds == 3 and f.estimate == pytest.approx(2 / 3)  # over the measured three
    assert "1/4 instances could not be measured" in f.detail
