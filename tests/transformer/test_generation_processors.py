"""Hugging Face's logits processors as generation options (``sequence_bias``,
``repetition_penalty``, ``no_repeat_ngram_size``, ``min_new_tokens``, with ``bad_words_ids`` and
``forced_eos_token_id``): each against transformers' processor of that name on random scores,
all of them together against a processor list in Hugging Face's order and against a loop over
Python lists, and whole generations against GPT-2's ``generate``."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graded import TransformerConfig, TransformerLM
from graded.transformer import Seq2SeqTransformer
from graded.transformer.logits import logits_processing

transformers = pytest.importorskip("transformers")
CPU = torch.device("cpu")


def _step_inputs(seed, vocab, length, rows=5):
    g = torch.Generator().manual_seed(seed)
    history = torch.randint(0, vocab, (rows, length), generator=g)
    scores = torch.randn(rows, vocab, generator=g, dtype=torch.float64) * 3
    return history, scores


def _process(scores, history, *, new_tokens=0, last=False, start=None, **options):
    processing = logits_processing(vocab_size=scores.shape[-1], device=CPU, **options)
    assert processing is not None
    return processing(scores, history, new_tokens=new_tokens, last=last, start=start)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31 - 1), vocab=st.integers(2, 6), length=st.integers(1, 6),
       entries=st.dictionaries(st.lists(st.integers(0, 5), min_size=1, max_size=4).map(tuple),
                               st.sampled_from([-2.5, -0.75, 0.5, 4.0, float("-inf")]),
                               min_size=1, max_size=6))
def test_sequence_bias_equals_hugging_faces_processor(seed, vocab, length, entries):
    """Entries longer than the history, several entries ending in one id (their biases add up),
    -inf biases, both of Hugging Face's forms (a dict and a list of pairs)."""
    entries = {tuple(t % vocab for t in k): b for k, b in entries.items()}
    history, scores = _step_inputs(seed, vocab, length)
    theirs = transformers.SequenceBiasLogitsProcessor([[list(k), b] for k, b in entries.items()])
    expected = theirs(history, scores)
    assert torch.equal(_process(scores, history, sequence_bias=entries), expected)
    as_list = [[list(k), b] for k, b in entries.items()]
    assert torch.equal(_process(scores, history, sequence_bias=as_list), expected)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31 - 1), vocab=st.integers(2, 8), length=st.integers(1, 7),
       penalty=st.sampled_from([0.5, 1.3, 2.0]), skip=st.lists(st.integers(0, 7), min_size=5,
                                                                max_size=5))
def test_repetition_penalty_equals_hugging_faces_processor(seed, vocab, length, penalty, skip):
    """Positive and negative scores, penalties above and below 1, and a per-row number of
    leading positions to skip (the left padding Hugging Face reads from the attention mask)."""
    history, scores = _step_inputs(seed, vocab, length)
    start = torch.tensor(skip).clamp(max=length)
    theirs = transformers.RepetitionPenaltyLogitsProcessor(penalty, prompt_ignore_length=start)
    assert torch.equal(_process(scores, history, repetition_penalty=penalty, start=start),
                       theirs(history, scores))
    everything = transformers.RepetitionPenaltyLogitsProcessor(penalty)
    assert torch.equal(_process(scores, history, repetition_penalty=penalty),
                       everything(history, scores))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31 - 1), vocab=st.integers(2, 5), length=st.integers(1, 9),
       n=st.integers(1, 4))
def test_no_repeat_ngram_size_equals_hugging_faces_processor(seed, vocab, length, n):
    history, scores = _step_inputs(seed, vocab, length)
    theirs = transformers.NoRepeatNGramLogitsProcessor(n)
    assert torch.equal(_process(scores, history, no_repeat_ngram_size=n),
                       theirs(history, scores))


def test_min_new_tokens_equals_hugging_faces_processor():
    history, scores = _step_inputs(0, 7, 6)
    theirs = transformers.MinNewTokensLengthLogitsProcessor(4, 3, eos_token_id=5)
    for length in range(4, 9):  # 0 to 4 new tokens after a prompt of 4
        ids = torch.cat([history, history], dim=1)[:, :length]
        ours = _process(scores, ids, new_tokens=length - 4, min_new_tokens=3, eos_token_id=5)
        assert torch.equal(ours, theirs(ids, scores)), length
    assert torch.isinf(_process(scores, history, new_tokens=2, min_new_tokens=3,
                                eos_token_id=5)[:, 5]).all()


