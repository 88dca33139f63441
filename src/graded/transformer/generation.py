"""Autoregressive generation: greedy, sampling (temperature, top-k, top-p), beam search.

Works for any model exposing a decoding step ``step(ids, key_padding_mask, cache) -> logits``;
:func:`generate` drives a :class:`~graded.transformer.models.TransformerLM` and
:func:`generate_seq2seq` a :class:`~graded.transformer.models.Seq2SeqTransformer`.
Prompts of different lengths are left-padded with ``pad_token_id`` and passed with a
``key_padding_mask``; positions skip the padding, so a padded prompt generates exactly what it
would alone, and ``max_len`` must hold the longest real prompt plus the new tokens. A model
whose attention pattern is placed by slot index (BigBird, block_sparse, sparse_fixed, LSH:
:func:`~graded.transformer.decoding_inputs.slot_placed_backends`) would see the padding move
a prompt across its blocks: it decodes the rows of each real length together, their padding
removed (:func:`_decode_by_padding`). With
``use_cache`` each step feeds only the newest token and reuses cached keys and values; without
it every step recomputes the whole sequence (the two agree). Hugging Face's ``sequence_bias``,
``repetition_penalty``, ``no_repeat_ngram_size``, ``bad_words_ids``, ``min_new_tokens`` and
``forced_eos_token_id`` are options (:func:`~graded.transformer.logits.logits_processing`); a
model that grades tokens
(000 §6.2) generates with the prompt's grades and a grader of the new tokens
(:func:`token_grading`).

This module holds what a user calls, :func:`generate` and :func:`generate_seq2seq`, which
build a model's decoding step; the loop they run is :func:`~graded.transformer.decoding.decode`
(:mod:`graded.transformer.decoding`), and the checks before it (the prompt, the options, the
KV cache) are :mod:`graded.transformer.decoding_inputs`, both importable from here too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from graded.transformer.cache import KVCache
from graded.transformer.decoding import PROCESSOR_OPTIONS, Step, decode, fill_id
from graded.transformer.decoding_grades import TokenGrader, token_grading
from graded.transformer.decoding_inputs import (
    cacheless_backends,
    check_decoding,
    check_prompt,
    position_limit,
    resolve_use_cache,
    slot_placed_backends,
)
from graded.transformer.logits import (
    NoTokenLeft,
    _is_token,
    eos_ids,
    filter_logits,
    no_token_left,
    select_next,
)

__all__ = ["PROCESSOR_OPTIONS", "cacheless_backends", "check_prompt", "decode", "filter_logits",
           "generate", "generate_seq2seq", "position_limit", "resolve_use_cache",
           "select_next"]


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
    ends, as in Hugging Face's ``generate``
    (:func:`~graded.transformer.decoding._beam_search`); its default here is True, Hugging
    Face's is False (pass ``early_stopping=False`` for the tokens of its defaults).
    ``use_cache``: None caches where every backend can (:func:`resolve_use_cache`), True
    requires it, False recomputes the prefix each step; the tokens are the same (up to
    rounding: a graded model in bfloat16 or float16 folds its gradings into the weights or
    scales the activations by the number of rows, :func:`graded.folding.graded_linear`, so two
    scores within a rounding step may order differently). Ids and counts may be NumPy
    integers, the EOS ids an integer tensor or array, the float options NumPy floats. Hugging
    Face's options of these names (:class:`~graded.transformer.logits.LogitsProcessing`):
    ``bad_words_ids`` (e.g.
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
    last of its row's (:func:`~graded.transformer.decoding_grades.grader_of`)."""
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

    options = dict(n_layers=model.decoder.n_layers, do_sample=do_sample,
                   temperature=temperature, top_k=top_k, top_p=top_p, num_beams=num_beams,
                   eos_token_id=eos_token_id, pad_token_id=pad_token_id, use_cache=use_cache,
                   generator=generator, length_penalty=length_penalty,
                   early_stopping=early_stopping, vocab_size=model.config.vocab_size,
                   grade_last=grade_last, bad_words_ids=bad_words_ids,
                   forced_eos_token_id=forced_eos_token_id, sequence_bias=sequence_bias,
                   repetition_penalty=repetition_penalty,
                   no_repeat_ngram_size=no_repeat_ngram_size, min_new_tokens=min_new_tokens,
                   renormalize_logits=renormalize_logits)
    # one read of the mask, for a model whose attention pattern is placed by slot index only
    by_padding = (max_new_tokens > 0 and input_ids.shape[0] > 0
                  and key_padding_mask is not None and bool(slot_placed_backends(model))
                  and bool(kpm.any()))
    try:
        if by_padding:
            return _decode_by_padding(step, input_ids, kpm, max_new_tokens, token_grades,
                                      options)
        return decode(step, input_ids, kpm, max_new_tokens, token_grades=token_grades,
                      **options)
    finally:
        model.train(was_training)


def _decode_by_padding(step: Step, input_ids: Tensor, key_padding_mask: Tensor,
                       max_new_tokens: int, token_grades: Tensor | None,
                       options: dict[str, object]) -> Tensor:
    """:func:`decode` of a padded prompt for a model whose attention pattern is placed by slot
    index (:func:`slot_placed_backends`): the rows with the same number of real tokens are
    decoded together with their padding removed, so each row generates what it generates
    alone, and put back in one (B, T + n) tensor, n the most new tokens of any group (a group
    that ended sooner is continued with the fill id, as a finished row is). Each group draws
    from ``generator`` in turn (groups by ascending real length), and a row's history for the
    logits processors is its real tokens. A row with no token left is refused as
    :func:`decode` refuses it, naming its row of the batch."""
    batch, length = input_ids.shape
    real = (~key_padding_mask).sum(dim=1)
    parts, stuck = [], []
    for n in real.unique().tolist():
        rows = (real == n).nonzero().flatten()
        keep = ~key_padding_mask[rows]
        ids = input_ids[rows][keep].view(len(rows), n)
        grades = None if token_grades is None else token_grades[rows][keep].view(len(rows), n)
        try:
            out = decode(step, ids, torch.zeros_like(keep[:, :n]), max_new_tokens,
                         token_grades=grades, **options)
        except NoTokenLeft as error:
            stuck.append((error.step, [int(rows[r]) for r in error.rows]))
            continue
        parts.append((rows, out[:, n:]))
    if stuck:  # the first step at which a row had no token left, as decode reports it
        first = min(at for at, _ in stuck)
        raise no_token_left(sorted(r for at, rs in stuck if at == first for r in rs), first)
    width = max(new.shape[1] for _, new in parts)
    fill = fill_id(options["pad_token_id"],
                   eos_ids(options["eos_token_id"], options["vocab_size"]))
    out = input_ids.new_full((batch, length + width), fill, dtype=torch.long)
    out[:, :length] = input_ids
    for rows, new in parts:
        out[rows, length : length + new.shape[1]] = new
    return out


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
