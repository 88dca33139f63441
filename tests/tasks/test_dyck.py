"""Dyck-k: words are balanced (independent recogniser), masks, depths, relabelling."""

import pytest
import torch

from graded.tasks import DyckLM, DyckRecognition


def balanced_by_cancellation(word, pairs):
    """Independent recogniser: repeatedly delete adjacent matched pairs."""
    s = list(word)
    changed = True
    while changed:
        changed = False
        for i in range(len(s) - 1):
            if (s[i], s[i + 1]) in pairs:
                del s[i: i + 2]
                changed = True
                break
    return not s


def max_depth(word, pairs):
    openers = {o for o, _ in pairs}
    d = best = 0
    for t in word:
        d += 1 if t in openers else -1
        best = max(best, d)
    return best


def test_lm_words_are_balanced_within_length_and_depth():
    task = DyckLM(k=3, min_length=4, max_length=20, max_depth=4)
    data = task.generate(100, seed=0)
    for w in task.words(data):
        assert balanced_by_cancellation(w, task.pairs)
        assert 4 <= len(w) <= 20 and len(w) % 2 == 0 and max_depth(w, task.pairs) <= 4


def test_lm_format_round_trips_and_metric_mask_marks_closing_targets():
    task = DyckLM(k=2, max_length=12)
    text = "<bos> ( [ ] ( ) ) <eos>"
    assert task.vocab.decode_str(task.vocab.encode(text)) == text
    data = task.generate(20, seed=1)
    closers = {c for _, c in task.pairs}
    for i, w in enumerate(task.words(data)):
        tokens = ["<bos>", *w, "<eos>"]
        targets = task.vocab.decode(data.targets[i][data.tensors["loss_mask"][i]])
        assert targets == tokens[1:]
        expected = [t in closers for t in tokens[1:]]
        n = len(expected)
        assert data.tensors["metric_mask"][i, :n].tolist() == expected
        assert not data.tensors["metric_mask"][i, n:].any()


def test_token_grades_are_enclosing_pairs():
    task = DyckLM(k=2, max_length=12)
    data = task.generate(10, seed=2)
    for i, w in enumerate(task.words(data)):
        expected, d = [0], 0  # <bos>
        for t in w:
            if t in ("(", "["):
                expected.append(d)
                d += 1
            else:
                d -= 1
                expected.append(d)
        assert data.tensors["token_grades"][i, : len(expected)].tolist() == expected


def test_recognition_labels_match_an_independent_recogniser():
    task = DyckRecognition(k=2, max_length=16)
    data = task.generate(300, seed=3)
    labels = [int(balanced_by_cancellation(w, task.pairs)) for w in task.words(data)]
    assert labels == data.targets.tolist()
    assert 0.4 < data.targets.float().mean() < 0.6


@pytest.mark.parametrize("cls", [DyckLM, DyckRecognition])
def test_relabelling_permutes_bracket_types_bijectively(cls):
    task = cls(k=3, max_length=16)
    table = task.type_permutation(seed=5)
    assert sorted(table.tolist()) == list(range(len(task.vocab)))
    assert not torch.equal(table, torch.arange(len(task.vocab)))
    data = task.generate(50, seed=4)
    moved = task.relabel(data, seed=5)
    inverse = torch.argsort(table)
    assert torch.equal(inverse[moved.inputs], data.inputs)
    for w, label in zip(task.words(moved), moved.targets.tolist()):
        if cls is DyckLM:
            assert balanced_by_cancellation(w, task.pairs)
        else:
            assert int(balanced_by_cancellation(w, task.pairs)) == label


def test_odd_lengths_are_rejected():
    with pytest.raises(ValueError, match="even"):
        DyckLM(max_length=15)


@pytest.mark.parametrize("cls, options", [
    (DyckLM, {"k": 2, "max_length": 16, "max_depth": 2}),
    (DyckRecognition, {"k": 2, "max_length": 16, "max_depth": 2, "p_open": 0.9}),
    (DyckRecognition, {"k": 1, "max_length": 20, "max_depth": 3, "p_open": 0.9}),
])
def test_grades_list_every_token_grade_the_data_holds(cls, options):
    # graded_object "tokens": ``grades`` lists the possible values of ``token_grades``
    task = cls(**options)
    data = task.generate(1500, seed=0)
    held = set(data.tensors["token_grades"].flatten().tolist())
    assert held <= set(task.grades)
    # the depth counter, recomputed by hand with the clamp at 0, reaches the top grade:
    # a close flipped to an open lifts the later depths by 2 past a balanced word's max_depth-1
    top = 0
    for w in task.words(data):
        d = 0
        for t in w:
            if t in "([{<":
                top, d = max(top, d), d + 1
            else:
                d = max(d - 1, 0)
                top = max(top, d)
    assert top == max(held) == (task.max_depth - 1 if cls is DyckLM else task.max_depth + 1)
    assert max(task.grades) == top


@pytest.mark.parametrize("length", [0, 2, 6, 40])
def test_a_word_of_an_even_length_asked_for_is_balanced_and_that_long(length):
    import random

    task = DyckLM(k=3, max_depth=3)
    for seed in range(20):
        word = task.sample_word(random.Random(seed), length)
        assert len(word) == length and balanced_by_cancellation(word, task.pairs)
        assert max_depth(word, task.pairs) <= 3


@pytest.mark.parametrize(("length", "error", "message"), [
    (3, ValueError, r"even length, got length=3"),
    (-2, ValueError, r"length must be >= 0, got -2"),
    (4.0, TypeError, r"length must be an int, got 4\.0"),
])
def test_a_word_length_no_balanced_word_has_is_refused_naming_it(length, error, message):
    import random

    with pytest.raises(error, match=message):
        DyckLM().sample_word(random.Random(0), length)


@pytest.mark.parametrize("seed, error, message", [
    (-5, ValueError, r"seed must be >= 0, got -5"),  # random.Random(-5) draws what 5 draws
    (5.0, TypeError, r"seed must be an int, got 5\.0 \(float\)"),
    (True, TypeError, r"seed must be an int, got True \(bool\)"),
])
def test_type_permutation_checks_its_seed_as_relabel_does(seed, error, message):
    task = DyckLM(k=3, max_length=16)
    data = task.generate(4, seed=1)
    for call in (lambda: task.type_permutation(seed), lambda: task.relabel(data, seed)):
        with pytest.raises(error, match=message):
            call()
    # a checked seed still gives relabel's table: the inputs move by it, token by token
    table = task.type_permutation(5)
    assert task.relabel(data, 5).inputs.tolist() == [[table[i].item() for i in row]
                                                     for row in data.inputs.tolist()]
