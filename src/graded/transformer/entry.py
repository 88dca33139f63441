"""The entry checks of the transformer models, before any layer runs.

What :class:`~graded.transformer.stacks.TransformerEncoder` and
:class:`~graded.transformer.stacks.TransformerDecoder` check of a call, from shapes where they
can and reading values once where they must: the inputs' shape (:func:`sequence_shape`), the
padding masks (:func:`check_padding_mask`), the encoder memory (:func:`check_memory_shape`),
the token ids and the positions of the pass (:func:`checked_entry`, which returns them,
:func:`default_positions` when none are given); then the layers run inside
:func:`trusted_inputs`, where they read no values again.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor

from graded.checks import check_token_ids, checked_inputs
from graded.positional import TABLE_POSITIONAL, check_position_range, check_positions
from graded.transformer.cache import KVCache
from graded.transformer.config import TransformerConfig

__all__ = [
    "check_memory_shape",
    "check_padding_mask",
    "checked_entry",
    "default_positions",
    "sequence_shape",
    "trusted_inputs",
]


def default_positions(
    length: int, key_padding_mask: Tensor | None, cache: KVCache | None, batch: int,
    device: torch.device,
) -> Tensor:
    """Absolute positions (B, T) of new tokens: consecutive after the cached ones, skipping
    left padding (a padded row's first real token is at position 0). After the cached tokens
    means after their real ones: a step without a mask that follows a padded one continues
    each row from its own count."""
    if key_padding_mask is None:
        if cache is not None and cache.real is not None:
            return (cache.real + torch.arange(length, device=device)).expand(batch, length)
        start = cache.length if cache is not None else 0
        return torch.arange(start, start + length, device=device).expand(batch, length)
    real = (~key_padding_mask).long()
    pos = real.cumsum(dim=1) - 1
    if cache is not None and cache.real is not None:
        pos = pos + cache.real
    return pos.clamp(min=0)


def checked_entry(
    config: TransformerConfig, inputs: Tensor, positions: Tensor | None,
    key_padding_mask: Tensor | None, cache: KVCache | None, who: str,
) -> Tensor:
    """A model's entry check: the token ids against the vocabulary, and the positions of the
    pass (``positions``, or :func:`default_positions`), which it returns, against
    ``config.max_len`` where the model adds positions from a table of that many rows (against
    0 otherwise); given positions are (B, T), or (1, T) or (T,) for every row. Consecutive
    default positions are checked from the shapes; ids and other positions are read once each
    (one host–device synchronisation on a GPU; none inside
    :func:`graded.checks.checked_inputs`). The model then runs its layers inside
    :func:`trusted_inputs`, where they read no values again."""
    batch, length = inputs.shape[:2]
    if config.vocab_size is not None and inputs.dtype in (torch.int64, torch.int32):
        check_token_ids(inputs, config.vocab_size)  # other dtypes: the embedding's error
    max_len = config.max_len if config.positional in TABLE_POSITIONAL else None
    if positions is None and key_padding_mask is None:
        start = cache.length if cache is not None else 0
        if length:  # start .. start + length - 1, known from the shapes
            high = start + length - 1
            if max_len is not None and high >= max_len and cache is not None \
                    and cache.real is not None:
                # each row goes on from its own real tokens (default_positions), fewer than
                # the cache's width where it holds padding: read their count only here
                high = int(cache.real.max()) + length - 1
            check_position_range(start, high, max_len, who)
        return default_positions(length, None, cache, batch, inputs.device)
    if positions is None:
        positions = default_positions(length, key_padding_mask, cache, batch, inputs.device)
    elif positions.shape not in ((batch, length), (1, length), (length,)):
        raise ValueError(f"{who}: positions have shape {tuple(positions.shape)}; expected "
                         f"(batch, length) = ({batch}, {length}), (1, {length}) or ({length},)")
    check_positions(positions, max_len, who)
    return positions


def sequence_shape(config: TransformerConfig, inputs: Tensor) -> tuple[int, int]:
    """(batch, length) of a model's inputs: integer token ids (B, T), or for a feature model
    (``vocab_size=None``) floating features (B, T, input_dim), checked from the dtype and
    shape alone (no value is read) and refused naming what was expected."""
    if config.vocab_size is not None:
        if inputs.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"token ids must be an integer tensor of dtype torch.int64 or "
                            f"torch.int32 (what the embedding takes), got {inputs.dtype}")
        if inputs.dim() != 2:
            raise ValueError(f"token ids must have shape (batch, length), got "
                             f"{tuple(inputs.shape)}")
    elif inputs.dim() != 3 or inputs.shape[-1] != config.input_dim:
        raise ValueError(f"features must have shape (batch, length, {config.input_dim}), got "
                         f"{tuple(inputs.shape)}")
    elif not inputs.is_floating_point():
        raise TypeError(f"features must be a floating tensor, got {inputs.dtype}")
    return inputs.shape[0], inputs.shape[1]


def trusted_inputs() -> contextlib.AbstractContextManager:
    """:func:`graded.checks.checked_inputs` in eager calls; nothing under the compiler (which
    reads no values)."""
    return checked_inputs(not torch.compiler.is_compiling())


def check_memory_shape(memory: Tensor | None, batch: int, d_model: int, who: str) -> None:
    """Refuse, naming its shape, an encoder memory that is not (B, S, d_model) with B the
    ``batch`` of the decoder's input, or 1 (one memory for every row, as attention broadcasts
    it). Shapes only: no value is read."""
    if memory is None:
        raise ValueError(f"{who}: cross-attention needs the encoder memory (B, S, d_model)")
    if not isinstance(memory, Tensor):
        raise TypeError(f"{who}: the encoder memory must be a tensor (B, S, d_model), got "
                        f"{type(memory).__name__}")
    if memory.dim() != 3 or memory.shape[0] not in (1, batch) or memory.shape[2] != d_model:
        raise ValueError(f"{who}: the encoder memory has shape {tuple(memory.shape)}; expected "
                         f"(batch, source length, d_model) = ({batch}, S, {d_model}), or 1 "
                         "row for every input row")


def check_padding_mask(mask: Tensor | None, batch: int, length: int,
                       name: str = "key_padding_mask") -> None:
    """Refuse, naming it (``name``), a padding mask that is not a bool (B, T) tensor with
    ``True`` marking padding, as in ``torch.nn``; None (no padding) passes. Shapes and dtype
    only: no value is read."""
    if mask is None:
        return
    if mask.dtype != torch.bool:
        raise TypeError(f"{name} must be bool (True = padding), got {mask.dtype}")
    if mask.shape != (batch, length):
        raise ValueError(
            f"{name} has shape {tuple(mask.shape)}; expected (batch, length) = "
            f"({batch}, {length})"
        )
