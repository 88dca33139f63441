"""Generation: KV cache = recomputation, beam 1 = greedy, padding, sampling filters."""

import itertools

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
    with pytest.raises(ValueError, match=r"temperature must be a finite number > 0"):
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
    per_step = [w for w in where if "decoding.py:decode" in w or "generation.py:step" in w]
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
    for eos in (17, True):  # the fill id without pad_token_id; True would be id 1
        with pytest.raises(ValueError, match=rf"eos_token_id must be a token id in \[0, 17\) "
                                             rf"or a non-empty list of them, got {eos}"):
            lm.generate(prompt, 3, eos_token_id=eos)
    assert lm.generate(prompt, 3, pad_token_id=-1).shape == (2, 7)  # no EOS: never used


def peaked_lm(seed, vocab=3, positional="learned"):
    """A tiny float64 LM with large weights: peaked next-token distributions, EOS often
    among the likely tokens."""
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=vocab, d_model=16, n_heads=2, n_layers=1, max_len=16,
                            positional=positional, init_std=0.6)
    return TransformerLM(cfg).double().eval()


def continuation(out_row, prompt_len, eos):
    """The generated tokens up to and including the first EOS."""
    seq = out_row[prompt_len:].tolist()
    return seq[: seq.index(eos) + 1] if eos in seq else seq


def next_logprobs(lm, seq):
    return torch.log_softmax(lm(torch.tensor([seq]))[0, -1], dim=-1).tolist()


@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0])
@pytest.mark.parametrize("early_stopping", [True, False, "never"])
def test_an_exhaustive_beam_returns_the_best_sequence_of_a_brute_force_search(
        length_penalty, early_stopping):
    """Vocabulary {0, 1, EOS=2}, three new tokens: 12 beams hold every prefix, so the beam
    returned must be the best of all 15 hypotheses (ended by EOS, or at the length limit),
    scored by summed log-probability / (generated length)**length_penalty."""
    eos, n = 2, 3
    for seed in range(3):
        lm = peaked_lm(seed)
        prompt = [1, 0]
        hyps = []
        for length in range(1, n + 1):
            for seq in itertools.product(range(3), repeat=length):
                if eos in seq[:-1] or (length < n and seq[-1] != eos):
                    continue
                logp = sum(next_logprobs(lm, prompt + list(seq[:i]))[tok]
                           for i, tok in enumerate(seq))
                hyps.append((logp / length**length_penalty, list(seq)))
        assert len(hyps) == 15
        best = max(hyps)[1]
        out = lm.generate(torch.tensor([prompt]), n, num_beams=12, eos_token_id=eos,
                          length_penalty=length_penalty, early_stopping=early_stopping)
        assert continuation(out[0], 2, eos) == best, seed


def reference_beam(lm, prompt, n, k, eos, length_penalty, early_stopping):
    """Beam search written out over lists: each step expands every beam by every token and
    ranks the candidates by summed log-probability; an EOS candidate among the k best
    finishes (scored / length**length_penalty), the k best others go on; at the length
    limit the running beams finish too. ``early_stopping=True`` ends the search once k have
    finished; with length_penalty 0 a running beam's score can only fall, so False and
    "never" need no stopping rule. Returns the best finished hypothesis."""
    beams, finished = [(0.0, [])], []
    for t in range(n):
        cands = sorted(((score + lp, [*seq, tok]) for score, seq in beams
                        for tok, lp in enumerate(next_logprobs(lm, prompt + seq))),
                       key=lambda c: -c[0])
        beams = []
        for rank, (score, seq) in enumerate(cands):
            if seq[-1] == eos:
                if rank < k:
                    finished.append((score / (t + 1) ** length_penalty, seq))
            elif len(beams) < k:
                beams.append((score, seq))
        if t == n - 1:
            finished += [(score / n**length_penalty, seq) for score, seq in beams]
        elif early_stopping is True and len(finished) >= k:
            break
    return max(finished)[1]


@pytest.mark.parametrize(("early_stopping", "length_penalty"),
                         [(True, 1.0), (True, 0.0), (False, 0.0), ("never", 0.0)])
