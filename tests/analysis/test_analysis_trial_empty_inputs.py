"""diagnose on inputs with no sequence or no position names the input's shape (it used to fail
in the feature concentration, or blame padding for its NaN means, naming no shape)."""

from __future__ import annotations

import pytest
import torch
from analysis_helpers import tiny_config

from graded import TransformerLM
from graded.analysis import diagnose


def _graded() -> TransformerLM:
    return TransformerLM(tiny_config(grading="exponential", grade_init="warm_start",
                                     grade_init_value=0.3))


@pytest.mark.parametrize("shape", [(0, 5), (2, 0)])
def test_diagnose_refuses_empty_inputs_naming_their_shape(shape):
    model = _graded()
    with pytest.raises(ValueError, match=rf"at least one position, got an input of shape "
                                         rf"\({shape[0]}, {shape[1]}\)"):
        diagnose(model, torch.zeros(shape, dtype=torch.long))


def test_diagnose_names_the_shape_of_inputs_without_a_length_axis():
    with pytest.raises(ValueError, match=r"no \(batch, length, \.\.\.\) tensor; got tensors of "
                                         r"shape \[\(3,\)\]"):
        diagnose(_graded(), torch.tensor([1, 2, 3]))
