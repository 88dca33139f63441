"""The relabelled split of modular arithmetic encodes only the pairs it returns: the same split
as encoding the whole table, keying its examples and relabelling every held-out pair (a naive
reference below), encoding no other pair (its peak memory at p = 3001 is tested in
test_tasks_trial_modular_table.py)."""

import itertools

import pytest
import torch

import graded.tasks.modular as modular
from graded.tasks import get_task
from graded.tasks.base import MAX_SEED, derived_seed

PYTHON_OPS = {"add": lambda a, b, p: (a + b) % p, "sub": lambda a, b, p: (a - b) % p,
              "mul": lambda a, b, p: a * b % p, "div": lambda a, b, p: a * pow(b, -1, p) % p}


def _reference(task, n_train, n_test, seed, unseen):
    """Train and test pairs (a, b, label) of a relabelled split, from the whole table in
    Python: the seeded order, train its first n_train pairs, the held-out pairs shown as
    (σa, σb) with label σ(a ∘ b), those shown as a training pair left out when ``unseen``."""
    p, op = task.p, task.operation
    table = [(a, b) for a, b in itertools.product(range(p), range(p)) if op != "div" or b]
    order = torch.randperm(len(table), generator=torch.Generator().manual_seed(seed)).tolist()
    pairs = [table[i] for i in order]
    train, held_out = pairs[:n_train], pairs[n_train:]
    sigma = task.automorphism(derived_seed(seed, 1)).tolist()
    seen = set(train) if unseen else set()
    shown = [(sigma[a], sigma[b], sigma[PYTHON_OPS[op](a, b, p)]) for a, b in held_out
             if (sigma[a], sigma[b]) not in seen]
    return ([(a, b, PYTHON_OPS[op](a, b, p)) for a, b in train],
            shown if n_test is None else shown[:n_test])


def _triples(task, data):
    a, b = task.operands(data)
    return list(zip(a.tolist(), b.tolist(), data.targets.tolist()))


@pytest.mark.parametrize("chunk", [3, 1 << 20])
@pytest.mark.parametrize("p, op", [(7, "add"), (8, "sub"), (11, "mul"), (13, "div"),
                                   (9, "add")])
@pytest.mark.parametrize("sizes", [(None, None), (20, 5), (5, None), (30, 1)])
@pytest.mark.parametrize("seed", [0, 4, MAX_SEED])
@pytest.mark.parametrize("unseen", [True, False])
def test_a_relabelled_split_is_the_naive_one(monkeypatch, chunk, p, op, sizes, seed, unseen):
    monkeypatch.setattr(modular, "_CHUNK", chunk, raising=False)  # boundaries in the scan
    task = get_task("modular", p=p, operation=op)
    n_train, n_test = sizes
    n_train_used = n_train or round(task.train_fraction * task.table_size)
    ref_train, ref_test = _reference(task, n_train_used, n_test, seed, unseen)
    if n_test is not None and len(ref_test) < n_test:
        with pytest.raises(ValueError, match="fewer than n_test"):
            task.split("relabelled", n_train, n_test, seed=seed, unseen=unseen)
        return
    train, test = task.split("relabelled", n_train, n_test, seed=seed, unseen=unseen)
    assert _triples(task, train) == ref_train
    assert _triples(task, test) == ref_test
    assert not test.tensors["key_padding_mask"].any() and test.inputs.shape == (len(ref_test), 4)
    assert train.info == test.info == task.generate(1).info


def test_too_few_unseen_pairs_are_counted_over_the_whole_table():
    task = get_task("modular", p=7)
    fresh = len(_reference(task, 40, None, 2, True)[1])
    with pytest.raises(ValueError, match=f"has {fresh} held-out pairs .* fewer than n_test="
                                         f"{fresh + 1}"):
        task.split("relabelled", 40, fresh + 1, seed=2)


def test_a_relabelled_split_encodes_only_the_pairs_it_returns(monkeypatch):
    encoded = []
    encode = modular.ModularArithmetic.encode_pairs

    def counting(self, a, b):
        encoded.append(len(a))
        return encode(self, a, b)

    monkeypatch.setattr(modular.ModularArithmetic, "encode_pairs", counting)
    task = get_task("modular", p=97)
    train, test = task.split("relabelled", 50, 20, seed=1)
    assert (len(train), len(test)) == (50, 20)
    assert max(encoded) <= 50  # the whole table (9409 pairs) was encoded before

