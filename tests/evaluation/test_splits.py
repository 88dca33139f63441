"""Split helpers: partitions, size thresholds, families, relabelled splits through make_split."""

import pytest
import torch

from graded.evaluation import (
    family_split,
    make_split,
    random_split,
    sequence_lengths,
    size_split,
)
from graded.tasks import TaskDataset, get_task


def _toy(n=10):
    lengths = torch.arange(1, n + 1)
    pad = torch.arange(n)[None, :] >= lengths[:, None]
    return TaskDataset({"inputs": torch.arange(n * n).reshape(n, n), "targets": torch.arange(n),
                        "key_padding_mask": pad}, task="t", kind="classification")


def test_random_split_is_a_partition():
    train, test = random_split(_toy(), n_test=3, seed=1)
    ids = sorted(train.targets.tolist() + test.targets.tolist())
    assert ids == list(range(10)) and len(test) == 3
    again, _ = random_split(_toy(), n_test=3, seed=1)
    assert torch.equal(again.targets, train.targets)
    with pytest.raises(ValueError, match="n_test must be <= 9"):
        random_split(_toy(), n_test=10)


def test_random_split_of_distinct_inputs_takes_the_first_n_test_of_a_seeded_permutation():
    perm = torch.randperm(10, generator=torch.Generator().manual_seed(4))
    train, test = random_split(_toy(), n_test=4, seed=4)
    assert test.targets.tolist() == perm[:4].tolist()
    assert train.targets.tolist() == perm[4:].tolist()


def test_random_split_keeps_every_copy_of_an_input_on_one_side():
    # 40 examples: 20 inputs once, 5 inputs 4 times each, shuffled; targets number them
    g = torch.Generator().manual_seed(0)
    rows = torch.cat([torch.arange(20), torch.arange(20, 25).repeat(4)])
    rows = rows[torch.randperm(40, generator=g)]
    data = TaskDataset({"inputs": torch.stack([rows, rows * 7]).T, "targets": torch.arange(40)},
                       task="t", kind="classification")
    for seed in range(5):
        train, test = random_split(data, n_test=10, seed=seed)
        assert len(test) == 10
        assert sorted(train.targets.tolist() + test.targets.tolist()) == list(range(40))
        train_rows = {tuple(r) for r in train.inputs.tolist()}
        assert not train_rows & {tuple(r) for r in test.inputs.tolist()}
        # each input's examples are all on the side its first copy went to
        for r in set(rows.tolist()):
            copies = set(torch.nonzero(rows == r).flatten().tolist())
            assert copies <= set(test.targets.tolist()) or copies <= set(train.targets.tolist())


def test_random_split_names_a_test_size_that_whole_groups_cannot_reach():
    data = TaskDataset({"inputs": torch.tensor([[0], [0], [1], [1]]),
                        "targets": torch.arange(4)}, task="t", kind="classification")
    with pytest.raises(ValueError, match=r"n_test=1 cannot be met without putting copies of one "
                                         r"input on both sides: .* test set of 0 or 2, no size "
                                         r"between; 4 examples hold 2 distinct inputs"):
        random_split(data, n_test=1)


def test_random_split_reaches_a_test_size_that_a_later_group_fills():
    # input 0 once, input 1 twice: n_test=2 is met by the two copies of input 1 alone, also
    # when the random order meets input 0 first (seed 2), which took it and then had no room
    data = TaskDataset({"inputs": torch.tensor([[0], [1], [1]]), "targets": torch.arange(3)},
                       task="t", kind="classification")
    for seed in range(8):
        train, test = random_split(data, n_test=2, seed=seed)
        assert sorted(test.targets.tolist()) == [1, 2] and train.targets.tolist() == [0]


def _greedy_split(keys, perm, n_test):
    """The first-fit reference: each input's copies, in the order of the first copy, go to the
    test side when they fit; None when that misses n_test."""
    test, train, seen = [], [], set()
    for i in perm:
        if keys[i] in seen:
            continue
        seen.add(keys[i])
        group = [j for j in perm if keys[j] == keys[i]]
        (test if len(test) + len(group) <= n_test else train).extend(group)
    return (train, test) if len(test) == n_test else None


