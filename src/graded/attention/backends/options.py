"""Backend options: the checks of each kind of option and the properties that run them when set.

A backend's options (``scale``, window and block sizes, kernels, seeds, switches) are checked
by one function per kind (:func:`check_int_option`, :func:`check_bool_option`,
:func:`check_option`, ...), whose errors name the backend, the option and the value. The
properties made by :func:`checked_option` and :func:`fixed_option` run those checks whenever
an option is set, in the constructor and after it (see
:class:`graded.attention.backends.base.AttentionBackend`).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import TYPE_CHECKING

from graded.checks import SEED_RANGE, check_bool, check_float

if TYPE_CHECKING:
    from graded.attention.backends.base import AttentionBackend

__all__ = [
    "BoolOptionError",
    "check_bool_option",
    "check_int_option",
    "check_kernel",
    "check_option",
    "check_scale",
    "check_seed",
    "checked_bool_option",
    "checked_int_option",
    "checked_option",
    "fixed_option",
]


def checked_option(option: str, check: Callable[[str, object], object], *,
                   on_change: Callable[[AttentionBackend], None] | None = None) -> property:
    """A backend option checked whenever it is set, in the constructor and after it: setting
    it keeps ``check(backend name, value)``, so ``backend.scale = 0`` is refused as
    ``scale=0`` is, naming the option and the value, and the option in force is unchanged.
    ``on_change(backend)`` runs after a value other than the one in force (or the first) is
    kept: for what is derived from the option. Read as a plain attribute: the check runs on
    assignment, not on the calls. The getter is a Python function, which the compiler traces
    (inside ``torch.compile`` and FlexAttention's ``mask_mod``), where it cannot trace
    ``operator.attrgetter``."""
    slot = f"_{option}"

    def get(self: AttentionBackend) -> object:
        try:
            return self.__dict__[slot]
        except KeyError:  # never set (a backend without the option): no such attribute
            raise AttributeError(option) from None

    def set_(self: AttentionBackend, value: object) -> None:
        value = check(self.name, value)
        changed = on_change is not None and (slot not in self.__dict__
                                             or self.__dict__[slot] != value)
        self.__dict__[slot] = value
        if changed:
            on_change(self)

    return property(get, set_, doc=f"The ``{option}`` option (checked when set"
                                   f"{'; a change acts at once' if on_change else ''}).")


def checked_int_option(option: str, minimum: int | None = 1, *, odd: bool = False,
                       optional: bool = False) -> property:
    """An integer option (:func:`check_int_option`; ``odd``: odd values only) checked whenever
    it is set, as :func:`checked_option`."""

    def check(name: str, value: object) -> int | None:
        value = check_int_option(name, option, value, minimum=minimum, optional=optional)
        if odd and value is not None and value % 2 == 0:
            raise ValueError(f"{name} backend: {option} must be odd, got {value}")
        return value

    return checked_option(option, check)


def checked_bool_option(option: str) -> property:
    """A bool option (:func:`check_bool_option`) checked whenever it is set, as
    :func:`checked_option`."""
    return checked_option(option, lambda name, value: check_bool_option(name, option, value))


def fixed_option(option: str, check: Callable[[str, object], object], why: str) -> property:
    """A backend option fixed at construction: the constructor sets it once, checked by
    ``check(backend name, value)``; set again, a value is checked as the constructor checks it,
    and one other than the option in force is refused with an ``AttributeError`` naming the
    option, the value and ``why`` (what was built from it), never taken without effect. The
    value in force may be set again (nothing changes)."""
    slot = f"_{option}"
    getter = checked_option(option, check).fget

    def set_(self: AttentionBackend, value: object) -> None:
        value = check(self.name, value)
        if slot in self.__dict__ and value != self.__dict__[slot]:
            raise AttributeError(
                f"{self.name} backend: {option} is fixed at construction ({why}), so it cannot "
                f"be set to {value!r} (it is {self.__dict__[slot]!r}); build a new backend "
                f"with {option}={value!r}"
            )
        self.__dict__[slot] = value

    return property(getter, set_, doc=f"The ``{option}`` option (fixed at construction).")


def check_scale(name: str, scale: object) -> float | None:
    """A backend's ``scale`` option: None (1/√D) or a positive finite number, the softmax
    temperature (:func:`graded.checks.check_float`). A zero or negative temperature is
    refused: the fused kernel turns the masked scores (-inf) into NaN with it, and FAVOR+ takes
    its square root."""
    if scale is None:
        return None
    return check_float(f"{name} backend: scale (None for 1/√head_dim)", scale, minimum=0,
                       strict_min=True)


def check_int_option(name: str, option: str, value: object, *, minimum: int | None = 1,
                     optional: bool = False) -> int | None:
    """Backend ``name``'s integer option ``option``: an int of at least ``minimum`` (any int
    for None; None too when ``optional``). A bool is refused: ``True`` would silently be a size
    of 1; so is a float, which would be truncated."""
    if value is None and optional:
        return None
    if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
            or (minimum is not None and value < minimum)):
        expected = ("an int" if minimum is None else "a positive int" if minimum == 1
                    else f"an int >= {minimum}")
        raise ValueError(f"{name} backend: {option} must be {expected}"
                         f"{' or None' if optional else ''}, got {value!r}")
    return int(value)


class BoolOptionError(TypeError, ValueError):
    """A backend's bool option given something other than True or False: a ``TypeError``, as
    :func:`graded.checks.check_bool` raises for every other bool of the library, and a
    ``ValueError``, as the refusals of the backends' other options are (and as this one was),
    for the callers that report invalid options as such (the precedent is
    :class:`graded.checks.NotANumberError`)."""


def check_bool_option(name: str, option: str, value: object) -> bool:
    """Backend ``name``'s bool option ``option``: ``True`` or ``False`` (a NumPy bool too,
    kept as the Python bool), by :func:`graded.checks.check_bool`. Anything else is refused
    with :class:`BoolOptionError` naming the backend, the option and the value: the string
    ``"false"`` is truthy, and 0 or 1 may be a count given to the wrong option."""
    try:
        return check_bool(f"{name} backend: {option}", value)
    except TypeError as error:
        raise BoolOptionError(str(error)) from None


def check_seed(name: str, seed: object, *, optional: bool = False) -> int | None:
    """A backend's ``seed`` option: an int in :data:`SEED_RANGE` (None too when
    ``optional``). A float would be truncated by the generator (1.5 would draw what 1 draws),
    so it is refused; so is an int the generator cannot take, which would otherwise fail at
    the first call with torch's "Overflow when unpacking long long", naming nothing."""
    seed = check_int_option(name, "seed", seed, minimum=None, optional=optional)
    if seed is not None and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise ValueError(f"{name} backend: seed must be an int in [{SEED_RANGE[0]}, "
                         f"{SEED_RANGE[1]}] (what torch.Generator.manual_seed takes), got "
                         f"{seed}")
    return seed


def check_option(name: str, option: str, value: object, choices: tuple[str, ...]) -> str:
    """Backend ``name``'s string option ``option``, refused unless it is one of ``choices``."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(
            f"{name} backend: {option} must be one of {', '.join(map(repr, choices))}, got "
            f"{value!r}"
        )
    return value


def check_kernel(name: str, kernel: object, choices: tuple[str, ...]) -> str:
    """A backend's ``kernel`` option, refused unless it is one of ``choices``."""
    return check_option(name, "kernel", kernel, choices)
