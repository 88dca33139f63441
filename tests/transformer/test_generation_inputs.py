"""Generation's arguments as a user gets them wrong: each refused before decoding, naming the
value and what was expected; and sampling checked draw for draw against ``torch.multinomial``
over a distribution computed by hand."""

import math
import re

import pytest
import torch

from graded import Seq2SeqTransformer, TransformerConfig, TransformerLM
from graded.interop import graft_grading
from graded.transformer import KVCache
from graded.transformer.generation import decode

VOCAB = 13


def tiny_lm(positional="learned", seed=0):
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=VOCAB, d_model=16, n_heads=2, n_layers=2, max_len=16,
                            positional=positional)
    return TransformerLM(cfg).eval()


PROMPT = torch.tensor([[1, 2, 3], [4, 5, 6]])


@pytest.mark.parametrize("bad", [2.0, 2.5, True, None, "3"])
def test_max_new_tokens_that_is_not_an_int_is_refused_naming_it(bad):
    """2.0 and None used to fail inside ``range`` ('float' object cannot be interpreted as an
    integer), True generated one token."""
    with pytest.raises(ValueError, match=rf"max_new_tokens must be an int >= 0, got {bad!r}"):
        tiny_lm().generate(PROMPT, bad)


@pytest.mark.parametrize("do_sample", [False, True])
@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), "hot"])
def test_a_temperature_no_sampling_could_use_is_refused_greedy_or_not(do_sample, bad):
    """Greedy decoding ignores the temperature (as Hugging Face's does) but used to take
    negative and NaN temperatures silently; an infinite one made sampling uniform, and NaN
    where a processor had put a score at -inf (-inf / inf). Temperature 0 without sampling is
    the common spelling of greedy decoding: taken, the same tokens as the default."""
    if bad == 0.0 and not do_sample:
        model = tiny_lm()
        assert torch.equal(model.generate(PROMPT, 2, temperature=0.0), model.generate(PROMPT, 2))
        return
    with pytest.raises(ValueError, match=rf"temperature must be a finite number > 0, got "
                                         rf"{bad!r}"):
        tiny_lm().generate(PROMPT, 2, do_sample=do_sample, temperature=bad)


@pytest.mark.parametrize(("option", "bad", "message"), [
    ("top_p", 1.5, r"top_p must be in \(0, 1\], got 1.5"),
    ("top_p", 0.0, r"top_p must be in \(0, 1\], got 0.0"),
    ("top_p", "0.5", r"top_p must be in \(0, 1\], got '0.5'"),
    ("top_k", 0, r"top_k must be a positive int or None, got 0"),
    ("num_beams", 2.0, r"num_beams must be an int >= 1, got 2.0"),
    ("num_beams", True, r"num_beams must be an int >= 1, got True"),
    ("do_sample", "no", r"do_sample must be True or False, got 'no'"),
    ("length_penalty", float("nan"), r"length_penalty must be a finite number .*got nan"),
    ("length_penalty", "a", r"length_penalty must be a finite number .*got 'a'"),
])
def test_a_bad_decoding_option_is_refused_naming_it_even_when_unused(option, bad, message):
    """Before, greedy decoding took top_p=1.5 and top_k=0 silently, a string do_sample
    sampled (it is true), num_beams=True ran greedy decoding and num_beams=2.0 failed in
    ``repeat_interleave``; a string top_p or length_penalty failed on a comparison."""
    with pytest.raises(ValueError, match=message):
        tiny_lm().generate(PROMPT, 2, **{option: bad})


@pytest.mark.parametrize("eos", [VOCAB, -1, True, 3.0, [], [3, VOCAB], (3, True), [[3]]])
def test_an_eos_id_the_model_cannot_emit_is_refused_even_with_a_pad_id(eos):
    """With a valid ``pad_token_id`` an EOS id outside the vocabulary used to be taken: no
    row could ever end. A list of ids (as Hugging Face's) must be non-empty and hold token
    ids only."""
    with pytest.raises(ValueError, match=rf"eos_token_id must be a token id in \[0, {VOCAB}\) "
                                         rf"or a non-empty list of them, got "
                                         rf"{re.escape(repr(eos))}"):
        tiny_lm().generate(PROMPT, 3, eos_token_id=eos, pad_token_id=0)


def test_an_empty_prompt_is_refused_naming_its_shape():
    """The next token is read at the last position; there was none (IndexError)."""
    with pytest.raises(ValueError, match=r"the prompt is empty \(input_ids of shape \(2, 0\)\)"):
        tiny_lm().generate(torch.zeros(2, 0, dtype=torch.long), 3)


def seq2seq():
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=VOCAB, d_model=16, n_heads=2, n_layers=1, max_len=16)
    return Seq2SeqTransformer(cfg).eval()


