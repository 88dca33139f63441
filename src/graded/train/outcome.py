"""How a training run ended: :class:`TrainResult`, its status, its summary and the resume message.

:meth:`Trainer.fit <graded.train.trainer.Trainer.fit>` returns a :class:`TrainResult`; the same
figures go to ``metrics.json`` (:func:`final_summary`: :func:`run_summary` with
:func:`end_fields`; a resume that runs no step keeps the figures of the summary it finds at its
step), and the word of :func:`end_status` to both ``metrics.json``'s ``status`` and
``history.jsonl``'s ``end`` event. An interrupted run prints :func:`resume_message`, naming its
checkpoint and the resume command.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graded.train.options import TrainOptions

__all__ = ["TrainResult", "end_fields", "end_status", "final_summary", "previous_summary",
           "resume_message", "run_summary"]


@dataclass
class TrainResult:
    """What :meth:`Trainer.fit <graded.train.trainer.Trainer.fit>` returns."""

    step: int
    losses: list[float] = field(default_factory=list)  # training loss of each step run here
    final_eval: dict[str, float] = field(default_factory=dict)
    best_metric: float | None = None
    best_checkpoint: Path | None = None
    last_checkpoint: Path | None = None
    interrupted: bool = False
    early_stopped: bool = False
    elapsed_s: float = 0.0


def run_summary(result: TrainResult, opts: TrainOptions, *, graded_loss: bool,
                world_size: int) -> dict[str, Any]:
    """The figures of ``metrics.json`` of a run that trained with ``opts`` on ``world_size``
    ranks (its ending, :func:`end_fields`, is added by the caller)."""
    return {
        "step": result.step,
        "steps": opts.steps,
        "train_loss": result.losses[-1] if result.losses else None,
        # what train_loss measures: the recipe's graded loss (items weighted by their
        # grades) or the plain loss, the unit of every eval loss
        "train_objective": "graded" if graded_loss else "plain",
        "eval": result.final_eval,
        "monitor": opts.monitor,
        "best": result.best_metric,
        "best_checkpoint": str(result.best_checkpoint) if result.best_checkpoint else None,
        "interrupted": result.interrupted,
        "early_stopped": result.early_stopped,
        "elapsed_s": result.elapsed_s,
        "world_size": world_size,
    }


def end_status(result: TrainResult | None, ended: BaseException | None, steps: int) -> str:
    """How a run of ``steps`` steps ended, the word of ``history.jsonl``'s ``end`` event and of
    ``metrics.json``'s ``status``: ``aborted`` (a second Ctrl-C) or ``failed`` when an
    exception ``ended`` it, else ``interrupted``, ``early_stopped``, ``finished`` or
    ``paused`` as ``result`` says."""
    if ended is not None:
        return "aborted" if isinstance(ended, KeyboardInterrupt) else "failed"
    if result is None:
        raise ValueError("a run that no exception ended needs its result to say how")
    return ("interrupted" if result.interrupted else "early_stopped"
            if result.early_stopped else "finished" if result.step >= steps
            else "paused")


def end_fields(result: TrainResult, ended: BaseException | None, steps: int
               ) -> dict[str, str | None]:
    """``metrics.json``'s ``status`` (:func:`end_status`) and ``error``: the exception
    that ended a failed run, else null (an aborted run did not fail: its status says
    it was aborted)."""
    failed = ended is not None and not isinstance(ended, KeyboardInterrupt)
    return {"status": end_status(result, ended, steps),
            "error": f"{type(ended).__name__}: {ended}" if failed else None}


def previous_summary(path: Path) -> dict[str, Any] | None:
    """The ``metrics.json`` at ``path``; None when there is none or it cannot be read (a new
    summary is then written whole)."""
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def final_summary(result: TrainResult, ended: BaseException | None, opts: TrainOptions, *,
                  graded_loss: bool, world_size: int, run_dir: Path,
                  resumed: bool) -> dict[str, Any]:
    """What ``metrics.json`` in ``run_dir`` holds at the end of a run: its figures
    (:func:`run_summary`) and its ending (:func:`end_fields`); a resume (``resumed``) that ran
    no step keeps the figures of the summary it finds (:func:`previous_summary`), with its own
    ending, when that summary is of the step it resumed at. Those of another step are not its
    own: a new run's, in the folder of one that ended before its first checkpoint, or a
    summary past the step resumed at (its checkpoint was damaged)."""
    ending = end_fields(result, ended, opts.steps)
    previous = (previous_summary(run_dir / "metrics.json")
                if resumed and not result.losses else None)
    if previous is not None and previous.get("step") != result.step:
        previous = None
    if previous is None:
        return {**run_summary(result, opts, graded_loss=graded_loss, world_size=world_size),
                **ending}
    return {**previous, **ending, "interrupted": result.interrupted}


def resume_message(step: int, steps: int, checkpoint: Path, command: str | None,
                   run_dir: Path) -> str:
    """What an interrupted run prints: the step it stopped at, its ``checkpoint`` and how to
    resume (``command``; by default through the Python API, from ``run_dir``)."""
    command = command or (
        f"Trainer(...).fit(resume_from={str(run_dir)!r})"
    )
    return (
        f"interrupted at step {step}/{steps}; checkpoint saved in "
        f"{checkpoint}\nresume with: {command}"
    )
