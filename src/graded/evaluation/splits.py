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

    Examples are visited in a seeded random order; each one not placed yet goes to the test
    side with all its copies (equal ``inputs``) if they fit in ``n_test``, else to the train
    side. Without repeated inputs this is the first ``n_test`` of the random order. A test size
    no grouping reaches exactly raises ``ValueError``.
    """
    check_int("n_test", n_test, minimum=1, maximum=len(data) - 1)
    perm = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed)).tolist()
    copies: dict[bytes, list[int]] = {}
    keys = input_keys(data)
    for i in perm:
        copies.setdefault(keys[i], []).append(i)
    test: list[int] = []
    train: list[int] = []
    for i in perm:
        group = copies.pop(keys[i], None)
        if group is None:  # placed with an earlier copy
            continue
        (test if len(test) + len(group) <= n_test else train).extend(group)
    if len(test) != n_test:
        raise ValueError(
            f"n_test={n_test} cannot be met without putting copies of one input on both sides: "
            f"whole groups of equal inputs give a test set of {len(test)}; "
            f"{len(data)} examples hold {len(set(keys))} distinct inputs"
        )
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
                         f"[{int(sizes.min())}, {int(sizes.max())}]")
    return data.subset(small), data.subset(large)


def family_split(data: TaskDataset, family_ids: Tensor | Sequence[object],
                 test_families: Collection[object]) -> tuple[TaskDataset, TaskDataset]:
    """Train on the examples whose family is not in ``test_families``, test on the others.

    ``family_ids`` gives each example's family: a (N,) tensor of ints (as the ``family`` tensor
    of a task with families, indices into ``task.families()``) or a sequence of names;
    ``test_families`` holds values of the same kind. A held-out example whose inputs equal a
    training example's (one graph drawn by two generators: a 4-cycle is also 2-regular) is left
    out of the test side, so no test input occurs in training. A held-out family absent from
    ``family_ids``, or either side being empty, raises.
    """
    if isinstance(test_families, str):  # set("cycle") would hold out 'c', 'y', 'l', 'e'
        raise ValueError(f"test_families must be a collection of families, got the string "
                         f"{test_families!r} (for one family, pass [{test_families!r}])")
    ids = family_ids.tolist() if isinstance(family_ids, Tensor) else list(family_ids)
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
