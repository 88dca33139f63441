"""The common task interface: registry, determinism, vocabularies, dataset tensors, splits."""

import math

import pytest
import torch

from graded.tasks import IGNORE_INDEX, TaskDataset, Vocab, available_tasks, get_task, task_options

SMALL = {
    "polynomials": {"max_degree": 2, "coeff_range": 3},
    "polynomials_seq2seq": {"max_degree": 2, "coeff_range": 3},
    "listops": {"max_length": 32, "max_depth": 3},
    "dyck": {"max_length": 16},
    "dyck_recognition": {"max_length": 16},
    "modular": {"p": 11},
    "multiscale": {"length": 32, "bands": ((1, 2), (4, 6), (9, 14)), "num_points": 8},
    "graph_properties": {"max_vertices": 7},
}
KEYS_BY_KIND = {
    "lm": {"inputs", "targets", "loss_mask", "key_padding_mask"},
    "seq2seq": {"inputs", "targets", "loss_mask", "key_padding_mask", "decoder_inputs",
                "decoder_key_padding_mask"},
    "classification": {"inputs", "targets"},
    "regression": {"inputs", "targets"},
}


def small_task(name):
    return get_task(name, **SMALL.get(name, {}))


def test_registry_lists_every_task_of_the_issue():
    assert set(available_tasks()) >= {
        "polynomials", "polynomial_regression", "weighted_projective",
        "weighted_projective_pair", "listops", "dyck", "dyck_recognition", "modular",
        "multiscale", "graph_properties",
    }


@pytest.mark.parametrize("name", available_tasks())
def test_generation_is_deterministic_under_its_seed(name):
    task = small_task(name)
    a, b, c = task.generate(12, seed=3), task.generate(12, seed=3), task.generate(12, seed=4)
    assert a.keys() == b.keys()
    for key in a.tensors:
        assert torch.equal(a.tensors[key], b.tensors[key]), key
    assert any(not torch.equal(a.tensors[k], c.tensors[k]) for k in ("inputs", "targets"))


@pytest.mark.parametrize("name", available_tasks())
def test_datasets_carry_the_tensors_of_their_kind(name):
    task = small_task(name)
    data = task.generate(10, seed=0)
    assert KEYS_BY_KIND[task.kind] <= set(data.keys())
    assert data.kind == task.kind and data.task == task.name
    if task.kind == "seq2seq":  # max_len covers source and target
        lengths = (data.inputs.shape[1], data.tensors["decoder_inputs"].shape[1])
        assert max(lengths) == task.max_len
    else:
        assert data.inputs.shape[1] == task.max_len
    info = data.info
    assert info["metric"] == task.metric and info["grades"] == tuple(task.grades)
    if task.vocab is None:
        assert data.inputs.dtype == torch.float32 and data.inputs.shape[-1] == task.input_dim
    else:
        assert data.inputs.dtype == torch.long
        assert int(data.inputs.max()) < len(task.vocab) and info["vocab_size"] == len(task.vocab)
    if task.kind in ("lm", "seq2seq"):
        scored = data.tensors["loss_mask"]
        assert torch.equal(scored, data.targets != IGNORE_INDEX)
        pad = data.tensors["key_padding_mask" if task.kind == "lm" else
                           "decoder_key_padding_mask"]
        assert not (scored & pad).any()
    if task.kind == "classification":
        assert int(data.targets.min()) >= 0 and int(data.targets.max()) < task.num_outputs
    if task.kind == "regression":
        assert data.targets.shape == (10, task.num_outputs)
    if task.graded_object == "tokens":
        tg = data.tensors["token_grades"]
        assert tg.shape == data.inputs.shape and int(tg.max()) <= max(task.grades)
    if task.graded_object in ("features", "positions"):
        n = task.input_dim if task.graded_object == "features" else task.max_len
        assert len(task.grades) == n


@pytest.mark.parametrize("name", available_tasks())
def test_config_rebuilds_the_same_task(name):
    task = small_task(name)
    again = get_task(name, **task.config())
    assert torch.equal(again.generate(5, 1).inputs, task.generate(5, 1).inputs)
    assert set(task.config()) == set(task_options(name))


def test_unknown_task_and_option_are_rejected_with_their_names():
    with pytest.raises(ValueError, match=r"'listop'.*available"):
        get_task("listop")
    with pytest.raises(ValueError, match="max_lenght"):
        get_task("listops", max_lenght=10)
    with pytest.raises(ValueError, match="max_depth must be >= 1, got 0"):
        get_task("listops", max_depth=0)
    with pytest.raises(TypeError, match="p must be an int"):
        get_task("modular", p=7.5)
    with pytest.raises(ValueError, match="n must be >= 1"):
        get_task("modular").generate(0)


def test_vocab_round_trips_and_names_unknown_tokens():
    v = Vocab(["<pad>", "a", "b"])
    assert v.decode_str(v.encode("a b a")) == "a b a"
    assert v.decode([1, 0, 2]) == ["a", "b"]
    with pytest.raises(ValueError, match="unknown token 'c'"):
        v.encode("a c")
    with pytest.raises(ValueError, match="unique"):
        Vocab(["<pad>", "a", "a"])


