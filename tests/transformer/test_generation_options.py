"""Generation options checked against naive loops and Hugging Face: banned tokens and banned
continuations and a forced EOS (``bad_words_ids`` / ``forced_eos_token_id``), and the max_len
room of a left-padded prompt."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graded import TransformerConfig, TransformerLM
from graded.transformer.logits import logits_processing


def lm_for(seed=0, max_len=48):
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=1, max_len=max_len,
                            positional="learned")
    return TransformerLM(cfg).eval()


def naive_decode(lm, prompt, n, banned, forced, *, sample, generator=None, words=()):
    """Token by token on the whole sequence: the logits with the banned ids at -inf, and the
    last token of each entry of ``words`` whose other tokens end a row, or only the forced id
    left at the last step, then argmax or a draw from the softmax."""
    ids = prompt
    for i in range(n):
        logits = lm(ids)[:, -1]
        if i == n - 1 and forced is not None:
            logits = torch.full_like(logits, float("-inf"))
            logits[:, forced] = 0.0
        else:
            logits[:, banned] = float("-inf")
            for row in range(ids.shape[0]):
                for word in words:
                    *prefix, last = word
                    if ids[row].tolist()[len(ids[row]) - len(prefix):] == prefix:
                        logits[row, last] = float("-inf")
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


def _bigram_it_generates(out, start):
    """Row 0's first two new tokens (from ``start``): banning them as an entry changes the
    row's second new token."""
    return out[0, start:start + 2].tolist()


@pytest.mark.parametrize("sample", [False, True])
@pytest.mark.parametrize("use_cache", [True, False])
def test_banned_continuations_equal_a_naive_loop_over_the_history(sample, use_cache):
    """An entry of several tokens bans its last one after its others, the prompt included."""
    lm = lm_for()
    prompt = torch.randint(0, 11, (4, 3), generator=torch.Generator().manual_seed(1))
    free = lm.generate(prompt, 6)
    bigram = _bigram_it_generates(free, 3)
    across = [int(prompt[1, -1]), int(free[1, 3])]  # its prefix is the prompt's last token
    words = [bigram, across, [int(free[2, 3]), int(free[2, 4]), int(free[2, 5])]]
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    ours = lm.generate(prompt, 6, bad_words_ids=[[10], *words], do_sample=sample,
                       generator=g1, use_cache=use_cache)
    with torch.no_grad():
        expected = naive_decode(lm, prompt, 6, [10], None, sample=sample, generator=g2,
                                words=words)
    assert torch.equal(ours, expected)
    if not sample:
        assert ours[0, 4] != free[0, 4] and ours[1, 3] != free[1, 3]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31 - 1), vocab=st.integers(2, 6), length=st.integers(1, 6),
       words=st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=4), min_size=1,
                      max_size=6),
       eos=st.one_of(st.none(), st.integers(0, 5)))
def test_constrain_equals_hugging_faces_no_bad_words_processor(seed, vocab, length, words, eos):
    """Random scores and histories over a small vocabulary (so that prefixes match): the banned
    scores are those of transformers' ``NoBadWordsLogitsProcessor``, entries longer than the
    history, repeated entries, an ``[eos]`` entry and entries ending in EOS included."""
    transformers = pytest.importorskip("transformers")
    words = [[t % vocab for t in w] for w in words]
    eos = None if eos is None else eos % vocab
    g = torch.Generator().manual_seed(seed)
    history = torch.randint(0, vocab, (5, length), generator=g)
    scores = torch.randn(5, vocab, generator=g, dtype=torch.float64)
    ours = logits_processing(vocab_size=vocab, device=scores.device, eos_token_id=eos,
                             bad_words_ids=words)
    processor = transformers.NoBadWordsLogitsProcessor(words, eos_token_id=eos)
    processed = scores if ours is None else ours(scores, history, new_tokens=0, last=False)
    assert torch.equal(processed, processor(history, scores))


def test_bad_words_ids_name_the_value_they_refuse():
    def check(words):
        logits_processing(vocab_size=11, device=torch.device("cpu"), bad_words_ids=words)

    with pytest.raises(ValueError, match=r"bad_words_ids entry \[\]: empty; expected one or"):
        check([[3], []])
    with pytest.raises(ValueError, match=r"entry \[3, 11\]: expected a token id in \[0, 11\), "
                       r"got 11"):
        check([[3, 11]])
    with pytest.raises(ValueError, match=r"entry \[-1, 4\]: expected a token id in \[0, 11\), "
                       r"got -1"):
        check([[-1, 4]])
    with pytest.raises(ValueError, match=r"entry \[2, 1.0\]: expected a token id .* got 1.0"):
        check([[2, 1.0]])
    with pytest.raises(ValueError, match=r"entry \[True\]: expected a token id .* got True"):
        check([[True]])
    with pytest.raises(ValueError, match="must be a list of token-id lists"):
        check([3, 4])


@pytest.mark.parametrize("num_beams", [1, 3])
def test_multi_token_bad_words_give_gpt2_generates_tokens(num_beams, gpt2_pair):
    """Greedy and beam search with entries of one, two, three and five tokens on left-padded
    prompts give ``GPT2LMHeadModel.generate``'s tokens, which differ from the unconstrained
    ones: the history an entry is matched against holds the prompt (row 1's entry starts
    with its last token) and its padding (row 0's starts with the pad id), as Hugging Face's
    ``input_ids`` do, and each beam's own tokens."""
    hf, lm = gpt2_pair
    pad = 12
    prompts = torch.tensor([[pad, pad, 7, 5, 3], [8, 11, 4, 6, 1], [10, 8, 11, 2, 0]])
    attention = (prompts != pad).long()
    options = {"num_beams": num_beams, "pad_token_id": pad}
    free = lm.generate(prompts, 7, key_padding_mask=attention == 0, **options)
    words = [[pad], [int(prompts[1, -1]), int(free[1, 5])],
             [int(free[2, 5]), int(free[2, 6]), int(free[2, 7])],
             [pad, *prompts[0, 2:].tolist(), int(free[0, 5])]]
    theirs = hf.generate(prompts, attention_mask=attention, max_new_tokens=7, do_sample=False,
                         bad_words_ids=words, **options)
    assert (theirs[:, 5:] != free[:, 5:]).any(dim=1).all()  # every row changes
    for use_cache in (True, False):
        ours = lm.generate(prompts, 7, key_padding_mask=attention == 0, bad_words_ids=words,
                           use_cache=use_cache, **options)
        assert torch.equal(ours, theirs), use_cache