def test_every_processor_together_equals_hugging_faces_list_in_its_order():
    """The order matters: the penalty divides the biased scores; the forced EOS overrides all
    at the last step."""
    history, scores = _step_inputs(3, 6, 7)
    options = {"sequence_bias": {(1,): 2.0, (2, 3): -1.5}, "repetition_penalty": 1.7,
               "no_repeat_ngram_size": 2, "bad_words_ids": [[4], [0, 5]], "min_new_tokens": 5,
               "eos_token_id": 2, "forced_eos_token_id": 2}
    start = torch.tensor([0, 2, 3, 0, 1])
    theirs = transformers.LogitsProcessorList([
        transformers.SequenceBiasLogitsProcessor([[[1], 2.0], [[2, 3], -1.5]]),
        transformers.RepetitionPenaltyLogitsProcessor(1.7, prompt_ignore_length=start),
        transformers.NoRepeatNGramLogitsProcessor(2),
        transformers.NoBadWordsLogitsProcessor([[4], [0, 5]], eos_token_id=2),
        transformers.MinNewTokensLengthLogitsProcessor(4, 5, eos_token_id=2),
    ])
    ours = _process(scores, history, new_tokens=3, start=start, **options)
    assert torch.equal(ours, theirs(history, scores))
    forced = transformers.ForcedEOSTokenLogitsProcessor(history.shape[1] + 1, 2)
    assert torch.equal(_process(scores, history, new_tokens=3, last=True, start=start,
                                **options), forced(history, theirs(history, scores)))


def _naive_greedy(lm, prompt, n, *, bias, penalty, ngram, min_new, eos):
    """Greedy decoding of one unpadded row on Python lists: the whole sequence each step, then
    the options written out one by one."""
    ids = prompt.tolist()
    for i in range(n):
        with torch.no_grad():
            scores = lm(torch.tensor([ids]))[0, -1].tolist()
        for word, b in bias.items():
            *prefix, last = word
            if len(prefix) <= len(ids) and ids[len(ids) - len(prefix):] == prefix:
                scores[last] += b
        for tok in set(ids):
            scores[tok] = scores[tok] * penalty if scores[tok] < 0 else scores[tok] / penalty
        if len(ids) >= ngram:
            tail = ids[len(ids) - ngram + 1:]
            for j in range(len(ids) - ngram + 1):
                if ids[j:j + ngram - 1] == tail:
                    scores[ids[j + ngram - 1]] = float("-inf")
        if i < min_new:
            scores[eos] = float("-inf")
        tok = max(range(len(scores)), key=lambda t: scores[t])
        ids.append(tok)
        if tok == eos:
            break
    return ids


@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_with_every_processor_equals_a_loop_over_lists(use_cache):
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=9, d_model=16, n_heads=2, n_layers=1, max_len=32)
    lm = TransformerLM(cfg).double().eval()
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    free = lm.generate(prompt, 8)[0, 5:].tolist()
    options = {"bias": {(free[0],): -1.0, (5, free[1]): 2.5}, "penalty": 1.4, "ngram": 2,
               "min_new": 3, "eos": free[0]}
    expected = _naive_greedy(lm, prompt[0], 8, **options)
    ours = lm.generate(prompt, 8, sequence_bias=options["bias"], repetition_penalty=1.4,
                       no_repeat_ngram_size=2, min_new_tokens=3, eos_token_id=free[0],
                       use_cache=use_cache)
    assert ours[0, :len(expected)].tolist() == expected
    assert expected[5:] != free[:len(expected) - 5]


