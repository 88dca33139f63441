"""Online 1-D bin packing (FunSearch, 003 §3.4): an evolvable `priority(item, bins)` heuristic.

Items arrive one at a time and each must be placed at once. The skeleton offers the item every
open bin it fits in, plus one new empty bin, in the order the bins were opened, and puts it in the
one whose `priority` is highest (the first on ties). The artefact is the bin index of each item;
the verifier re-checks every capacity and counts the bins.

The score is FunSearch's: the excess of the number of bins over the L1 lower bound
ceil(Σ sizes / capacity), in percent, averaged per dataset as a ratio of means,
100 · (mean bins − mean L1) / mean L1. Each instance is one input of the score signature and
scores −100 · (bins − L1) / L̄, where L̄ is the mean L1 bound of its group (the instances evolved
on, or the held-out instances of one dataset); the mean of a group's scores is therefore exactly
minus FunSearch's excess for that group.

Departure from FunSearch: its skeleton passes one preallocated empty bin per item to `priority`;
here the empty bins appear once, as a single new bin after the open ones. Heuristics that are
elementwise in `bins` (best fit, first fit, FunSearch's published ones) choose the same bins.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Sequence
from fractions import Fraction
from functools import cache
from importlib import resources
from typing import Any

import numpy as np

from graded.search.program.problem import InvalidArtefact, Problem
from graded.search.program.program import check_seed

__all__ = [
    "DATASETS",
    "SKELETON",
    "best_fit",
    "bin_packing_problem",
    "count_bins",
    "dataset_excess",
    "first_fit",
    "l1_bound",
    "load_instances",
    "weibull_instances",
]

DATA_FILE = "binpacking_or3_weibull5k.json"
# name accepted by `bin_packing_problem` -> key in the shipped JSON
DATASETS: dict[str, str] = {"or3": "OR3", "weibull5k": "Weibull 5k"}

SKELETON = '''"""Online 1-D bin packing: each item goes to its highest-priority bin (FunSearch)."""
import numpy as np


def pack(instance):
    """Returns the bin of each item of `instance`, bins numbered in the order they are opened.

    The item is offered every open bin it fits in and one new empty bin (last); `priority`
    scores them and the first of the highest-scoring bins receives the item.
    """
    capacity = float(instance["capacity"])
    items = instance["items"]
    remaining = np.full(len(items) + 1, capacity)  # open bins first, then the next new bin
    opened = 0
    assignment = []
    for item in items:
        candidates = np.flatnonzero(remaining[: opened + 1] >= item)
        if candidates.size == 0:
            raise ValueError(f"item {item} exceeds the bin capacity {capacity}")
        scores = np.asarray(priority(float(item), remaining[candidates]), dtype=float)
        if scores.shape != candidates.shape:
            raise ValueError(f"priority returned shape {scores.shape}, expected {candidates.shape}")
        if np.isnan(scores).any():
            raise ValueError("priority returned NaN")
        chosen = int(candidates[int(np.argmax(scores))])
        remaining[chosen] -= item
        if chosen == opened:
            opened += 1
        assignment.append(chosen)
    return assignment


# EVOLVE-BLOCK-START
def priority(item, bins):
    """Returns the priority with which we want to add `item` to each bin.

    `bins` holds the remaining capacities of the bins the item fits in. Best fit: the tighter
    the fit, the higher the priority.
    """
    return -(bins - item)
# EVOLVE-BLOCK-END
'''


@cache
def _shipped() -> dict[str, dict[str, dict[str, Any]]]:
    path = resources.files(__package__).joinpath("data").joinpath(DATA_FILE)
    return json.loads(path.read_text(encoding="utf-8"))


def load_instances(dataset: str) -> dict[str, dict[str, Any]]:
    """Instances of a shipped dataset ("or3" or "weibull5k"): name -> {capacity, items}."""
    if dataset not in DATASETS:
        raise ValueError(f"bin-packing dataset {dataset!r}; expected one of {sorted(DATASETS)}")
    raw = _shipped()[DATASETS[dataset]]
    return {name: {"capacity": v["capacity"], "items": list(v["items"])} for name, v in raw.items()}


def weibull_instances(
    count: int, items: int, seed: int = 0, shape: float = 3.0, scale: float = 45.0
) -> dict[str, dict[str, Any]]:
    """Fresh Weibull instances like FunSearch's training set: capacity 100, items drawn from
    Weibull(scale 45, shape 3), rounded to the nearest integer and clipped to [1, 100]."""
    for name, value in (("count", count), ("items", items)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"weibull instances {name}={value!r}; expected an integer >= 1")
    # numpy names neither the option nor the value (-1: "expected non-negative integer"; 1.5: a
    # TypeError from SeedSequence)
    rng = np.random.default_rng(check_seed(seed, "bin-packing seed"))
    out = {}
    for i in range(count):
        sizes = np.clip(np.rint(scale * rng.weibull(shape, size=items)), 1, 100).astype(int)
        out[f"weibull_train_{i}"] = {"capacity": 100, "items": sizes.tolist()}
    return out


def _exact(value: float, what: str) -> Fraction:
    """``value`` as the number it is written as: an integer as itself, a float as the shortest
    decimal that reads back as it (its ``repr``), so that 0.1 is one tenth."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return Fraction(int(value))
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{what}={value!r}; expected a finite number")
    return Fraction(repr(float(value)))


