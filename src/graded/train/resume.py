"""Resuming a run: everything is checked and loaded before anything is written.

:func:`plan_resume` (called by :meth:`graded.train.trainer.Trainer.prepare_resume`, the CLI's
preflight) checks each checkpoint's config against the new one before reading any of its
tensors, and loads the newest checkpoint that accepts it (a key the resume rule of
:mod:`graded.train.runs` keeps fixed refuses it) and that is intact, into the model and
optimizer (newer damaged or foreign ones are skipped, and listed; when none accepts the config,
the refusal is the error), its scheduler state, its best metric and early-stopping count
(:class:`~graded.train.stopping.Stopper`), and the peak
learning rates now configured (:func:`use_peak_lrs`). Its :class:`ResumePlan` is what
:meth:`Trainer.fit` starts from; the only state it leaves for later is the RNG, restored when the
first resumed step is about to run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from graded.train.checkpoint import (
    STATE_FILE,
    CheckpointManager,
    IntactCheckpoint,
    load_checkpoint,
    read_rng_state,
)
from graded.train.runs import CONFIG_FILE, RunError, checked_changes
from graded.train.state_tensors import CheckpointError, checkpoint_error
from graded.train.stopping import Stopper


@dataclass
class ResumePlan:
    """What :func:`plan_resume` checked and loaded, before anything was written."""

    source: Path  # the run folder or checkpoint folder asked for
    checkpoint: Path  # the checkpoint loaded: the newest intact one
    step: int
    stopper: Stopper  # best metric and early-stopping count (a one-value stopper: as both)
    rng: tuple[dict[str, torch.Tensor], dict[str, Any]]
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
) -> ResumePlan:
    """Check and load a resume from ``source`` (a run folder or one checkpoint folder) into
    ``model``, ``optimizer`` and ``scheduler`` as built for the config ``now`` (a
    :func:`graded.train.runs.run_view`); write nothing. Raises RunError for a config that cannot
    resume, CheckpointError when no checkpoint loads."""
    source = Path(source)
    peaks = list(scheduler.base_lrs)  # as built from the options now
    checkpoints = CheckpointManager(source / "checkpoints")
    if checkpoints.folders():
        # each checkpoint's config is checked before its tensors are read; a newer checkpoint
        # that is damaged or of another run is skipped; a config no checkpoint accepts is
        # refused (RunError: the config changed in a way a run cannot)
        found = checkpoints.find_intact(
            model, optimizer, accept=lambda state: checked_changes(source, state, now),
            reject=RunError)
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
        found = IntactCheckpoint(source, load_checkpoint(source, model, optimizer,
                                                         restore_rng=False), [])
    changes = checked_changes(source, found.meta, now)
    steps = (now.get("train") or {}).get("steps")
    if isinstance(steps, int) and steps < found.meta["step"]:
        # the run is past it: nothing could be trained, and recording the new total would
        # leave config.yaml (and the run's "finished" end) at fewer steps than were made
        raise RunError(f"cannot resume {source} with train.steps={steps}: its checkpoint "
                       f"{found.path} is at step {found.meta['step']}; expected train.steps "
                       f">= {found.meta['step']} (more steps continue the run)")
    try:
        stopper = Stopper.from_state(found.meta.get("stopper"))
    except (AttributeError, TypeError, ValueError) as exc:
        raise checkpoint_error(found.path / STATE_FILE,
                               f"no usable stopper state ({exc!r})") from None
    try:
        scheduler.load_state_dict(found.meta["scheduler"])
    except (KeyError, TypeError, ValueError) as exc:
        raise checkpoint_error(found.path / STATE_FILE,
                               f"no usable scheduler state ({exc!r})") from None
    use_peak_lrs(optimizer, scheduler, peaks)
    return ResumePlan(source, found.path, found.meta["step"], stopper,
                      read_rng_state(found.path), found.skipped, changes,
                      found.meta.get("grad_scaler"))