def test_seq2seq_generation_takes_the_processors_from_its_start_token():
    """The decoder's history starts at the start token, which the penalty and the n-grams read
    as Hugging Face reads ``decoder_input_ids``."""
    torch.manual_seed(1)
    cfg = TransformerConfig(vocab_size=9, d_model=16, n_heads=2, n_layers=1, max_len=32)
    model = Seq2SeqTransformer(cfg).double().eval()
    src = torch.tensor([[2, 7, 1, 8], [6, 3, 3, 5]])
    options = {"repetition_penalty": 3.0, "no_repeat_ngram_size": 1, "min_new_tokens": 4,
               "eos_token_id": 8, "sequence_bias": {(0, 4): 1.0}}
    out = model.generate(src, 8, bos_token_id=0, **options)
    assert all(len(set(row)) == len(row) for row in out.tolist())  # no token twice, start too
    with torch.no_grad():
        for row in range(2):
            ids = [0]
            memory = model.encode(src[row:row + 1], None)
            for i in range(8):
                scores = model.decode(torch.tensor([ids]), memory)[0, -1]
                scores = _process(scores[None], torch.tensor([ids]), new_tokens=i, **options)
                ids.append(int(scores.argmax()))
                if ids[-1] == 8:
                    break
            assert out[row, :len(ids)].tolist() == ids


@pytest.mark.parametrize("num_beams", [1, 3])
def test_processors_give_gpt2_generates_tokens(num_beams, gpt2_pair):
    """Greedy and beam search on left-padded prompts give ``GPT2LMHeadModel.generate``'s
    tokens with each option alone and all together, and each changes the unconstrained
    tokens: the penalty skips the left padding (Hugging Face reads it from the attention
    mask), the n-grams and the biases read it."""
    hf, lm = gpt2_pair
    pad, eos = 12, 3
    prompts = torch.tensor([[pad, pad, 7, 5, 3], [8, 11, 4, 6, 1], [10, 8, 11, 2, 0]])
    attention = (prompts != pad).long()
    base = {"num_beams": num_beams, "pad_token_id": pad}
    free = lm.generate(prompts, 7, key_padding_mask=attention == 0, **base)
    cases = [
        {"sequence_bias": {(int(free[0, 5]),): -3.0, (pad, 7): 0.5,
                           (int(free[1, 5]), int(free[1, 6])): -4.0}},
        {"repetition_penalty": 2.5 if num_beams == 1 else 400.0},  # log-probs near 0 in beams
        {"no_repeat_ngram_size": 2},
        {"min_new_tokens": 5, "eos_token_id": eos},
        {"sequence_bias": {(5,): 1.25}, "repetition_penalty": 1.5, "no_repeat_ngram_size": 3,
         "bad_words_ids": [[9]], "min_new_tokens": 2, "eos_token_id": eos},
    ]
    for options in cases:
        theirs_options = dict(options)
        if "sequence_bias" in options:
            theirs_options["sequence_bias"] = [[list(k), v]
                                               for k, v in options["sequence_bias"].items()]
        theirs = hf.generate(prompts, attention_mask=attention, max_new_tokens=7,
                             do_sample=False, **base, **theirs_options)
        reference = free if "eos_token_id" not in options else lm.generate(
            prompts, 7, key_padding_mask=attention == 0, eos_token_id=eos, **base)
        assert not torch.equal(theirs, reference), options
        for use_cache in (True, False):
            ours = lm.generate(prompts, 7, key_padding_mask=attention == 0,
                               use_cache=use_cache, **base, **options)
            assert torch.equal(ours, theirs), (options, use_cache)


def test_renormalize_logits_equals_hugging_faces_logit_normalization_after_the_processors():
    history, scores = _step_inputs(5, 7, 4)
    scores[2] = float("-inf")  # a row with no token left stays at -inf (not NaN)
    theirs = transformers.LogitsProcessorList([
        transformers.NoBadWordsLogitsProcessor([[1], [4]], eos_token_id=None),
        transformers.LogitNormalization(),
    ])(history, scores)
    ours = _process(scores, history, bad_words_ids=[[1], [4]], renormalize_logits=True)
    torch.testing.assert_close(ours[[0, 1, 3, 4]], theirs[[0, 1, 3, 4]], rtol=0, atol=1e-15)
    assert torch.isneginf(ours[2]).all()
    assert torch.equal(torch.isneginf(ours), torch.isneginf(scores) | torch.isin(
        torch.arange(7), torch.tensor([1, 4])))
    with pytest.raises(ValueError, match=r"renormalize_logits must be True or False, got 'yes'"):
        _process(scores, history, renormalize_logits="yes")