def test_random_split_is_first_fit_where_first_fit_succeeds_and_raises_only_when_no_grouping_fits():
    from itertools import combinations

    g = torch.Generator().manual_seed(3)
    for trial in range(60):
        n = int(torch.randint(3, 9, (1,), generator=g))
        rows = torch.randint(0, 4, (n,), generator=g)
        data = TaskDataset({"inputs": rows[:, None], "targets": torch.arange(n)}, task="t",
                           kind="classification")
        n_test = int(torch.randint(1, n, (1,), generator=g))
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(trial)).tolist()
        sizes = [int((rows == r).sum()) for r in set(rows.tolist())]
        possible = any(sum(c) == n_test for k in range(len(sizes) + 1)
                       for c in combinations(sizes, k))
        if not possible:
            with pytest.raises(ValueError, match=f"n_test={n_test} cannot be met"):
                random_split(data, n_test=n_test, seed=trial)
            continue
        train, test = random_split(data, n_test=n_test, seed=trial)
        assert len(test) == n_test
        assert not set(train.inputs.flatten().tolist()) & set(test.inputs.flatten().tolist())
        greedy = _greedy_split(rows.tolist(), perm, n_test)
        if greedy is not None:  # the split of every seed that worked before stays the same
            assert (train.targets.tolist(), test.targets.tolist()) == greedy


def test_size_split_thresholds_the_lengths():
    data = _toy()
    assert sequence_lengths(data).tolist() == list(range(1, 11))
    small, large = size_split(data, threshold=4)
    assert sequence_lengths(small).tolist() == [1, 2, 3, 4]
    assert sequence_lengths(large).tolist() == list(range(5, 11))
    with pytest.raises(ValueError, match=r"empty side: sizes range over \[1, 10\]"):
        size_split(data, threshold=10)


def test_size_split_names_fractional_sizes_as_they_are():
    # the range was printed through int(): sizes 0.25 .. 0.75 read "[0, 0]"
    data = _toy(4)
    with pytest.raises(ValueError, match=r"threshold 1 leaves an empty side: sizes range over "
                                         r"\[0.25, 0.75\]"):
        size_split(data, threshold=1, sizes=[0.25, 0.5, 0.5, 0.75])
    small, large = size_split(data, threshold=0.5, sizes=[0.25, 0.5, 0.5, 0.75])
    assert small.targets.tolist() == [0, 1, 2] and large.targets.tolist() == [3]


def test_make_split_relabelled_dyck_keeps_the_words_balanced_and_renames_types():
    task = get_task("dyck_recognition", k=2, max_length=12)
    train, test = make_split(task, "relabelled", 30, 30, seed=0)
    plain = task.generate(30, seed=1)  # the objects before relabelling
    shown = task.relabel(plain, seed=2)  # the split's test candidates
    assert torch.equal(shown.targets, plain.targets)
    assert not torch.equal(shown.inputs, plain.inputs)
    assert torch.equal(train.inputs, task.generate(30, seed=0).inputs)  # canonical = as drawn
    # short words repeat: the test side keeps the relabelled words not shown in training
    seen = {tuple(r) for r in train.inputs.tolist()}
    kept = [r for r in shown.inputs.tolist() if tuple(r) not in seen]
    assert len(kept) < 30 and test.inputs.tolist()[: len(kept)] == kept and len(test) == 30
    assert not seen & {tuple(r) for r in test.inputs.tolist()}
    with pytest.raises(ValueError, match="split kind must be one of"):
        make_split(task, "by_colour")
    with pytest.raises(ValueError, match="family split is not meaningful for task "
                                         "'dyck_recognition'"):
        make_split(task, "family")


def test_family_split_holds_out_exactly_the_test_families():
    data = _toy()
    ids = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 3])
    train, test = family_split(data, ids, test_families={1, 3})
    assert test.targets.tolist() == [1, 4, 7, 9]
    assert train.targets.tolist() == [0, 2, 3, 5, 6, 8]
    names = ["tree", "cycle"] * 5
    train, test = family_split(data, names, ["cycle"])
    assert train.targets.tolist() == [0, 2, 4, 6, 8] and test.targets.tolist() == [1, 3, 5, 7, 9]


def test_family_split_takes_the_test_families_as_a_tensor_like_the_family_ids():
    # a tensor's elements are 0-d tensors, which equal no int in a set: tensor([1, 3]) was
    # refused as "test families ['tensor(1)', 'tensor(3)'] do not occur in the data"
    data = _toy()
    ids = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 3])
    train, test = family_split(data, ids, torch.tensor([1, 3]))
    held_out = [i for i, f in enumerate(ids.tolist()) if f in (1, 3)]  # by hand
    assert test.targets.tolist() == held_out == [1, 4, 7, 9]
    assert train.targets.tolist() == [i for i in range(10) if i not in held_out]
    with pytest.raises(ValueError, match=r"test families \['5'\] do not occur"):
        family_split(data, ids, torch.tensor([5]))


