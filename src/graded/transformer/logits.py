"""What a decoding step does to the model's next-token scores before it picks a token: the
temperature, top-k and top-p filters of sampling (:func:`filter_logits`, :func:`select_next`) and
Hugging Face's ``bad_words_ids`` and ``forced_eos_token_id`` (:func:`token_constraints`,
:func:`constrain`), shared by greedy, sampled and beam decoding
(:mod:`graded.transformer.generation`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["BadWords", "constrain", "filter_logits", "select_next", "token_constraints"]


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """Set logits outside the top-k, or outside the smallest set with probability >= top_p
    (nucleus sampling, Holtzman et al. 2020), to -inf. The most likely token always stays;
    a token tied with the last one kept stays too (which of equal logits to drop would be
    arbitrary), as top-k keeps ties; ``top_p=1`` keeps every token. The nucleus mass is summed
    in the logits' dtype promoted to at least float32."""
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k <= 0:
            raise ValueError(f"top_k must be a positive int or None, got {top_k!r}")
        k = min(top_k, logits.shape[-1])
        kth = torch.topk(logits, k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if top_p < 1.0:
            sorted_logits = torch.sort(logits, descending=True, dim=-1).values
            dtype = torch.promote_types(logits.dtype, torch.float32)
            mass = torch.softmax(sorted_logits.to(dtype), dim=-1).cumsum(dim=-1)
            # keep a token while the mass strictly before it is below top_p: a prefix of the
            # sorted tokens (at least one), then every token tied with its smallest logit
            kept = 1 + (mass[..., :-1] < top_p).sum(dim=-1, keepdim=True)
            smallest = sorted_logits.gather(-1, kept - 1)
            logits = logits.masked_fill(logits < smallest, float("-inf"))
    return logits


def select_next(
    logits: Tensor, *, do_sample: bool, temperature: float, top_k: int | None,
    top_p: float | None, generator: torch.Generator | None,
) -> Tensor:
    """Next token ids (B,) from last-position logits (B, V)."""
    if not do_sample:
        return logits.argmax(dim=-1)
    if temperature <= 0:
        raise ValueError(f"temperature must be positive when sampling, got {temperature}")
    logits = filter_logits(logits / temperature, top_k, top_p)
    probs = torch.softmax(logits.float(), dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@dataclass(frozen=True, eq=False)
class BadWords:
    """Hugging Face's ``bad_words_ids``, ready to apply (:func:`token_constraints`):
    ``always`` (a long tensor, None for none), the ids of single-token entries, banned at every
    step; ``sequences``, one (prefixes (G, n), last tokens (G,)) pair per prefix length n >= 1,
    the entries of n + 1 tokens, whose last token is banned where a row's history ends with its
    prefix. Hugging Face's ``SequenceBiasLogitsProcessor`` (of which
    ``NoBadWordsLogitsProcessor`` is the -inf case) groups them the same way."""

    always: Tensor | None
    sequences: tuple[tuple[Tensor, Tensor], ...] = ()


def token_constraints(
    bad_words_ids: Sequence[Sequence[int]] | None, forced_eos_token_id: int | None,
    eos_token_id: int | None, vocab_size: int, device: torch.device,
) -> tuple[BadWords | None, int | None]:
    """The banned words (None for none) and the forced EOS id of Hugging Face's
    ``bad_words_ids`` and ``forced_eos_token_id``, checked: each entry a non-empty list of
    token ids in [0, ``vocab_size``). As its ``NoBadWordsLogitsProcessor`` does, an entry
    ``[eos_token_id]`` is dropped (EOS is never banned on its own; a longer entry ending in it
    stays) and repeated entries count once. An entry ``[t1, ..., tn]`` bans ``tn`` at a step
    whose history (the prompt, its padding included, and the tokens generated so far) ends with
    ``t1, ..., t(n-1)``; a single-token entry bans its token at every step (:func:`constrain`)."""
    bad = None
    if bad_words_ids is not None:
        if isinstance(bad_words_ids, (str, bytes)) or not all(
                isinstance(w, (list, tuple)) for w in bad_words_ids):
            raise ValueError(f"bad_words_ids must be a list of token-id lists, e.g. [[pad_id]], "
                             f"got {bad_words_ids!r}")
        words = {}  # entry -> None: distinct entries, in their first order
        for word in bad_words_ids:
            if not word:
                raise ValueError(f"bad_words_ids entry {list(word)!r}: empty; expected one or "
                                 "more token ids")
            for token in word:
                if not _is_token(token, vocab_size):
                    raise ValueError(f"bad_words_ids entry {list(word)!r}: expected a token id "
                                     f"in [0, {vocab_size}), got {token!r}")
            words[tuple(int(t) for t in word)] = None
        words.pop((eos_token_id,), None)
        bad = _bad_words(list(words), device) if words else None
    if forced_eos_token_id is not None and not _is_token(forced_eos_token_id, vocab_size):
        raise ValueError(f"forced_eos_token_id must be a token id in [0, {vocab_size}), got "
                         f"{forced_eos_token_id!r}")
    return bad, forced_eos_token_id


def _bad_words(words: list[tuple[int, ...]], device: torch.device) -> BadWords:
    """Distinct, checked entries grouped as :class:`BadWords` holds them."""
    single = sorted({w[0] for w in words if len(w) == 1})
    by_prefix: dict[int, list[tuple[int, ...]]] = {}
    for word in words:
        if len(word) > 1:
            by_prefix.setdefault(len(word) - 1, []).append(word)
    sequences = tuple(
        (torch.tensor([w[:-1] for w in group], dtype=torch.long, device=device),
         torch.tensor([w[-1] for w in group], dtype=torch.long, device=device))
        for _, group in sorted(by_prefix.items()))
    always = torch.tensor(single, dtype=torch.long, device=device) if single else None
    return BadWords(always, sequences)


def _is_token(value: object, vocab_size: int) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)
            and 0 <= value < vocab_size)


def constrain(scores: Tensor, bad: BadWords | None, forced: int | None,
              history: Tensor | None = None) -> Tensor:
    """Scores (B, V) of one step under :func:`token_constraints`: the banned ids at -inf
    (Hugging Face's ``NoBadWordsLogitsProcessor``), or, at the last step (``forced`` given),
    -inf everywhere but 0 at the forced EOS id (``ForcedEOSTokenLogitsProcessor``, which runs
    after it and so overrides it). ``history`` (B, L) holds each row's tokens so far, the
    prompt with its padding first, as Hugging Face's ``input_ids``: an entry of n + 1 tokens
    bans its last where the last n tokens of a row equal its first n (never when L < n)."""
    if forced is not None:
        out = torch.full_like(scores, float("-inf"))
        out[:, forced] = 0.0
        return out
    if bad is None:
        return scores
    if bad.always is not None:
        scores = scores.index_fill(-1, bad.always, float("-inf"))
    if bad.sequences:
        if history is None:
            raise ValueError("bad_words_ids with entries of several tokens need the history "
                             "of each row (history=)")
        hits = torch.zeros(scores.shape, dtype=torch.long, device=scores.device)
        for prefixes, last in bad.sequences:
            n = prefixes.shape[1]
            if n > history.shape[1]:  # the prefix is longer than the history: no match
                continue
            match = (history[:, None, -n:] == prefixes).all(dim=-1)  # (B, G)
            hits.index_add_(1, last, match.long())  # an id may end several entries
        scores = scores.masked_fill(hits > 0, float("-inf"))
    return scores
