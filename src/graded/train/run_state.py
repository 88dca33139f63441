"""The trainer's run state: what a checkpoint and ``config.yaml`` hold, the save of a checkpoint
(every rank's RNG state gathered to rank 0), and resuming (:meth:`RunState.prepare_resume`;
a trainer whose model is no longer as built refuses a fit that would start a new run from it).

:class:`RunState` is mixed into :class:`~graded.train.trainer.Trainer`, as
:class:`~graded.train.step.OptimizerStep` is: its methods read the model, optimizer, scheduler,
options and run folder the trainer built.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from graded.kinds import TaskKind
from graded.train import distributed as D
from graded.train.checkpoint import CheckpointManager
from graded.train.data import StepSampler
from graded.train.options import TrainOptions
from graded.train.preflight import check_resume_from
from graded.train.recipes import Recipe
from graded.train.resume import ResumePlan, plan_resume
from graded.train.runs import RunError, RunFolder, run_view
from graded.train.state_tensors import (
    capture_rng_state,
    jsonable,
    rng_state_from_bytes,
    rng_state_to_bytes,
)
from graded.train.stopping import Stopper

__all__ = ["RunState"]


#: The attribute a trainer sets on a model it trained or loaded a checkpoint into
#: (:meth:`RunState._mark_model`).
TRAINED_MARK = "_graded_trained"


class RunState:
    """The checkpointed state of a run and its resume, mixed into
    :class:`~graded.train.trainer.Trainer`, which sets the attributes below."""

    model: torch.nn.Module
    kind: TaskKind
    opts: TrainOptions
    ctx: D.DistContext
    recipe: Recipe | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler | None
    sampler: StepSampler
    checkpoints: CheckpointManager
    run: RunFolder
    run_dir: Path
    seed: int
    config: dict[str, Any]
    _plan: ResumePlan | None
    _holds: str | None
    _finish_recipe: Callable[[], None]  # OptimizerStep's

    def _state(self, step: int, stopper: Stopper) -> dict[str, Any]:
        return {
            "step": step,
            "seed": self.seed,
            "kind": self.kind.name,
            "data_position": {"epoch": step // self.sampler.steps_per_epoch,
                              "batch": step % self.sampler.steps_per_epoch},
            "scheduler": self.scheduler.state_dict(),  # lr_lambdas are plain functions: None
            "grad_scaler": None if self.scaler is None else self.scaler.state_dict(),
            "stopper": stopper.to_state(),
            "options": self.opts.model_dump(mode="json"),
            "config": self.run_config(),
        }

    def _save(self, step: int, stopper: Stopper, *, is_best: bool = False) -> Path | None:
        self._finish_recipe()  # the saved optimizer state has the bounded grade learning rate
        rng = None  # one process: save_checkpoint takes its own
        if self.ctx.distributed:  # every rank's RNG state, by rank, to rank 0
            sent = D.gather_bytes(self.ctx, rng_state_to_bytes(capture_rng_state()))
            rng = [rng_state_from_bytes(data) for data in sent or ()]
        path = None
        if self.ctx.is_main:
            path = self.checkpoints.save(
                step, self.model, self.optimizer, self._state(step, stopper),
                is_best=is_best, metric=stopper.best, rng=rng,
            )
        D.barrier(self.ctx)
        return path

    def run_config(self) -> dict[str, Any]:
        """What ``config.yaml`` holds and every checkpoint stores: the caller's ``config`` (from
        :mod:`graded.config` a ``RunConfig`` dump) with the options in use; without one, what
        the trainer knows: task kind, seed, recipe, the model's config and the options."""
        options = self.opts.model_dump(mode="json")
        if self.config:
            return {**self.config, "train": options}
        to_dict = getattr(getattr(self.model, "config", None), "to_dict", None)
        model = jsonable(to_dict()) if callable(to_dict) else {"class": type(self.model).__name__}
        recipe = getattr(self.recipe, "name", type(self.recipe).__name__) if self.recipe else None
        return {"kind": self.kind.name, "seed": self.seed, "recipe": recipe, "model": model,
                "train": options}

    def prepare_resume(self, source: str | Path) -> ResumePlan:
        """Check and load all that resuming from ``source`` (a run folder or a checkpoint folder)
        needs, writing nothing (:func:`graded.train.resume.plan_resume`): a config key that
        cannot change raises RunError, no intact checkpoint CheckpointError. A refusal leaves
        the trainer as it was (its checks all run before anything is loaded: a fit without
        ``resume_from`` of a trainer as built still starts a new run), unless torch's loading
        itself failed part way, after which only a completed resume may train. The CLI calls it
        as its preflight; ``fit(resume_from=source)`` then starts from this plan. ``source``
        is checked as ``fit``'s ``resume_from`` is (:func:`~graded.train.preflight.
        check_resume_from`: a path that exists, not empty)."""
        if source is None:
            raise TypeError("prepare_resume: source must be a path (str or Path) to a run "
                            "folder or one of its checkpoints, got None")
        source = check_resume_from(source)
        now = run_view(self.run_config(), options=self.opts.model_dump(mode="json"),
                       seed=self.seed, kind=self.kind.name)
        loading: list[Path] = []
        try:
            plan = plan_resume(source, self.model, self.optimizer, self.scheduler, now,
                               loading=loading.append, run=self.run)
        except BaseException:
            # refused before loading (every check runs first): the model, optimizer and
            # scheduler are as they were, and so is what they hold (as built, or an earlier
            # plan); refused while loading: neither a fit nor an earlier plan may start from
            # what it left
            if loading:
                self._holds, self._plan = f"what a resume from {loading[-1]} loaded", None
            raise
        self._holds = f"checkpoint {plan.checkpoint} (step {plan.step})"
        self._mark_model(self._holds)
        self._plan = plan
        return plan

    def _mark_model(self, holds: str) -> None:
        """Note on the model itself what it holds besides its state as built (a run's
        training, a loaded checkpoint): a new Trainer given this model then says its run starts
        from those weights (:meth:`_trained_elsewhere`)."""
        self.model.__dict__[TRAINED_MARK] = f"{holds} of run {self.run_dir}"

    def _trained_elsewhere(self) -> str | None:
        """For a new run of this trainer: the warning that its model holds what another
        trainer's run left (:meth:`_mark_model`), so the run starts from those weights and not
        from the initialisation its config records; None for a model as built."""
        held = self.model.__dict__.get(TRAINED_MARK)
        if held is None:
            return None
        return (f"the model given to this Trainer holds {held}: this run starts from those "
                "weights, not from the initialisation its config.yaml records, so what is "
                "rebuilt from that config (a rerun, the initial model of `graded report`) has "
                "other weights; build a freshly initialised model for a run its config "
                "reproduces, or continue the earlier run with fit(resume_from=...)")

    def _refuse_reuse(self) -> None:
        """Refuse a fit without ``resume_from`` once the model and optimizer are no longer as
        built: it would start a new run at step 0 (its schedule, logs and checkpoints anew)
        from weights and optimizer state that another run or a checkpoint left."""
        if self._holds is None:
            return
        source = self.run_dir if self._plan is None else self._plan.source  # a plan not yet run
        raise RunError(
            f"this Trainer's model and optimizer already hold {self._holds}, so fit() without "
            "resume_from would start a new run at step 0 from that state, mixing two runs; "
            f"continue the run with fit(resume_from={str(source)!r}), or build a new Trainer "
            "with a freshly initialised model for a new run")
