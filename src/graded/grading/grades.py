"""Grade tensors: conversion of user grades to a validated tensor, and the straight-through
floor that keeps learnable grades in a grading map's domain (see :mod:`graded.grading`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = ["GradesLike", "as_grade_tensor", "straight_through_floor"]

GradesLike = Tensor | Sequence[float] | Sequence[Sequence[float]] | float | int


def _describe_bad(values: Tensor, bad: Tensor) -> str:
    idx = bad.nonzero()[:5].tolist()
    vals = values[bad][:5].tolist()
    shown = ", ".join(
        f"{v!r} at index {tuple(i) if len(i) > 1 else i[0]}" for v, i in zip(vals, idx)
    )
    more = "" if int(bad.sum()) <= 5 else f" (and {int(bad.sum()) - 5} more)"
    return shown + more


def _at(index: tuple[int, ...]) -> str:
    return "" if not index else f" at index {index[0] if len(index) == 1 else index}"


def _first_bool(values: object, index: tuple[int, ...] = ()) -> str | None:
    """The first bool in ``values`` (a bool, a NumPy bool, a bool tensor or array, possibly
    inside lists), described as "the bool True at index 0"; None when there is none."""
    if isinstance(values, (bool, np.bool_)):
        return f"the bool {bool(values)!r}{_at(index)}"
    if isinstance(values, Tensor):
        if values.dtype != torch.bool:
            return None
        if not has_values(values) or values.numel() == 0:
            return f"a tensor of dtype torch.bool and shape {tuple(values.shape)}{_at(index)}"
        first = values.reshape(-1)[0].item()
        return (f"the bool {first!r}{_at(index + tuple(0 for _ in values.shape))} "
                f"(dtype torch.bool)")
    if isinstance(values, np.ndarray) and values.dtype != object:
        if values.dtype != np.bool_:
            return None
        if values.size == 0:
            return f"an array of dtype bool and shape {values.shape}{_at(index)}"
        first = bool(values.reshape(-1)[0])
        return f"the bool {first!r}{_at(index + tuple(0 for _ in values.shape))} (dtype bool)"
    if isinstance(values, (Sequence, np.ndarray)) and not isinstance(values, (str, bytes)):
        for i, v in enumerate(values):
            found = _first_bool(v, (*index, i))
            if found is not None:
                return found
    return None


def _refuse_bools(grades: object, name: str) -> None:
    """A TypeError naming the first bool in ``grades``: ``torch.tensor`` would read True as
    1.0, and a bool is no grade (:class:`graded.algebra.GradedSpace` refuses it too)."""
    found = _first_bool(grades)
    if found is not None:
        raise TypeError(f"{name} must be real numbers, got {found}: a bool is not a grade "
                        f"(a floating or integer value or dtype is expected)")


def as_grade_tensor(
    grades: GradesLike,
    *,
    dim: int | None = None,
    name: str = "grades",
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    allow_heads: bool = True,
) -> Tensor:
    """Convert ``grades`` to a floating tensor and validate it.

    Checks: floating or numeric input (bools are refused, in a list or as a tensor's dtype),
    shape ``(dim,)`` (or ``(num_heads, dim)`` when ``allow_heads``), finite values. Errors name
    the offending value and what was expected. The result keeps autograd history when
    ``grades`` is a tensor.
    """
    if isinstance(grades, Tensor):
        t = grades
        _refuse_bools(t, name)
        if t.is_complex():
            raise TypeError(f"{name} must be a real tensor, got dtype {t.dtype} (a floating "
                            f"or integer dtype is expected)")
        if not t.is_floating_point():
            t = t.to(dtype or torch.get_default_dtype())
        if dtype is not None or device is not None:
            t = t.to(dtype=dtype or t.dtype, device=device)
    elif isinstance(grades, (int, float)) and not isinstance(grades, bool):
        if dim is None:
            raise ValueError(f"a scalar {name}={grades!r} needs dim to fix its length")
        t = torch.full((dim,), float(grades), dtype=dtype or torch.get_default_dtype(),
                       device=device)
    else:
        _refuse_bools(grades, name)
        try:
            t = torch.tensor(grades, dtype=dtype or torch.get_default_dtype(), device=device)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"{name} must be a tensor or a sequence of numbers, got {grades!r}"
            ) from exc
    max_ndim = 2 if allow_heads else 1
    if t.ndim < 1 or t.ndim > max_ndim:
        expected = "(dim,) or (num_heads, dim)" if allow_heads else "(dim,)"
        raise ValueError(f"{name} must have shape {expected}, got shape {tuple(t.shape)}")
    if dim is not None and t.shape[-1] != dim:
        raise ValueError(
            f"{name} has length {t.shape[-1]} in its last dimension but dim={dim}: "
            f"one grade per feature is expected"
        )
    if has_values(t):
        bad = ~torch.isfinite(t.detach())
        if bool(bad.any()):
            raise ValueError(f"{name} must be finite, got {_describe_bad(t.detach(), bad)}")
    return t


def has_values(t: Tensor) -> bool:
    """Whether ``t`` holds values to check: not on the "meta" device, where a module is built
    without them (``with torch.device("meta")``, then ``to_empty`` and ``load_state_dict``)."""
    return t.device.type != "meta"


def straight_through_floor(x: Tensor, floor: float) -> Tensor:
    """max(x, floor) in the forward pass, exactly, and the identity in the backward pass.

    At floor 0 this is x − min(x, 0), the second term a constant (two operators; exact, as
    x − x = 0). Otherwise it is (x − x) + max(x, floor) with the second x and the max
    constants (three operators): the first term is exactly 0 in value and carries the
    gradient 1, so the value is max(x, floor) itself. The form x − min(x − floor, 0) would
    round x − floor: in bfloat16 −0.5 − 0.001 is −0.5, and the "floored" value would be 0,
    the point the floor exists to avoid (1/q infinite, x/q NaN at x = 0)."""
    if floor == 0:
        return x - x.detach().clamp(max=0.0)
    held = x.detach()
    return (x - held) + held.clamp(min=floor)