@pytest.mark.parametrize("bos", [1.5, VOCAB, -1, None])
def test_a_bos_id_that_is_not_a_token_is_refused_naming_it(bos):
    """1.5 used to be truncated to token 1 by ``torch.full``; an id out of range was refused
    as 'token ids' without naming ``bos_token_id``."""
    with pytest.raises(ValueError, match=rf"bos_token_id must be a token id in \[0, {VOCAB}\), "
                                         rf"got {bos!r}"):
        seq2seq().generate(PROMPT, 3, bos_token_id=bos)


def test_seq2seq_options_are_checked_before_the_encoder_runs_and_name_the_source():
    model = seq2seq()
    calls = []
    model.encoder.register_forward_hook(lambda *_: calls.append(1))
    with pytest.raises(ValueError, match=r"num_beams must be an int >= 1, got 2.5"):
        model.generate(PROMPT, 3, bos_token_id=1, num_beams=2.5)
    with pytest.raises(ValueError, match=r"src_ids must be an integer tensor"):
        model.generate(PROMPT.float(), 3, bos_token_id=1)
    assert not calls


def test_seq2seq_beam_search_equals_a_batch_of_one_source_at_a_time():
    """The memory is repeated for the beams once, before decoding: each source decoded in a
    padded batch gives the beams it gives alone (an independent run per source)."""
    model = seq2seq()
    src = torch.tensor([[3, 4, 5, 0], [6, 7, 8, 9]])
    mask = torch.tensor([[False, False, False, True], [False] * 4])
    for use_cache in (True, False):
        batch = model.generate(src, 5, bos_token_id=1, num_beams=3, eos_token_id=2,
                               src_key_padding_mask=mask, use_cache=use_cache)
        for b, length in enumerate((3, 4)):
            alone = model.generate(src[b:b + 1, :length], 5, bos_token_id=1, num_beams=3,
                                   eos_token_id=2, use_cache=use_cache)
            assert torch.equal(batch[b, :alone.shape[1]], alone[0])
            assert (batch[b, alone.shape[1]:] == 2).all()  # filled with the pad (EOS) id


@pytest.mark.parametrize("shape", [(2, 3), (1, 3), (3, 4), (2, 4, 1)])
@pytest.mark.parametrize("positional", ["learned", "rope"])
def test_positions_of_another_shape_than_the_ids_are_refused_naming_both(shape, positional):
    """They used to fail inside the position table or the rotation with a broadcasting
    error; (B, T), (1, T) and (T,) are taken and give the default positions' logits."""
    lm = tiny_lm(positional)
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    expected = lm(ids)
    for good in (torch.arange(4), torch.arange(4)[None], torch.arange(4).expand(2, 4)):
        torch.testing.assert_close(lm(ids, positions=good), expected, rtol=0, atol=0)
    bad = torch.zeros(shape, dtype=torch.long)
    with pytest.raises(ValueError, match=rf"TransformerDecoder: positions have shape "
                                         rf"{re.escape(str(shape))}; expected \(batch, "
                                         rf"length\) = \(2, 4\), \(1, 4\) or \(4,\)"):
        lm(ids, positions=bad)


def test_graft_grading_without_a_grading_is_refused_naming_it():
    """``grading=None`` used to give back an ungraded copy from a function whose job is to
    grade."""
    with pytest.raises(ValueError, match=r"grading must be 'linear' \(LGT\) or 'exponential' "
                                         r"\(EGT\), got None"):
        graft_grading(tiny_lm(), None)


def hand_distribution(logits, temperature, top_k, top_p):
    """Probabilities (V,) of one row, by hand: divide by the temperature, keep the top_k
    largest, then the most likely of those until their renormalised mass reaches top_p, and
    renormalise over what is kept."""
    scaled = [x / temperature for x in logits.tolist()]
    order = sorted(range(len(scaled)), key=lambda v: -scaled[v])[:top_k]
    top = max(scaled[v] for v in order)
    weights = [math.exp(scaled[v] - top) for v in order]
    kept, mass = [], 0.0
    for v, w in zip(order, weights):
        kept.append(v)
        mass += w / sum(weights)
        if mass >= top_p:
            break
    total = sum(math.exp(scaled[v] - top) for v in kept)
    probs = torch.zeros(len(scaled), dtype=torch.float64)
    for v in kept:
        probs[v] = math.exp(scaled[v] - top) / total
    return probs


@pytest.mark.parametrize("use_cache", [True, False])
def test_sampling_draws_what_multinomial_draws_from_the_distribution_computed_by_hand(
        use_cache):
    """Same generator, same draws: each step's token is ``torch.multinomial`` over the
    temperature / top-k / top-p distribution written out above, from the logits of a full
    forward pass over the sequence so far."""
    lm = tiny_lm()
    with torch.no_grad():
        lm.head.proj.weight.mul_(4)  # spread out the distribution: draws that can differ
    temperature, top_k, top_p, n = 0.7, 6, 0.8, 6
    out = lm.generate(PROMPT, n, do_sample=True, temperature=temperature, top_k=top_k,
                      top_p=top_p, use_cache=use_cache,
                      generator=torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)
    ids = PROMPT
    with torch.no_grad():
        for _ in range(n):
            last = lm(ids)[:, -1].double()
            probs = torch.stack([hand_distribution(row, temperature, top_k, top_p)
                                 for row in last])
            tok = torch.multinomial(probs.float(), 1, generator=g)
            ids = torch.cat([ids, tok], dim=1)
    assert len(set(ids[:, 3:].flatten().tolist())) > 3  # not one token over and over
    assert torch.equal(out, ids)


