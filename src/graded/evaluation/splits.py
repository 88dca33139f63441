"""Train/test split helpers for the split types of 003 §3.2.

003 §3.2: "the train-test split is also part of the experiment". A random split tests
interpolation; a split by size (train on small objects, test on larger ones) tests whether a
size-robust rule was learned; a split by family (train on some graph families, test on the
others) tests whether the rule transfers to objects from another generator; a relabelled split
(train on canonical copies, test on isomorphic ones) tests whether the symmetry was learned.
``make_split`` asks a task for one of them; the dataset-level helpers split an existing dataset.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Iterator, Sequence

import torch
from torch import Tensor

from graded.checks import check_int
from graded.tasks.base import SPLIT_KINDS, Task, TaskDataset, check_seed, input_keys


def make_split(task: Task, kind: str = "random", n_train: int = 1000, n_test: int = 1000,
               seed: int = 0, *, unseen: bool = True) -> tuple[TaskDataset, TaskDataset]:
    """Train and test sets of ``task`` by split ``kind`` (one of ``SPLIT_KINDS``); ``unseen``
    as in :meth:`Task.split` (True: no test input occurs in training)."""
    if kind not in SPLIT_KINDS:
        raise ValueError(f"split kind must be one of {SPLIT_KINDS}, got {kind!r}")
    return task.split(kind, n_train, n_test, seed, unseen=unseen)


def random_split(data: TaskDataset, n_test: int, seed: int = 0
                 ) -> tuple[TaskDataset, TaskDataset]:
    """A random partition into len(data) - n_test train and n_test test examples that keeps
    every copy of one input on the same side (no test input occurs in training).

    Examples are visited in a seeded random order, each input's copies (equal ``inputs``) as
    one group where its first copy comes; a group goes to the test side when it fits in what
    is left of ``n_test`` and the groups after it can still fill the rest exactly, else to the
    train side. Without repeated inputs this is the first ``n_test`` of the random order. Only
    a test size that no set of whole groups reaches raises ``ValueError``. ``seed`` is checked
    as a task's split checks it (an int in [0, ``MAX_SEED``]).

    Memory: which test sizes the later groups can fill is a bit set of n_test + 1 bits per
    group, kept for about √(groups) groups at a time (recomputed block by block from
    checkpoints), not for every group: quadratic memory would be gigabytes at 10⁵ examples.
    """
    if len(data) < 2:
        raise ValueError(f"random_split needs at least 2 examples (one per side), the data "
                         f"has {len(data)}")
    check_int("n_test", n_test, minimum=1, maximum=len(data) - 1)
    seed = check_seed(seed)
    perm = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed)).tolist()
    copies: dict[bytes, list[int]] = {}
    keys = input_keys(data)
    for i in perm:
        copies.setdefault(keys[i], []).append(i)
    groups = list(copies.values())  # in the order of their first copies
    sizes = [len(group) for group in groups]
    reachable = _subset_sums(sizes)  # bit s set when some groups hold s examples together
    if not reachable >> n_test & 1:
        below = (reachable & ((1 << n_test) - 1)).bit_length() - 1
        above = reachable >> (n_test + 1)
        above = n_test + 1 + (above & -above).bit_length() - 1 if above else None
        raise ValueError(
            f"n_test={n_test} cannot be met without putting copies of one input on both sides: "
            f"whole groups of equal inputs give a test set of {below}"
            f"{'' if above is None else f' or {above}'}, no size between; {len(data)} "
            f"examples hold {len(groups)} distinct inputs"
        )
    if len(groups) == len(data):  # no repeated input: the first n_test of the order
        return data.subset(perm[n_test:]), data.subset(perm[:n_test])
    test: list[int] = []
    train: list[int] = []
    for g, later in _later_sums(sizes, n_test):
        left = n_test - len(test) - sizes[g]
        fits = left >= 0 and later >> left & 1
        (test if fits else train).extend(groups[g])
    return data.subset(train), data.subset(test)


def _subset_sums(sizes: Sequence[int]) -> int:
    """The sums of the sub-multisets of ``sizes`` as a bit set (bit s: sum s reachable).

    Equal sizes are added by binary splitting (1, 2, 4, ... copies at a time), a bounded
    knapsack: O(√N log N) shifts of N-bit sets, as sizes summing to N take O(√N) values."""
    reach = 1
    for size, count in Counter(sizes).items():
        k = 1
        while count > 0:
            take = min(k, count)
            reach |= reach << (size * take)
            count -= take
            k *= 2
    return reach


def _later_sums(sizes: Sequence[int], limit: int) -> Iterator[tuple[int, int]]:
    """(g, the sums up to ``limit`` of subsets of the groups after g) for g = 0, 1, ...

    The sets are a backward recurrence read forwards: checkpoints every √G groups are kept
    from one backward pass, and each block's sets are recomputed from its checkpoint when the
    forward pass reaches it."""
    mask = (1 << (limit + 1)) - 1
    n = len(sizes)
    block = max(1, math.isqrt(n))
    checkpoints = {n: 1}  # the groups from b on (b a multiple of block, or n)
    reach = 1
    for g in range(n - 1, 0, -1):
        reach = (reach | reach << sizes[g]) & mask
        if g % block == 0:
            checkpoints[g] = reach
    for start in range(0, n, block):
        stop = min(start + block, n)
        sums = [checkpoints[stop]]  # the groups after stop - 1, stop - 2, ..., start
        for g in range(stop - 1, start, -1):
            sums.append((sums[-1] | sums[-1] << sizes[g]) & mask)
        for g in range(start, stop):
            yield g, sums[stop - 1 - g]


def padding_mask(data: TaskDataset) -> Tensor:
    """The (N, T) ``key_padding_mask`` of ``data`` (True = padding); all False without one.

    A mask of another dtype is refused: ``~`` of a 0/1 integer mask is -1/-2 (255/254 as
    uint8), which counted a 2-token row as -4 tokens (764 as uint8), and a floating mask is
    additive (-inf = padding, as attention reads it), not True/False."""
    pad = data.get("key_padding_mask")
    if pad is None:
        return torch.zeros(data.inputs.shape[:2], dtype=torch.bool)
    if pad.dtype != torch.bool:
        raise TypeError(f"key_padding_mask of dtype {pad.dtype}; expected a boolean mask "
                        "(True = padding), e.g. mask.bool() of a 0/1 one")
    return pad


def sequence_lengths(data: TaskDataset) -> Tensor:
    """Number of non-padding tokens of every example (the full width without a mask)."""
    return (~padding_mask(data)).sum(1)


def size_split(data: TaskDataset, threshold: float,
               sizes: Tensor | Sequence[float] | None = None
               ) -> tuple[TaskDataset, TaskDataset]:
    """Train on examples of size <= threshold, test on the larger ones.

    ``sizes`` (one per example, a tensor or a sequence) defaults to the sequence lengths. A
    NaN size (on neither side of any threshold) or either side being empty raises.
    """
    sizes = sequence_lengths(data) if sizes is None else torch.as_tensor(sizes)
    if sizes.shape != (len(data),):
        raise ValueError(f"sizes must have shape ({len(data)},), got {tuple(sizes.shape)}")
    if sizes.is_floating_point() and bool(sizes.isnan().any()):
        raise ValueError(f"sizes must be numbers, got NaN at examples "
                         f"{torch.nonzero(sizes.isnan()).flatten().tolist()}")
    small = torch.nonzero(sizes <= threshold).flatten()
    large = torch.nonzero(sizes > threshold).flatten()
    if len(small) == 0 or len(large) == 0:
        raise ValueError(f"threshold {threshold} leaves an empty side: sizes range over "
                         f"[{sizes.min().item()}, {sizes.max().item()}]")
    return data.subset(small), data.subset(large)


def family_split(data: TaskDataset, family_ids: Tensor | Sequence[object],
                 test_families: Collection[object]) -> tuple[TaskDataset, TaskDataset]:
    """Train on the examples whose family is not in ``test_families``, test on the others.

    ``family_ids`` gives each example's family: a (N,) tensor of ints (as the ``family`` tensor
    of a task with families, indices into ``task.families()``) or a sequence of names;
    ``test_families`` holds values of the same kind (ints, in a tensor too). A held-out example
    whose inputs equal a training example's (one graph drawn by two generators: a 4-cycle is
    also 2-regular) is left out of the test side, so no test input occurs in training. A
    held-out family absent from ``family_ids``, or either side being empty, raises.
    """
    if isinstance(test_families, str):  # set("cycle") would hold out 'c', 'y', 'l', 'e'
        raise ValueError(f"test_families must be a collection of families, got the string "
                         f"{test_families!r} (for one family, pass [{test_families!r}])")
    ids = family_ids.tolist() if isinstance(family_ids, Tensor) else list(family_ids)
    if isinstance(test_families, Tensor):  # its elements, 0-d tensors, equal no int in a set
        test_families = test_families.reshape(-1).tolist()
    if len(ids) != len(data):
        raise ValueError(f"family_ids must give one family per example ({len(data)}), "
                         f"got {len(ids)}")
    held_out = set(test_families)
    if not held_out:
        raise ValueError(f"test_families is empty; expected at least one of the data's "
                         f"families {sorted(map(str, set(ids)))}")
    missing = sorted(map(str, held_out - set(ids)))
    if missing:
        raise ValueError(f"test families {missing} do not occur in the data; its families are "
                         f"{sorted(map(str, set(ids)))}")
    train = [i for i, f in enumerate(ids) if f not in held_out]
    if not train:
        raise ValueError(f"test families {sorted(map(str, held_out))} cover every example, "
                         "leaving no training family")
    keys = input_keys(data)
    seen = {keys[i] for i in train}
    test = [i for i, f in enumerate(ids) if f in held_out and keys[i] not in seen]
    if not test:
        raise ValueError(f"every example of the test families {sorted(map(str, held_out))} "
                         "has inputs that also occur in a training family")
    return data.subset(train), data.subset(test)