def test_task_dataset_subset_keeps_rows_and_rejects_ragged_tensors():
    tensors = {"inputs": torch.arange(6).reshape(3, 2), "targets": torch.tensor([0, 1, 2])}
    data = TaskDataset(tensors, task="t", kind="classification")
    sub = data.subset([2, 0])
    assert torch.equal(sub.targets, torch.tensor([2, 0])) and torch.equal(sub[0]["inputs"],
                                                                          torch.tensor([4, 5]))
    with pytest.raises(ValueError, match="same number of examples"):
        TaskDataset({"inputs": torch.zeros(3), "targets": torch.zeros(2)}, task="t",
                    kind="regression")


@pytest.mark.parametrize("name", available_tasks())
def test_random_split_partitions_one_pool(name):
    task = small_task(name)
    if name == "modular":
        train, test = task.split("random", seed=0)
        total = 11 * 11
        assert len(train) == round(0.5 * total) and len(train) + len(test) == total
    else:
        train, test = task.split("random", 12, 8, seed=0)
        assert (len(train), len(test)) == (12, 8)
    rows_train = set(map(tuple, train.inputs.reshape(len(train), -1).tolist()))
    rows_test = set(map(tuple, test.inputs.reshape(len(test), -1).tolist()))
    if name == "modular":  # the whole table, each pair once
        assert not rows_train & rows_test and len(rows_train | rows_test) == 121
    else:
        pool = task.generate(len(train) + len(test), 0).inputs
        assert rows_train | rows_test == set(map(tuple, pool.reshape(len(pool), -1).tolist()))


def _rows(data):
    return [tuple(r) for r in data.inputs.reshape(len(data), -1).tolist()]


# small configurations whose generators repeat objects, so an unfiltered split leaks
REPEATING = [
    ("dyck", {"k": 1, "max_length": 10}, "random"),
    ("dyck_recognition", {"k": 2, "max_length": 10}, "relabelled"),
    ("graph_properties", {"max_vertices": 5}, "random"),
    ("graph_properties", {"max_vertices": 5}, "relabelled"),
    ("graph_properties", {"max_vertices": 5, "graph_families": ("cycle", "regular", "grid"),
                          "test_families": ("cycle",)}, "family"),
    ("listops", {"min_length": 4, "max_length": 6, "max_depth": 1, "max_args": 2}, "random"),
]


@pytest.mark.parametrize("name, options, kind", REPEATING)
def test_no_test_input_of_a_split_occurs_in_its_training_set(name, options, kind):
    task = get_task(name, **options)
    train, test = task.split(kind, 150, 100, seed=0)
    assert (len(train), len(test)) == (150, 100)
    seen = set(_rows(train))
    assert not seen & set(_rows(test))
    # the unfiltered draw (the test candidates of the split) does repeat training inputs
    if kind == "random":
        pool = task.generate(250, seed=0)
        perm = torch.randperm(250, generator=torch.Generator().manual_seed(0))
        assert torch.equal(train.inputs, pool.inputs[perm[:150]])  # train is untouched
        candidates = _rows(pool.subset(perm[150:]))
    elif kind == "family":
        candidates = _rows(task.family_configs()[1].generate(100, seed=1))
    else:
        candidates = _rows(task.relabel(task.generate(100, seed=1), seed=2))
    fresh = [r for r in candidates if r not in seen]
    assert len(fresh) < 100 and _rows(test)[: len(fresh)] == fresh
    # deterministic under the seed, top-up draws included
    again = task.split(kind, 150, 100, seed=0)[1]
    assert torch.equal(again.inputs, test.inputs) and torch.equal(again.targets, test.targets)


@pytest.mark.parametrize("name, options, kind", REPEATING)
def test_a_split_with_unseen_false_keeps_the_test_draw_as_drawn(name, options, kind):
    # an i.i.d. test set: the candidates of the split, repeats of training inputs included
    task = get_task(name, **options)
    train, test = task.split(kind, 150, 100, seed=0, unseen=False)
    if kind == "random":
        pool = task.generate(250, seed=0)
        perm = torch.randperm(250, generator=torch.Generator().manual_seed(0))
        drawn = pool.subset(perm[150:])
    elif kind == "family":
        drawn = task.family_configs()[1].generate(100, seed=1)
    else:
        drawn = task.relabel(task.generate(100, seed=1), seed=2)
    assert torch.equal(test.inputs, drawn.inputs) and torch.equal(test.targets, drawn.targets)
    assert set(_rows(train)) & set(_rows(test))  # these tasks repeat objects


def test_modular_relabelled_split_with_unseen_false_shows_every_held_out_pair():
    task = get_task("modular", p=7, operation="add", train_fraction=0.5)
    train, test = task.split("relabelled", seed=0, unseen=False)
    pool = task.generate(49, seed=0)
    shown = task.relabel(pool.subset(torch.arange(len(train), 49)), seed=1)
    assert torch.equal(test.inputs, shown.inputs) and torch.equal(test.targets, shown.targets)
    assert set(_rows(train)) & set(_rows(test))  # σ maps some held-out pairs onto training ones