@pytest.mark.parametrize(("k", "n", "use_cache"), [(2, 5, True), (3, 3, False)])
def test_a_narrow_beam_equals_a_beam_search_written_out_over_lists(
        early_stopping, length_penalty, k, n, use_cache):
    """Two or three beams over four tokens: rows come to hold k finished hypotheses while a
    running beam is still better, and that beam must be ranked with them when the length
    limit ends it (it used to be dropped, and a worse finished one returned)."""
    eos = 3
    for seed in range(9):
        lm = peaked_lm(seed, vocab=4)
        prompts = torch.randint(0, 4, (2, 3), generator=torch.Generator().manual_seed(seed))
        out = lm.generate(prompts, n, num_beams=k, eos_token_id=eos, use_cache=use_cache,
                          length_penalty=length_penalty, early_stopping=early_stopping)
        for b in range(2):
            expected = reference_beam(lm, prompts[b].tolist(), n, k, eos, length_penalty,
                                      early_stopping)
            assert continuation(out[b], 3, eos) == expected, (seed, b)


def nucleus_by_hand(logits, top_p):
    """Indices of the smallest set of most likely tokens whose probability reaches top_p
    (summed in float64 over the sorted probabilities)."""
    probs = torch.softmax(logits.double(), dim=-1).tolist()
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    kept, mass = [], 0.0
    for i in order:
        if mass >= top_p:
            break
        kept.append(i)
        mass += probs[i]
    return sorted(kept)


def test_top_p_keeps_the_smallest_set_reaching_p_as_computed_by_hand():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        logits = torch.randn(12, generator=g, dtype=torch.float64) * 3
        top_p = float(torch.rand(1, generator=g)) * 0.98 + 0.01
        kept = (~torch.isinf(filter_logits(logits[None], top_p=top_p)))[0]
        assert kept.nonzero().flatten().tolist() == nucleus_by_hand(logits, top_p)


def test_top_p_one_keeps_every_token_even_of_negligible_probability():
    """With p = 1 the nucleus is the whole vocabulary; the float32 running sum reaching 1.0
    before the last tokens used to drop those of probability ~1e-9."""
    logits = torch.tensor([[0.0, -20.0, -20.0, -20.0, -20.0, -20.0]])
    assert not torch.isinf(filter_logits(logits, top_p=1.0)).any()
    assert torch.equal(filter_logits(logits, top_p=1.0), logits)


def test_top_p_keeps_every_token_tied_with_the_last_one_kept():
    """Probabilities (a, b, b, c): a mass a + b/2 needs one of the two tied tokens; which one
    would be arbitrary (their order in the vocabulary), so both stay, in either order, as
    top-k keeps ties."""
    for logits in ([2.0, 1.0, 1.0, 0.0], [1.0, 2.0, 0.0, 1.0], [1.0, 0.0, 1.0, 2.0]):
        logits = torch.tensor([logits])
        probs = torch.softmax(logits, dim=-1)[0].sort(descending=True).values
        top_p = float(probs[0] + probs[1] / 2)
        kept = ~torch.isinf(filter_logits(logits, top_p=top_p))
        assert kept.tolist() == (logits >= 1.0).tolist()
    assert (~torch.isinf(filter_logits(torch.tensor([[1.0, 2.0, 1.0]]), top_k=2))).all()


@pytest.mark.parametrize("top_k", [0, -1, 2.5, True])
def test_a_top_k_that_is_not_a_positive_int_is_refused_naming_it(top_k):
    with pytest.raises(ValueError, match=rf"top_k must be a positive int or None, got "
                                         rf"{top_k!r}"):
        filter_logits(torch.zeros(1, 4), top_k=top_k)


