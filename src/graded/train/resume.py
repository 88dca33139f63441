"""Resuming a run: everything is checked and loaded before anything is written.

:func:`plan_resume` (called by :meth:`graded.train.trainer.Trainer.prepare_resume`, the CLI's
preflight) checks each checkpoint's config against the new one before reading any of its
tensors, and loads the newest checkpoint that accepts it (a key the resume rule of
:mod:`graded.train.runs` keeps fixed refuses it) and that is intact, into the model and
optimizer (newer damaged or foreign ones are skipped, and listed: damaged files, or a stopper,
scheduler or fp16 gradient scaler state that cannot be used; when none accepts the config,
the refusal is the error), its scheduler state, its best metric and early-stopping count
(:class:`~graded.train.stopping.Stopper`), and the peak learning rates now configured
(:func:`use_peak_lrs`). It is all or nothing: every check that can refuse the resume runs
before the first tensor is loaded, so a refused resume leaves the model, optimizer and
scheduler as they were. Its :class:`ResumePlan` is what :meth:`Trainer.fit` starts from; the
only state it leaves for later is the RNG, restored when the first resumed step is about to
run.
"""

from __future__ import annotations

import copy
import math
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from graded.train.checkpoint import STATE_FILE, CheckpointManager, IntactCheckpoint
from graded.train.checkpoint_folder import check_checkpoint
from graded.train.runs import (
    CONFIG_FILE,
    RunError,
    RunFolder,
    checked_changes,
    checkpoint_view,
    holds_checkpoint,
    last_run_view,
    resume_changes,
)
from graded.train.state_tensors import CheckpointError, RngState, checkpoint_error
from graded.train.stopping import Stopper


@dataclass
class ResumePlan:
    """What :func:`plan_resume` checked and loaded, before anything was written."""

    source: Path  # the run folder or checkpoint folder asked for
    checkpoint: Path  # the checkpoint loaded: the newest intact one
    step: int
    stopper: Stopper  # best metric and early-stopping count (a one-value stopper: as both)
    rng: RngState  # every rank's, as checked when the checkpoint was read
    skipped: list[tuple[Path, str]] = field(default_factory=list)  # newer, damaged checkpoints
    changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # accepted overrides
    grad_scaler: dict[str, Any] | None = None  # the fp16 gradient scaler's state


def use_peak_lrs(optimizer: torch.optim.Optimizer,
                 scheduler: torch.optim.lr_scheduler.LambdaLR, peaks: list[float]) -> None:
    """After loading a checkpoint, make ``peaks`` the schedule's base (peak) learning rates, so
    the next step runs at ``peak × multiplier(step)`` of the schedule as now configured: a new
    ``lr``, ``grade_lr`` or ``steps`` is used from the resume step on."""
    scheduler.base_lrs = list(peaks)
    for group, peak, multiplier in zip(optimizer.param_groups, peaks, scheduler.lr_lambdas):
        group["initial_lr"] = peak
        group["lr"] = peak * multiplier(scheduler.last_epoch)


