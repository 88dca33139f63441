"""A grading copied (``copy.deepcopy``, pickling) inside a :func:`shared_scales` block is a
grading outside it: it computes its scales from its own grades, then and after they change."""

import copy
import pickle

import pytest
import torch

from graded.grading import ExponentialGrading, LinearGrading, shared_scales


def _copies(grading):
    with shared_scales(grading):
        grading.scales()  # held for the block
        return [copy.deepcopy(grading), pickle.loads(pickle.dumps(grading))]


@pytest.mark.parametrize("cls", [ExponentialGrading, LinearGrading])
def test_a_copy_made_inside_the_block_follows_its_new_grades(cls):
    # the copies kept the block's held scales for good: [1, 2, 4] after set_grades([3, 3, 3])
    g = cls(3, [0.0, 1.0, 2.0])
    for c in _copies(g):
        c.set_grades([3.0, 3.0, 3.0])
        expected = [8.0] * 3 if cls is ExponentialGrading else [4.0] * 3  # 2^3, 3 + 1
        assert c.scales().tolist() == expected
    assert g.scales().tolist() == ([1.0, 2.0, 4.0] if cls is ExponentialGrading
                                   else [1.0, 2.0, 3.0])


def test_a_learnable_grading_can_be_deep_copied_inside_the_block():
    # the held scales carry a graph: copy.deepcopy refused them ("Only Tensors created
    # explicitly by the user (graph leaves) support the deepcopy protocol")
    g = ExponentialGrading(3, [0.0, 1.0, 2.0], learnable=True)
    with shared_scales(g):
        g.scales()
        c = copy.deepcopy(g)
    with torch.no_grad():
        c.grades.fill_(1.0)
    assert c.scales().tolist() == [2.0, 2.0, 2.0]
