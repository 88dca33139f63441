"""Autoregressive generation: greedy, sampling (temperature, top-k, top-p), beam search.

Works for any model exposing a decoding step ``step(ids, key_padding_mask, cache) -> logits``;
:func:`generate` drives a :class:`~graded.transformer.models.TransformerLM` and
:func:`generate_seq2seq` a :class:`~graded.transformer.models.Seq2SeqTransformer`.
Prompts of different lengths are left-padded with ``pad_token_id`` and passed with a
``key_padding_mask``; positions skip the padding, so a padded prompt generates exactly what it
would alone, and ``max_len`` must hold the longest real prompt plus the new tokens. With
``use_cache`` each step feeds only the newest token and reuses cached keys and values; without
it every step recomputes the whole sequence (the two agree). Hugging Face's ``sequence_bias``,
``repetition_penalty``, ``no_repeat_ngram_size``, ``bad_words_ids``, ``min_new_tokens`` and
``forced_eos_token_id`` are options (:func:`~graded.transformer.logits.logits_processing`); a
model that grades tokens
(000 §6.2) generates with the prompt's grades and a grader of the new tokens
(:func:`token_grading`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor

from graded.checks import checked_inputs
from graded.positional import TABLE_POSITIONAL
from graded.transformer.cache import KVCache
from graded.transformer.decoding_grades import GradeLast, TokenGrader, token_grading
from graded.transformer.logits import (
    LogitsProcessing,
    _is_number,
    _is_token,
    _select_next,
    check_sampling,
    eos_ids,
    filter_logits,
    logits_processing,
    no_token_left,
    select_next,
)

__all__ = ["PROCESSOR_OPTIONS", "check_prompt", "decode", "filter_logits", "generate",
           "generate_seq2seq", "select_next"]

#: The options of Hugging Face's logits processors that generation takes, with their defaults
#: (:func:`~graded.transformer.logits.logits_processing`).
PROCESSOR_OPTIONS: dict[str, object] = {
    "sequence_bias": None, "repetition_penalty": None, "no_repeat_ngram_size": 0,
    "bad_words_ids": None, "min_new_tokens": 0, "forced_eos_token_id": None,
    "renormalize_logits": False,
}

Step = Callable[..., Tensor]  # (ids, key_padding_mask, cache[, token_grades]) -> logits


def check_prompt(input_ids: Tensor, max_new_tokens: int, max_len: int | None, *,
                 key_padding_mask: Tensor | None = None, name: str = "input_ids") -> None:
    """A (batch, length) integer prompt, max_new_tokens >= 0, and room for them in ``max_len``
    (None: no limit). Positions skip left padding (:func:`graded.transformer.models.
    default_positions`, as Hugging Face's ``generate`` counts them from ``attention_mask``), so
    the room needed is the longest row's real tokens plus ``max_new_tokens``: the padding of a
    left-padded batch takes no position. ``key_padding_mask`` (True = padding, checked by the
    caller) gives the real tokens; without it every token is real. A prompt holds at least one
    token (the next one is read at the last position). ``name`` names ``input_ids`` in the
    errors."""
    if input_ids.dim() != 2 or input_ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(
            f"{name} must be an integer tensor of shape (batch, length), got "
            f"{tuple(input_ids.shape)} {input_ids.dtype}"
        )
    if input_ids.shape[1] == 0:
        raise ValueError(f"the prompt is empty ({name} of shape {tuple(input_ids.shape)}); "
                         "expected at least one token per row (e.g. a BOS token)")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral):
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be non-negative, got {max_new_tokens}")
    if max_len is None or input_ids.shape[1] + max_new_tokens <= max_len:
        return  # fits even counting the padding: nothing to read
    real, what = input_ids.shape[1], "prompt length"
    if key_padding_mask is not None and input_ids.shape[0] and real:
        real = int((~key_padding_mask).sum(dim=1).max())
        if real < input_ids.shape[1]:
            what = "longest prompt (real tokens, left padding excluded)"
    if real + max_new_tokens > max_len:
        raise ValueError(
            f"{what} {real} + max_new_tokens {max_new_tokens} exceeds the model's "
            f"max_len={max_len}"
        )


def check_decoding(
    *, do_sample: bool, temperature: float, top_k: int | None, top_p: float | None,
    num_beams: int, length_penalty: float, eos_token_id: int | Sequence[int] | None,
    vocab_size: int,
) -> None:
    """The decoding options of :func:`decode`, each refused naming its value: ``do_sample``
    a bool (a string such as ``"no"`` would be true), the sampling options
    (:func:`~graded.transformer.logits.check_sampling`, checked whether or not the decoding
    samples, but for temperature 0 without sampling: a common spelling of greedy decoding),
    ``num_beams`` an int >= 1 (wider than the vocabulary is allowed: the beams fill as the
    candidates multiply), ``length_penalty`` a finite number, ``eos_token_id`` a token id the
    model can produce (any other would never end a row) or a non-empty list of them
    (:func:`~graded.transformer.logits.eos_ids`)."""
    if not isinstance(do_sample, bool):
        raise ValueError(f"do_sample must be True or False, got {do_sample!r}")
    # temperature 0 is a common way to ask for greedy decoding: taken (and unused) without
    # sampling, refused with it
    greedy_zero = not do_sample and _is_number(temperature) and temperature == 0
    check_sampling(1.0 if greedy_zero else temperature, top_k, top_p)
    if isinstance(num_beams, bool) or not isinstance(num_beams, numbers.Integral):
        raise ValueError(f"num_beams must be an int >= 1, got {num_beams!r}")
    if num_beams < 1:
        raise ValueError(f"num_beams must be >= 1, got {num_beams}")
    if not _is_number(length_penalty) or not math.isfinite(length_penalty):
        raise ValueError(f"length_penalty must be a finite number (1.0: the mean "
                         f"log-probability), got {length_penalty!r}")
    eos_ids(eos_token_id, vocab_size)


def decode(
    step: Step, input_ids: Tensor, key_padding_mask: Tensor, max_new_tokens: int, *,
    n_layers: int, do_sample: bool, temperature: float, top_k: int | None, top_p: float | None,
    num_beams: int, eos_token_id: int | Sequence[int] | None, pad_token_id: int | None,
    use_cache: bool, generator: torch.Generator | None, length_penalty: float,
    early_stopping: bool | str = True, vocab_size: int,
    token_grades: Tensor | None = None, grade_last: GradeLast | None = None,
    **processors: object,
) -> Tensor:
    """The decoding loop shared by the models: ``step(ids, key_padding_mask, cache)`` returns
    logits (B, T, V) for the tokens it is given (all of them, or only the new one when a cache is
    kept); greedy, sampled or beam decoding of ``max_new_tokens`` tokens, returned with the
    prompt as a new int64 tensor (B, T + n), n <= ``max_new_tokens`` (an empty batch: no row
    ends early, n = ``max_new_tokens``, and the step is not called). For a model that
    grades tokens, ``token_grades`` (B, T) grade ``input_ids``, ``grade_last(ids, mask)`` grades
    each new token (:func:`grader_of`), and the step is called with the grades of the tokens it
    is given as a fourth argument. The steps after the
    first run inside :func:`graded.checks.checked_inputs`: their ids are the model's own
    choices (< ``vocab_size``) or the fill id of finished rows, checked here once.

    ``processors`` (:data:`PROCESSOR_OPTIONS`) act as Hugging Face's logits processors of
    those names (:class:`~graded.transformer.logits.LogitsProcessing`): on the logits before
    sampling's temperature and filters, on the log-probabilities in beam search; each row's
    (each beam's) history is its ids so far, ``input_ids`` and its padding included, as Hugging
    Face's ``input_ids``; the repetition penalty starts at each row's first real token; the EOS
    is forced at the last of the ``max_new_tokens`` steps (Hugging Face's ``max_length - 1``).
    An open row whose scores are all -inf (the processors, or the model, ban every token) is refused
    with a ValueError naming the step and the row, whether decoding is greedy (argmax would
    emit a banned token), sampled or a beam search (whose row would end without a
    hypothesis); greedy and sampled decoding raise it after the loop (one read instead of one
    per step). A finished row's scores are not used (it is continued with the pad id), and a
    beam-search row whose beams all run out keeps the hypotheses it finished before."""
    check_decoding(do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
                   num_beams=num_beams, length_penalty=length_penalty,
                   eos_token_id=eos_token_id, vocab_size=vocab_size)
    if early_stopping not in EARLY_STOPPING:
        raise ValueError(f"early_stopping must be one of {EARLY_STOPPING}, got "
                         f"{early_stopping!r}")
    unknown = sorted(set(processors) - set(PROCESSOR_OPTIONS))
    if unknown:
        raise TypeError(f"unknown generation option(s) {unknown}; the logits processors are "
                        f"{sorted(PROCESSOR_OPTIONS)}")
    processing = logits_processing(vocab_size=vocab_size, device=input_ids.device,
                                   eos_token_id=eos_token_id, **processors)
    # the repetition penalty skips each row's left padding, as Hugging Face's attention mask
    start = (None if processing is None or processing.repetition_penalty is None
             else (~key_padding_mask).int().argmax(dim=1))
    eos = eos_ids(eos_token_id, vocab_size)
    pad = pad_token_id if pad_token_id is not None else (eos[0] if eos else 0)
    if pad_token_id is not None and (isinstance(pad, bool)
                                     or not isinstance(pad, numbers.Integral)):
        raise ValueError(f"pad_token_id must be an int token id or None, got {pad!r}")
    if (eos or num_beams > 1) and not _is_token(pad, vocab_size):  # the EOS ids are checked
        used = ("finished rows are continued with it" if eos else
                "beam search continues the beams it cannot fill with it")
        raise ValueError(f"pad_token_id must be a token id in [0, {vocab_size}): {used}; got "
                         f"{pad!r}")
    if num_beams > 1 and do_sample:
        raise ValueError("beam search with do_sample=True is not supported; choose one")
    if max_new_tokens == 0 or input_ids.shape[0] == 0:
        # a new tensor, as every decoding returns (writing into it leaves the prompt as it
        # is), of the shape and dtype a batch of rows would have: an empty batch has no row to
        # finish early, and gets (0, T + max_new_tokens) whether it is greedy, sampled or beam
        # decoding (the model is not called on it)
        out = input_ids.new_full((input_ids.shape[0], input_ids.shape[1] + max_new_tokens),
                                 pad, dtype=torch.long)
        out[:, : input_ids.shape[1]] = input_ids
        return out
    if num_beams > 1:
        return _beam_search(step, input_ids, key_padding_mask, max_new_tokens, n_layers=n_layers,
                            num_beams=num_beams, eos=eos, pad=pad,
                            use_cache=use_cache, length_penalty=length_penalty,
                            early_stopping=early_stopping, processing=processing,
                            start=start, token_grades=token_grades, grade_last=grade_last)
    cache = KVCache.empty(n_layers) if use_cache else None
    ids, kpm = input_ids, key_padding_mask
    finished = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    ends = torch.tensor(eos, device=ids.device) if eos else None
    grades = token_grades
    # the first step at which each row had no token left (max_new_tokens: none), read once
    # after the loop: argmax would pick a banned token there, multinomial fail on NaN
    stuck = torch.full_like(finished, max_new_tokens, dtype=torch.long)
    logits = _run(step, ids, kpm, cache, grades)
    for i in range(max_new_tokens):
        # in at least float32, as Hugging Face's generate casts them: a bfloat16 score
        # divided by a penalty or temperature would round (ties, a different argmax)
        scores = logits[:, -1].to(torch.promote_types(logits.dtype, torch.float32))
        if processing is not None:
            scores = processing(scores, ids, new_tokens=i, last=i == max_new_tokens - 1,
                                start=start)
        # a finished row's token is the fill id, whatever its scores; an open row with every
        # score at -inf is an error, raised after the loop
        empty = torch.isneginf(scores).all(dim=-1)
        stuck = torch.where(empty & ~finished & (stuck == max_new_tokens), i, stuck)
        scores = scores.masked_fill(empty[:, None], 0.0)
        tok = _select_next(scores, do_sample=do_sample, temperature=temperature,
                           top_k=top_k, top_p=top_p, generator=generator)
        tok = torch.where(finished, torch.full_like(tok, pad), tok)
        ids = torch.cat([ids, tok[:, None]], dim=1)
        new_pad = finished[:, None].clone()
        kpm = torch.cat([kpm, new_pad], dim=1)
        if ends is not None:
            finished |= torch.isin(tok, ends)
        # the only read of a step: whether every row is done (none without an EOS id)
        if i == max_new_tokens - 1 or (ends is not None and bool(finished.all())):
            break
        new_grades = None
        if grades is not None:  # checked by grade_last
            new_grades = grade_last(ids, kpm)[:, None]
            grades = torch.cat([grades, new_grades], dim=1)
        # the new ids are the model's own choices and the positions within the limit the
        # prompt was checked against: the model reads neither again (no wait on a GPU)
        with checked_inputs():
            if cache is not None:
                logits = _run(step, tok[:, None], new_pad, cache, new_grades)
            else:
                logits = _run(step, ids, kpm, None, grades)
    _check_stuck(stuck, max_new_tokens)
    return ids


def _check_stuck(stuck: Tensor, max_new_tokens: int) -> None:
    """Refuse the rows that had no token left: ``stuck`` (B,) holds each row's first such
    step, ``max_new_tokens`` for none."""
    first = int(stuck.min()) if stuck.numel() else max_new_tokens
    if first < max_new_tokens:
        raise no_token_left((stuck == first).nonzero().flatten().tolist(), first)


def _run(step: Step, ids: Tensor, kpm: Tensor, cache: KVCache | None,
         grades: Tensor | None) -> Tensor:
    """One decoding step; the grades go to the step only for a model that grades tokens."""
    return step(ids, kpm, cache) if grades is None else step(ids, kpm, cache, grades)


EARLY_STOPPING = (True, False, "never")


def _row_done(finished: list[tuple[float, Tensor]], best_running: float, k: int, length: int,
              max_length: int, length_penalty: float, early_stopping: bool | str) -> bool:
    """Whether a beam-search row can stop (see :func:`_beam_search`): it holds ``k`` finished
    hypotheses and, unless ``early_stopping`` is True, none of its running beams (the best has
    summed log-probability ``best_running`` over ``length`` tokens) can still enter them."""
    if len(finished) < k:
        return False
    if early_stopping is True:
        return True
    worst_kept = sorted(score for score, _ in finished)[-k]
    if early_stopping == "never" and length_penalty > 0:
        length = max_length
    return worst_kept >= best_running / length ** length_penalty


def _beam_search(
    step: Step, input_ids: Tensor, key_padding_mask: Tensor, max_new_tokens: int, *,
    n_layers: int, num_beams: int, eos: tuple[int, ...], pad: int, use_cache: bool,
    length_penalty: float, early_stopping: bool | str = True,
    processing: LogitsProcessing | None = None, start: Tensor | None = None,
    token_grades: Tensor | None = None, grade_last: GradeLast | None = None,
) -> Tensor:
    """Beam search. Hypotheses are ranked by log-probability / length**length_penalty, where
    length counts generated tokens; a row keeps its ``num_beams`` best finished ones. When a row
    is done (Hugging Face's ``early_stopping``): ``True``, as soon as it holds ``num_beams``
    finished hypotheses; ``False``, when moreover the best running beam, scored at its current
    length, cannot beat the worst kept hypothesis; ``"never"``, when it cannot even at the
    length that scores it best (``max_new_tokens`` for length_penalty > 0). A row still open
    after ``max_new_tokens`` ranks its running beams with its finished hypotheses (they end
    there, as at Hugging Face's maximum length), so the best hypothesis returned is the best
    of all that the search finished. With one beam this is greedy decoding. ``processing``
    acts on the log-probabilities, after the softmax, as Hugging Face's logits processors do
    in its beam search, each beam's history read from that beam's ids; ``start`` (B,) is each
    prompt's first real position (:func:`decode`); a hypothesis finishes at any of the ids
    ``eos``."""
    batch, prompt_len = input_ids.shape
    k = num_beams
    device = input_ids.device
    ids = input_ids.repeat_interleave(k, dim=0)
    kpm = key_padding_mask.repeat_interleave(k, dim=0)
    cache = KVCache.empty(n_layers) if use_cache else None
    finished: list[list[tuple[float, Tensor]]] = [[] for _ in range(batch)]
    done = [False] * batch
    grades = None if token_grades is None else token_grades.repeat_interleave(k, dim=0)
    logits = _run(step, ids, kpm, cache, grades)
    # scores in float32 at least (bf16 / fp16 logits are promoted), float64 for a float64 model
    score_dtype = torch.promote_types(logits.dtype, torch.float32)
    beam_scores = torch.zeros(batch, k, device=device, dtype=score_dtype)
    beam_scores[:, 1:] = float("-inf")
    start = None if start is None else start.repeat_interleave(k)
    for t in range(max_new_tokens):
        scores = logits[:, -1].to(score_dtype)
        logp = torch.log_softmax(scores, dim=-1)  # (B*K, V)
        # a beam whose scores are all -inf has no token (its log_softmax would be NaN)
        logp = logp.masked_fill(torch.isneginf(scores).all(dim=-1, keepdim=True), float("-inf"))
        if processing is not None:
            logp = processing(logp, ids, new_tokens=t, last=t == max_new_tokens - 1,
                              start=start)
        vocab = logp.shape[-1]
        cand = (beam_scores.view(-1, 1) + logp).view(batch, k * vocab)
        top_scores, top_idx = cand.topk(min(2 * k, k * vocab), dim=-1)
        next_beam = torch.zeros(batch, k, dtype=torch.long, device=device)
        next_tok = torch.full((batch, k), pad, dtype=torch.long, device=device)
        next_scores = torch.full((batch, k), float("-inf"), device=device, dtype=score_dtype)
        stuck: list[int] = []
        for b in range(batch):
            if done[b]:
                continue
            slot = 0
            for rank in range(top_idx.shape[1]):
                score = float(top_scores[b, rank])
                if score == float("-inf"):
                    break
                beam, tok = divmod(int(top_idx[b, rank]), vocab)
                if tok in eos:
                    if rank < k:
                        seq = torch.cat([ids[b * k + beam, prompt_len:],
                                         torch.tensor([tok], device=device)])
                        finished[b].append((score / (t + 1) ** length_penalty, seq))
                    continue
                next_beam[b, slot], next_tok[b, slot], next_scores[b, slot] = beam, tok, score
                slot += 1
                if slot == k:
                    break
            if slot == 0 and not finished[b]:  # no beam left and no hypothesis to return
                stuck.append(b)
            if t < max_new_tokens - 1:  # at the last step the running beams end as well
                done[b] = _row_done(finished[b], float(next_scores[b, 0]), k, t + 1,
                                    max_new_tokens, length_penalty, early_stopping)
        if stuck:
            raise no_token_left(stuck, t)
        if all(done):
            break
        src = (torch.arange(batch, device=device)[:, None] * k + next_beam).view(-1)
        ids = torch.cat([ids.index_select(0, src), next_tok.view(-1, 1)], dim=1)
        kpm = torch.cat([kpm.index_select(0, src),
                         torch.zeros(batch * k, 1, dtype=torch.bool, device=device)], dim=1)
        beam_scores = next_scores
        if t == max_new_tokens - 1:
            break
        new_grades = None
        if grades is not None:
            new_grades = grade_last(ids, kpm)[:, None]
            grades = torch.cat([grades.index_select(0, src), new_grades], dim=1)
        with checked_inputs():  # the model's own ids, as in decode
            if cache is not None:
                # a seq2seq step passes the same encoder memory: a beam moves within its
                # source's rows of the repeated memory, which are equal, so the cache's
                # record of it (KVCache.memory_record) stays
                cache.reorder(src)
                logits = _run(step, next_tok.view(-1, 1), kpm[:, -1:], cache, new_grades)
            else:
                logits = _run(step, ids, kpm, None, grades)
    generated = ids.shape[1] - prompt_len
    outputs = []
    for b in range(batch):
        hyps = list(finished[b])
        if not done[b]:  # its running beams end here and may beat every finished one
            for j in range(k):
                score = float(beam_scores[b, j])
                if score > float("-inf") and generated > 0:
                    hyps.append((score / generated ** length_penalty,
                                 ids[b * k + j, prompt_len:]))
        best = max(hyps, key=lambda h: h[0])[1] if hyps else ids.new_empty(0)
        outputs.append(best)
    width = max((len(o) for o in outputs), default=0)
    out = torch.full((batch, prompt_len + width), pad, dtype=torch.long, device=device)
    out[:, :prompt_len] = input_ids
    for b, seq in enumerate(outputs):
        out[b, prompt_len : prompt_len + len(seq)] = seq
    return out


def _defaults(key_padding_mask: Tensor | None, input_ids: Tensor) -> Tensor:
    """The prompt's padding mask (none: no padding), checked: a bool (B, T) mask whose last
    column is real. The next token is read from the last position's logits, so a right-padded
    prompt would continue from the output of a padding token."""
    if key_padding_mask is None:
        return torch.zeros(input_ids.shape, dtype=torch.bool, device=input_ids.device)
    if key_padding_mask.shape != input_ids.shape or key_padding_mask.dtype != torch.bool:
        raise ValueError(
            f"key_padding_mask must be a bool tensor of shape {tuple(input_ids.shape)}, got "
            f"{tuple(key_padding_mask.shape)} {key_padding_mask.dtype}"
        )
    if input_ids.shape[1]:
        rows = key_padding_mask[:, -1].nonzero().flatten().tolist()
        if rows:
            raise ValueError(
                f"key_padding_mask marks the last prompt position of row(s) {rows[:8]} as "
                "padding: prompts must be left-padded, with a real last token (each row's "
                "next token is predicted from its last position)"
            )
    return key_padding_mask


def position_limit(config: object) -> int | None:
    """The longest sequence a model can see: ``max_len`` for positions from a table
    (sinusoidal, learned), None for RoPE/ALiBi/none. ``config`` is a model config, or any object
    with ``positional`` and ``max_len`` (a morphic model)."""
    if getattr(config, "positional", None) in TABLE_POSITIONAL:
        return config.max_len
    return None



def cacheless_backends(model: torch.nn.Module) -> list[tuple[str, str]]:
    """(module name, backend name) of every self-attention module of ``model.decoder`` whose
    backend cannot decode incrementally (its capabilities lack ``incremental``): one query
    against the cached keys would not reproduce its pattern. Cross-attention is not listed (its
    keys are the whole memory at every step, as in the uncached pass)."""
    from graded.attention.backends import capabilities_of
    from graded.attention.multihead import MultiheadAttention

    found = []
    for name, sub in model.decoder.named_modules():
        module = getattr(sub, "attn", None)  # an AttentionSublayer's MultiheadAttention
        if (not isinstance(module, MultiheadAttention) or module.backend is None
                or getattr(sub, "cross", False)):
            continue
        if not capabilities_of(module.backend).incremental:
            found.append((name, module.backend_name))
    return found


def resolve_use_cache(model: torch.nn.Module, use_cache: bool | None) -> bool:
    """``use_cache`` as generation runs it: None (the default) caches when every
    self-attention backend can decode incrementally and recomputes the whole prefix each step
    otherwise (exact either way: the uncached pass is the definition); True refuses a backend
    that cannot (:func:`check_cache_support`); False never caches."""
    if use_cache is None:
        return not cacheless_backends(model)
    if not isinstance(use_cache, bool):
        raise TypeError(f"use_cache must be None, True or False, got {use_cache!r}")
    if use_cache:
        check_cache_support(model)
    return use_cache


def check_cache_support(model: torch.nn.Module) -> None:
    """Refuse, before any decoding, a KV cache that a self-attention backend of
    ``model.decoder`` cannot serve (:func:`cacheless_backends`)."""
    from graded.attention.backends import backends_supporting

    for name, backend in cacheless_backends(model)[:1]:
        raise ValueError(
            f"generation with use_cache=True: attention backend {backend!r} "
            f"({name}) cannot decode incrementally with a KV cache; pass use_cache=False or "
            "None (each step recomputes the whole prefix, exact) or use one of "
            f"{', '.join(backends_supporting('incremental'))}"
        )


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    input_ids: Tensor,
    max_new_tokens: int,
    *,
    key_padding_mask: Tensor | None = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    num_beams: int = 1,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    use_cache: bool | None = None,
    generator: torch.Generator | None = None,
    length_penalty: float = 1.0,
    early_stopping: bool | str = True,
    bad_words_ids: Sequence[Sequence[int]] | None = None,
    forced_eos_token_id: int | Sequence[int] | None = None,
    sequence_bias: Mapping[tuple[int, ...], float] | Sequence[Sequence[object]] | None = None,
    repetition_penalty: float | None = None,
    no_repeat_ngram_size: int = 0,
    min_new_tokens: int = 0,
    renormalize_logits: bool = False,
    token_grades: Tensor | None = None,
    token_grader: TokenGrader | None = None,
) -> Tensor:
    """Continue ``input_ids`` (B, T), T >= 1, with a decoder-only LM; returns (B, T + n) ids
    where n <= max_new_tokens, a new int64 tensor (for ``max_new_tokens=0`` too, a copy of the
    prompt; an empty batch gives (0, T + max_new_tokens)); every option is checked before the
    first step (:func:`check_decoding`), used or not. ``eos_token_id`` is one id or, as Hugging
    Face's, a list of ids any of which ends a row; rows that emitted one are filled with
    ``pad_token_id`` (default: the first EOS id, or 0), and beam search continues with it the
    beams a step cannot fill (more beams than candidates): with EOS ids or beams it must be a
    token id of the model. ``early_stopping`` (True, False or "never") decides when beam search
    ends, as in Hugging Face's ``generate`` (:func:`_beam_search`). ``use_cache``: None caches
    where every backend can (:func:`resolve_use_cache`), True requires it, False recomputes the
    prefix each step; the tokens are the same. Hugging Face's options of these names
    (:class:`~graded.transformer.logits.LogitsProcessing`): ``bad_words_ids`` (e.g.
    ``[[pad_id]]``: never generate the pad token; ``[[a, b]]``: never ``b`` right after ``a``),
    ``forced_eos_token_id`` (the last new token of an unfinished row is this EOS),
    ``sequence_bias`` (``{(a,): -2.0, (a, b): 1.5}``: add -2 to ``a``'s score, 1.5 to ``b``'s
    right after ``a``), ``repetition_penalty`` (> 1 makes the row's tokens less likely),
    ``no_repeat_ngram_size`` (n: no n-gram twice in a row), ``min_new_tokens`` (no EOS before
    that many) and ``renormalize_logits`` (the log-softmax after them: in beam search the tokens
    left share the whole probability). A model that grades tokens
    (``TransformerConfig.token_grading``, 000 §6.2) needs ``token_grades`` (B, T) of the prompt
    and ``token_grader``, the grades of a row's token ids as the task grades them (e.g.
    ``lambda ids: task.grade_tokens(task.vocab.decode(ids))``): each new token's grade is the
    last of its row's (:func:`grader_of`)."""
    check_prompt(input_ids, max_new_tokens, None)
    kpm = _defaults(key_padding_mask, input_ids)
    check_prompt(input_ids, max_new_tokens, position_limit(model.config), key_padding_mask=kpm)
    token_grades, grade_last = token_grading(model, input_ids, token_grades, token_grader,
                                             grades_new_tokens=max_new_tokens > 0)
    use_cache = resolve_use_cache(model, use_cache)
    was_training = model.training
    model.eval()

    def step(ids: Tensor, mask: Tensor, cache: KVCache | None,
             grades: Tensor | None = None) -> Tensor:
        extra = {} if grades is None else {"token_grades": grades}
        return model(ids, mask if cache is not None or bool(mask.any()) else None, cache=cache,
                     **extra)

    try:
        return decode(step, input_ids, kpm, max_new_tokens, n_layers=model.decoder.n_layers,
                    do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
                    num_beams=num_beams, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
                    use_cache=use_cache, generator=generator, length_penalty=length_penalty,
                    early_stopping=early_stopping, vocab_size=model.config.vocab_size,
                    token_grades=token_grades, grade_last=grade_last,
                    bad_words_ids=bad_words_ids, forced_eos_token_id=forced_eos_token_id,
                    sequence_bias=sequence_bias, repetition_penalty=repetition_penalty,
                    no_repeat_ngram_size=no_repeat_ngram_size, min_new_tokens=min_new_tokens,
                    renormalize_logits=renormalize_logits)
    finally:
        model.train(was_training)


@torch.no_grad()
def generate_seq2seq(
    model: torch.nn.Module,
    src_ids: Tensor,
    max_new_tokens: int,
    *,
    bos_token_id: int,
    src_key_padding_mask: Tensor | None = None,
    token_grades: Tensor | None = None,
    token_grader: TokenGrader | None = None,
    **kwargs: object,
) -> Tensor:
    """Decode targets for ``src_ids`` starting from ``bos_token_id``; returns (B, 1 + n).
    ``kwargs`` are :func:`generate`'s options (sampling, beams, EOS and padding, the logits
    processors). A model that grades tokens needs
    ``token_grades`` (B, S) of the source, as ``Seq2SeqTransformer.forward`` takes them, and
    ``token_grader`` for the decoder's sequence from ``bos_token_id`` (its grades are
    ``decoder_token_grades``)."""
    check_prompt(src_ids, 0, None, name="src_ids")
    if not _is_token(bos_token_id, model.config.vocab_size):
        raise ValueError(f"bos_token_id must be a token id in [0, {model.config.vocab_size}), "
                         f"got {bos_token_id!r}")
    kwargs = _generation_kwargs(kwargs)
    check_decoding(vocab_size=model.config.vocab_size, **{  # before the encoder runs
        name: kwargs[name] for name in ("do_sample", "temperature", "top_k", "top_p",
                                        "num_beams", "length_penalty", "eos_token_id")})
    start = torch.full((src_ids.shape[0], 1), bos_token_id, dtype=torch.long,
                       device=src_ids.device)
    check_prompt(start, max_new_tokens, position_limit(model.config))
    token_grades, grade_last = token_grading(model, src_ids, token_grades, token_grader,
                                             grades_new_tokens=True)
    kwargs = {**kwargs, "use_cache": resolve_use_cache(model, kwargs.get("use_cache"))}
    was_training = model.training
    model.eval()
    try:
        memory = model.encode(src_ids, src_key_padding_mask,
                              **({} if token_grades is None else {"token_grades": token_grades}))
        src_mask = src_key_padding_mask
        if kwargs["num_beams"] > 1:  # beam search decodes B * num_beams rows, as B groups
            memory = memory.repeat_interleave(kwargs["num_beams"], dim=0)
            if src_mask is not None:
                src_mask = src_mask.repeat_interleave(kwargs["num_beams"], dim=0)

        def step(ids: Tensor, mask: Tensor, cache: KVCache | None,
                 grades: Tensor | None = None) -> Tensor:
            return model.decode(ids, memory, tgt_key_padding_mask=mask if cache is None else None,
                                src_key_padding_mask=src_mask, cache=cache, token_grades=grades)

        kpm = torch.zeros_like(start, dtype=torch.bool)
        start_grades = None if grade_last is None else grade_last(start, kpm)[:, None]
        return decode(step, start, kpm, max_new_tokens, n_layers=model.decoder.n_layers,
                    vocab_size=model.config.vocab_size, token_grades=start_grades,
                    grade_last=grade_last, **kwargs)
    finally:
        model.train(was_training)


def _generation_kwargs(kwargs: dict[str, object]) -> dict[str, object]:
    allowed = {
        "do_sample": False, "temperature": 1.0, "top_k": None, "top_p": None, "num_beams": 1,
        "eos_token_id": None, "pad_token_id": None, "use_cache": None, "generator": None,
        "length_penalty": 1.0, "early_stopping": True, **PROCESSOR_OPTIONS,
    }
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise TypeError(f"unknown generation option(s) {unknown}; allowed: {sorted(allowed)}")
    return {**allowed, **kwargs}