def test_renormalized_beam_search_gives_gpt2_generates_tokens(gpt2_pair):
    """Hugging Face's ``renormalize_logits`` takes the log-softmax after the processors: with
    tokens banned, the beams that lost more of their probability are no longer penalised for
    it, and beam search picks other tokens. It was not an option of ours (the Marian options
    dropped it: tokens differed from ``hf.generate`` on half the random seeds)."""
    hf, lm = gpt2_pair
    pad = 12
    prompts = torch.tensor([[pad, pad, 7, 5, 3], [8, 11, 4, 6, 1], [10, 8, 11, 2, 0]])
    attention = (prompts != pad).long()
    base = {"num_beams": 3, "pad_token_id": pad, "bad_words_ids": [[0], [4], [6]]}
    theirs = hf.generate(prompts, attention_mask=attention, max_new_tokens=7, do_sample=False,
                         renormalize_logits=True, **base)
    plain = hf.generate(prompts, attention_mask=attention, max_new_tokens=7, do_sample=False,
                        **base)
    assert not torch.equal(theirs, plain)
    for use_cache in (True, False):
        ours = lm.generate(prompts, 7, key_padding_mask=attention == 0, use_cache=use_cache,
                           renormalize_logits=True, **base)
        assert torch.equal(ours, theirs), use_cache
    greedy = {**base, "num_beams": 1}  # a log-softmax shifts each row: argmax is unchanged
    assert torch.equal(lm.generate(prompts, 7, key_padding_mask=attention == 0,
                                   renormalize_logits=True, **greedy),
                       lm.generate(prompts, 7, key_padding_mask=attention == 0, **greedy))


def test_processor_options_name_the_value_they_refuse():
    def check(**options):
        logits_processing(vocab_size=11, device=CPU, **options)

    with pytest.raises(ValueError, match=r"sequence_bias must be \{\(token ids\): bias\}"):
        check(sequence_bias=[3, 4])
    with pytest.raises(ValueError, match=r"sequence_bias entry \[3, 11\]: expected a token id "
                       r"in \[0, 11\), got 11"):
        check(sequence_bias={(3, 11): 1.0})
    with pytest.raises(ValueError, match=r"sequence_bias entry \[\]: empty"):
        check(sequence_bias=[[[], 1.0]])
    with pytest.raises(ValueError, match=r"entry \[2\]: expected a finite bias or -inf, got "
                       r"nan"):
        check(sequence_bias={(2,): float("nan")})
    with pytest.raises(ValueError, match=r"entry \[2\]: expected a finite bias .* got '1'"):
        check(sequence_bias={(2,): "1"})
    with pytest.raises(ValueError, match=r"gives entry \[2, 3\] twice"):
        check(sequence_bias=[[[2, 3], 1.0], [(2, 3), -1.0]])
    with pytest.raises(ValueError, match=r"sequence_bias entry 5: expected a list or tuple"):
        check(sequence_bias=[[5, 1.0]])
    for bad in (0, -1.5, float("inf"), True, "2"):
        with pytest.raises(ValueError, match=rf"repetition_penalty must be a positive number "
                           rf"\(1 for none\), got {bad!r}"):
            check(repetition_penalty=bad)
    for name in ("no_repeat_ngram_size", "min_new_tokens"):
        for bad in (-1, 2.0, True):
            with pytest.raises(ValueError, match=rf"{name} must be an int >= 0 \(0 for none\), "
                               rf"got {bad!r}"):
                check(**{name: bad})
    with pytest.raises(ValueError, match="min_new_tokens=2 needs eos_token_id"):
        check(min_new_tokens=2)
    with pytest.raises(TypeError, match=r"unknown generation option\(s\) \['repetition_penalt'\]"):
        torch.manual_seed(0)
        cfg = TransformerConfig(vocab_size=9, d_model=8, n_heads=2, n_layers=1, max_len=16)
        Seq2SeqTransformer(cfg).generate(torch.tensor([[1, 2]]), 2, bos_token_id=0,
                                         repetition_penalt=1.2)