def plan_resume(
    source: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    now: dict[str, Any],
    *,
    loading: Callable[[Path], object] | None = None,
    run: RunFolder | None = None,
) -> ResumePlan:
    """Check and load a resume from ``source`` (a run folder or one checkpoint folder) into
    ``model``, ``optimizer`` and ``scheduler`` as built for the config ``now`` (a
    :func:`graded.train.runs.run_view`); write nothing. Raises RunError for a config that cannot
    resume, CheckpointError when no checkpoint loads.

    The plan's ``changes`` (what the resume records) are those of ``now`` against the config
    the run last ran with: the checkpoint's, with the changes the history of ``run`` (the run
    folder the resume writes, when the checkpoint is one of its own) recorded since
    (:func:`graded.train.runs.last_run_view`).

    All or nothing: every check that can refuse (the config, ``train.steps``, the files, the
    stopper and scheduler states, an fp16 run's gradient scaler state) passes before the first
    tensor is loaded, so a refusal leaves ``model``, ``optimizer`` and ``scheduler`` as they
    were. In a run folder, a checkpoint whose files or states fail is skipped for the newest
    older one that passes (:meth:`~graded.train.checkpoint.CheckpointManager.find_intact`,
    listed in the plan's ``skipped``), its state being as damaged as a truncated file; the
    refusal is the error only when none passes. ``loading(checkpoint)`` is called once they
    passed, just before the loading starts: an exception after that call (a failure of
    torch's own loading) may leave them part loaded."""
    source = Path(source)
    peaks = list(scheduler.base_lrs)  # as built from the options now
    checkpoints = CheckpointManager(source / "checkpoints")
    confirmed: list[tuple[dict[str, tuple[Any, Any]], Stopper, dict[str, Any]]] = []

    def confirm(path: Path, meta: dict[str, Any]) -> None:
        confirmed.append(_checked_resume(source, path, meta, now, scheduler))
        if loading is not None:
            loading(path)

    if checkpoints.folders():
        # each checkpoint's config is checked before its tensors are read; a newer checkpoint
        # that is damaged or of another run is skipped; a config no checkpoint accepts is
        # refused (RunError: the config changed in a way a run cannot)
        found = checkpoints.find_intact(
            model, optimizer, accept=lambda state: checked_changes(source, state, now),
            reject=RunError, confirm=confirm)
    elif (source / CONFIG_FILE).is_file() and not (source / STATE_FILE).is_file():
        raise CheckpointError(f"run folder {source} holds no checkpoint: it stopped before "
                              "its first one, so there is nothing to resume; train it anew "
                              "(without resuming)")
    elif not (source / STATE_FILE).is_file():
        what = "a file" if source.is_file() else ("a folder holding no checkpoint "
                                                   "(checkpoints/step_<N>), config.yaml or "
                                                   "state.json")
        raise CheckpointError(f"cannot resume from {source}: it is {what}, neither a run "
                              "folder nor one of its checkpoint folders (step_<N>, holding "
                              "state.json); expected a run folder of the trainer or "
                              "RUN/checkpoints/step_<N>")
    else:
        checked = check_checkpoint(source, model, optimizer)
        confirm(source, checked.meta)
        checked.load_into(model, optimizer)
        found = IntactCheckpoint(source, checked.meta, [], checked.rng)
    changes, stopper, scheduler_state = confirmed[-1]
    if run is not None and holds_checkpoint(run.path, found.path):
        changes, _ = resume_changes(last_run_view(checkpoint_view(found.meta), run.history()),
                                    now)
    scheduler.load_state_dict(scheduler_state)
    use_peak_lrs(optimizer, scheduler, peaks)
    return ResumePlan(source, found.path, found.meta["step"], stopper, found.rng, found.skipped,
                      changes, found.meta.get("grad_scaler"))


