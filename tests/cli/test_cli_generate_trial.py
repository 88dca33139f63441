"""`graded generate`'s refusal of a --max-new-tokens the model's max_len has no room for:
the numbers, in words that agree (one start token, one prompt token, several)."""

import pytest


@pytest.mark.parametrize(("kind", "prompt_len", "expected"), [
    ("seq2seq", 3, "--max-new-tokens 9 does not fit: the start token leaves room for 7 in the "
                   "model's max_len=8"),
    ("lm", 1, "--max-new-tokens 9 does not fit: the prompt's 1 token leaves room for 7 in the "
              "model's max_len=8"),
    ("lm", 3, "--max-new-tokens 9 does not fit: the prompt's 3 tokens leave room for 5 in the "
              "model's max_len=8"),
], ids=["seq2seq", "one prompt token", "three prompt tokens"])
def test_graded_generate_says_how_much_room_the_prompt_leaves_in_words_that_agree(
        kind, prompt_len, expected):
    from types import SimpleNamespace

    from graded.cli.generate import _new_token_budget

    model = SimpleNamespace(config=SimpleNamespace(positional="learned", max_len=8))
    with pytest.raises(ValueError) as refused:
        _new_token_budget(model, SimpleNamespace(name=kind, generates_tokens=True),
                          prompt_len, 9)
    assert str(refused.value) == expected
