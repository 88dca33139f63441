"""The switches of the graded layers take True or False only, and the error names the
argument the user passed (``learnable_grades``, ``bias``), not the name of an inner module's
argument (ExponentialGrading's ``learnable``)."""

from __future__ import annotations

import pytest
import torch

from graded.nn.graded_layers import (
    GradedLinear,
    InputGradedLinear,
    MultiplicativeGradedLinear,
    OutputGradedLinear,
)

LAYERS = [GradedLinear, MultiplicativeGradedLinear, InputGradedLinear, OutputGradedLinear]


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("value", ["no", 1, 0, None])
def test_learnable_grades_must_be_a_bool_and_the_error_names_it(layer, value):
    with pytest.raises(TypeError, match=rf"^learnable_grades must be True or False, got "
                                        rf"{value!r} \({type(value).__name__}\)$"):
        layer(3, 2, learnable_grades=value)


@pytest.mark.parametrize("layer", LAYERS)
def test_bias_must_be_a_bool_and_the_error_names_it(layer):
    with pytest.raises(TypeError, match=r"^bias must be True or False, got 'no' \(str\)$"):
        layer(3, 2, bias="no")


@pytest.mark.parametrize("layer", LAYERS)
def test_bool_switches_are_read_as_given(layer):
    m = layer(3, 2, bias=False, learnable_grades=True)
    grades = m.grading.grades if hasattr(m, "grading") else m.grades
    assert isinstance(grades, torch.nn.Parameter)
    linear = m.linear if hasattr(m, "linear") else m
    assert linear.bias is None
