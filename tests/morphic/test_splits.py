"""Generalisation splits of the morphic tasks: held-out adder sets, moduli and lengths."""

import pytest
import torch

from graded.morphic.tasks import (
    DyckDepthTask,
    ModularAdditionTask,
    ModularReduction,
    build_dyck_model,
    build_modular_model,
    evaluate_dyck,
    evaluate_modular,
    length_split,
)
from graded.morphic.tasks.dyck import CLOSE, D0, DPOS, FILL, OPEN
from graded.morphic.training import train_morphic


def rows(t: torch.Tensor) -> set[tuple[int, ...]]:
    return {tuple(r) for r in t.tolist()}


def test_modular_examples_match_a_hand_computation():
    task = ModularAdditionTask((5, 7), (1, 3))
    ids, targets, _adder, _modulus = task.make(torch.tensor([[4, 1, 0], [6, 0, 1]]))
    # tokens: digits 0..6, ADD_1 = 7, ADD_3 = 8, MOD_5 = 9, MOD_7 = 10, "=" = 11
    assert ids.tolist() == [[4, 8, 9, 11], [6, 7, 10, 11]]
    assert targets[:, 3].tolist() == [(4 + 3) % 5, (6 + 1) % 7]
    assert (targets[:, :3] == -100).all() and task.vocab_size == 12
    assert len(task.all_triples()) == 2 * 5 + 2 * 7
    with pytest.raises(ValueError, match="0 <= x < its modulus"):
        task.make(torch.tensor([[5, 0, 0]]))  # 5 is not a digit mod 5


def test_modular_reduction_and_integer_shift_are_the_tools_they_name():
    from graded.morphic.tasks.modular import integer_shift

    moduli, width = (5, 7), 10
    tool = ModularReduction(moduli, width)
    for j, p in enumerate(moduli):
        for s in range(width):
            y = tool(torch.eye(2)[j], torch.eye(width)[s])
            assert int(y.argmax()) == s % p and float(y.sum()) == 1.0
    shift = integer_shift(width, 3)
    for s in range(width - 3):
        assert int(shift(torch.eye(width)[s]).argmax()) == s + 3


@pytest.mark.parametrize("seed", range(4))
def test_held_out_adder_sets_are_disjoint_and_keep_every_symbol_in_training(seed):
    task = ModularAdditionTask((5, 7, 11), (1, 2, 3, 4))
    train, held = task.split_adders(per_modulus=1, seed=seed)
    assert not rows(train) & rows(held)
    assert rows(train) | rows(held) == rows(task.all_triples())
    pairs_train = {(a, m) for _, a, m in train.tolist()}
    pairs_held = {(a, m) for _, a, m in held.tolist()}
    assert not pairs_train & pairs_held  # the (modulus, adder) combination is new
    assert {m for _, m in pairs_held} == {0, 1, 2}  # one held-out adder per modulus
    assert {a for a, _ in pairs_train} == set(range(4))  # every adder trained
    for j, p in enumerate(task.moduli):  # every digit and answer of each modulus trained
        mine = train[train[:, 2] == j]
        assert set(mine[:, 0].tolist()) == set(range(p))
        assert set(task.answers(mine).tolist()) == set(range(p))
    with pytest.raises(ValueError, match=r"per_modulus must be an int in \[1, 3\]"):
        task.split_adders(per_modulus=4)


def test_held_out_moduli_are_never_trained_and_need_only_trained_digits_and_answers():
    task = ModularAdditionTask((5, 7, 11), (1, 2, 3))
    train, held = task.split_moduli([7])
    assert set(held[:, 2].tolist()) == {1} and 1 not in set(train[:, 2].tolist())
    assert rows(train) | rows(held) == rows(task.all_triples())
    assert set(held[:, 0].tolist()) <= set(train[:, 0].tolist())
    assert set(task.answers(held).tolist()) <= set(task.answers(train).tolist())
    assert set(held[:, 1].tolist()) <= set(train[:, 1].tolist())
    with pytest.raises(ValueError, match=r"held-out moduli \[11\] exceed the largest training "
                                         r"modulus 7"):
        task.split_moduli([11])
    with pytest.raises(ValueError, match=r"distinct moduli of the task \[5, 7, 11\], got \[6\]"):
        task.split_moduli([6])


@pytest.mark.slow  # a training run of 3.5 s on 2 cores: `pytest -m slow`
def test_modular_model_applies_to_held_out_moduli_after_training_on_the_others():
    task = ModularAdditionTask((5, 7, 11), (1, 2, 3))
    train, held = task.split_moduli([7])
    torch.manual_seed(0)
    model = build_modular_model(task, router_input="operator")

    def batches(g: torch.Generator):
        ids, targets, _, _ = task.sample(64, g, triples=train)
        return ids, targets

    train_morphic(model, batches, steps=250, lr=0.01, seed=0, log_every=250)
    assert evaluate_modular(model, task, train)["answer_accuracy"] == 1.0
    result = evaluate_modular(model, task, held)
    assert result["routing_accuracy"] == 1.0 and result["answer_accuracy"] == 1.0


def test_dyck_length_split_holds_out_longer_sequences_and_trains_every_symbol():
    train, test = length_split(12, 40)
    ids, targets = train.sample(256, torch.Generator().manual_seed(0))
    long_ids, _ = test.sample(64, torch.Generator().manual_seed(1))
    assert ids.shape[1] == 12 and long_ids.shape[1] == 40  # disjoint: no sequence in both
    assert set(ids.unique().tolist()) == {OPEN, CLOSE, FILL}
    assert set(targets.unique().tolist()) == {D0, DPOS}
    with pytest.raises(ValueError, match="test_length must exceed train_length = 12, got 12"):
        length_split(12, 12)


def test_dyck_model_trained_short_is_evaluated_on_longer_sequences():
    train, test = length_split(10, 30)
    torch.manual_seed(0)
    model = build_dyck_model(train, max_len=30)
    train_morphic(model, lambda g: train.sample(64, g), steps=150, lr=0.02, seed=0,
                  log_every=150)
    ids, targets = test.sample(256, torch.Generator().manual_seed(3))
    result = evaluate_dyck(model, ids, targets, from_position=10)
    hits = (model(ids).argmax(-1) == targets)[:, 10:]  # independent count past length 10
    assert result["accuracy_from_position"] == pytest.approx(float(hits.float().mean()))
    assert result["accuracy_from_position"] >= 0.85
    with pytest.raises(ValueError, match="exceeds max_len 10"):
        build_dyck_model(DyckDepthTask(10))(ids)
