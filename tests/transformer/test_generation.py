"""Generation: KV cache = recomputation, beam 1 = greedy, padding, sampling filters."""

import pytest
import torch

from graded import Seq2SeqTransformer, TransformerConfig, TransformerLM
from graded.transformer.generation import filter_logits


def lm_for(positional, seed=0):
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=17, d_model=32, n_heads=4, n_layers=2, max_len=48,
                            positional=positional)
    return TransformerLM(cfg).eval()


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rope", "alibi"])
def test_kv_cache_generation_equals_full_recomputation(positional):
    lm = lm_for(positional)
    prompt = torch.randint(0, 17, (3, 5))
    cached = lm.generate(prompt, 12, use_cache=True)
    full = lm.generate(prompt, 12, use_cache=False)
    assert torch.equal(cached, full)
    g = torch.Generator().manual_seed(3)
    s1 = lm.generate(prompt, 12, do_sample=True, top_k=5, generator=g)
    g = torch.Generator().manual_seed(3)
    s2 = lm.generate(prompt, 12, do_sample=True, top_k=5, generator=g, use_cache=False)
    assert torch.equal(s1, s2)


def test_cached_logits_equal_full_forward_logits():
    lm = lm_for("rope")
    x = torch.randint(0, 17, (2, 9))
    full = lm(x)
    cache = lm.new_cache()
    parts = [lm(x[:, :4], cache=cache)] + [lm(x[:, i : i + 1], cache=cache) for i in range(4, 9)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("use_cache", [True, False])
def test_beam_search_with_one_beam_equals_greedy(use_cache):
    lm = lm_for("learned")
    prompt = torch.randint(0, 17, (4, 3))
    greedy = lm.generate(prompt, 10, eos_token_id=5, pad_token_id=0, use_cache=use_cache)
    beam = lm.generate(prompt, 10, num_beams=1, eos_token_id=5, pad_token_id=0,
                       use_cache=use_cache)
    assert torch.equal(greedy, beam)


def sequence_logprob(lm, prompt, continuation):
    full = torch.cat([prompt, continuation]).unsqueeze(0)
    logp = torch.log_softmax(lm(full)[0, :-1], dim=-1)
    idx = torch.arange(len(prompt) - 1, full.shape[1] - 1)
    return logp[idx, full[0, len(prompt):]].sum().item()


def test_beam_search_finds_a_sequence_at_least_as_likely_as_greedy():
    lm = lm_for("sinusoidal", seed=4)
    prompt = torch.randint(0, 17, (1, 4))
    greedy = lm.generate(prompt, 6)[0, 4:]
    beam = lm.generate(prompt, 6, num_beams=4, length_penalty=0.0)[0, 4:]
    cached = lm.generate(prompt, 6, num_beams=4, length_penalty=0.0, use_cache=False)[0, 4:]
    assert torch.equal(beam, cached)
    assert sequence_logprob(lm, prompt[0], beam) >= sequence_logprob(lm, prompt[0], greedy) - 1e-5


@pytest.mark.parametrize("positional", ["learned", "rope", "alibi"])
def test_left_padded_batch_generates_what_each_prompt_generates_alone(positional):
    lm = lm_for(positional)
    prompts = [torch.randint(1, 17, (n,)) for n in (2, 5, 3)]
    width = 5
    batch = torch.zeros(3, width, dtype=torch.long)
    kpm = torch.ones(3, width, dtype=torch.bool)
    for i, p in enumerate(prompts):
        batch[i, width - len(p):] = p
        kpm[i, width - len(p):] = False
    out = lm.generate(batch, 7, key_padding_mask=kpm)
    for i, p in enumerate(prompts):
        alone = lm.generate(p.unsqueeze(0), 7)
        assert torch.equal(out[i, width:], alone[0, len(p):])


def test_stop_token_ends_rows_and_pads_them():
    lm = lm_for("learned")
    prompt = torch.randint(0, 17, (3, 4))
    free = lm.generate(prompt, 8)
    eos = int(free[0, 6])  # the third generated token of row 0
    out = lm.generate(prompt, 8, eos_token_id=eos, pad_token_id=16)
    row = out[0, 4:].tolist()
    stop = row.index(eos)
    assert all(t == 16 for t in row[stop + 1:])


def test_top_k_and_top_p_filters():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    assert torch.isinf(filter_logits(logits, top_k=2)).tolist() == [[True, False, False, True]]
    probs = torch.softmax(logits, -1)[0]
    # top-p just above the largest probability keeps exactly two tokens
    kept = ~torch.isinf(filter_logits(logits, top_p=float(probs.max()) + 1e-3))
    assert kept.tolist() == [[False, True, True, False]]
    kept = ~torch.isinf(filter_logits(logits, top_p=0.01))
    assert kept.tolist() == [[False, True, False, False]]


def test_sampling_with_temperature_follows_the_distribution():
    lm = lm_for("learned")
    prompt = torch.zeros(2000, 1, dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    out = lm.generate(prompt, 1, do_sample=True, temperature=2.0, generator=g)[:, 1]
    expected = torch.softmax(lm(prompt[:1])[0, -1] / 2.0, -1)
    freq = torch.bincount(out, minlength=17).float() / 2000
    assert (freq - expected).abs().max() < 0.04


def test_seq2seq_generation_cache_and_beams():
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=17, d_model=32, n_heads=4, n_layers=2, max_len=32)
    model = Seq2SeqTransformer(cfg).eval()
    src = torch.randint(0, 17, (2, 6))
    a = model.generate(src, 8, bos_token_id=1)
    b = model.generate(src, 8, bos_token_id=1, use_cache=False)
    c = model.generate(src, 8, bos_token_id=1, num_beams=1)
    assert torch.equal(a, b) and torch.equal(a, c)
    assert model.generate(src, 8, bos_token_id=1, num_beams=3).shape[0] == 2


def test_generation_rejects_bad_arguments():
    lm = lm_for("learned")
    with pytest.raises(ValueError, match=r"prompt length 40 \+ max_new_tokens 10 exceeds"):
        lm.generate(torch.zeros(1, 40, dtype=torch.long), 10)
    with pytest.raises(ValueError, match="temperature must be positive"):
        lm.generate(torch.zeros(1, 2, dtype=torch.long), 2, do_sample=True, temperature=0.0)
    with pytest.raises(ValueError, match="top_p must be in"):
        lm.generate(torch.zeros(1, 2, dtype=torch.long), 2, do_sample=True, top_p=1.5)


@pytest.mark.parametrize("options", [{}, {"do_sample": True, "top_p": 0.9}, {"num_beams": 2},
                                     {"use_cache": False}])
@pytest.mark.parametrize("eos", [None, 3])
def test_generation_checks_the_prompt_once_and_trusts_its_own_tokens(options, eos):
    """The model checks the prompt at the first step; every later step runs inside
    ``checked_inputs`` (its ids are the model's own choices, its positions within the limit
    the prompt was checked against), so that on a GPU cached greedy or sampled decoding waits
    for nothing per token without an EOS id and once (are all rows done?) with one. Beam
    search keeps its per-step bookkeeping on the host; without a cache each step reads whether
    the mask masks anything. Tokens are those of an unchecked loop (the tests above)."""
    from host_reads import HostReads

    lm = lm_for("rope")
    prompt = torch.randint(0, 17, (3, 5), generator=torch.Generator().manual_seed(4))
    cached = options.get("use_cache", True)
    mask = torch.zeros_like(prompt, dtype=torch.bool)
    with HostReads() as first:  # the first step: ids, and with a cache the positions of the mask
        lm(prompt, mask if cached else None, cache=lm.new_cache() if cached else None)
    if options.get("do_sample"):
        options = {**options, "generator": torch.Generator().manual_seed(5)}
    with HostReads() as reads:
        out = lm.generate(prompt, 8, eos_token_id=eos, **options)
    steps = out.shape[1] - prompt.shape[1]
    where = [s.split(" <- ")[0] for s in reads.sites]
    checks = [w for w in where if "checks.py" in w]
    assert len(checks) == len(first.sites)  # the prompt's check, once
    per_step = [w for w in where if "generation.py:decode" in w or "generation.py:step" in w]
    if "num_beams" in options:
        assert all("checks.py" in w or "_beam_search" in w for w in where)
    elif options.get("use_cache") is False:
        assert len(per_step) == steps + (eos is not None) * (steps - 1)
    else:
        assert len(per_step) == (0 if eos is None else steps - (steps == 8))


def test_a_fill_id_outside_the_vocabulary_is_refused_before_decoding():
    """Finished rows are continued with the fill id (``pad_token_id``, else the EOS id), which
    the later steps take as checked: it must be a token id of the model."""
    lm = lm_for("learned")
    prompt = torch.randint(0, 17, (2, 4), generator=torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match=r"pad_token_id must be a token id in \[0, 17\): "
                                         r"finished rows are continued with it; got -1"):
        lm.generate(prompt, 3, eos_token_id=2, pad_token_id=-1)
    with pytest.raises(ValueError, match=r"eos_token_id \(the fill id\) must be a token id in "
                                         r"\[0, 17\)"):
        lm.generate(prompt, 3, eos_token_id=17)
    assert lm.generate(prompt, 3, pad_token_id=-1).shape == (2, 7)  # no EOS: never used
