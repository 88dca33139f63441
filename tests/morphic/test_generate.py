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
    about probabilities; it is refused up front like 0 and negative values, by the decoding
    loop's check that the LMs share."""
    model = build_morphic_model({
        "vocab_size": 6, "max_len": 8,
        "grades": [{"label": "g0", "dim": 4, "index": 0}], "layers": [{"banded": [0]}]})
    with pytest.raises(ValueError,
                       match=f"temperature must be a finite number > 0, got {temperature!r}"):
        model.generate(torch.zeros(1, 2, dtype=torch.long), 2, do_sample=True,
                       temperature=temperature)


def test_generate_applies_hugging_faces_processors_as_a_loop_over_the_whole_sequence():
    """Greedy morphic generation with a repetition penalty, a no-repeat n-gram size and a
    sequence bias equals a loop that runs the model on the whole sequence, processes the last
    logits with the same options and takes the argmax."""
    from graded.transformer.logits import logits_processing

    torch.manual_seed(0)
    model = build_morphic_model({
        "vocab_size": 7, "max_len": 16,
        "grades": [{"label": "g0", "dim": 4, "index": 0}, {"label": "g1", "dim": 4, "index": 1}],
        "layers": [{"banded": [0, 1], "block": "linear"}]}).eval()
    ids = torch.tensor([[1, 2, 3], [4, 4, 5]])
    options = {"repetition_penalty": 2.0, "no_repeat_ngram_size": 2,
               "sequence_bias": {(3, 6): 1.5, (0,): -0.5}}
    ours = model.generate(ids, 6, **options)
    processing = logits_processing(vocab_size=7, device=ids.device, **options)
    expected = ids
    with torch.no_grad():
        for i in range(6):
            scores = processing(model(expected)[:, -1], expected, new_tokens=i, last=i == 5)
            expected = torch.cat([expected, scores.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(ours, expected)
    assert not torch.equal(ours, model.generate(ids, 6))
