"""The best checkpoint and early stopping: two comparisons of the monitored metric, kept apart.

At each evaluation the trainer compares the monitored metric (``train.monitor``, better as
``train.monitor_mode`` says) twice:

- against ``best``, the best value seen so far, strictly (a tie keeps the earlier one): an
  evaluation that beats it makes its checkpoint the best one (``best.json``, ``graded eval``'s
  default checkpoint, ``metrics.json``'s ``best``), whatever ``min_delta`` is;
- against ``reference``, the value of the last evaluation that counted as an improvement for
  early stopping: it counts when it beats ``reference`` by more than
  ``early_stopping.min_delta``, which resets ``bad_evals``; otherwise ``bad_evals`` grows, and
  the run stops after ``early_stopping.patience`` of them in a row.

A NaN value (an evaluation whose metric is not a number) beats nothing, in both comparisons:
it is never the best and counts as no improvement; a NaN recorded as ``best`` or
``reference`` (a state saved before this rule) is beaten by any number.

So ``min_delta`` affects only the patience count, as in Keras (``EarlyStopping`` beside
``ModelCheckpoint(save_best_only=True)``) and PyTorch Lightning (whose ``min_delta`` belongs to
the early-stopping callback). Without early stopping ``min_delta`` is 0 and both values agree.

A checkpoint stores the state as ``stopper`` in ``state.json``:
``{"best", "best_step", "reference", "bad_evals"}``. A ``stopper`` holding one value (``best``
and ``bad_evals``, no ``reference``) resumes with that value as both ``best`` and ``reference``
and ``best_step`` unknown (null).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

__all__ = ["Stopper", "sets_best"]


def _beats(value: float, than: float | None, mode: Literal["min", "max"],
           delta: float = 0.0) -> bool:
    """Whether ``value`` is better than ``than`` by more than ``delta`` (None: anything is). A
    NaN ``value`` is better than nothing, any other is better than a NaN ``than`` (every
    comparison with NaN is false: the first NaN evaluation became the best for good)."""
    if math.isnan(value):
        return False
    if than is None or math.isnan(than):
        return True
    return value < than - delta if mode == "min" else value > than + delta


@dataclass
class Stopper:
    """The monitored metric's best value and the early-stopping count (module docstring)."""

    best: float | None = None  # the best value seen: the best checkpoint's
    best_step: int | None = None  # the step of that evaluation (None: not known)
    reference: float | None = None  # the last value that improved by more than min_delta
    bad_evals: int = 0  # evaluations in a row that did not

    def observe(self, value: float, step: int, *, mode: Literal["min", "max"],
                min_delta: float = 0.0) -> bool:
        """Count the evaluation of ``step``; return whether its checkpoint is the new best."""
        is_best = _beats(value, self.best, mode)
        if is_best:
            self.best, self.best_step = value, step
        if _beats(value, self.reference, mode, min_delta):
            self.reference, self.bad_evals = value, 0
        else:
            self.bad_evals += 1
        return is_best

    def stopped(self, patience: int | None) -> bool:
        """Whether ``patience`` evaluations in a row brought no improvement (None: never)."""
        return patience is not None and self.bad_evals >= patience

    def to_state(self) -> dict[str, Any]:
        """The JSON ``stopper`` of a checkpoint."""
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, Any] | None) -> Stopper:
        """The stopper a checkpoint's ``stopper`` holds; one holding a single value (no
        ``reference``) gives it as both ``best`` and ``reference``."""
        state = state or {}
        best = state.get("best")
        return cls(best=best, best_step=state.get("best_step"),
                   reference=state.get("reference", best),
                   bad_evals=int(state.get("bad_evals", 0)))


def sets_best(step: int, state: dict[str, Any] | None, best: float | None) -> bool:
    """Whether the checkpoint of ``step``, whose ``stopper`` is ``state``, is the one whose
    evaluation set ``best``: it names its own step as ``best_step``; in a ``stopper`` holding
    one value, its evaluation counted as an improvement (``bad_evals`` 0) with that value."""
    if not isinstance(state, dict) or best is None or state.get("best") != best:
        return False
    if "reference" in state:
        return state.get("best_step") == step
    return state.get("bad_evals") == 0
