"""What a decoding step does to the model's next-token scores before it picks a token: the
logits processors of Hugging Face's ``generate`` that ours offers (:class:`LogitsProcessing`:
``sequence_bias``, ``repetition_penalty``, ``no_repeat_ngram_size``, ``bad_words_ids``,
``min_new_tokens``, ``forced_eos_token_id``), then sampling's temperature, top-k and top-p
(:func:`filter_logits`, :func:`select_next`), shared by greedy, sampled and beam decoding
(:mod:`graded.transformer.generation`)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

__all__ = ["LogitsProcessing", "NoTokenLeft", "TokenSequences", "check_sampling",
           "filter_logits", "logits_processing", "no_token_left", "select_next"]


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """Set logits outside the top-k, or outside the smallest set with probability >= top_p
    (nucleus sampling, Holtzman et al. 2020), to -inf. The most likely token always stays;
    a token tied with the last one kept stays too (which of equal logits to drop would be
    arbitrary), as top-k keeps ties; ``top_p=1`` keeps every token. The nucleus mass is summed
    in the logits' dtype promoted to at least float32."""
    check_sampling(top_k=top_k, top_p=top_p)
    if top_k is not None:
        k = min(top_k, logits.shape[-1])
        kth = torch.topk(logits, k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits = torch.sort(logits, descending=True, dim=-1).values
        dtype = torch.promote_types(logits.dtype, torch.float32)
        mass = torch.softmax(sorted_logits.to(dtype), dim=-1).cumsum(dim=-1)
        # keep a token while the mass strictly before it is below top_p: a prefix of the
        # sorted tokens (at least one), then every token tied with its smallest logit
        kept = 1 + (mass[..., :-1] < top_p).sum(dim=-1, keepdim=True)
        smallest = sorted_logits.gather(-1, kept - 1)
        logits = logits.masked_fill(logits < smallest, float("-inf"))
    return logits


def check_sampling(temperature: float = 1.0, top_k: int | None = None,
                   top_p: float | None = None) -> None:
    """Sampling's options, each refused naming its value: ``temperature`` a finite number
    > 0 (0 is no distribution: greedy decoding is ``do_sample=False``; at infinity every
    score becomes 0 and a score at -inf, NaN), ``top_k`` a positive int or None, ``top_p`` a
    number in (0, 1] or None. Generation checks them whether or not it samples: greedy and
    beam decoding ignore them, as Hugging Face's do, but not a value no sampling could use."""
    if not _is_number(temperature) or not 0 < temperature < math.inf:  # NaN too
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral)
                              or top_k <= 0):
        raise ValueError(f"top_k must be a positive int or None, got {top_k!r}")
    if top_p is not None and (not _is_number(top_p) or not 0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")


def select_next(
    logits: Tensor, *, do_sample: bool, temperature: float, top_k: int | None,
    top_p: float | None, generator: torch.Generator | None,
) -> Tensor:
    """Next token ids (B,) from last-position logits (B, V): the argmax without sampling, else
    a draw after the temperature and the top-k / top-p filters (:func:`filter_logits`). A row
    whose scores are all -inf has no token left (every one is banned) and is refused, naming
    the row(s), as generation refuses it (:func:`no_token_left`): argmax would return a
    banned token, sampling a draw from no distribution."""
    empty = torch.isneginf(logits).all(dim=-1)
    if bool(empty.any()):
        raise no_token_left(empty.nonzero().flatten().tolist())
    return _select_next(logits, do_sample=do_sample, temperature=temperature, top_k=top_k,
                        top_p=top_p, generator=generator)


def _select_next(
    logits: Tensor, *, do_sample: bool, temperature: float, top_k: int | None,
    top_p: float | None, generator: torch.Generator | None,
) -> Tensor:
    """:func:`select_next` for logits with a score above -inf in every row (the caller has
    refused the others): no read of the logits to check them, none per decoding step."""
    if not do_sample:
        return logits.argmax(dim=-1)
    check_sampling(temperature)
    # the row's largest score first brought to 0, and the quotients taken in float64 (the
    # temperature as a float32 scalar was 0 below 1e-45, inf above 3e38): they are then <= 0,
    # so a tiny temperature sends the other scores to -inf (a draw of the largest) instead of
    # its own to inf (softmax's NaN: the draw failed); the same distribution, as softmax,
    # top-k and top-p do not see a shift
    shifted = (logits - logits.amax(dim=-1, keepdim=True)).double() / temperature
    logits = filter_logits(shifted.to(logits.dtype), top_k, top_p)
    probs = torch.softmax(logits.float(), dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class NoTokenLeft(ValueError):
    """The error of :func:`no_token_left`, holding its ``rows`` and ``step`` (None: not in a
    generation) so that a caller decoding part of a batch can name the batch's rows."""

    def __init__(self, rows: list[int], step: int | None = None) -> None:
        at = "" if step is None else f" at new token {step + 1}"
        super().__init__(
            f"no token is left to generate{at} in row(s) {_first_rows(rows)}: every score is "
            "-inf there (the logits processors, e.g. bad_words_ids, no_repeat_ngram_size, "
            "sequence_bias or min_new_tokens, or the model's scores ban every token)")
        self.rows, self.step = rows, step


def no_token_left(rows: list[int], step: int | None = None) -> NoTokenLeft:
    """The error for the rows (batch indices) whose scores are all -inf, at new token
    ``step + 1`` of a generation when ``step`` is given: no token is left to choose."""
    return NoTokenLeft(rows, step)


def _first_rows(rows: list[int]) -> str:
    """``rows`` as a list, the first 8 of a longer one with the count of the rest."""
    return str(rows) if len(rows) <= 8 else f"{rows[:8]} and {len(rows) - 8} more"


@dataclass(frozen=True, eq=False)
class TokenSequences:
    """Token sequences with an additive bias each, grouped for matching as Hugging Face's
    ``SequenceBiasLogitsProcessor`` groups them (its ``NoBadWordsLogitsProcessor`` is the case of
    biases -inf): ``single`` (V,), the bias of each id that is an entry on its own (0 for the
    others), added at every step; ``groups``, one (prefixes (G, n), last tokens (G,), biases (G,))
    triple per prefix length n >= 1, an entry of n + 1 tokens adding its bias to its last
    token's score where a row's history ends with its first n (never when the history is
    shorter). Biases are held in float32, as Hugging Face holds them."""

    single: Tensor | None
    groups: tuple[tuple[Tensor, Tensor, Tensor], ...] = ()

    @classmethod
    def of(cls, entries: Mapping[tuple[int, ...], float], vocab_size: int,
           device: torch.device) -> TokenSequences:
        """Checked, distinct entries (token ids -> bias) grouped by length."""
        single = None
        by_prefix: dict[int, list[tuple[tuple[int, ...], float]]] = {}
        for word, bias in entries.items():
            if len(word) == 1:
                if single is None:
                    single = torch.zeros(vocab_size, device=device)
                single[word[0]] = bias
            else:
                by_prefix.setdefault(len(word) - 1, []).append((word, bias))
        groups = tuple(
            (torch.tensor([w[:-1] for w, _ in group], dtype=torch.long, device=device),
             torch.tensor([w[-1] for w, _ in group], dtype=torch.long, device=device),
             torch.tensor([b for _, b in group], device=device))
            for _, group in sorted(by_prefix.items()))
        return cls(single, groups)

    def bias(self, scores: Tensor, history: Tensor) -> Tensor:
        """The (B, V) bias of one step, in the scores' dtype: the single entries' biases plus,
        per id, the biases of the entries ending in it whose prefix ends the row's ``history``
        (B, L)."""
        bias = torch.zeros_like(scores)
        if self.single is not None:
            bias += self.single
        for prefixes, last, values in self.groups:
            n = prefixes.shape[1]
            if n > history.shape[1]:
                continue
            match = (history[:, None, -n:] == prefixes).all(dim=-1)  # (B, G)
            bias.index_add_(1, last, torch.where(match, values, 0.0).to(bias.dtype))
        return bias


@dataclass(frozen=True, eq=False)
class LogitsProcessing:
    """The logits processors of Hugging Face's ``generate`` that ours offers, checked
    (:func:`logits_processing`) and applied in its order, each as its processor of that name
    computes it: ``bias`` (``sequence_bias``) adds each entry's bias; ``repetition_penalty``
    divides a positive score (multiplies a negative one) of every id the row holds after its
    left padding, once per id (Keskar et al. 2019; Hugging Face skips the padding the attention
    mask marks); ``no_repeat_ngram_size`` n puts at -inf each id that would repeat an n-gram of
    the row's ids, padding included; ``banned`` (``bad_words_ids``) puts its entries at -inf;
    ``min_new_tokens`` puts every EOS id at -inf until that many tokens are new; at the last
    step ``forced_eos_token_id`` leaves only its ids, at 0. They act on the logits before sampling's
    temperature and filters, and on the log-probabilities in beam search. ``renormalize``
    (Hugging Face's ``renormalize_logits``, its ``LogitNormalization`` after every processor)
    takes the log-softmax of the processed scores: in beam search the tokens a processor left
    then share the whole probability, which changes how beams compare; greedy decoding and
    sampling pick as without it (a log-softmax shifts a row by a constant)."""

    bias: TokenSequences | None = None
    repetition_penalty: float | None = None
    no_repeat_ngram_size: int = 0
    banned: TokenSequences | None = None
    min_new_tokens: int = 0
    eos_token_ids: tuple[int, ...] = ()
    forced_eos_token_ids: tuple[int, ...] = ()
    renormalize: bool = False

    def __call__(self, scores: Tensor, history: Tensor, *, new_tokens: int, last: bool,
                 start: Tensor | None = None) -> Tensor:
        """Scores (B, V) of one step. ``history`` (B, L): each row's ids so far, the prompt
        with its padding first, as Hugging Face's ``input_ids``; ``new_tokens``: how many
        tokens have been generated; ``last``: whether this step is the last;
        ``start`` (B,): the position of each row's first real token (0 for none), which the
        repetition penalty starts from."""
        if last and self.forced_eos_token_ids:
            out = torch.full_like(scores, float("-inf"))
            out[:, list(self.forced_eos_token_ids)] = 0.0
            return self._normalised(out)
        if self.bias is not None:
            scores = scores + self.bias.bias(scores, history)
        if self.repetition_penalty is not None:
            scores = _penalise_repeats(scores, history, self.repetition_penalty, start)
        if self.no_repeat_ngram_size:
            scores = _ban_repeated_ngrams(scores, history, self.no_repeat_ngram_size)
        if self.banned is not None:
            scores = scores + self.banned.bias(scores, history)
        if new_tokens < self.min_new_tokens:
            scores = scores.index_fill(-1, torch.tensor(self.eos_token_ids,
                                                        device=scores.device), float("-inf"))
        return self._normalised(scores)

    def _normalised(self, scores: Tensor) -> Tensor:
        """The log-softmax of ``scores`` with ``renormalize`` (a row with no token left stays
        at -inf, not NaN); ``scores`` without."""
        if not self.renormalize:
            return scores
        out = torch.log_softmax(scores, dim=-1)
        return out.masked_fill(torch.isneginf(scores).all(dim=-1, keepdim=True), float("-inf"))


def _penalise_repeats(scores: Tensor, history: Tensor, penalty: float,
                      start: Tensor | None) -> Tensor:
    vocab = scores.shape[-1]
    ids = history
    if start is not None:  # the skipped positions point at an extra column, dropped below
        before = torch.arange(history.shape[1], device=history.device) < start[:, None]
        ids = history.masked_fill(before, vocab)
    seen = torch.zeros(scores.shape[0], vocab + 1, dtype=torch.bool, device=scores.device)
    seen = seen.scatter_(1, ids, True)[:, :vocab]
    penalised = torch.where(scores < 0, scores * penalty, scores / penalty)
    return torch.where(seen, penalised, scores)


def _ban_repeated_ngrams(scores: Tensor, history: Tensor, n: int) -> Tensor:
    length = history.shape[1]
    if length < n:
        return scores
    vocab = scores.shape[-1]
    windows = history.unfold(1, n, 1)  # (B, L - n + 1, n): every n-gram of the row
    tail = history[:, length - n + 1:]  # the n - 1 ids a next token would extend
    match = (windows[..., :-1] == tail[:, None]).all(dim=-1)
    banned = torch.zeros(scores.shape[0], vocab + 1, dtype=torch.bool, device=scores.device)
    banned.scatter_(1, torch.where(match, windows[..., -1], vocab), True)
    return scores.masked_fill(banned[:, :vocab], float("-inf"))


def logits_processing(
    *, vocab_size: int, device: torch.device, eos_token_id: int | Sequence[int] | None = None,
    sequence_bias: Mapping[tuple[int, ...], float] | Sequence[Sequence[object]] | None = None,
    repetition_penalty: float | None = None, no_repeat_ngram_size: int = 0,
    bad_words_ids: Sequence[Sequence[int]] | None = None, min_new_tokens: int = 0,
    forced_eos_token_id: int | Sequence[int] | None = None, renormalize_logits: bool = False,
) -> LogitsProcessing | None:
    """Hugging Face's options of these names, checked, as a :class:`LogitsProcessing` (None
    when none is set). ``sequence_bias``: ``{(t1, ..., tn): bias}`` or ``[[[t1, ..., tn],
    bias], ...]``; ``bad_words_ids``: ``[[t1, ..., tn], ...]``; each entry a non-empty list of
    token ids in [0, ``vocab_size``), each sequence given once. As Hugging Face's
    ``NoBadWordsLogitsProcessor`` does, an entry ``[e]`` of ``bad_words_ids`` naming an EOS id
    ``e`` is dropped (EOS is never banned on its own; a longer entry ending in it stays) and
    repeated entries count once. ``repetition_penalty`` > 0 (1 changes nothing);
    ``no_repeat_ngram_size`` and ``min_new_tokens`` >= 0 (0 is off); ``min_new_tokens`` needs
    ``eos_token_id``. ``eos_token_id`` and ``forced_eos_token_id`` are one id or a list of
    ids, as Hugging Face's (:func:`eos_ids`); ``renormalize_logits`` a bool (the log-softmax
    after the processors, :class:`LogitsProcessing`)."""
    if not isinstance(renormalize_logits, bool):
        raise ValueError(f"renormalize_logits must be True or False, got {renormalize_logits!r}")
    eos = eos_ids(eos_token_id, vocab_size)
    forced = eos_ids(forced_eos_token_id, vocab_size, name="forced_eos_token_id")
    bias = None
    if sequence_bias is not None:
        bias = TokenSequences.of(_biases(sequence_bias, vocab_size), vocab_size, device)
    banned = None
    if bad_words_ids is not None:
        if isinstance(bad_words_ids, (str, bytes)) or not all(
                isinstance(w, (list, tuple)) for w in bad_words_ids):
            raise ValueError(f"bad_words_ids must be a list of token-id lists, e.g. [[pad_id]], "
                             f"got {bad_words_ids!r}")
        words = {_entry(w, "bad_words_ids", vocab_size): float("-inf") for w in bad_words_ids}
        for e in eos:
            words.pop((e,), None)
        banned = TokenSequences.of(words, vocab_size, device) if words else None
    if repetition_penalty is not None:
        if not _is_number(repetition_penalty) or not 0 < repetition_penalty < math.inf:
            raise ValueError(f"repetition_penalty must be a positive number (1 for none), got "
                             f"{repetition_penalty!r}")
        if repetition_penalty == 1:
            repetition_penalty = None
    for name, value in (("no_repeat_ngram_size", no_repeat_ngram_size),
                        ("min_new_tokens", min_new_tokens)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
            raise ValueError(f"{name} must be an int >= 0 (0 for none), got {value!r}")
    no_repeat_ngram_size, min_new_tokens = int(no_repeat_ngram_size), int(min_new_tokens)
    if min_new_tokens and not eos:
        raise ValueError(f"min_new_tokens={min_new_tokens} needs eos_token_id: it keeps the EOS "
                         "from being chosen before that many new tokens")
    if (all(x is None for x in (bias, banned, repetition_penalty))
            and not (no_repeat_ngram_size or min_new_tokens or forced or renormalize_logits)):
        return None
    return LogitsProcessing(bias, repetition_penalty, no_repeat_ngram_size, banned,
                            min_new_tokens, eos, forced, renormalize_logits)


def _biases(sequence_bias: object, vocab_size: int) -> dict[tuple[int, ...], float]:
    """``sequence_bias`` in either of Hugging Face's forms, checked, as {entry: bias}."""
    if isinstance(sequence_bias, Mapping):
        pairs = list(sequence_bias.items())
    elif isinstance(sequence_bias, (list, tuple)) and all(
            isinstance(p, (list, tuple)) and len(p) == 2 for p in sequence_bias):
        pairs = [(p[0], p[1]) for p in sequence_bias]
    else:
        raise ValueError(f"sequence_bias must be {{(token ids): bias}} or [[[token ids], bias], "
                         f"...], e.g. {{(5,): -2.0, (3, 7): 1.5}}; got {sequence_bias!r}")
    out: dict[tuple[int, ...], float] = {}
    for word, bias in pairs:
        if not isinstance(word, (list, tuple)):
            raise ValueError(f"sequence_bias entry {word!r}: expected a list or tuple of token "
                             "ids")
        key = _entry(word, "sequence_bias", vocab_size)
        if not _is_number(bias) or math.isnan(bias) or bias == math.inf:
            raise ValueError(f"sequence_bias entry {list(word)!r}: expected a finite bias or "
                             f"-inf, got {bias!r}")
        if key in out:
            raise ValueError(f"sequence_bias gives entry {list(word)!r} twice")
        out[key] = float(bias)
    return out


def _entry(word: Sequence[object], name: str, vocab_size: int) -> tuple[int, ...]:
    if not word:
        raise ValueError(f"{name} entry {list(word)!r}: empty; expected one or more token ids")
    for token in word:
        if not _is_token(token, vocab_size):
            raise ValueError(f"{name} entry {list(word)!r}: expected a token id in "
                             f"[0, {vocab_size}), got {token!r}")
    return tuple(int(t) for t in word)


def _is_token(value: object, vocab_size: int) -> bool:
    """An int id in [0, ``vocab_size``): a Python int or a NumPy integer (as ``max_new_tokens``
    and ``num_beams`` take them), never a bool."""
    return (isinstance(value, numbers.Integral) and not isinstance(value, bool)
            and 0 <= value < vocab_size)


def eos_ids(eos_token_id: object, vocab_size: int, *, name: str = "eos_token_id"
            ) -> tuple[int, ...]:
    """The ids that end a row, as a tuple (empty for None): ``eos_token_id`` is one token id
    or, as Hugging Face's ``generate`` takes it, a non-empty list of them, each in
    [0, ``vocab_size``) (any other could never be emitted), also as a 0-d or 1-d integer tensor
    or NumPy array; refused naming ``name``."""
    if eos_token_id is None:
        return ()
    given = eos_token_id
    if isinstance(given, (torch.Tensor, np.ndarray)) and given.ndim <= 1:
        given = given.tolist()  # an int tensor or array, as Hugging Face's generate takes them
    ids = tuple(given) if isinstance(given, (list, tuple)) else (given,)
    if not ids or not all(_is_token(i, vocab_size) for i in ids):
        raise ValueError(f"{name} must be a token id in [0, {vocab_size}) or a non-empty list "
                         f"of them, got {eos_token_id!r}: the model could never emit it to end "
                         "a row")
    return tuple(int(i) for i in ids)


def _is_number(value: object) -> bool:
    """A real number: a Python int or float, or a NumPy scalar (``np.float32(0.7)``, as a
    sweep over ``np.linspace(..., dtype=np.float32)`` gives), never a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
