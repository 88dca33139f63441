"""Learning-rate schedules as multipliers for :class:`torch.optim.lr_scheduler.LambdaLR`.

- :func:`inverse_sqrt`: 002 Eq. (6.6) (Vaswani et al.),
  lr(s) = d_model^{-1/2} · min(s^{-1/2}, s · warmup^{-3/2}), with steps counted from 1. As a
  multiplier of the base learning rate it is normalised to peak at 1 when ``d_model`` is None.
- :func:`warmup_cosine`: linear warmup, then cosine decay to ``min_ratio``.
- :func:`constant`: optional linear warmup, then constant.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from graded.checks import check_int

__all__ = ["constant", "inverse_sqrt", "make_scheduler", "warmup_cosine"]


def _check_warmup(warmup_steps: int) -> None:
    if not isinstance(warmup_steps, int) or isinstance(warmup_steps, bool) or warmup_steps < 0:
        raise ValueError(f"warmup_steps must be a non-negative int, got {warmup_steps!r}")


def inverse_sqrt(warmup_steps: int, d_model: int | None = None) -> Callable[[int], float]:
    """Multiplier for step ``s`` (0-based as LambdaLR counts); see module doc."""
    _check_warmup(warmup_steps)
    if d_model is not None and (isinstance(d_model, bool) or not isinstance(d_model, int)
                                or d_model <= 0):
        # a negative d_model would make d_model^{-1/2} a complex number
        raise ValueError(f"d_model must be a positive int or None, got {d_model!r}")
    w = max(warmup_steps, 1)

    def fn(step: int) -> float:
        s = step + 1
        value = min(s**-0.5, s * w**-1.5)
        return value * (d_model**-0.5 if d_model is not None else w**0.5)

    return fn


def warmup_cosine(
    warmup_steps: int, total_steps: int, min_ratio: float = 0.0
) -> Callable[[int], float]:
    """Linear warmup over ``warmup_steps`` then cosine decay to ``min_ratio`` at total_steps."""
    _check_warmup(warmup_steps)
    total_steps = check_int("total_steps", total_steps)
    if total_steps <= warmup_steps:
        raise ValueError(
            f"total_steps ({total_steps}) must exceed warmup_steps ({warmup_steps})"
        )
    if not 0.0 <= min_ratio <= 1.0:
        raise ValueError(f"min_ratio must be in [0, 1], got {min_ratio}")

    def fn(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min((step - warmup_steps) / (total_steps - warmup_steps), 1.0)
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return fn


def constant(warmup_steps: int = 0) -> Callable[[int], float]:
    _check_warmup(warmup_steps)

    def fn(step: int) -> float:
        return min(1.0, (step + 1) / warmup_steps) if warmup_steps else 1.0

    return fn


SCHEDULES = ("constant", "inverse_sqrt", "cosine")


def make_scheduler(
    optimizer: torch.optim.Optimizer, name: str, *, warmup_steps: int = 0,
    total_steps: int | None = None, d_model: int | None = None, min_ratio: float = 0.0,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR for ``name`` in ``constant``, ``inverse_sqrt``, ``cosine``. ``min_ratio``
    (the cosine's floor) and ``d_model`` (inverse_sqrt's scale) are refused for a schedule
    that has no use for them, as ``TrainOptions`` refuses ``min_lr_ratio``: they would
    change nothing."""
    if name in SCHEDULES and name != "cosine" and min_ratio != 0.0:
        raise ValueError(f"min_ratio={min_ratio!r} is the floor of the cosine schedule; "
                         f"schedule {name!r} has none (expected 0, or schedule 'cosine')")
    if name in SCHEDULES and name != "inverse_sqrt" and d_model is not None:
        raise ValueError(f"d_model={d_model!r} scales the inverse_sqrt schedule (002 Eq. 6.6); "
                         f"schedule {name!r} does not read it (expected None)")
    if name == "constant":
        fn = constant(warmup_steps)
    elif name == "inverse_sqrt":
        fn = inverse_sqrt(warmup_steps, d_model)
    elif name == "cosine":
        if total_steps is None:
            raise ValueError("the cosine schedule needs total_steps")
        fn = warmup_cosine(warmup_steps, total_steps, min_ratio)
    else:
        raise ValueError(f"unknown schedule {name!r}; expected one of {SCHEDULES}")
    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)