def l1_bound(items: Sequence[float], capacity: float) -> int:
    """The L1 lower bound on the number of bins: ceil(Σ sizes / capacity), computed exactly.

    The sizes and the capacity are read as the decimals they are written as (:func:`_exact`)
    and summed as fractions: a float sum rounds, and the ceiling of a sum that is an integer
    but rounds to just above it is one too many (``sum([0.1] * 30)`` is
    3.0000000000000013, whose ceiling 4 is no lower bound for 30 items of size 0.1 and bins
    of capacity 1, which fit in 3).
    """
    cap = _exact(capacity, "capacity")
    if cap <= 0:
        raise ValueError(f"capacity={capacity!r}; expected a number > 0")
    total = sum((_exact(size, f"items[{i}]") for i, size in enumerate(items)), Fraction(0))
    return math.ceil(total / cap)


def dataset_excess(bins: Sequence[float], bounds: Sequence[float]) -> float:
    """FunSearch's excess in percent: 100 · (mean bins − mean bound) / mean bound."""
    if len(bins) != len(bounds) or not bins:
        raise ValueError(
            f"got {len(bins)} bin counts and {len(bounds)} bounds; expected equal numbers, > 0"
        )
    mean_bound = float(np.mean(bounds))
    return 100.0 * (float(np.mean(bins)) - mean_bound) / mean_bound


def count_bins(instance: dict[str, Any], assignment: Any) -> int:
    """Checks a packing of `instance` and returns its number of bins.

    `assignment[i]` is the bin of item i; bins must be numbered 0, 1, 2, ... in the order they
    are first used and no bin may hold more than the capacity. Raises `InvalidArtefact` naming
    the first violation. The online constraint (no look-ahead) is the skeleton's, not checked
    here: any feasible packing is counted correctly.
    """
    items, capacity = instance["items"], instance["capacity"]
    if not isinstance(assignment, (list, tuple)):
        raise InvalidArtefact(f"expected a list of bin indices, got {type(assignment).__name__}")
    if len(assignment) != len(items):
        raise InvalidArtefact(f"got {len(assignment)} bin indices for {len(items)} items")
    loads: list[float] = []
    # room left per bin, reduced item by item exactly as the skeleton (and `first_fit`,
    # `best_fit`) do: with float sizes, re-adding the loads can round a bin the skeleton
    # filled exactly to capacity to just over it (0.1 + 0.2 + 0.7 > 1.0 in floats)
    room: list[float] = []
    for position, (size, index) in enumerate(zip(items, assignment)):
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise InvalidArtefact(f"item {position} has bin {index!r}; expected an integer >= 0")
        if index > len(loads):
            raise InvalidArtefact(
                f"item {position} opens bin {index} while only {len(loads)} bins are open; "
                "bins must be numbered in the order they are opened"
            )
        if index == len(loads):
            loads.append(0.0)
            room.append(capacity)
        loads[index] += size
        if size > room[index]:
            raise InvalidArtefact(
                f"bin {index} holds {loads[index]} after item {position}, over capacity {capacity}"
            )
        room[index] -= size
    return len(loads)


def _score(instance: dict[str, Any], assignment: Any) -> float:
    """Verifier: −100 · (bins − L1) / L̄ with L̄ the mean L1 bound of the instance's group."""
    bins = count_bins(instance, assignment)
    return -100.0 * (bins - instance["l1_bound"]) / instance["group_mean_l1"]


