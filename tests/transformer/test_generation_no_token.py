"""Decoding where the logits processors leave a row no token: refused naming the step and the
row, the same for greedy, sampled and beam decoding; a finished row's scores are never read.

The steps here are fixed score tables (no model), so every token is worked out by hand."""

import pytest
import torch

from graded import TransformerConfig, TransformerLM
from graded.transformer.generation import decode

VOCAB = 4
EOS = 3


def _decode(step, prompt, max_new_tokens, **options):
    defaults = dict(n_layers=0, do_sample=False, temperature=1.0, top_k=None, top_p=None,
                    num_beams=1, eos_token_id=None, pad_token_id=None, use_cache=False,
                    generator=None, length_penalty=1.0, vocab_size=VOCAB)
    mask = torch.zeros_like(prompt, dtype=torch.bool)
    return decode(step, prompt, mask, max_new_tokens, **{**defaults, **options})


def _fixed(rows):
    """A step whose scores are ``rows`` (B, V) at every position, whatever the ids (each row's
    for each of its beams: beam search steps B * num_beams rows)."""
    table = torch.tensor(rows, dtype=torch.float64)

    def step(ids, mask, cache):
        per_row = table.repeat_interleave(ids.shape[0] // table.shape[0], dim=0)
        return per_row[:, None].expand(-1, ids.shape[1], -1)

    return step


MODES = [dict(), dict(do_sample=True, generator=torch.Generator().manual_seed(0)),
         dict(num_beams=2)]


@pytest.mark.parametrize("mode", MODES, ids=["greedy", "sampling", "beam"])
def test_a_row_left_without_a_token_is_refused_naming_its_first_such_step_and_row(mode):
    """no_repeat_ngram_size=1 bans every id a row holds. Row 0 (prompt 0 1) has 2 and 3 left,
    so its third new token has none; row 1 (prompt 0 0) runs out one step later. Greedy
    decoding used to emit the banned token 0 there (argmax of all -inf), beam search to return
    the row without any new token, sampling to fail naming the rows but not the step."""
    step = _fixed([[0.0, 1.0, 40.0, 5.0], [0.0, 1.0, 40.0, 5.0]])
    prompt = torch.tensor([[0, 1], [0, 0]])
    # up to the second new token the rows decode: row 0 takes the two ids it has left (2
    # then 3 for greedy decoding; beam search may rank 3 2 first, a tie of the same sum)
    out = _decode(step, prompt, 2, no_repeat_ngram_size=1, **mode)
    assert sorted(out[0, 2:].tolist()) == [2, 3]
    if not mode:
        assert out[0].tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match=r"no token is left to generate at new token 3 in "
                                         r"row\(s\) \[0\]: every score is -inf"):
        _decode(step, prompt, 4, no_repeat_ngram_size=1, **mode)


@pytest.mark.parametrize("mode", MODES, ids=["greedy", "sampling", "beam"])
def test_every_token_banned_is_refused_at_the_first_step_for_every_row(mode):
    model_free = _fixed([[1.0, 2.0, 3.0, 4.0]] * 3)
    with pytest.raises(ValueError, match=r"at new token 1 in row\(s\) \[0, 1, 2\]"):
        _decode(model_free, torch.tensor([[1], [2], [0]]), 3,
                bad_words_ids=[[t] for t in range(VOCAB)], **mode)


def test_a_model_whose_scores_are_all_minus_inf_is_refused_without_any_processor():
    """The scores of a step (a model that masks its own vocabulary) are read, not only the
    processors' output."""
    step = _fixed([[0.0, 1.0, 2.0, 3.0], [float("-inf")] * VOCAB])
    for mode in MODES:
        with pytest.raises(ValueError, match=r"at new token 1 in row\(s\) \[1\]"):
            _decode(step, torch.tensor([[1], [2]]), 2, **mode)


@pytest.mark.parametrize("mode", MODES[:2], ids=["greedy", "sampling"])
def test_a_finished_row_whose_scores_are_all_banned_is_continued_with_the_pad_id(mode):
    """Row 0 ends at once (the EOS scores 100 against 0); with
    no_repeat_ngram_size=1 its history 0 1 3 2 bans every id at the third step, where row 1
    (prompt 0 0) still has the EOS left. Sampling used to fail ('no token is left to sample in
    row(s) [0]') on the finished row; worked by hand: row 1 takes 1, 2, then the EOS."""
    step = _fixed([[0.0, 0.0, 0.0, 100.0], [0.0, 100.0, 50.0, -100.0]])
    prompt = torch.tensor([[0, 1], [0, 0]])
    out = _decode(step, prompt, 4, no_repeat_ngram_size=1, eos_token_id=EOS, pad_token_id=2,
                  **mode)
    assert out.tolist() == [[0, 1, 3, 2, 2], [0, 0, 1, 2, 3]]


def test_a_beam_row_whose_beams_run_out_after_a_finished_hypothesis_returns_it():
    """Two beams: at the first step the EOS finishes a hypothesis and token 1 runs on; after
    it every token is banned (0 and 1 by no_repeat_ngram_size=1, 2 at -inf, the EOS by the
    bad word 1 3), so the row keeps the hypothesis it finished: [3]."""
    step = _fixed([[0.0, 1.0, float("-inf"), 2.0]])
    out = _decode(step, torch.tensor([[0]]), 3, num_beams=2, eos_token_id=EOS,
                  no_repeat_ngram_size=1, bad_words_ids=[[1, EOS]])
    assert out.tolist() == [[0, 3]]


def test_generate_and_a_banned_prompt_of_a_model_name_the_row_that_runs_out():
    """Through a model: every token but 7 banned, and 7 banned after itself (the bigram 7 7),
    so each row's second new token has none left."""
    torch.manual_seed(0)
    lm = TransformerLM(TransformerConfig(vocab_size=13, d_model=16, n_heads=2, n_layers=2,
                                         max_len=16)).eval()
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]])
    banned = [[t] for t in range(13) if t != 7] + [[7, 7]]
    assert lm.generate(prompt, 1, bad_words_ids=banned)[:, 3].tolist() == [7, 7]
    for options in (dict(), dict(do_sample=True), dict(num_beams=3)):
        with pytest.raises(ValueError, match=r"at new token 2 in row\(s\) \[0, 1\]"):
            lm.generate(prompt, 3, bad_words_ids=banned, **options)
