"""Token grades while generating: a finished (padded) row gets grade 0, and a non-callable
grader is named."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from graded.transformer.decoding_grades import grader_of, token_grading


def test_a_finished_row_gets_grade_zero_and_the_others_their_last_grade():
    calls = []

    def grader(ids):
        calls.append(list(ids))
        return [float(t) / 2 for t in ids]

    grade_last = grader_of(grader, torch.float64)
    ids = torch.tensor([[5, 6, 7], [3, 4, 0]])
    pads = torch.tensor([[False, False, False], [False, False, True]])
    out = grade_last(ids, pads)
    assert out.dtype == torch.float64 and out.tolist() == [3.5, 0.0]
    assert calls == [[5, 6, 7]]  # the finished row is not graded at all


def test_a_non_callable_token_grader_is_named():
    class Graded(nn.Module):
        config = SimpleNamespace(token_grading=True)

    ids = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(TypeError, match=r"token_grader must be callable, got list"):
        token_grading(Graded(), ids, torch.zeros(1, 3), [1, 2], grades_new_tokens=False)


@pytest.mark.parametrize("grade", ["2", True, None, [1.0], float("nan"), -1])
def test_a_last_grade_that_is_not_a_number_or_below_zero_is_refused_naming_it(grade):
    # float() would have read "2" as 2.0 and True as 1.0 without a word, and None as a TypeError
    # that named neither the grader nor the token
    grade_last = grader_of(lambda ids: [0.0] * (len(ids) - 1) + [grade], torch.float32)
    ids, pads = torch.tensor([[4, 9]]), torch.zeros(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"token_grader graded token 9 with .*; expected a "
                                         "finite grade >= 0"):
        grade_last(ids, pads)


def test_grades_given_as_numpy_or_0d_tensors_are_read_as_numbers():
    import numpy as np

    for grade in (np.float32(1.5), np.int64(3), torch.tensor(2.5)):
        grade_last = grader_of(lambda ids, g=grade: [0.0] * (len(ids) - 1) + [g], torch.float64)
        out = grade_last(torch.tensor([[4, 9]]), torch.zeros(1, 2, dtype=torch.bool))
        assert out.tolist() == [float(grade)]
