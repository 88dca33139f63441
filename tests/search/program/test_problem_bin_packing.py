"""Online bin packing (FunSearch): best fit reproduces the published excess, the verifier counts."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest

from graded.search.program.problem import InvalidArtefact
from graded.search.program.problems.bin_packing import (
    SKELETON,
    best_fit,
    bin_packing_problem,
    count_bins,
    dataset_excess,
    first_fit,
    l1_bound,
    load_instances,
    weibull_instances,
)


def naive_any_fit(items, capacity, best):
    """First or best fit with plain lists, written independently of the package."""
    loads: list[int] = []
    out = []
    for size in items:
        choice = None
        for b, load in enumerate(loads):
            if load + size <= capacity and (
                choice is None or (best and capacity - load < capacity - loads[choice])
            ):
                choice = b
                if not best:
                    break
        if choice is None:
            loads.append(0)
            choice = len(loads) - 1
        loads[choice] += size
        out.append(choice)
    return out


def run_skeleton(instance, priority_source=None):
    """Runs the (trusted) skeleton in-process, optionally with another `priority`."""
    namespace: dict = {}
    exec(SKELETON, namespace)
    if priority_source is not None:
        exec(priority_source, namespace)
    return namespace["pack"](instance)


def bins_and_bounds(dataset, heuristic):
    instances = load_instances(dataset).values()
    bins = [count_bins(v, heuristic(v["items"], v["capacity"])) for v in instances]
    bounds = [l1_bound(v["items"], v["capacity"]) for v in instances]
    return bins, bounds


def test_best_fit_reproduces_the_published_excess_on_or3():
    bins, bounds = bins_and_bounds("or3", best_fit)
    assert np.mean(bounds) == pytest.approx(201.2, abs=1e-12)
    assert np.mean(bins) == pytest.approx(212.0, abs=1e-12)
    assert round(dataset_excess(bins, bounds), 2) == 5.37


def test_best_fit_reproduces_the_published_excess_on_weibull_5k():
    bins, bounds = bins_and_bounds("weibull5k", best_fit)
    assert np.mean(bounds) == pytest.approx(1987.8, abs=1e-9)
    assert np.mean(bins) == pytest.approx(2067.0, abs=1e-9)
    assert round(dataset_excess(bins, bounds), 2) == 3.98


def test_first_fit_is_worse_than_best_fit_on_both_datasets():
    for dataset in ("or3", "weibull5k"):
        ff = dataset_excess(*bins_and_bounds(dataset, first_fit))
        bf = dataset_excess(*bins_and_bounds(dataset, best_fit))
        assert ff > bf


@pytest.mark.parametrize("seed", range(5))
def test_baselines_match_a_naive_list_implementation(seed):
    rng = np.random.default_rng(seed)
    items = rng.integers(1, 60, size=200).tolist()
    assert first_fit(items, 60) == naive_any_fit(items, 60, best=False)
    assert best_fit(items, 60) == naive_any_fit(items, 60, best=True)


def test_skeleton_default_priority_is_best_fit_and_constant_priority_is_first_fit():
    for name, instance in list(load_instances("or3").items())[:4]:
        expected_bf = best_fit(instance["items"], instance["capacity"])
        assert run_skeleton(instance) == expected_bf, name
        constant = "def priority(item, bins):\n    return np.zeros(len(bins))\n"
        expected_ff = first_fit(instance["items"], instance["capacity"])
        assert run_skeleton(instance, constant) == expected_ff


def test_skeleton_lets_a_heuristic_open_a_new_bin_although_one_fits():
    instance = {"capacity": 10, "items": [6, 3, 3]}
    # the emptiest bin is always the new one: every item opens a bin
    emptiest = "def priority(item, bins):\n    return bins - item\n"
    assert run_skeleton(instance, emptiest) == [0, 1, 2]
    assert run_skeleton(instance) == [0, 0, 1]


def test_count_bins_on_a_worked_example():
    instance = {"capacity": 10, "items": [5, 5, 4, 6, 10]}
    assert count_bins(instance, [0, 0, 1, 1, 2]) == 3
    assert l1_bound(instance["items"], 10) == 3
    assert l1_bound([5, 5, 1], 10) == 2


@pytest.mark.parametrize(("sizes", "capacity"), [
    (["0.1"] * 10, "1"),
    (["0.1"] * 30, "1"),  # sum() in floats: 3.0000000000000013, whose ceiling was 4
    (["0.09", "0.34", "0.46", "0.11"], "1"),  # 1.0000000000000002 in floats: the bound was 2
    (["0.7"] * 10, "0.7"),
    (["0.3", "0.6", "0.2"], "0.3"),
    (["0.25", "0.5"], "0.5"),
])
def test_l1_bound_is_the_ceiling_of_the_exact_sum_of_the_sizes_as_written(sizes, capacity):
    exact = math.ceil(sum(Fraction(s) for s in sizes) / Fraction(capacity))
    assert l1_bound([float(s) for s in sizes], float(capacity)) == exact


def test_l1_bound_matches_fractions_on_random_decimal_sizes_that_fill_whole_bins():
    # sizes in hundredths completed to a whole number of unit bins: a float sum lands on
    # either side of the integer, and its ceiling was one too many for about a quarter of them
    rng = np.random.default_rng(0)
    for _ in range(200):
        cents = rng.integers(1, 100, size=int(rng.integers(2, 40))).tolist()
        if sum(cents) % 100:
            cents.append(100 - sum(cents) % 100)
        exact = math.ceil(sum(Fraction(c, 100) for c in cents))
        assert l1_bound([c / 100 for c in cents], 1.0) == exact
        assert l1_bound(np.array(cents) / 100, np.float64(1.0)) == exact  # numpy values too


@pytest.mark.parametrize(("items", "capacity", "message"), [
    ([1.0], 0, r"capacity=0; expected a number > 0"),
    ([float("nan")], 1.0, r"items\[0\]=nan; expected a finite number"),
    ([1.0, "2"], 10, r"items\[1\]='2'; expected a finite number"),
])
def test_l1_bound_names_a_value_it_cannot_bound(items, capacity, message):
    with pytest.raises(ValueError, match=message):
        l1_bound(items, capacity)

def test_count_bins_accepts_a_float_bin_the_skeleton_filled_exactly_to_capacity():
    # 0.09 + 0.34 + 0.46 + 0.11 = 1 exactly in decimals, but 1.0000000000000002 when the
    # float loads are re-added; the skeleton's own check (room left >= item) accepts each item
    items = [0.09, 0.34, 0.46, 0.11]
    assert sum(Fraction(str(x)) for x in items) == 1
    assert first_fit(items, 1.0) == best_fit(items, 1.0) == [0, 0, 0, 0]
    assert count_bins({"capacity": 1.0, "items": items}, [0, 0, 0, 0]) == 1
    with pytest.raises(InvalidArtefact, match=r"over capacity 1\.0"):
        count_bins({"capacity": 1.0, "items": [*items, 0.01]}, [0, 0, 0, 0, 0])


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ({"bins": []}, "expected a list of bin indices"),
        ([0, 0, 1], "got 3 bin indices for 4 items"),
        ([0, 0, 0, 1], "over capacity 10"),
        ([0, 2, 1, 1], "opens bin 2 while only 1 bins are open"),
        ([0, -1, 1, 1], "expected an integer >= 0"),
        ([0, 0.0, 1, 1], "expected an integer >= 0"),
        ([0, True, 1, 1], "expected an integer >= 0"),
    ],
)
def test_count_bins_rejects_bad_packings_with_the_reason(assignment, message):
    instance = {"capacity": 10, "items": [6, 4, 7, 3]}
    with pytest.raises(InvalidArtefact, match=message):
        count_bins(instance, assignment)


def test_group_mean_of_instance_scores_is_minus_funsearch_excess():
    problem = bin_packing_problem("or3")
    for group in ("or3-held-out", "weibull5k"):
        inputs = [x for x in problem.held_out if x["group"] == group]
        scores = [problem.score(x, best_fit(x["items"], x["capacity"])) for x in inputs]
        bins = [count_bins(x, best_fit(x["items"], x["capacity"])) for x in inputs]
        bounds = [x["l1_bound"] for x in inputs]
        assert np.mean(scores) == pytest.approx(-dataset_excess(bins, bounds), abs=1e-12)
    weibull = [x for x in problem.held_out if x["group"] == "weibull5k"]
    scores = [problem.score(x, best_fit(x["items"], x["capacity"])) for x in weibull]
    assert round(-float(np.mean(scores)), 2) == 3.98


def test_or3_split_is_disjoint_and_reports_on_weibull_5k():
    problem = bin_packing_problem("or3", evolve_instances=10)
    evolve = [x["instance"] for x in problem.inputs]
    held = [x["instance"] for x in problem.held_out if x["dataset"] == "OR3"]
    assert evolve == [f"u500_{i:02d}" for i in range(10)]
    assert held == [f"u500_{i:02d}" for i in range(10, 20)]
    assert sum(x["group"] == "weibull5k" for x in problem.held_out) == 5
    assert problem.entry == "pack" and problem.name == "bin-packing"


def test_weibull_problem_evolves_on_fresh_instances_and_reports_on_the_shipped_ones():
    problem = bin_packing_problem("weibull5k", evolve_instances=3, train_items=1000, seed=1)
    assert len(problem.inputs) == 3 and all(len(x["items"]) == 1000 for x in problem.inputs)
    assert [x["instance"] for x in problem.held_out] == [f"test_{i}" for i in range(5)]
    again = bin_packing_problem("weibull5k", evolve_instances=3, train_items=1000, seed=1)
    assert again.inputs == problem.inputs


def test_weibull_generator_draws_clipped_integer_weibull_sizes():
    items = weibull_instances(1, 20000, seed=3)["weibull_train_0"]["items"]
    assert all(isinstance(x, int) and 1 <= x <= 100 for x in items)
    # mean of 45 · Weibull(3) is 45 Γ(4/3) ≈ 40.19; rounding and clipping barely move it
    assert np.mean(items) == pytest.approx(45 * math.gamma(4 / 3), abs=0.5)


def test_shipped_data_has_the_published_sizes():
    or3 = load_instances("or3")
    weibull = load_instances("weibull5k")
    assert len(or3) == 20 and {len(v["items"]) for v in or3.values()} == {500}
    assert {v["capacity"] for v in or3.values()} == {150}
    assert len(weibull) == 5 and {len(v["items"]) for v in weibull.values()} == {5000}
    assert {v["capacity"] for v in weibull.values()} == {100}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dataset": "or4"}, "bin-packing dataset 'or4'"),
        ({"dataset": "or3", "evolve_instances": 20}, "evolve_instances=20"),
        ({"dataset": "weibull5k", "evolve_instances": 0}, "evolve_instances=0"),
    ],
)
def test_problem_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        bin_packing_problem(**kwargs)


def test_registry_builds_the_problem_and_inputs_and_artefacts_survive_json():
    from graded.search.program.problem import get_problem

    problem = get_problem("bin-packing", dataset="or3")
    inputs = json.loads(json.dumps([*problem.inputs, *problem.held_out]))  # as the sandbox sees
    assert inputs == [*problem.inputs, *problem.held_out]
    first = problem.inputs[0]
    artefact = json.loads(json.dumps(run_skeleton(inputs[0])))
    bins = count_bins(first, best_fit(first["items"], first["capacity"]))
    expected = -100 * (bins - first["l1_bound"]) / first["group_mean_l1"]
    assert problem.score(first, artefact) == pytest.approx(expected)
