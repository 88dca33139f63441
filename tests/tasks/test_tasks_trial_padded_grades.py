"""Task.grade_tokens grades a padded row (the prompt grading decodes rows with their padding)
as the datasets grade it: every ``<pad>`` has grade 0, as ``token_grades`` pads with 0."""

import pytest

from graded.tasks import available_tasks, get_task

# every token-graded task, at sizes whose rows are mostly padding
PADDED = [
    ("dyck", {"max_length": 12, "min_length": 2}),
    ("dyck_recognition", {"max_length": 12, "min_length": 2}),
    ("graph_properties", {"max_vertices": 6, "min_vertices": 3}),
    ("listops", {"max_length": 24, "max_depth": 2}),
    ("polynomials", {"max_degree": 2, "coeff_range": 2, "min_degree": 0}),
    ("polynomials_seq2seq", {"max_degree": 2, "coeff_range": 2, "min_degree": 0}),
]


def test_the_padded_cases_cover_every_token_graded_task():
    graded = sorted(n for n in available_tasks() if get_task(n).graded_object == "tokens")
    assert [name for name, _ in PADDED] == graded


@pytest.mark.parametrize("name, options", PADDED)
def test_grade_tokens_of_a_padded_row_equals_the_datasets_token_grades_padding_included(
        name, options):
    task = get_task(name, **options)
    data = task.generate(30, seed=5)
    pairs = [("inputs", "token_grades")]
    if task.kind == "seq2seq":
        pairs.append(("decoder_inputs", "decoder_token_grades"))
    padded_rows = 0
    for ids_key, grades_key in pairs:
        for ids, grades in zip(data.tensors[ids_key], data.tensors[grades_key]):
            tokens = task.vocab.decode(ids, skip_pad=False)
            padded_rows += "<pad>" in tokens
            assert task.grade_tokens(tokens) == grades.tolist(), tokens
    assert padded_rows > 0  # the property is about padding: some rows must have it


def test_padding_has_grade_zero_in_a_graph_and_a_polynomial_by_hand():
    graph = get_task("graph_properties", max_vertices=4)
    # vertex 1 occurs twice (degree 2), vertices 2 and 3 once; two pads
    assert graph.grade_tokens("n=4 1 2 1 3 <pad> <pad>") == [0, 2, 1, 2, 1, 0, 0]
    poly = get_task("polynomials", max_degree=1, coeff_range=1)
    # <bos> (1 + x) * (1 - x) = 1 0 -1, then padding
    assert poly.grade_tokens("<bos> 1 1 * 1 -1 = 1 0 -1 <pad> <pad>") == [
        0, 0, 1, 0, 0, 1, 0, 0, 1, 2, 0, 0]
