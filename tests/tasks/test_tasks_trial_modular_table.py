"""Modular arithmetic draws its pairs from the operation table without materialising more of it
than a split returns: the same pairs as the table read in a seeded random order, at a cost
that does not grow with p² (beyond the table's order) for a split of given sizes."""

import itertools
import subprocess
import sys

import pytest
import torch

from graded.tasks import get_task

OPERATIONS = ["add", "sub", "mul", "div", "quad"]


def _reference_pairs(p, operation, seed, n):
    """The first n pairs of the table (row-major, b ≠ 0 for div) in randperm(seed) order."""
    table = [(a, b) for a, b in itertools.product(range(p), range(p))
             if operation != "div" or b != 0]
    order = torch.randperm(len(table), generator=torch.Generator().manual_seed(seed))
    return [table[i] for i in order[:n].tolist()]


@pytest.mark.parametrize("operation", OPERATIONS)
@pytest.mark.parametrize("seed", [0, 5, 2**64 - 1])
def test_generated_pairs_are_the_table_in_seeded_random_order(operation, seed):
    task = get_task("modular", p=7, operation=operation)
    n = task.table()[0].shape[0]
    data = task.generate(n, seed)
    a, b = task.operands(data)
    assert list(zip(a.tolist(), b.tolist())) == _reference_pairs(7, operation, seed, n)


@pytest.mark.parametrize("operation", OPERATIONS)
def test_a_random_split_of_given_sizes_is_the_prefix_of_the_table_order(operation):
    task = get_task("modular", p=11, operation=operation)
    train, test = task.split("random", 30, 20, seed=3)
    pairs = _reference_pairs(11, operation, 3, 50)
    assert list(zip(*[x.tolist() for x in task.operands(train)])) == pairs[:30]
    assert list(zip(*[x.tolist() for x in task.operands(test)])) == pairs[30:]
    # without n_test the test side is every held-out pair, as before
    train, test = task.split("random", 30, seed=3)
    assert len(train) + len(test) == task.table()[0].shape[0]


@pytest.mark.slow  # p = 3001 (3 s each on 2 cores): `pytest -m slow`
@pytest.mark.parametrize("kind", ["random", "relabelled"])
def test_a_small_split_of_a_large_table_does_not_build_the_table(kind):
    # p = 3001: 9 million pairs; encoding all of them took ~1 GB for a random split of 10 + 10,
    # and encoding, keying and relabelling them ~2.2 GB for a relabelled one. What remains is
    # the table's order (8 bytes a pair, ~70 MiB) and, relabelled, a mask of 1 byte a pair.
    code = (
        "import resource, sys\n"
        "from graded.tasks import get_task\n"
        "task = get_task('modular', p=3001)\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        f"train, test = task.split({kind!r}, 10, 10, seed=0)\n"
        "assert (len(train), len(test)) == (10, 10)\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    grown_kib = int(out.stdout.strip())
    assert grown_kib < 400_000, f"the split grew the peak memory by {grown_kib} KiB"