def _any_fit(items: Sequence[int], capacity: float, best: bool) -> list[int]:
    remaining = np.zeros(0)
    assignment = []
    for size in items:
        fits = np.flatnonzero(remaining >= size)
        if fits.size == 0:
            remaining = np.append(remaining, capacity)
            chosen = remaining.size - 1
        elif best:
            chosen = int(fits[np.argmin(remaining[fits])])  # argmin: the first on ties
        else:
            chosen = int(fits[0])
        remaining[chosen] -= size
        assignment.append(chosen)
    return assignment


def first_fit(items: Sequence[int], capacity: float) -> list[int]:
    """First fit: each item goes to the earliest-opened bin it fits in, else a new bin."""
    return _any_fit(items, capacity, best=False)


def best_fit(items: Sequence[int], capacity: float) -> list[int]:
    """Best fit: each item goes to the fitting bin with least room left (earliest on ties)."""
    return _any_fit(items, capacity, best=True)


def _group(name: str, instances: dict[str, dict[str, Any]], dataset: str) -> tuple:
    bounds = {k: l1_bound(v["items"], v["capacity"]) for k, v in instances.items()}
    mean = float(np.mean(list(bounds.values())))
    return tuple(
        {
            "group": name,
            "dataset": dataset,
            "instance": k,
            "capacity": v["capacity"],
            "items": v["items"],
            "l1_bound": bounds[k],
            "group_mean_l1": mean,
        }
        for k, v in instances.items()
    )


def bin_packing_problem(
    dataset: str = "or3",
    evolve_instances: int = 10,
    train_items: int = 5000,
    seed: int = 0,
    time_limit_s: float = 60.0,
) -> Problem:
    """Online bin packing evolved on part of a dataset and reported on the rest.

    `dataset="or3"`: evolved on the first `evolve_instances` OR3 instances (u500_00, ...); the
    held-out inputs are the remaining OR3 instances (group "or3-held-out") and the five
    Weibull 5k instances (group "weibull5k"). `dataset="weibull5k"`: evolved on
    `evolve_instances` fresh Weibull instances of `train_items` items drawn with `seed` (as
    FunSearch trained on generated instances); held out: the five shipped Weibull 5k instances.
    Each input is one instance (a dict with its group, capacity, items and bounds). There is
    no precheck: packing the evolved-on instances costs little more than starting the sandbox.

    The verifier has no time limit by default (``verify_timeout_s=None``, the option every
    problem takes): its work is bounded by the problem, not by the candidate. `count_bins`
    refuses an assignment whose length is not the instance's number of items before anything
    else, then does a fixed amount of work per item (about 3 ms for OR3's 10 evolved-on
    instances, 28 ms for 10 generated Weibull ones of 5000 items, 22 ms for the 15 held out).
    """
    for name, value in (("evolve_instances", evolve_instances), ("train_items", train_items)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"bin-packing {name}={value!r}; expected an integer >= 1")
    check_seed(seed, "bin-packing seed")  # also for "or3", which draws nothing with it
    or3 = load_instances("or3")
    weibull = load_instances("weibull5k")
    if dataset == "or3":
        if not 1 <= evolve_instances < len(or3):
            raise ValueError(
                f"evolve_instances={evolve_instances}; expected 1..{len(or3) - 1} for OR3"
            )
        names = sorted(or3)
        train = {k: or3[k] for k in names[:evolve_instances]}
        held = {k: or3[k] for k in names[evolve_instances:]}
        inputs = _group("or3-evolve", train, "OR3")
        held_out = _group("or3-held-out", held, "OR3") + _group("weibull5k", weibull, "Weibull 5k")
    elif dataset == "weibull5k":
        if evolve_instances < 1:
            raise ValueError(f"evolve_instances={evolve_instances}; expected >= 1")
        train = weibull_instances(evolve_instances, train_items, seed=seed)
        inputs = _group("weibull-evolve", train, "Weibull generated")
        held_out = _group("weibull5k", weibull, "Weibull 5k")
    else:
        raise ValueError(f"bin-packing dataset {dataset!r}; expected one of {sorted(DATASETS)}")
    return Problem(
        name="bin-packing",
        skeleton=SKELETON,
        entry="pack",
        inputs=inputs,
        score=_score,
        held_out=held_out,
        time_limit_s=time_limit_s,
        memory_mb=1024,
        description=(
            f"Online 1-D bin packing ({dataset}); score = minus the excess over the L1 bound in %"
            " (group mean = FunSearch's excess); initial priority = best fit"
        ),
    )
