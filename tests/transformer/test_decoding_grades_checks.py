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
