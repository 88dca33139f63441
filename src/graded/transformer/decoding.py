"""The decoding loop of generation: greedy, sampled (temperature, top-k, top-p) and beam
search, over a model's decoding step.

:func:`decode` drives any ``step(ids, key_padding_mask, cache) -> logits`` (a
:data:`Step`): each step feeds the whole sequence, or with a KV cache only the newest token;
the logits processors of :data:`PROCESSOR_OPTIONS`
(:class:`~graded.transformer.logits.LogitsProcessing`) act on the scores; beam search is
:func:`_beam_search`. :mod:`graded.transformer.generation` builds the step of a model and
checks its prompt.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from graded.checks import checked_inputs
from graded.transformer.cache import KVCache
from graded.transformer.decoding_grades import GradeLast
from graded.transformer.decoding_inputs import check_decoding
from graded.transformer.logits import (
    LogitsProcessing,
    _is_token,
    _select_next,
    eos_ids,
    logits_processing,
    no_token_left,
)

__all__ = ["EARLY_STOPPING", "PROCESSOR_OPTIONS", "Step", "decode", "fill_id"]

#: The options of Hugging Face's logits processors that generation takes, with their defaults
#: (:func:`~graded.transformer.logits.logits_processing`).
PROCESSOR_OPTIONS: dict[str, object] = {
    "sequence_bias": None, "repetition_penalty": None, "no_repeat_ngram_size": 0,
    "bad_words_ids": None, "min_new_tokens": 0, "forced_eos_token_id": None,
    "renormalize_logits": False,
}

Step = Callable[..., Tensor]  # (ids, key_padding_mask, cache[, token_grades]) -> logits


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
    each new token (:func:`~graded.transformer.decoding_grades.grader_of`), and the step is
    called with the grades of the tokens it is given as a fourth argument. The steps after the
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
    # a bool itself: 1 or 1.0 equal True, but beam search would read them as False
    if not (isinstance(early_stopping, bool) or (isinstance(early_stopping, str)
                                                 and early_stopping in EARLY_STOPPING)):
        raise ValueError(f"early_stopping must be one of {EARLY_STOPPING}, got "
                         f"{early_stopping!r}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got "
                        f"{type(generator).__name__} {generator!r}")
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
    pad = fill_id(pad_token_id, eos)
    if pad_token_id is not None and (isinstance(pad, bool)
                                     or not isinstance(pad, numbers.Integral)):
        raise ValueError(f"pad_token_id must be an int token id or None, got {pad!r}")
    if (eos or num_beams > 1) and not _is_token(pad, vocab_size):  # the EOS ids are checked
        used = ("finished rows are continued with it" if eos else
                "beam search continues the beams it cannot fill with it")
        raise ValueError(f"pad_token_id must be a token id in [0, {vocab_size}): {used}; got "
                         f"{pad!r}")
    pad = int(pad)  # a NumPy integer too
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


def fill_id(pad_token_id: int | None, eos: tuple[int, ...]) -> int:
    """The id that continues finished rows: ``pad_token_id``, else the first EOS id, else 0."""
    return pad_token_id if pad_token_id is not None else (eos[0] if eos else 0)


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
    ``eos``. Each step reads the ``max(2, 1 + len(eos)) * num_beams`` best candidates of a row,
    as Hugging Face's ``beams_to_keep``: with several EOS ids more than ``num_beams`` of them
    may be EOS, and the running beams are the best of the others."""
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
    # candidates read per step: as Hugging Face's beams_to_keep, room for k running beams
    # after every EOS candidate (with n EOS ids up to n * k of the best are EOS)
    kept = max(2, 1 + len(eos)) * k
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
        top_scores, top_idx = cand.topk(min(kept, k * vocab), dim=-1)
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