def test_a_right_padded_prompt_is_refused_naming_its_row():
    """The next token comes from the last position: a row whose last prompt slot is padding
    would continue from a padding token's output, so it is refused."""
    lm = lm_for("learned")
    prompt = torch.tensor([[3, 4, 5], [3, 4, 0]])
    kpm = torch.tensor([[False, False, False], [False, False, True]])
    with pytest.raises(ValueError, match=r"last prompt position of row\(s\) \[1\] as padding: "
                                         "prompts must be left-padded"):
        lm.generate(prompt, 3, key_padding_mask=kpm)
    left = torch.tensor([[3, 4, 5], [0, 3, 4]])
    out = lm.generate(left, 3, key_padding_mask=kpm.flip(1))
    assert torch.equal(out[1, 3:], lm.generate(left[1:, 1:], 3)[0, 2:])


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rope", "alibi"])
def test_a_cached_step_without_a_mask_continues_each_padded_row_at_its_own_position(
        positional):
    """After a left-padded prompt has been cached with its mask, a step given no mask (no new
    padding) places each row's token after that row's real tokens: its logits equal the full
    uncached pass with the whole mask."""
    lm = lm_for(positional)
    x = torch.tensor([[0, 0, 3, 4], [5, 6, 7, 8]])
    kpm = torch.tensor([[True, True, False, False], [False, False, False, False]])
    cache = lm.new_cache()
    lm(x, kpm, cache=cache)
    nxt = torch.tensor([[9], [9]])
    stepped = torch.cat([lm(nxt, cache=cache), lm(nxt, cache=cache)], dim=1)
    full = lm(torch.cat([x, nxt, nxt], dim=1),
              torch.cat([kpm, torch.zeros(2, 2, dtype=torch.bool)], dim=1))[:, -2:]
    torch.testing.assert_close(stepped, full, atol=1e-5, rtol=1e-5)


def test_the_generation_functions_build_no_autograd_graph():
    """``graded.transformer.generate`` called directly (not through the model's no-grad
    method) runs every step without recording gradients, as the methods do."""
    from graded.transformer import generate, generate_seq2seq

    lm = lm_for("rope")
    recorded = []
    lm.register_forward_hook(lambda module, args, out: recorded.append(out.requires_grad))
    generate(lm, torch.randint(0, 17, (2, 3)), 4, num_beams=2)
    torch.manual_seed(0)
    model = Seq2SeqTransformer(TransformerConfig(vocab_size=17, d_model=16, n_heads=2,
                                                 n_layers=1, max_len=16)).eval()
    model.decoder.register_forward_hook(lambda module, args, out: recorded.append(
        out[0].requires_grad))
    generate_seq2seq(model, torch.randint(0, 17, (2, 3)), 3, bos_token_id=1)
    assert len(recorded) > 4 and not any(recorded)


def test_top_k_and_top_p_equal_hugging_faces_warpers_on_edge_cases():
    """k above the vocabulary, tiny and full top_p, rows with -inf scores, batch 1 and float16
    scores, against transformers' ``TopKLogitsWarper`` and ``TopPLogitsWarper`` (ties have
    probability 0 among these random scores, where the two differ by design)."""
    transformers = pytest.importorskip("transformers")
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies

    @hypothesis.settings(max_examples=150, deadline=None, derandomize=True)
    @hypothesis.given(seed=st.integers(0, 2**31 - 1), batch=st.integers(1, 3),
                      vocab=st.integers(1, 8), k=st.integers(1, 12),
                      top_p=st.sampled_from([1e-9, 0.3, 0.5, 0.9, 0.999, 1.0]),
                      banned=st.integers(0, 3),
                      dtype=st.sampled_from([torch.float32, torch.float16]))
    def check(seed, batch, vocab, k, top_p, banned, dtype):
        g = torch.Generator().manual_seed(seed)
        scores = torch.randn(batch, vocab, generator=g) * 3
        scores[:, :min(banned, vocab - 1)] = float("-inf")
        scores = scores.to(dtype)
        ids = torch.zeros(batch, 1, dtype=torch.long)
        top_k_hf = transformers.TopKLogitsWarper(k)(ids, scores.clone())
        assert torch.equal(filter_logits(scores, top_k=k), top_k_hf)
        top_p_hf = transformers.TopPLogitsWarper(top_p)(ids, scores.clone())
        assert torch.equal(filter_logits(scores, top_p=top_p), top_p_hf)

    check()