def test_a_temperature_that_is_not_positive_is_refused_naming_it():
    cfg = TransformerConfig(vocab_size=9, d_model=8, n_heads=2, n_layers=1, max_len=16)
    lm = TransformerLM(cfg)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match=rf"temperature must be a finite number > 0, "
                           rf"got {bad}"):
            lm.generate(torch.tensor([[1, 2]]), 2, do_sample=True, temperature=bad)


def test_no_option_set_means_no_processing():
    """The decoding loop skips the processors entirely; a penalty of 1 is no penalty."""
    assert logits_processing(vocab_size=5, device=CPU) is None
    assert logits_processing(vocab_size=5, device=CPU, repetition_penalty=1.0) is None
    assert logits_processing(vocab_size=5, device=CPU, bad_words_ids=[[2]],
                             eos_token_id=2) is None


@settings(max_examples=40, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31 - 1), vocab=st.integers(3, 7), new=st.integers(0, 4),
       eos=st.lists(st.integers(0, 6), min_size=1, max_size=3),
       words=st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=2), max_size=4))
def test_eos_id_lists_equal_hugging_faces_processors(seed, vocab, new, eos, words):
    """A list of EOS ids, as Hugging Face's ``generate`` takes: ``min_new_tokens`` masks every
    one of them, ``bad_words_ids`` drops an entry ``[e]`` for each, a list of forced EOS ids
    leaves all of them at 0."""
    eos = [e % vocab for e in eos]
    words = [[w % vocab for w in word] for word in words]
    history, scores = _step_inputs(seed, vocab, 4 + new)
    options = {"eos_token_id": eos, "min_new_tokens": 3}
    if words:
        options["bad_words_ids"] = words
    theirs = transformers.LogitsProcessorList(
        ([transformers.NoBadWordsLogitsProcessor(words, eos_token_id=eos)] if words else [])
        + [transformers.MinNewTokensLengthLogitsProcessor(4, 3, eos_token_id=eos)])
    assert torch.equal(_process(scores, history, new_tokens=new, **options),
                       theirs(history, scores))
    forced = transformers.ForcedEOSTokenLogitsProcessor(history.shape[1] + 1, eos)
    assert torch.equal(_process(scores, history, new_tokens=new, last=True,
                                forced_eos_token_id=eos),
                       forced(history, scores))


@pytest.mark.parametrize("num_beams", [1, 3])
def test_a_list_of_eos_ids_ends_rows_as_gpt2_generate_does(num_beams, gpt2_pair):
    """Any id of the list ends a row (greedy and beam search, cache on and off) and finished
    rows are filled with ``pad_token_id``, or without one with the first EOS id: the tokens of
    ``GPT2LMHeadModel.generate`` given the same list."""
    hf, lm = gpt2_pair
    pad = 12
    prompts = torch.tensor([[pad, pad, 7, 5, 3], [8, 11, 4, 6, 1], [10, 8, 11, 2, 0]])
    attention = (prompts != pad).long()
    free = lm.generate(prompts, 7, key_padding_mask=attention == 0, pad_token_id=pad)
    eos = [int(free[0, 5]), int(free[1, 9])]  # ids that end different rows at different steps
    assert eos[0] != eos[1] and eos[1] not in free[1, 5:9]
    for pad_token_id in (pad, None):
        theirs = hf.generate(prompts, attention_mask=attention, max_new_tokens=7,
                             do_sample=False, num_beams=num_beams, eos_token_id=eos,
                             pad_token_id=pad_token_id)
        for use_cache in (True, False):
            ours = lm.generate(prompts, 7, key_padding_mask=attention == 0,
                               num_beams=num_beams, use_cache=use_cache, eos_token_id=eos,
                               pad_token_id=pad_token_id, early_stopping=False)
            assert torch.equal(ours, theirs), (use_cache, pad_token_id)
    if num_beams == 1:  # each id ended a row, the rest filled after it
        assert ours[0, 5] == eos[0] and ours[1, 9] == eos[1]
        assert (ours[0, 6:] == eos[0]).all() and (ours[1, 10:] == eos[0]).all()
