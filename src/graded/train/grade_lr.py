"""The grade learning-rate bound of 000 Alg 5.1 (LGT) and Alg 7.1 (EGT), applied to an
optimizer: which of its groups hold grades, and their rate capped below the bound.
:meth:`graded.train.recipes.Recipe.start_step` calls these once per step."""

from __future__ import annotations

import math
import weakref

import torch
from torch import Tensor, nn

from graded.train.optim import is_grade_parameter
from graded.transformer.graded import gradings

__all__ = ["cap_grade_lr", "grade_groups", "grade_lr_bound", "read_host", "to_host"]

# optimizer -> (signature of its groups, model and lr_bound; indices of its grade groups)
_GRADE_GROUPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def grade_lr_bound(kind: str, q_max: float, lam: float | None = None) -> float:
    """The grade learning-rate bound: 1/q_max for LGT (000 Alg 5.1), 1/(λ^{q_max} ln λ) for
    EGT (000 Alg 7.1, Prop 7.5). Infinite where the algorithms' expression has no bound. The
    EGT bound is computed as exp(−q_max·ln λ)/ln λ: where λ^{q_max} is beyond the largest float
    it is 0 (the grades' rate is 0), not an OverflowError. NaN grades (q_max NaN) have no
    bound: it is 0, so that they do not lift the cap and take the scheduled rate."""
    if kind not in ("linear", "exponential"):
        raise ValueError(f"kind must be 'linear' or 'exponential', got {kind!r}")
    if math.isnan(q_max):
        return 0.0
    if kind == "linear":
        return 1.0 / q_max if q_max > 0 else math.inf
    if lam is None or lam <= 1.0:
        return math.inf
    log_lam = math.log(lam)
    return math.exp(-max(q_max, 0.0) * log_lam) / log_lam


def grade_groups(model: nn.Module, optimizer: torch.optim.Optimizer, *, recipe: str,
                 lr_bound: str) -> list[int]:
    """Indices of the optimizer's groups that hold grades: the ``grades`` group of
    :meth:`graded.train.recipes.Recipe.param_groups`, and any other group holding a grading's
    grades (an optimizer built without it), whose rate the bound then caps too. Under
    ``lr_bound="paper"`` a group that mixes grades with other parameters cannot be capped
    alone: ValueError naming the ``recipe``.

    Kept per optimizer while its groups (their first parameter, size and name), the model
    and ``lr_bound`` stay the same: finding them walks every parameter, a few hundred
    microseconds of host time per step on a 12-layer model."""
    groups = optimizer.param_groups
    signature = (id(model), lr_bound, tuple(
        (id(g["params"][0]) if g["params"] else None, len(g["params"]), g.get("name"))
        for g in groups))
    kept = _GRADE_GROUPS.get(optimizer)
    if kept is not None and kept[0] == signature:
        return kept[1]
    found = _find_grade_groups(model, optimizer, recipe, lr_bound)
    _GRADE_GROUPS[optimizer] = (signature, found)
    return found


def _find_grade_groups(model: nn.Module, optimizer: torch.optim.Optimizer, recipe: str,
                       lr_bound: str) -> list[int]:
    grade_ids = {id(p) for n, p in model.named_parameters() if is_grade_parameter(n)}
    grade_ids |= {id(g.grades) for g in gradings(model).values() if g.learnable}
    found = []
    for i, group in enumerate(optimizer.param_groups):
        params = group["params"]
        held = sum(id(p) in grade_ids for p in params)
        if group.get("name") != "grades" and held == 0:
            continue
        if held < len(params) and lr_bound == "paper":
            name = group.get("name", f"#{i}")
            raise ValueError(
                f"recipe {recipe!r}: optimizer group {name!r} holds {held} grade "
                f"parameter(s) together with {len(params) - held} other(s); the grade "
                "learning-rate bound needs the grades in a group of their own (build the "
                "optimizer from recipe.param_groups(model, ...), or set lr_bound: off)")
        found.append(i)
    return found


def cap_grade_lr(optimizer: torch.optim.Optimizer, groups: list[int], *, kind: str,
                 lr_bound: str, lr_margin: float, q_max: float,
                 lam: float | None) -> dict[str, float]:
    """Cap the learning rate of the grade ``groups`` at ``lr_margin`` × the bound at ``q_max``
    (and λ for EGT, ``kind="exponential"``), under ``lr_bound="paper"``; the values to log
    (λ, q_max, the bound, -1 where it is infinite, and the largest grade rate)."""
    logged: dict[str, float] = {}
    if kind == "exponential":
        logged["lambda"] = lam
    bound = grade_lr_bound(kind, q_max, lam)
    logged["q_max"] = q_max
    logged["grade_lr_bound"] = bound if math.isfinite(bound) else -1.0
    for i in groups:
        group = optimizer.param_groups[i]
        if lr_bound == "paper":
            # the rate to cap is the scheduled one: what a scheduler (or the user) set since
            # the last cap, else the rate the last cap started from, so that a bound that
            # loosens again (smaller grades) gives the rate back without a scheduler
            lr = group["lr"]
            scheduled = (group["scheduled_lr"] if lr == group.get("capped_lr", math.nan)
                         else lr)
            lr = min(scheduled, lr_margin * bound) if math.isfinite(bound) else scheduled
            group.update(lr=lr, scheduled_lr=scheduled, capped_lr=lr)
        logged["grade_lr"] = max(logged.get("grade_lr", 0.0), group["lr"])
    return logged


def to_host(values: Tensor) -> tuple[Tensor, torch.cuda.Event | None]:
    """``values`` copied to the host without waiting for them (on a GPU: into pinned memory,
    an event marking when the copy is done)."""
    if values.device.type != "cuda":
        return values, None
    host = values.to("cpu", non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return host, event


def read_host(queued: tuple[Tensor, torch.cuda.Event | None]) -> list[float]:
    """The values :func:`to_host` queued, as floats (waiting for their copy only)."""
    values, event = queued
    if event is not None:
        event.synchronize()
    return values.tolist()