def test_family_split_leaves_out_held_out_examples_whose_inputs_occur_in_training():
    from graded.encodings import adjacency_from_edges

    task = get_task("graph_properties", max_vertices=6)
    c4 = adjacency_from_edges(4, [(0, 1), (1, 2), (2, 3), (0, 3)])  # a cycle, and 2-regular
    star = adjacency_from_edges(4, [(0, 1), (0, 2), (0, 3)])
    c5 = adjacency_from_edges(5, [(0, 1), (1, 2), (2, 3), (3, 4), (0, 4)])
    data = task.encode_graphs([c4, star, c4, c5])
    names = ["regular", "tree", "cycle", "cycle"]
    train, test = family_split(data, names, ["cycle"])
    assert torch.equal(train.inputs, data.inputs[[0, 1]])
    assert torch.equal(test.inputs, data.inputs[[3]])  # the C4 drawn as a cycle is left out
    with pytest.raises(ValueError, match=r"every example of the test families \['cycle'\] has "
                                         r"inputs that also occur in a training family"):
        family_split(data.subset([0, 1, 2]), names[:3], ["cycle"])


def test_family_split_rejects_absent_families_an_empty_train_side_and_bad_lengths():
    data = _toy()
    names = ["tree", "cycle"] * 5
    with pytest.raises(ValueError, match=r"test families \['grid'\] do not occur"):
        family_split(data, names, ["grid"])
    with pytest.raises(ValueError, match="leaving no training family"):
        family_split(data, names, ["tree", "cycle"])
    with pytest.raises(ValueError, match=r"one family per example \(10\), got 3"):
        family_split(data, names[:3], ["tree"])


def test_family_split_of_a_graph_dataset_matches_the_task_family_split():
    task = get_task("graph_properties", test_families=("cycle",))
    data = task.generate(60, seed=0)
    train, test = family_split(data, data.tensors["family"], [task.families().index("cycle")])
    assert len(train) + len(test) == 60
    assert set(test.tensors["family"].tolist()) == {task.families().index("cycle")}
    _, task_test = make_split(task, "family", 10, 10, seed=0)
    assert set(task_test.tensors["family"].tolist()) == {task.families().index("cycle")}


def test_make_split_passes_unseen_through():
    """make_split(..., unseen=False) is Task.split(..., unseen=False): short Dyck words repeat,
    so the i.i.d. test draw holds training inputs, and the default drops them."""
    from graded.tasks.base import input_keys

    task = get_task("dyck", k=2, max_length=8)
    for unseen in (True, False):
        train, test = make_split(task, "random", 300, 100, seed=0, unseen=unseen)
        want = task.split("random", 300, 100, 0, unseen=unseen)[1]
        assert input_keys(test) == input_keys(want)
        seen = set(input_keys(train))
        overlap = sum(k in seen for k in input_keys(test))
        assert (overlap == 0) if unseen else (overlap > 0)


def test_size_split_refuses_a_nan_size_instead_of_dropping_its_example():
    # NaN <= t and NaN > t are both False: the example was on neither side, so the two sides
    # held 5 of 6 examples
    sizes = torch.tensor([1.0, 2.0, float("nan"), 3.0, 4.0, 1.0])
    with pytest.raises(ValueError, match=r"sizes must be numbers, got NaN at examples \[2\]"):
        size_split(_toy(6), threshold=2, sizes=sizes)


def test_size_split_takes_sizes_as_a_list_and_partitions_by_them():
    sizes = [5, 1, 3, 2, 6, 4]
    small, large = size_split(_toy(6), threshold=3, sizes=sizes)
    # by hand: sizes <= 3 at examples 1, 2, 3; the rest above, each in its original order
    assert small.targets.tolist() == [1, 2, 3] and large.targets.tolist() == [0, 4, 5]


def test_family_split_refuses_a_bare_family_name():
    # a string is a collection of its letters: "ab" would hold out families 'a' and 'b'
    names = ["a", "b", "ab"] * 3 + ["a"]
    with pytest.raises(ValueError, match=r"test_families must be a collection of families, got "
                                         r"the string 'ab' \(for one family, pass \['ab'\]\)"):
        family_split(_toy(), names, "ab")
