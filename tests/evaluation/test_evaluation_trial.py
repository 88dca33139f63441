"""Metrics and splits against independent computations, on the inputs a researcher passes.

R² of a constant float64 column, masks that are weights rather than booleans, float targets
that are not class ids, the memory of a random split with repeated inputs, and the seed and
size checks of the dataset-level splits.
"""

from __future__ import annotations

import random
import tracemalloc
from fractions import Fraction

import pytest
import torch

from graded.evaluation.metrics import accuracy, exact_match, r2
from graded.evaluation.splits import family_split, random_split
from graded.tasks.dataset import TaskDataset


def _r2_exact(pred: list[list[float]], true: list[list[float]]) -> float:
    """scikit-learn's uniform-average R² in exact rational arithmetic (the float64 values
    taken exactly): a column with SS_tot = 0 scores 1 when SS_res = 0, else 0."""
    n = len(true)
    scores = []
    for j in range(len(true[0])):
        y = [Fraction(row[j]) for row in true]
        p = [Fraction(row[j]) for row in pred]
        mean = sum(y) / n
        ss_tot = sum((v - mean) ** 2 for v in y)
        ss_res = sum((a - b) ** 2 for a, b in zip(y, p))
        scores.append(1 - ss_res / ss_tot if ss_tot else Fraction(int(ss_res == 0)))
    return float(sum(scores) / len(scores))


def test_r2_of_a_constant_float64_column_is_zero_or_one_not_a_rounding_artefact():
    # seven 0.1s average to 0.10000000000000002 in float64, so sum((y - mean)^2) is 1.3e-33:
    # a prediction 1e-9 off scored 1 - 7e-18/1.3e-33 = -5.2e15 instead of 0
    y = torch.full((7, 2), 0.1, dtype=torch.float64)
    y[:, 1] = torch.arange(7, dtype=torch.float64)
    p = y.clone()
    p[:, 0] += 1e-9
    p[:, 1] += torch.tensor([0.5, -0.25, 0.0, 0.0, 0.125, 0.0, 1.0], dtype=torch.float64)
    expected = _r2_exact(p.tolist(), y.tolist())
    assert r2(p, y) == pytest.approx(expected, abs=1e-12)
    assert r2(p[:, :1], y[:, :1]) == 0.0
    assert r2(y[:, :1].clone(), y[:, :1]) == 1.0


def test_r2_of_an_infinite_constant_column_stays_nan():
    y = torch.full((3, 1), float("inf"), dtype=torch.float64)
    assert torch.isnan(torch.tensor(r2(torch.zeros(3, 1, dtype=torch.float64), y)))


def test_a_mask_of_weights_is_refused_naming_the_value():
    pred, target = torch.tensor([0, 1, 1, 1]), torch.tensor([0, 1, 2, 1])
    with pytest.raises(ValueError, match=r"mask holds 0\.5 .*expected a boolean mask"):
        accuracy(pred, target, torch.tensor([0.5, 0.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match=r"mask holds 2 "):
        exact_match(pred[None], target[None], torch.tensor([[1, 0, 2, 1]]))
    # a 0/1 mask of any dtype is read as the boolean one: 2 of the 3 kept entries are right
    for dtype in (torch.long, torch.float32, torch.uint8):
        assert accuracy(pred, target, torch.tensor([1, 0, 1, 1], dtype=dtype)) == 2 / 3


def test_float_targets_that_are_not_class_ids_are_refused():
    pred = torch.tensor([0, 1, 1, 1])
    for bad in (0.5, float("nan")):
        with pytest.raises(ValueError, match=r"targets are torch.float32 values that are not "
                                             r"whole numbers \(e.g. " + str(bad)):
            accuracy(pred, torch.tensor([bad, 1.0, 2.0, 1.0]))
    # whole float targets (and -100, ignored) are class ids: 2 of the 3 kept entries are right
    assert accuracy(pred, torch.tensor([-100.0, 1.0, 2.0, 1.0])) == 2 / 3


def test_later_sums_are_the_subset_sums_of_the_later_groups():
    from graded.evaluation.splits import _later_sums

    rng = random.Random(3)
    sizes = [rng.choice([1, 1, 2, 3, 5]) for _ in range(23)]
    limit = 9
    seen = []
    for g, bits in _later_sums(sizes, limit):
        later = sizes[g + 1:]
        # independent: every subset sum of the later groups, by brute force over the values
        sums = {0}
        for s in later:
            sums |= {t + s for t in sums}
        assert bits == sum(1 << t for t in sums if t <= limit), g
        seen.append(g)
    assert seen == list(range(len(sizes)))


def test_random_split_with_repeated_inputs_keeps_memory_far_below_quadratic():
    # 20000 examples, each input twice: one bit set per group of all later sums took 17 MB
    # (3.2 GB at 300000 examples); checkpoints take under 4 MB here
    n = 20000
    data = TaskDataset({"inputs": (torch.arange(n) // 2)[:, None], "targets": torch.arange(n)},
                       task="toy", kind="classification")
    tracemalloc.start()
    try:
        train, test = random_split(data, n // 4, seed=0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8e6, peak
    assert len(test) == n // 4 and len(train) == n - n // 4
    assert not set(test.inputs[:, 0].tolist()) & set(train.inputs[:, 0].tolist())


def test_random_split_checks_its_seed_and_a_one_example_dataset():
    data = TaskDataset({"inputs": torch.arange(6)[:, None], "targets": torch.arange(6)},
                       task="toy", kind="classification")
    with pytest.raises(ValueError, match="seed must be >= 0, got -1"):
        random_split(data, 2, seed=-1)
    with pytest.raises(ValueError, match=f"seed must be <= {2**64 - 1}, got {2**70}"):
        random_split(data, 2, seed=2**70)
    with pytest.raises(ValueError, match=r"needs at least 2 examples .* the data has 1"):
        random_split(data.subset([0]), 1)
    # the first 2 of the seeded permutation, as before
    perm = torch.randperm(6, generator=torch.Generator().manual_seed(5))
    assert random_split(data, 2, seed=5)[1].targets.tolist() == perm[:2].tolist()


def test_family_split_with_no_test_family_says_so():
    data = TaskDataset({"inputs": torch.arange(4)[:, None], "targets": torch.arange(4)},
                       task="toy", kind="classification")
    for empty in ([], (), set(), torch.tensor([], dtype=torch.long)):
        with pytest.raises(ValueError, match=r"test_families is empty; expected at least one "
                                             r"of the data's families \['a', 'b'\]"):
            family_split(data, ["a", "b", "a", "b"], empty)
    train, test = family_split(data, ["a", "b", "a", "b"], ["b"])
    assert (train.targets.tolist(), test.targets.tolist()) == ([0, 2], [1, 3])

