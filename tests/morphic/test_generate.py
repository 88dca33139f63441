"""Morphic generation stays within the positions the model has."""

from __future__ import annotations

import pytest
import torch

from graded.morphic import build_morphic_model


def test_generate_refuses_a_prompt_past_max_len_with_learned_positions():
    model = build_morphic_model({
        "vocab_size": 6, "max_len": 8,
        "grades": [{"label": "g0", "dim": 4, "index": 0}, {"label": "g1", "dim": 4, "index": 1}],
        "layers": [{"banded": [0, 1], "block": "linear"}]})
    ids = torch.zeros(1, 6, dtype=torch.long)
    assert model.generate(ids, 2).shape == (1, 8)  # fits exactly
    with pytest.raises(ValueError, match="max_len=8"):
        model.generate(ids, 3)
    with pytest.raises(ValueError, match="max_len=8"):
        model.generate(torch.zeros(1, 9, dtype=torch.long), 1)


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("nan")])
def test_generate_refuses_a_temperature_that_is_not_positive_naming_it(temperature):
    """NaN compares false with 0, so `temperature <= 0` let it through to a multinomial error
    about probabilities; it is refused up front like 0 and negative values."""
    model = build_morphic_model({
        "vocab_size": 6, "max_len": 8,
        "grades": [{"label": "g0", "dim": 4, "index": 0}], "layers": [{"banded": [0]}]})
    with pytest.raises(ValueError, match=f"temperature must be > 0, got {temperature}"):
        model.generate(torch.zeros(1, 2, dtype=torch.long), 2, do_sample=True,
                       temperature=temperature)
