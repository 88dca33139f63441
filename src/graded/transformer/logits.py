"""What a decoding step does to the model's next-token scores before it picks a token: the
temperature, top-k and top-p filters of sampling (:func:`filter_logits`, :func:`select_next`) and
Hugging Face's ``bad_words_ids`` and ``forced_eos_token_id`` (:func:`token_constraints`,
:func:`constrain`), shared by greedy, sampled and beam decoding
(:mod:`graded.transformer.generation`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["constrain", "filter_logits", "select_next", "token_constraints"]


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


def token_constraints(
    bad_words_ids: Sequence[Sequence[int]] | None, forced_eos_token_id: int | None,
    eos_token_id: int | None, vocab_size: int, device: torch.device,
) -> tuple[Tensor | None, int | None]:
    """The banned token ids (a long tensor, None for none) and the forced EOS id of Hugging
    Face's ``bad_words_ids`` and ``forced_eos_token_id``, checked. As its
    ``NoBadWordsLogitsProcessor`` does, an entry ``[eos_token_id]`` is dropped (EOS is never
    banned); entries of several tokens (a banned continuation) are refused here."""
    banned = None
    if bad_words_ids is not None:
        if isinstance(bad_words_ids, (str, bytes)) or not all(
                isinstance(w, (list, tuple)) for w in bad_words_ids):
            raise ValueError(f"bad_words_ids must be a list of token-id lists, e.g. [[pad_id]], "
                             f"got {bad_words_ids!r}")
        for word in bad_words_ids:
            if len(word) != 1:
                raise ValueError(f"bad_words_ids entry {list(word)!r}: only single-token entries "
                                 "are supported (each bans one token id at every step); "
                                 "expected [token_id]")
            if not _is_token(word[0], vocab_size):
                raise ValueError(f"bad_words_ids entry {list(word)!r}: expected a token id in "
                                 f"[0, {vocab_size})")
        ids = sorted({int(w[0]) for w in bad_words_ids} - {eos_token_id})
        banned = torch.tensor(ids, dtype=torch.long, device=device) if ids else None
    if forced_eos_token_id is not None and not _is_token(forced_eos_token_id, vocab_size):
        raise ValueError(f"forced_eos_token_id must be a token id in [0, {vocab_size}), got "
                         f"{forced_eos_token_id!r}")
    return banned, forced_eos_token_id


def _is_token(value: object, vocab_size: int) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)
            and 0 <= value < vocab_size)


def constrain(scores: Tensor, banned: Tensor | None, forced: int | None) -> Tensor:
    """Scores (B, V) of one step under :func:`token_constraints`: the banned ids at -inf
    (Hugging Face's ``NoBadWordsLogitsProcessor`` for single tokens), or, at the last step
    (``forced`` given), -inf everywhere but 0 at the forced EOS id
    (``ForcedEOSTokenLogitsProcessor``, which runs after it and so overrides it)."""
    if forced is not None:
        out = torch.full_like(scores, float("-inf"))
        out[:, forced] = 0.0
        return out
    if banned is not None:
        scores = scores.index_fill(-1, banned, float("-inf"))
    return scores
