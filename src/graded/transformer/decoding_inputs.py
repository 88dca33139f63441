"""What generation checks before it decodes: the prompt, the decoding options, the room
the positions leave, whether the model's attention can decode with a KV cache, and whether it
reads a left-padded prompt as it reads the prompt alone.

:func:`check_prompt` (a prompt and the room for its new tokens within :func:`position_limit`),
:func:`check_decoding` (the options of :func:`~graded.transformer.decoding.decode`),
:func:`resolve_use_cache` (``use_cache`` as generation runs it, from
:func:`cacheless_backends`) and :func:`slot_placed_backends`, used by
:mod:`graded.transformer.generation` and the morphic models' generation.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
from torch import Tensor

from graded.positional import TABLE_POSITIONAL
from graded.transformer.logits import _is_number, check_sampling, eos_ids

__all__ = ["cacheless_backends", "check_cache_support",
           "check_decoding", "check_prompt", "position_limit", "resolve_use_cache",
           "slot_placed_backends"]


def check_prompt(input_ids: Tensor, max_new_tokens: int, max_len: int | None, *,
                 key_padding_mask: Tensor | None = None, name: str = "input_ids") -> None:
    """A (batch, length) integer prompt, max_new_tokens >= 0, and room for them in ``max_len``
    (None: no limit). Positions skip left padding (:func:`graded.transformer.entry.
    default_positions`, as Hugging Face's ``generate`` counts them from ``attention_mask``), so
    the room needed is the longest row's real tokens plus ``max_new_tokens``: the padding of a
    left-padded batch takes no position. ``key_padding_mask`` (True = padding, checked by the
    caller) gives the real tokens; without it every token is real. A prompt holds at least one
    token (the next one is read at the last position). ``name`` names ``input_ids`` in the
    errors."""
    if not isinstance(input_ids, Tensor):  # a list of lists, as a tokenizer may return
        raise TypeError(f"{name} must be an integer torch.Tensor of shape (batch, length), got "
                        f"a {type(input_ids).__name__} (e.g. torch.tensor(ids))")
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
    """The decoding options of :func:`~graded.transformer.decoding.decode`, each refused
    naming its value: ``do_sample`` a bool (a string such as ``"no"`` would be true), the
    sampling options (:func:`~graded.transformer.logits.check_sampling`, checked whether or
    not the decoding samples, but for temperature 0 without sampling: a common spelling of
    greedy decoding), ``num_beams`` an int >= 1 (wider than the vocabulary is allowed: the
    beams fill as the candidates multiply), ``length_penalty`` a finite number,
    ``eos_token_id`` a token id the model can produce (any other would never end a row) or a
    non-empty list of them (:func:`~graded.transformer.logits.eos_ids`)."""
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


def position_limit(config: object) -> int | None:
    """The longest sequence a model can see: ``max_len`` for positions from a table
    (sinusoidal, learned), None for RoPE/ALiBi/none. ``config`` is a model config, or any object
    with ``positional`` and ``max_len`` (a morphic model)."""
    if getattr(config, "positional", None) in TABLE_POSITIONAL:
        return config.max_len
    return None


def _self_attention_backends(model: torch.nn.Module) -> list[tuple[str, object]]:
    """(module name, MultiheadAttention) of every self-attention module of ``model.decoder``
    that runs a backend (cross-attention left out: its keys are the whole memory)."""
    from graded.attention.multihead import MultiheadAttention

    found = []
    for name, sub in model.decoder.named_modules():
        module = getattr(sub, "attn", None)  # an AttentionSublayer's MultiheadAttention
        if (isinstance(module, MultiheadAttention) and module.backend is not None
                and not getattr(sub, "cross", False)):
            found.append((name, module))
    return found


def cacheless_backends(model: torch.nn.Module) -> list[tuple[str, str]]:
    """(module name, backend name) of every self-attention module of ``model.decoder`` whose
    backend cannot decode incrementally (its capabilities lack ``incremental``): one query
    against the cached keys would not reproduce its pattern. Cross-attention is not listed (its
    keys are the whole memory at every step, as in the uncached pass)."""
    from graded.attention.backends import capabilities_of

    return [(name, module.backend_name) for name, module in _self_attention_backends(model)
            if not capabilities_of(module.backend).incremental]


def slot_placed_backends(model: torch.nn.Module) -> list[tuple[str, str]]:
    """(module name, backend name) of every self-attention module of ``model.decoder`` whose
    backend is not ``shift_invariant`` (:class:`~graded.attention.backends.Capabilities`; a
    backend registered without declaring it included): its pattern is placed by slot index, so
    a left-padded prompt would not attend as it does alone, and generation decodes the rows of
    each padding length by themselves, their padding removed."""
    from graded.attention.backends import capabilities_of

    return [(name, module.backend_name) for name, module in _self_attention_backends(model)
            if not capabilities_of(module.backend).shift_invariant]


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
