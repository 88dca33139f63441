"""Argument checks shared by every layer: errors name the argument, its value and the range.

One definition of each check; the task, encoding and evaluation modules import these.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import numbers
import operator
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["SEED_RANGE", "NotANumberError", "check_bool", "check_choice",
           "check_finite_nonnegative", "check_float", "check_id_range", "check_int",
           "check_token_ids", "checked_inputs", "inputs_checked", "value_range"]

#: The seeds a ``torch.Generator`` takes (``manual_seed``; one from 2**64 on fails with "Overflow
#: when unpacking long long", naming nothing), the bounds included.
SEED_RANGE = (-(2**63), 2**64 - 1)

# True inside checked_inputs(): token ids and positions were checked by the caller
_CHECKED: contextvars.ContextVar[bool] = contextvars.ContextVar("inputs_checked", default=False)


def check_int(name: str, value: Any, *, minimum: int | None = None,
              maximum: int | None = None) -> int:
    """``value`` as an ``int`` (any integer type, e.g. NumPy's, and a 0-d integer tensor or
    array, but not ``bool``).

    Raises ``TypeError`` naming ``name`` when ``value`` is not an integer (a float tensor,
    which ``int()`` would truncate, or a tensor of one element but more dimensions, included),
    ``ValueError`` when it lies outside [minimum, maximum].
    """
    number = value
    if getattr(number, "shape", None) == () and callable(getattr(number, "item", None)):
        number = number.item()  # a 0-d tensor or array: its Python scalar (2.5, True refused)
    if (isinstance(number, bool) or not hasattr(number, "__index__")
            or getattr(number, "shape", None) is not None):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    value = operator.index(number)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


class NotANumberError(TypeError, ValueError):
    """A value given for a number is not one: a ``TypeError``, and a ``ValueError`` for the
    callers (pydantic validators, option checks) that report invalid values as such."""


def _span(minimum: float | None, maximum: float | None, strict_min: bool) -> str:
    """The allowed range in words: ``> 0``, ``>= 0.0``, ``<= 1``, ``in (0, 1]``."""
    if minimum is not None and maximum is not None:
        return f"in {'(' if strict_min else '['}{minimum}, {maximum}]"
    if minimum is not None:
        return f"{'>' if strict_min else '>='} {minimum}"
    return f"<= {maximum}" if maximum is not None else ""


def _real(value: Any) -> float | int | None:
    """``value`` as a Python number: a real number (any ``numbers.Real``, e.g. NumPy's) or a
    0-d tensor or array of one; None for anything else (booleans included)."""
    if getattr(value, "shape", None) == () and callable(getattr(value, "item", None)):
        value = value.item()  # a 0-d tensor or NumPy array (a bool or complex one is refused)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return value


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is ``True`` or ``False`` (a NumPy bool too): ``TypeError`` naming
    ``name`` otherwise, since ``bool("false")`` is True and 0 or 1 may be a count given to the
    wrong option."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")


def check_float(name: str, value: Any, *, minimum: float | None = None,
                maximum: float | None = None, strict_min: bool = False) -> float:
    """``value`` as a finite ``float`` in [minimum, maximum] (``(minimum, ...`` with
    ``strict_min``): the one check of a number, whose errors name ``name``, the value and the
    range. Any real number is accepted (NumPy's too), and a 0-d tensor or array; a ``bool``
    is not.
    Raises :class:`NotANumberError` (a ``TypeError`` and a ``ValueError``) for a value that is
    not a number, ``ValueError`` for NaN, ±inf (NaN compares false with every bound, so it is
    refused before them) and a value out of range."""
    span = _span(minimum, maximum, strict_min)
    number = _real(value)
    if number is None:
        raise NotANumberError(f"{name} must be a number{' ' + span if span else ''}, got "
                              f"{value!r} ({type(value).__name__})")
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {number}"
                         + (f" (expected {span})" if span else ""))
    if minimum is not None and (number <= minimum if strict_min else number < minimum):
        op = ">" if strict_min else ">="
        raise ValueError(f"{name} must be {op} {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {number}")
    return float(number)


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> Any:
    """``value`` if it is one of ``choices``; ``ValueError`` naming ``name`` otherwise."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value


def value_range(t: torch.Tensor) -> tuple[float, float] | None:
    """(min, max) of a tensor (ints for an integer one; NaN when a float one holds NaN), read
    in one transfer: one host–device synchronisation on a GPU instead of one per value. None
    for an empty tensor, and under ``torch.compile`` (value checks read data: eager calls
    only)."""
    if not t.numel() or torch.compiler.is_compiling():
        return None
    lo, hi = torch.stack(torch.aminmax(t)).tolist()
    return lo, hi


def inputs_checked() -> bool:
    """Whether the caller has checked the values of token ids and positions
    (:func:`checked_inputs`)."""
    return _CHECKED.get()


@contextlib.contextmanager
def checked_inputs(active: bool = True) -> Iterator[None]:
    """Inside the block, models and encodings take the values of their token ids, positions
    and token grades as checked, and a padding mask as it is given (not read to see whether
    it masks anything): they check dtypes and shapes, but read no values. Reading values
    is a host–device synchronisation on a GPU; a model checks its inputs once at its entry
    and runs its layers in this block (a rotary embedding in every layer would read its
    positions again), and the trainer, which checks its data sets once on the host, runs
    its steps in it, so that the host can queue one step while the GPU computes the last.
    Out-of-range values inside the block are the caller's error: a GPU then reports an
    index assertion from the embedding kernel. ``active=False`` makes the block a no-op (for
    a caller whose data could not be checked)."""
    if not active:
        yield
        return
    token = _CHECKED.set(True)
    try:
        yield
    finally:
        _CHECKED.reset(token)


def check_token_ids(ids: torch.Tensor, vocab_size: int) -> None:
    """:func:`check_id_range` in eager calls outside :func:`checked_inputs` (what a model
    checks at its entry)."""
    if torch.compiler.is_compiling() or _CHECKED.get():
        return
    check_id_range(ids, vocab_size)


def check_id_range(ids: torch.Tensor, vocab_size: int, name: str = "token ids") -> None:
    """Raise ``ValueError`` naming the range found unless every id lies in [0, vocab_size);
    the values are read once (:func:`value_range`)."""
    span = value_range(ids)
    if span is not None and (span[0] < 0 or span[1] >= vocab_size):
        raise ValueError(f"{name} must lie in [0, {vocab_size}); got range "
                         f"[{span[0]}, {span[1]}]")


def check_finite(t: torch.Tensor, name: str) -> None:
    """Raise ``ValueError`` naming the range found unless every value of ``t`` is finite (a NaN
    or ∞ would otherwise fail a comparison silently, or reach every output it touches); the
    values are read once (:func:`value_range`)."""
    _check_values(t, name, nonnegative=False)


def check_finite_nonnegative(t: torch.Tensor, name: str) -> None:
    """:func:`check_finite`, and every value ≥ 0."""
    _check_values(t, name, nonnegative=True)


def _check_values(t: torch.Tensor, name: str, *, nonnegative: bool) -> None:
    span = value_range(t.detach())
    if span is not None and not (math.isfinite(span[0]) and math.isfinite(span[1])
                                 and (span[0] >= 0 or not nonnegative)):
        need = "finite and >= 0" if nonnegative else "finite"
        raise ValueError(f"{name} must be {need}, got values in [{span[0]}, {span[1]}]")
