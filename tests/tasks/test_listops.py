"""ListOps: values by an independent evaluator, format round trip, depths, lengths."""

import statistics

import pytest

from graded.tasks import ListOps
from graded.tasks.listops import apply_operator, parse, to_tokens


def naive_value(text: str) -> int:
    """Evaluate a ListOps string with an explicit stack of partial lists (no recursion)."""
    stack = []
    for tok in text.split():
        if tok.startswith("["):
            stack.append([tok])
        elif tok == "]":
            op, *args = stack.pop()
            if op == "[MIN":
                v = min(args)
            elif op == "[MAX":
                v = max(args)
            elif op == "[SM":
                v = sum(args) % 10
            else:  # LRA: int(np.median(args))
                v = int(statistics.median(args))
            if not stack:
                return v
            stack[-1].append(v)
        else:
            stack[-1].append(int(tok))
    raise AssertionError("unterminated expression")


def test_values_match_an_independent_stack_evaluator():
    task = ListOps(max_length=48, max_depth=4)
    data = task.generate(200, seed=0)
    for row, target in zip(data.inputs, data.targets):
        assert naive_value(task.vocab.decode_str(row)) == int(target)


def test_median_truncates_like_lra():
    assert apply_operator("[MED", [1, 2]) == 1
    assert apply_operator("[MED", [3, 8]) == 5
    assert apply_operator("[MED", [9, 0, 4]) == 4
    assert apply_operator("[SM", [9, 8, 7]) == 4


def test_documented_example_round_trips():
    text = "[MAX 2 9 [MIN 4 7 ] 0 ]"
    task = ListOps()
    assert task.vocab.decode_str(task.vocab.encode(text)) == text
    tree = parse(text.split())
    assert " ".join(to_tokens(tree)) == text and naive_value(text) == 9
    with pytest.raises(ValueError, match="unexpected"):
        parse(["[MAX", "]"])
    with pytest.raises(ValueError, match="after the end"):
        parse(["[MAX", "2", "]", "]"])


def test_token_grades_count_enclosing_lists():
    task = ListOps(max_length=40, max_depth=5)
    data = task.generate(30, seed=1)
    for row, grades in zip(data.inputs, data.tensors["token_grades"]):
        toks = task.vocab.decode(row)
        open_lists = 0
        for t, g in zip(toks, grades.tolist()):
            if t == "]":
                open_lists -= 1
            assert g == open_lists
            if t.startswith("["):
                open_lists += 1
        assert max(grades.tolist()) <= task.max_depth


def test_long_expressions_reach_lra_lengths_within_bounds():
    task = ListOps(min_length=512, max_length=1024, max_depth=9, max_args=10)
    data = task.generate(4, seed=0)
    lengths = (~data.tensors["key_padding_mask"]).sum(1)
    assert data.inputs.shape[1] == 1024
    assert bool(((lengths >= 512) & (lengths <= 1024)).all())
    for row, target in zip(data.inputs, data.targets):
        assert naive_value(task.vocab.decode_str(row)) == int(target)


def test_impossible_length_range_fails_with_advice():
    task = ListOps(min_length=60, max_length=64, max_depth=1, max_args=3, max_tries=20)
    with pytest.raises(ValueError, match="widen the length range"):
        task.generate(1)


def test_a_prompt_with_an_unmatched_closing_bracket_gets_no_negative_grade():
    # grade_tokens grades prompts of any provenance; an unmatched "]" used to read as depth -1
    task = ListOps()
    toks = ["[MAX", "1", "]", "]", "[MIN", "2", "]"]
    open_lists, expected = [], []
    for t in toks:  # a stack of the lists open at each token
        if t == "]" and open_lists:
            open_lists.pop()
        expected.append(len(open_lists))
        if t.startswith("["):
            open_lists.append(t)
    assert task.grade_tokens(toks) == expected == [0, 1, 0, 0, 0, 1, 0]
