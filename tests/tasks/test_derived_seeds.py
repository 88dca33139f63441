"""Seeds a split derives from its seed (test draw, relabelling, top-up draws) stay within the
seeds a torch.Generator takes, and relabel checks its seed by name."""

import pytest
import torch

from graded.tasks import Task, TaskDataset, available_tasks, get_task
from graded.tasks.base import MAX_SEED, unseen_test

LARGEST = 2**64 - 1  # torch.Generator().manual_seed takes seeds up to this one


def _same(a: TaskDataset, b: TaskDataset) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a.tensors[k], b.tensors[k])
                                        for k in a.tensors)


def test_max_seed_is_the_largest_seed_a_torch_generator_takes():
    torch.Generator().manual_seed(LARGEST)
    with pytest.raises((RuntimeError, ValueError)):  # "Overflow when unpacking long long"
        torch.Generator().manual_seed(LARGEST + 1)
    assert MAX_SEED == LARGEST


@pytest.mark.parametrize(("name", "options"), [
    ("dyck_recognition", {"k": 2, "max_length": 10}),
    ("graph_properties", {"max_vertices": 5}),
    ("weighted_projective", {}),
])
def test_a_relabelled_split_at_the_largest_seed_wraps_its_derived_seeds_to_0_and_1(name,
                                                                                  options):
    # seed + 1 and seed + 2 were 2^64 and 2^64 + 1, refused by generate as "seed must be <=
    # ...": modulo 2^64 they are 0 and 1, so the test set is relabel(generate(n, 0), 1)
    task = get_task(name, **options)
    train, test = task.split("relabelled", 12, 10, seed=LARGEST, unseen=False)
    assert _same(train, task.canonicalize(task.generate(12, LARGEST)))
    assert _same(test, task.relabel(task.generate(10, 0), 1))


@pytest.mark.parametrize(("seed", "test_seed"), [(LARGEST, 0), (LARGEST - 1, LARGEST)])
def test_a_size_split_near_the_largest_seed_draws_its_test_set_at_seed_plus_1_mod_2_64(
        seed, test_seed):
    task = get_task("dyck", max_length=16)
    train, test = task.split("size", 8, 8, seed=seed, unseen=False)
    small, large = task.split_configs("size")
    assert _same(train, small.generate(8, seed))
    assert _same(test, large.generate(8, test_seed))


def test_a_modular_relabelled_split_at_the_largest_seed_relabels_with_seed_0():
    task = get_task("modular", p=7, operation="add", train_fraction=0.5)
    train, test = task.split("relabelled", seed=LARGEST, unseen=False)
    pool = task.generate(49, seed=LARGEST)
    shown = task.relabel(pool.subset(torch.arange(len(train), 49)), seed=0)
    assert _same(test, shown)


@pytest.mark.parametrize("seed", [0, 12345, LARGEST - 3_000_009, LARGEST - 1_000_003, LARGEST])
def test_top_up_draws_take_seed_plus_multiples_of_1_000_003_modulo_2_64(seed):
    # every candidate is a training input: each top-up draw is made and its seed recorded
    rows = TaskDataset({"inputs": torch.zeros(4, 2), "targets": torch.zeros(4)}, task="t",
                       kind="regression")
    seeds = []

    def draw(m, s):
        seeds.append(s)
        torch.Generator().manual_seed(s)  # a seed every generator takes
        return rows

    with pytest.raises(ValueError, match="only 0 of n_test=4"):
        unseen_test(rows, rows, 4, draw, seed)
    expected = [(seed + 1_000_003 * a) % 2**64 for a in range(1, 7)]
    assert seeds == expected
    if seed + 6 * 1_000_003 <= LARGEST:  # far from the limit: the seeds as before, unreduced
        assert seeds == [seed + 1_000_003 * a for a in range(1, 7)]


def test_a_split_at_the_largest_seed_with_top_up_draws_has_no_training_input():
    # dyck_recognition with k=2, max_length=10 repeats words: the split tops up its test set
    task = get_task("dyck_recognition", k=2, max_length=10)
    train, test = task.split("relabelled", 150, 100, seed=LARGEST)
    assert len(test) == 100
    seen = {tuple(r) for r in train.inputs.tolist()}
    assert not seen & {tuple(r) for r in test.inputs.tolist()}
    again = task.split("relabelled", 150, 100, seed=LARGEST)[1]
    assert _same(test, again)


def _relabelling_tasks() -> list[str]:
    return [n for n in available_tasks() if type(get_task(n)).relabel is not Task.relabel]


@pytest.mark.parametrize("name", _relabelling_tasks())
def test_relabel_refuses_a_seed_out_of_range_naming_it(name):
    # 2^64 gave a raw "Overflow when unpacking long" from manual_seed (or was taken by
    # random.Random); -1 was taken
    task = get_task(name)
    data = task.generate(3, seed=0)
    task.relabel(data, LARGEST)
    with pytest.raises(ValueError, match=rf"seed must be <= {LARGEST}, got {LARGEST + 1}"):
        task.relabel(data, LARGEST + 1)
    with pytest.raises(ValueError, match=r"seed must be >= 0, got -1"):
        task.relabel(data, -1)
    with pytest.raises(TypeError, match=r"seed must be an int, got True \(bool\)"):
        task.relabel(data, True)


def test_split_refuses_a_seed_out_of_range_naming_it():
    task = get_task("dyck", max_length=16)
    with pytest.raises(ValueError, match=rf"seed must be <= {LARGEST}, got {LARGEST + 1}"):
        task.split("random", 4, 4, seed=LARGEST + 1)
