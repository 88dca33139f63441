"""Argument checks shared by every layer: errors name the argument, its value and the range.

One definition of each check; the task, encoding and evaluation modules import these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["check_choice", "check_float", "check_int"]


def check_int(name: str, value: Any, *, minimum: int | None = None,
              maximum: int | None = None) -> int:
    """``value`` as an ``int`` (any integer type, e.g. NumPy's, but not ``bool``).

    Raises ``TypeError`` naming ``name`` when ``value`` is not an integer, ``ValueError`` when it
    lies outside [minimum, maximum].
    """
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def check_float(name: str, value: Any, *, minimum: float | None = None,
                maximum: float | None = None, strict_min: bool = False) -> float:
    """``value`` as a ``float``; ``TypeError``/``ValueError`` naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    if minimum is not None and (value <= minimum if strict_min else value < minimum):
        op = ">" if strict_min else ">="
        raise ValueError(f"{name} must be {op} {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return float(value)


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> Any:
    """``value`` if it is one of ``choices``; ``ValueError`` naming ``name`` otherwise."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value