def _checked_resume(
    source: Path, path: Path, meta: dict[str, Any], now: dict[str, Any],
    scheduler: torch.optim.lr_scheduler.LambdaLR,
) -> tuple[dict[str, tuple[Any, Any]], Stopper, dict[str, Any]]:
    """Every check a resume from the checkpoint ``path`` (its state ``meta``) makes besides
    its files', changing nothing: the config changes ``now`` makes (RunError for one a run
    cannot make), ``train.steps`` not below its step (RunError), and its stopper and scheduler
    states and, under fp16, its gradient scaler state (CheckpointError naming
    ``state.json``: the checkpoint is damaged, and a run folder's resume takes an older one).
    Returns the changes, the stopper and the scheduler state to load."""
    changes = checked_changes(source, meta, now)
    steps = (now.get("train") or {}).get("steps")
    if isinstance(steps, int) and steps < meta["step"]:
        # the run is past it: nothing could be trained, and recording the new total would
        # leave config.yaml (and the run's "finished" end) at fewer steps than were made
        raise RunError(f"cannot resume {source} with train.steps={steps}: its checkpoint "
                       f"{path} is at step {meta['step']}; expected train.steps "
                       f">= {meta['step']} (more steps continue the run)")
    try:
        stopper = Stopper.from_state(meta.get("stopper"))
    except (AttributeError, TypeError, ValueError) as exc:
        raise checkpoint_error(path / STATE_FILE, f"no usable stopper state ({exc!r})") from None
    try:
        state = meta["scheduler"]
        _check_scheduler_state(scheduler, state)
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
        raise checkpoint_error(path / STATE_FILE,
                               f"no usable scheduler state ({exc!r})") from None
    if (now.get("train") or {}).get("precision") == "fp16":
        try:
            _check_grad_scaler_state(meta.get("grad_scaler"))
        except (TypeError, ValueError) as exc:
            raise checkpoint_error(path / STATE_FILE,
                                   f"no usable grad_scaler state ({exc})") from None
    return changes, stopper, state


#: The fields of a gradient scaler's state (``torch.amp.GradScaler.state_dict``), each with
#: the check its value passes: those of the scaler's constructor, a finite positive scale
#: and a step count the scaler can have reached.
_GRAD_SCALER_FIELDS: dict[str, tuple[type, Callable[[Any], bool], str]] = {
    "scale": (float, lambda v: _finite(v) and v > 0, "a finite number > 0"),
    "growth_factor": (float, lambda v: _finite(v) and v > 1, "a finite number > 1"),
    "backoff_factor": (float, lambda v: 0 < v < 1, "a number in (0, 1)"),
    "growth_interval": (int, lambda v: v >= 1, "an int >= 1"),
    "_growth_tracker": (int, lambda v: v >= 0, "an int >= 0"),
}


def _finite(value: float) -> bool:
    """Whether a JSON number is finite (an int is, however large: no float conversion)."""
    return isinstance(value, int) or math.isfinite(value)


def _check_grad_scaler_state(state: Any) -> None:
    """The fp16 gradient scaler's checkpointed state, checked before anything is loaded:
    TypeError or ValueError naming the field that a scaler cannot resume from (loading it
    would fail only at the first resumed step, after the run folder is written; a state left
    out would restart the scaler at its initial scale, and the resumed losses would no longer
    be the uninterrupted run's)."""
    if not isinstance(state, dict):
        raise TypeError(f"it is {state!r}, expected the scaler's state (a dict) since "
                        "train.precision is 'fp16'")
    for name, (kind, ok, expected) in _GRAD_SCALER_FIELDS.items():
        if name not in state:
            raise ValueError(f"{name} is missing, expected {expected}")
        value = state[name]
        numeric = (int,) if kind is int else (int, float)
        if isinstance(value, bool) or not isinstance(value, numeric) or not ok(value):
            raise ValueError(f"{name} is {value!r}, expected {expected}")


def _check_scheduler_state(scheduler: torch.optim.lr_scheduler.LambdaLR,
                           state: dict[str, Any]) -> None:
    """Load ``state`` into a stand-in of ``scheduler`` (its own attributes and multipliers;
    ``scheduler`` and ``state`` unchanged) and compute the multipliers at its step, as
    :func:`use_peak_lrs` will: whatever of that fails raises."""
    trial = copy.copy(scheduler)  # a shallow copy: load_state_dict rebinds its attributes only
    trial.lr_lambdas = [types.SimpleNamespace() for _ in scheduler.lr_lambdas]
    trial.load_state_dict(copy.deepcopy(state))
    if isinstance(trial.last_epoch, bool) or not isinstance(trial.last_epoch, int):
        raise TypeError(f"last_epoch is {trial.last_epoch!r}, expected an int")
    for multiplier in scheduler.lr_lambdas:
        float(multiplier(trial.last_epoch))
