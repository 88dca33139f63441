"""Diagnostics plumbing: run_model's argument forms and the input checks no other test reaches."""

import pytest
import torch
from torch import nn

from graded.analysis._common import check_weights, input_length, run_model


class _Add(nn.Module):
    def forward(self, a, b=None, *, scale=1.0):
        return scale * (a if b is None else a + b)


def test_run_model_unpacks_a_tuple_and_passes_keywords():
    a, b = torch.ones(2, 3), torch.full((2, 3), 2.0)
    torch.testing.assert_close(run_model(_Add(), (a, b), scale=2.0), torch.full((2, 3), 6.0))
    torch.testing.assert_close(run_model(_Add(), a), a)


def test_run_model_refuses_other_inputs():
    with pytest.raises(TypeError, match=r"inputs must be a tensor or a tuple of model arguments, "
                                        r"got list"):
        run_model(_Add(), [torch.ones(1)])


def test_check_weights_names_type_and_shape():
    with pytest.raises(TypeError, match=r"attn must be a floating tensor, got torch\.int64"):
        check_weights(torch.ones(2, 2, dtype=torch.long), "attn")
    with pytest.raises(TypeError, match=r"weights must be a floating tensor, got list"):
        check_weights([0.5, 0.5])
    with pytest.raises(ValueError, match=r"attn must have shape \(\.\.\., queries, keys\), got "
                                         r"shape \(4,\)"):
        check_weights(torch.ones(4), "attn", min_dim=2)
    with pytest.raises(ValueError, match=r"p must have shape \(\.\.\., keys\), got shape \(\)"):
        check_weights(torch.tensor(1.0), "p")


def test_input_length_is_the_longest_sequence():
    assert input_length((torch.zeros(2, 5), torch.zeros(2, 7, 3), "mask")) == 7
    with pytest.raises(ValueError, match=r"inputs hold no \(batch, length, \.\.\.\) tensor"):
        input_length((torch.zeros(3), None))
