"""Generation options checked against naive loops: banned tokens and a forced EOS (Hugging Face's
``bad_words_ids`` / ``forced_eos_token_id``), and the max_len room of a left-padded prompt."""

import pytest
import torch

from graded import TransformerConfig, TransformerLM


def lm_for(seed=0, max_len=48):
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=1, max_len=max_len,
                            positional="learned")
    return TransformerLM(cfg).eval()


def naive_decode(lm, prompt, n, banned, forced, *, sample, generator=None):
    """Token by token on the whole sequence: the logits with the banned ids at -inf, or only
    the forced id left at the last step, then argmax or a draw from the softmax."""
    ids = prompt
    for i in range(n):
        logits = lm(ids)[:, -1]
        if i == n - 1 and forced is not None:
            logits = torch.full_like(logits, float("-inf"))
            logits[:, forced] = 0.0
        else:
            logits[:, banned] = float("-inf")
        if sample:
            tok = torch.multinomial(logits.softmax(-1), 1, generator=generator)[:, 0]
        else:
            tok = logits.argmax(-1)
        ids = torch.cat([ids, tok[:, None]], dim=1)
    return ids


@pytest.mark.parametrize("sample", [False, True])
@pytest.mark.parametrize("use_cache", [True, False])
def test_banned_tokens_and_a_forced_eos_equal_a_naive_masked_loop(sample, use_cache):
    lm = lm_for()
    prompt = torch.randint(0, 11, (4, 3), generator=torch.Generator().manual_seed(1))
    free = lm.generate(prompt, 6)
    banned = sorted({int(t) for t in free[:, 3:].flatten()})[:2]  # tokens it does generate
    forced = 7
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    ours = lm.generate(prompt, 6, bad_words_ids=[[b] for b in banned],
                       forced_eos_token_id=forced, do_sample=sample, generator=g1,
                       use_cache=use_cache)
    with torch.no_grad():
        expected = naive_decode(lm, prompt, 6, banned, forced, sample=sample, generator=g2)
    assert torch.equal(ours, expected)
    assert not torch.isin(ours[:, 3:-1], torch.tensor(banned)).any()
    assert (ours[:, -1] == forced).all()


def test_an_entry_naming_the_eos_id_does_not_ban_it():
    """As Hugging Face's NoBadWordsLogitsProcessor: ``[eos_token_id]`` is dropped."""
    lm = lm_for()
    prompt = torch.randint(0, 11, (3, 3), generator=torch.Generator().manual_seed(2))
    free = lm.generate(prompt, 5)
    eos = int(free[0, 4])
    assert torch.equal(lm.generate(prompt, 5, eos_token_id=eos, bad_words_ids=[[eos]]),
                       lm.generate(prompt, 5, eos_token_id=eos))


def test_a_left_padded_prompt_needs_room_for_its_real_tokens_only():
    """Positions skip left padding, so the check counts the longest row's real tokens;
    the padded batch generates what each row generates alone."""
    lm = lm_for(max_len=8)
    short = torch.tensor([[3, 4]])
    long = torch.tensor([[1, 2, 3, 4, 5]])
    padded = torch.tensor([[0, 0, 0, 0, 0, 0, 3, 4], [0, 0, 0, 1, 2, 3, 4, 5]])
    mask = padded == 0
    mask[1, 3:] = False
    out = lm.generate(padded, 3, key_padding_mask=mask)  # 5 real + 3 new = 8
    assert torch.equal(out[0, 6:], lm.generate(short, 3)[0])
    assert torch.equal(out[1, 3:], lm.generate(long, 3)[0])
    with pytest.raises(ValueError, match=r"longest prompt \(real tokens, left padding "
                       r"excluded\) 5 \+ max_new_tokens 4 exceeds the model's max_len=8"):
        lm.generate(padded, 4, key_padding_mask=mask)
    with pytest.raises(ValueError, match=r"prompt length 8 \+ max_new_tokens 1 exceeds"):
        lm.generate(padded, 1)  # no mask: every token is real
