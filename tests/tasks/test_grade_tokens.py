"""Task.grade_tokens grades a sequence as the task's datasets grade it in token_grades."""

import pytest

from graded.tasks import available_tasks, get_task

SMALL = {  # the token-graded tasks, small
    "polynomials": {"max_degree": 2, "coeff_range": 3},
    "polynomials_seq2seq": {"max_degree": 2, "coeff_range": 3},
    "listops": {"max_length": 32, "max_depth": 3},
    "dyck": {"max_length": 16},
    "dyck_recognition": {"max_length": 16},
    "graph_properties": {"max_vertices": 7},
}
TOKEN_GRADED = sorted(SMALL)


def small_task(name):
    return get_task(name, **SMALL.get(name, {}))


def test_the_token_graded_tasks_are_those_that_implement_grade_tokens():
    graded = [n for n in available_tasks() if get_task(n).graded_object == "tokens"]
    assert graded == TOKEN_GRADED


def _rows(data, ids_key, grades_key, mask_key):
    for ids, grades, pad in zip(data.tensors[ids_key], data.tensors[grades_key],
                                data.tensors[mask_key]):
        keep = ~pad
        yield ids[keep].tolist(), grades[keep].tolist()


@pytest.mark.parametrize("name", TOKEN_GRADED)
def test_grade_tokens_of_every_example_equals_the_datasets_token_grades(name):
    task = small_task(name)
    data = task.generate(40, seed=3)
    pairs = [("inputs", "token_grades", "key_padding_mask")]
    if task.kind == "seq2seq":
        pairs.append(("decoder_inputs", "decoder_token_grades", "decoder_key_padding_mask"))
    for keys in pairs:
        for ids, grades in _rows(data, *keys):
            tokens = task.vocab.decode(ids)
            assert task.grade_tokens(tokens) == grades
            assert task.grade_tokens(" ".join(tokens)) == grades  # a prompt string


@pytest.mark.parametrize("name", [n for n in TOKEN_GRADED if small_task(n).causal_grades])
def test_causal_grades_grade_every_prefix_as_a_prefix(name):
    task = small_task(name)
    for ids, grades in _rows(task.generate(20, seed=4), "inputs", "token_grades",
                             "key_padding_mask"):
        tokens = task.vocab.decode(ids)
        for n in range(1, len(tokens) + 1):
            assert task.grade_tokens(tokens[:n]) == grades[:n]


def test_graph_grades_are_not_causal_and_say_so():
    task = small_task("graph_properties")
    assert not task.causal_grades
    assert task.grade_tokens("n=4 1 2 1 3") == [0, 2, 1, 2, 1]  # vertex 1 has degree 2
    with pytest.raises(ValueError, match="starts with its vertex count n=K"):
        task.grade_tokens("1 2")


def test_grading_refuses_an_unknown_token_and_a_task_without_token_grades():
    with pytest.raises(ValueError, match="unknown token 'x'"):
        small_task("dyck").grade_tokens("( x )")
    with pytest.raises(ValueError, match=r"task 'modular' does not grade its tokens "
                       r"\(graded_object='none'\)"):
        small_task("modular").grade_tokens("1 2")