def test_a_cache_of_another_batch_or_depth_is_refused_naming_both():
    """A broadcasting error (another batch) and an IndexError (fewer layers) before; a cache
    made by the model and continued with its own rows equals the full forward pass."""
    lm = tiny_lm("rope")
    ids = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(0))
    cache = lm.new_cache()
    steps = [lm(ids[:, :4], cache=cache), lm(ids[:, 4:], cache=cache)]
    torch.testing.assert_close(torch.cat(steps, dim=1), lm(ids), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"TransformerDecoder: the cache holds 2 row\(s\), the "
                                         r"new tokens 3"):
        lm(torch.zeros(3, 1, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match=r"TransformerDecoder: the cache has 1 layer\(s\); "
                                         r"expected 2"):
        lm(ids, cache=KVCache.empty(1))


def test_sampling_with_every_token_banned_names_the_rows_left_without_a_token():
    """``torch.multinomial`` used to fail on NaN probabilities ('probability tensor contains
    either inf, nan or element < 0'); a row that can sample is unaffected."""
    lm = tiny_lm()
    with pytest.raises(ValueError, match=r"no token is left to generate at new token 1 in "
                                         r"row\(s\) \[0, 1\]"):
        lm.generate(PROMPT, 2, do_sample=True, bad_words_ids=[[t] for t in range(VOCAB)])
    every_but_7 = [[t] for t in range(VOCAB) if t != 7]
    out = lm.generate(PROMPT, 2, do_sample=True, bad_words_ids=every_but_7)
    assert (out[:, 3:] == 7).all()  # the only token left, whatever the draw


def test_a_bfloat16_models_scores_are_processed_in_float32_as_hugging_face_does():
    """Hugging Face's ``generate`` casts the next-token logits to float32 before its
    processors. 1.203125 (a bfloat16) divided by a repetition penalty of 1.2 is 1.0026 in
    float32 and rounds to 1.0 in bfloat16, a tie with token 0 that greedy decoding used to
    resolve to 0; transformers' processor on the float32 scores picks 1."""
    transformers = pytest.importorskip("transformers")
    scores = torch.tensor([1.0, 1.203125, -3.0, 0.5], dtype=torch.bfloat16)

    def step(ids, mask, cache):
        return scores.expand(ids.shape[0], ids.shape[1], -1)

    prompt = torch.tensor([[1, 3]])
    out = decode(step, prompt, torch.zeros_like(prompt, dtype=torch.bool), 1, n_layers=0,
                 do_sample=False, temperature=1.0, top_k=None, top_p=None, num_beams=1,
                 eos_token_id=None, pad_token_id=None, use_cache=False, generator=None,
                 length_penalty=1.0, vocab_size=4, repetition_penalty=1.2)
    processor = transformers.RepetitionPenaltyLogitsProcessor(1.2)
    reference = processor(prompt, scores.float()[None]).argmax(dim=-1)
    assert reference.tolist() == [1]
    assert out[:, -1].tolist() == reference.tolist()


@pytest.mark.parametrize("pad", [-1, VOCAB])
def test_a_fill_id_outside_the_vocabulary_is_refused_for_beam_search_before_decoding(pad):
    """Twenty beams over 13 tokens: the first step fills 13, and the other seven continued with
    the fill id, which the model read as an embedding index ('IndexError: index out of range
    in self'). A valid fill id is never chosen (its beams score -inf): the tokens are those of
    any other."""
    lm = tiny_lm()
    with pytest.raises(ValueError, match=rf"pad_token_id must be a token id in \[0, {VOCAB}\): "
                                         rf"beam search continues the beams it cannot fill "
                                         rf"with it; got {pad}"):
        lm.generate(PROMPT, 2, num_beams=20, pad_token_id=pad)
    assert torch.equal(lm.generate(PROMPT, 3, num_beams=20, pad_token_id=5),
                       lm.generate(PROMPT, 3, num_beams=20, pad_token_id=0))


@pytest.mark.parametrize("bad", ["x", 2.5, True])
def test_a_fill_id_that_is_not_an_int_is_refused_naming_it(bad):
    """'x' failed inside torch.full_like, 2.5 was truncated to token 2, True taken as token 1."""
    with pytest.raises(ValueError, match=rf"pad_token_id must be an int token id or None, got "
                                         rf"{re.escape(repr(bad))}"):
        tiny_lm().generate(PROMPT, 2, num_beams=2, pad_token_id=bad)
