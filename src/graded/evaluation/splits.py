"""Train/test split helpers for the split types of 003 §3.2.

003 §3.2: "the train-test split is also part of the experiment". A random split tests
interpolation; a split by size (train on small objects, test on larger ones) tests whether a
size-robust rule was learned; a split by family (train on some graph families, test on the
others) tests whether the rule transfers to objects from another generator; a relabelled split
(train on canonical copies, test on isomorphic ones) tests whether the symmetry was learned.
``make_split`` asks a task for one of them; the dataset-level helpers split an existing dataset.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch
from torch import Tensor

from graded.checks import check_int
from graded.tasks.base import SPLIT_KINDS, Task, TaskDataset, input_keys


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
    a test size that no set of whole groups reaches raises ``ValueError``.
    """
    check_int("n_test", n_test, minimum=1, maximum=len(data) - 1)
    perm = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed)).tolist()
    copies: dict[bytes, list[int]] = {}
    keys = input_keys(data)
    for i in perm:
        copies.setdefault(keys[i], []).append(i)
    groups = list(copies.values())  # in the order of their first copies
    # reachable[g]: bit s set when the groups g, g+1, ... hold a subset of s examples
    reachable = [1] * (len(groups) + 1)
    for g in range(len(groups) - 1, -1, -1):
        reachable[g] = reachable[g + 1] | (reachable[g + 1] << len(groups[g]))
    if not reachable[0] >> n_test & 1:
        below = (reachable[0] & ((1 << n_test) - 1)).bit_length() - 1
        above = reachable[0] >> (n_test + 1)
        above = n_test + 1 + (above & -above).bit_length() - 1 if above else None
        raise ValueError(
            f"n_test={n_test} cannot be met without putting copies of one input on both sides: "
            f"whole groups of equal inputs give a test set of {below}"
            f"{'' if above is None else f' or {above}'}, no size between; {len(data)} "
            f"examples hold {len(groups)} distinct inputs"
        )
    test: list[int] = []
    train: list[int] = []
    for g, group in enumerate(groups):
        left = n_test - len(test) - len(group)
        fits = left >= 0 and reachable[g + 1] >> left & 1
        (test if fits else train).extend(group)
    return data.subset(train), data.subset(test)


def sequence_lengths(data: TaskDataset) -> Tensor:
    """Number of non-padding tokens of every example (the full width without a mask)."""
    pad = data.get("key_padding_mask")
    if pad is None:
        return torch.full((len(data),), data.inputs.shape[1], dtype=torch.long)
    return (~pad).sum(1)


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
