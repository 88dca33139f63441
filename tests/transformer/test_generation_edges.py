"""Generation at its edges: no new token, an empty batch, and option checks that do not depend
on whether a step runs."""

import pytest
import torch

from graded import Seq2SeqTransformer, TransformerConfig, TransformerLM
from graded.transformer.generation import decode

VOCAB = 13
MODES = [dict(), dict(do_sample=True, generator=torch.Generator().manual_seed(0)),
         dict(num_beams=3)]
MODE_IDS = ["greedy", "sampling", "beam"]


def _lm() -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(TransformerConfig(vocab_size=VOCAB, d_model=16, n_heads=2, n_layers=2,
                                           max_len=24)).eval()


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_no_new_token_returns_a_new_int64_copy_of_the_prompt(mode, dtype):
    """max_new_tokens=0 used to return the prompt tensor itself: writing into the result
    changed the caller's prompt (and an int32 prompt came back int32, where every decoding
    of a new token returns int64)."""
    lm = _lm()
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=dtype)
    kept = prompt.clone()
    out = lm.generate(prompt, 0, **mode)
    assert out is not prompt and out.data_ptr() != prompt.data_ptr()
    assert out.dtype == torch.int64 == lm.generate(prompt, 1, **mode).dtype
    assert out.tolist() == kept.tolist()
    out[:, 0] = 9  # the caller owns the result
    assert torch.equal(prompt, kept)


def test_no_new_token_from_decode_is_a_copy_too():
    prompt = torch.tensor([[1, 2]])

    def step(ids, mask, cache):  # never called for no new token
        raise AssertionError("the step ran")

    out = decode(step, prompt, torch.zeros_like(prompt, dtype=torch.bool), 0, n_layers=0,
                 do_sample=False, temperature=1.0, top_k=None, top_p=None, num_beams=1,
                 eos_token_id=None, pad_token_id=None, use_cache=False, generator=None,
                 length_penalty=1.0, vocab_size=4)
    assert out is not prompt and out.tolist() == [[1, 2]]


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("eos", [None, 3])
def test_an_empty_batch_has_the_width_of_a_batch_that_runs_every_step(mode, eos):
    """(0, T + n), the shape of a batch none of whose rows ends early (here a one-row prompt
    without EOS). Beam search used to return (0, T) and greedy or sampled decoding with an EOS
    id (0, T + 1): an empty batch counted as 'every row finished' after one step."""
    lm = _lm()
    one = lm.generate(torch.tensor([[1, 2, 3, 4]]), 5)
    assert one.shape == (1, 4 + 5)
    out = lm.generate(torch.zeros(0, 4, dtype=torch.long), 5, eos_token_id=eos, **mode)
    assert out.shape == (0, one.shape[1]) and out.dtype == torch.int64


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_an_empty_batch_of_a_seq2seq_model_has_the_full_width(mode):
    torch.manual_seed(0)
    model = Seq2SeqTransformer(TransformerConfig(vocab_size=VOCAB, d_model=16, n_heads=2,
                                                 n_layers=1, max_len=24)).eval()
    out = model.generate(torch.zeros(0, 5, dtype=torch.long), 4, bos_token_id=1,
                         eos_token_id=2, **mode)
    assert out.shape == (0, 1 + 4)


def test_beam_search_with_sampling_is_refused_even_without_a_new_token():
    """Every option is checked before the first step, used or not: beam sampling used to be
    accepted when max_new_tokens=0 or the batch was empty."""
    lm = _lm()
    for prompt, n in ((torch.tensor([[1, 2]]), 0), (torch.zeros(0, 2, dtype=torch.long), 3)):
        with pytest.raises(ValueError, match="beam search with do_sample=True is not supported"):
            lm.generate(prompt, n, num_beams=2, do_sample=True)
