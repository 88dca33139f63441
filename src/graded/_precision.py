"""Buffers held at a precision of their own, whatever their module is cast to.

Some constants lose what they mean when a model is cast to bfloat16 or float16: the base λ of
the exponential grading (1.01 becomes 1.0078, and the first values of an annealing schedule all
become 1) and the routing thresholds τ of a morphic layer (0.1 becomes 0.10009765625, and stays
so after a cast back). A module keeps such a buffer by running ``nn.Module._apply`` inside
:func:`held_precision` and widening a narrow value of an older state dict with
:func:`widen_loaded` before loading it; each use casts the buffer to the dtype it meets, so what
the module computes stays in the compute dtype.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["at_least_float32", "held_precision", "widen_loaded"]

# the dtype a buffer is held in, given the dtype a cast (or a state dict) gives it
DtypeRule = Callable[[torch.dtype], torch.dtype]


def at_least_float32(dtype: torch.dtype) -> torch.dtype:
    """float32 for a narrower floating dtype, ``dtype`` itself otherwise (float64 stays)."""
    return torch.promote_types(dtype, torch.float32)


@contextlib.contextmanager
def held_precision(module: nn.Module, rules: Mapping[str, DtypeRule]) -> Iterator[None]:
    """Around ``nn.Module._apply`` (behind ``.to``, ``.cuda``, ``.half``, ``.bfloat16``, ...):
    each buffer named in ``rules`` that the cast left in another dtype than its rule gives is
    put back from its value before the cast, on the new device, in the rule's dtype."""
    before = {name: module._buffers[name] for name in rules}
    yield
    for name, rule in rules.items():
        after = module._buffers[name]
        if after is None or before[name] is None:
            continue
        keep = rule(after.dtype)
        if after.dtype != keep:
            module._buffers[name] = before[name].to(device=after.device, dtype=keep)


def widen_loaded(state_dict: dict[str, Any], prefix: str, rules: Mapping[str, DtypeRule]) -> None:
    """In ``state_dict`` (as ``nn.Module._load_from_state_dict`` receives it), each floating
    value of a buffer named in ``rules`` converted to the rule's dtype: a state dict saved
    before the buffer kept its precision loads without narrowing it again, also with
    ``load_state_dict(..., assign=True)``. The precision such a state dict lost is not
    recovered."""
    for name, rule in rules.items():
        value = state_dict.get(prefix + name)
        if isinstance(value, Tensor) and value.is_floating_point() and (
                value.dtype != rule(value.dtype)):
            state_dict[prefix + name] = value.to(rule(value.dtype))
