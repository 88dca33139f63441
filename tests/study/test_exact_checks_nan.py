"""An exact check whose deviation could not be measured (NaN) gives no verdict: it neither
passes because Python's max dropped the NaN, nor fails."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from graded.study.experiments import _e9_structure as structure
from graded.study.experiments import e9_numerics
from graded.study.experiments._e_common import nan_max


@pytest.mark.parametrize("values", [(0.0, math.nan), (math.nan, 1.0), (1e-15, math.nan, 2e-15)])
def test_nan_max_is_nan_wherever_the_nan_stands(values):
    assert math.isnan(nan_max(*values))
    assert math.isnan(float(np.max(values)))  # the reference: numpy propagates NaN


def test_nan_max_of_numbers_is_their_largest_and_needs_one_value():
    assert nan_max(0.0, 3e-10, 1e-12) == 3e-10
    with pytest.raises(ValueError, match="at least one value"):
        nan_max()


def test_a_round_trip_whose_utility_is_nan_reports_a_nan_deviation(monkeypatch):
    # Python's max(0.0, nan) is 0.0: a NaN second-pass utility read as "no further gain"
    def nan_utilities(z, candidates, edges, space, weight, bias, targets):
        return torch.full((z.shape[0], z.shape[1], len(candidates)), math.nan,
                          dtype=torch.float64)

    monkeypatch.setattr(structure, "exact_utilities", nan_utilities)
    r = structure.check_round_trip(torch.Generator().manual_seed(0), 2)
    assert r["idempotence"] <= 1e-9 and r["projection"] <= 1e-9
    assert math.isnan(r["second_gain"])


def test_an_exact_check_of_a_nan_deviation_is_inconclusive_not_failed():
    f = e9_numerics._exact("23", "largest deviation", "0", math.nan, False, 4, "")
    assert f.verdict == "inconclusive"
    assert e9_numerics._exact("23", "largest deviation", "0", 1e-12, True, 4, "").verdict == (
        "holds")
    assert e9_numerics._exact("23", "largest deviation", "0", 1e-3, False, 4, "").verdict == (
        "fails")


@pytest.mark.slow
def test_e8_smallest_adder_ablation_is_nan_when_an_adders_increase_is_nan(monkeypatch):
    # Python's min([0.5, nan, ...]) is 0.5: an adder whose ablation was not measured dropped
    # out of "the smallest increase over the adders"
    from graded.study.experiments import e8_morphic as e8

    real = e8.edge_ablation

    def one_adder_measured(model, data):
        return [{**r, "delta": 0.5 if r["edge"] == "add_1" else math.nan}
                if r["layer"] == 1 and r["edge"].startswith("add_") else r
                for r in real(model, data)]

    monkeypatch.setattr(e8, "edge_ablation", one_adder_measured)
    assert math.isnan(e8.adder_run("internal", 0, 2)["ablation_min_adder"])