def test_a_split_asking_for_more_unseen_objects_than_exist_names_the_shortfall():
    task = get_task("dyck", k=1, max_length=4)  # three words: (), (()), ()()
    with pytest.raises(ValueError, match=r"only 0 of n_test=5 test examples could be drawn "
                                         r"whose inputs are not among the 20 training "
                                         r"examples \(3 distinct\)"):
        task.split("random", 20, 5, seed=0)


@pytest.mark.parametrize("name", ["polynomials", "polynomial_regression", "listops", "dyck",
                                  "dyck_recognition"])
def test_size_split_trains_on_smaller_objects_than_it_tests(name):
    from graded.evaluation import sequence_lengths

    task = small_task(name)
    train, test = task.split("size", 20, 20, seed=0)
    if name == "polynomials":
        grades = train.tensors["token_grades"]
        # the largest coefficient degree of the prompt bounds the input degrees
        small_max = int(grades.max())
        large_min = int(test.tensors["token_grades"].amax(1).min())
        assert small_max < large_min
    else:
        assert int(sequence_lengths(train).max()) < int(sequence_lengths(test).min())


@pytest.mark.parametrize("name", ["modular", "multiscale", "weighted_projective"])
def test_meaningless_splits_raise_naming_the_task(name):
    with pytest.raises(ValueError, match=f"size split is not meaningful for task '{name}'"):
        small_task(name).split("size", 5, 5)


@pytest.mark.parametrize("name", [n for n in available_tasks() if n != "graph_properties"])
def test_tasks_without_families_refuse_a_family_split_naming_the_task(name):
    task = small_task(name)
    assert task.families() == ()
    with pytest.raises(ValueError, match=f"family split is not meaningful for task '{name}'"):
        task.split("family", 5, 5)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_task_option_that_is_not_finite_is_refused_naming_it(value):
    # NaN compares false with every bound, so check_float let it through to the generator
    from graded.checks import check_float
    from graded.tasks.polynomial_regression import PolynomialRegression

    with pytest.raises(ValueError, match=rf"noise must be a finite number, got {value}"):
        PolynomialRegression(noise=value)
    with pytest.raises(ValueError, match=r"edge_prob must be a finite number"):
        check_float("edge_prob", value, minimum=0.0, maximum=1.0)
    assert check_float("edge_prob", 0.5, minimum=0.0, maximum=1.0) == 0.5


def test_equal_float_inputs_share_one_key_so_no_signed_zero_escapes_the_leakage_check():
    """``input_keys`` keys rows by their bytes: -0.0 and 0.0 are equal inputs with different
    bytes, so a test row [-0.0, 1.0] escaped ``unseen_test`` beside a train row [0.0, 1.0]."""
    from graded.tasks.base import input_keys, unseen_test

    def rows(values):
        x = torch.tensor(values)
        return TaskDataset({"inputs": x, "targets": torch.zeros(len(x))}, task="t",
                           kind="regression")

    train = rows([[0.0, 1.0], [2.0, 3.0]])
    candidates = rows([[-0.0, 1.0], [4.0, 5.0]])
    assert input_keys(train)[0] == input_keys(candidates)[0]
    fresh = rows([[6.0, 7.0]])
    test = unseen_test(train, candidates, 2, lambda m, seed: fresh, seed=0)
    assert test.inputs.tolist() == [[4.0, 5.0], [6.0, 7.0]]


@pytest.mark.parametrize("name", ["modular", "dyck"])
def test_a_seed_beyond_what_a_torch_generator_takes_is_refused_naming_it(name):
    task = get_task(name)
    largest = 2**64 - 1  # torch.Generator().manual_seed takes seeds up to this one
    torch.Generator().manual_seed(largest)
    assert len(task.generate(2, seed=largest)) == 2
    with pytest.raises(ValueError, match=rf"seed must be <= {largest}, got {largest + 1}"):
        task.generate(2, seed=largest + 1)


def test_a_boolean_mask_selects_the_examples_where_it_is_true():
    tensors = {"inputs": torch.arange(8).reshape(4, 2), "targets": torch.tensor([5, 6, 7, 8])}
    data = TaskDataset(tensors, task="t", kind="classification")
    mask = [True, False, False, True]
    expected = [t for t, keep in zip([5, 6, 7, 8], mask, strict=True) if keep]
    assert data.subset(mask).targets.tolist() == expected
    assert data.subset(torch.tensor(mask)).targets.tolist() == expected
    assert data.subset([]).targets.tolist() == []
    with pytest.raises(ValueError, match=r"one entry per example, shape \(4,\), got \(2,\)"):
        data.subset([True, False])
    with pytest.raises(TypeError, match=r"ints\) or a boolean mask, got dtype torch.float32"):
        data.subset(torch.tensor([0.7, 2.9]))
