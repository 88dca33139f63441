"""Modular arithmetic: labels by Python integers, table splits, automorphic relabelling."""

import pytest
import torch

from graded.tasks import ModularArithmetic


def reference(a, b, p, op):
    if op == "add":
        return (a + b) % p
    if op == "sub":
        return (a - b) % p
    if op == "mul":
        return (a * b) % p
    if op == "quad":
        return (a * a + a * b + b * b) % p
    return next(c for c in range(p) if (c * b) % p == a % p)  # division by search


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "quad"])
def test_labels_match_integer_arithmetic(op):
    task = ModularArithmetic(p=13, operation=op)
    data = task.generate(60, seed=0)
    for row, c in zip(data.inputs.tolist(), data.targets.tolist()):
        a, sym, b, eq = task.vocab.decode(row)
        assert sym == {"add": "+", "sub": "-", "mul": "*", "div": "/", "quad": "^"}[op]
        assert eq == "=" and c == reference(int(a), int(b), 13, op)


def test_division_never_divides_by_zero_and_covers_the_table():
    task = ModularArithmetic(p=7, operation="div")
    data = task.generate(42, seed=0)
    a, b = task.operands(data)
    assert bool((b != 0).all()) and len({(x, y) for x, y in zip(a.tolist(), b.tolist())}) == 42
    with pytest.raises(ValueError, match="exceeds the 42 distinct pairs"):
        task.generate(43)


def test_train_fraction_split_is_disjoint():
    task = ModularArithmetic(p=11, train_fraction=0.3)
    train, test = task.split("random", seed=1)
    assert len(train) == round(0.3 * 121) and len(train) + len(test) == 121
    a = set(map(tuple, train.inputs.tolist()))
    assert not a & set(map(tuple, test.inputs.tolist()))


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_relabelled_test_set_is_correct_and_a_bijective_image(op):
    task = ModularArithmetic(p=11, operation=op)
    sigma = task.automorphism(seed=2)
    assert sorted(sigma.tolist()) == list(range(11)) and not torch.equal(sigma, torch.arange(11))
    _, test = task.split("relabelled", 40, 40, seed=0)
    a, b = task.operands(test)
    assert [reference(x, y, 11, op) for x, y in zip(a.tolist(), b.tolist())] == \
        test.targets.tolist()


def test_quad_has_no_relabelling_and_composite_p_rejects_division():
    with pytest.raises(ValueError, match="not meaningful for operation 'quad'"):
        ModularArithmetic(p=11, operation="quad").split("relabelled", 10, 10)
    with pytest.raises(ValueError, match="needs a prime p, got p=12"):
        ModularArithmetic(p=12, operation="div")


def test_documented_example_round_trips():
    task = ModularArithmetic(p=97)
    ids = task.vocab.encode("28 + 57 =")
    assert task.vocab.decode_str(ids) == "28 + 57 ="
    data = task.generate(97 * 97, seed=0)
    row = (data.inputs == torch.tensor(ids)).all(1)
    assert data.targets[row].tolist() == [85]


@pytest.mark.parametrize("op", ["add", "mul"])
def test_relabelled_split_shows_no_training_pair_in_its_test_set(op):
    # σ maps the table onto itself: the image (σa, σb) of a held-out pair is a training pair
    # for about train_fraction of them, and would be scored with its training answer
    task = ModularArithmetic(p=11, operation=op, train_fraction=0.5)
    train, test = task.split("relabelled", seed=0)
    train_pairs = set(zip(*(t.tolist() for t in task.operands(train))))
    test_pairs = list(zip(*(t.tolist() for t in task.operands(test))))
    assert not train_pairs & set(test_pairs)
    # independently: the held-out pairs (a, b) with (σa, σb) held out too, in table order
    sigma = task.automorphism(seed=1).tolist()
    order = list(zip(*(t.tolist() for t in task.operands(task.generate(121, seed=0)))))
    held_out = order[len(train):]
    expected = [(sigma[a], sigma[b]) for a, b in held_out
                if (sigma[a], sigma[b]) not in train_pairs]
    assert test_pairs == expected and 0 < len(expected) < len(held_out)
    assert test.targets.tolist() == [reference(a, b, 11, op) for a, b in test_pairs]
    with pytest.raises(ValueError, match=rf"has {len(expected)} held-out pairs whose "
                                         rf"relabelled pair is not a training pair, fewer "
                                         rf"than n_test={len(expected) + 1}"):
        task.split("relabelled", len(train), len(expected) + 1, seed=0)
