"""The training loop: AdamW with a recipe's parameter groups, exact resume, Ctrl-C, DDP.

One :class:`Trainer` drives any model of a task kind of :mod:`graded.kinds` (the morphic models
through their ``training_loss``). What it does at each optimizer step (000 Algorithms 5.1
and 7.1 when a graded recipe is chosen):

1. take the step's global batch (a pure function of ``(seed, step)``, :mod:`graded.train.data`),
   this rank's share of it, split into ``grad_accum`` micro-batches;
2. accumulate gradients of the step's loss, the mean over all its items (tokens, rows or
   elements) on every rank (:meth:`Trainer._train_step`), under a graded recipe each item
   weighted by w(q) of its grade, the graded loss of 000 Def 5.37 / 7.1 (the grades from
   ``kind.loss_grades``, the weights from ``recipe.loss_weights``; which grades:
   :mod:`graded.train.recipes`), plus ``recipe.regularization(model)`` once (DDP syncs on the
   last micro-batch);
   Forward passes run under autocast with ``precision`` bf16 or fp16 (parameters, optimizer
   state, the loss sum and evaluation stay fp32); fp16 scales the loss with a gradient scaler
   (its state is checkpointed); ``compile`` wraps the training module in ``torch.compile``;
3. clip the gradient norm (unscaled first under fp16), step AdamW (skipped by the scaler when
   fp16 gradients are not finite) and the learning-rate schedule (which counts the trainer's
   steps, a skipped one included);
4. call ``recipe.start_step`` (λ annealing now; the grade learning-rate bound, from q_max
   copied to the host without waiting, applied before the next optimizer step or a save);
   what it returns is logged with the next step (``recipe.on_step`` prepares the first). A
   step is logged with what it ran with: the learning rate of its optimizer step (not the
   next one, which the scheduler has set by then), its λ, bound and grade learning rate;
5. every ``log_every`` steps log scalars and grades; every ``eval_every`` steps evaluate, keep
   the best checkpoint and apply early stopping.

A step's loss, gradient norm and metrics stay on the device until the trainer needs them: it
reads every step since its last read in one transfer at a log step, before an evaluation or a
checkpoint, and at the end (a non-finite loss then raises ``FloatingPointError`` naming its
step, before anything more is saved). The training data are checked once, when the trainer is
built (token ids against the model's vocabulary, token grades: ``TaskKind.check_data``; the
evaluation data too), and the steps run inside :func:`graded.checks.checked_inputs`. So with
plain AdamW a step never waits for a GPU, and the host queues the next step while the device
computes this one; a graded recipe's bound waits, before the next optimizer step, for a copy
the device made right after this one; fp16's gradient scaler reads whether the gradients are
finite.

Resuming from a checkpoint restores the model, optimiser, scheduler, RNG states (each rank's
own) and step, so on CPU with the same seed the losses after resuming equal those of an
uninterrupted run. SIGINT or SIGTERM finishes the current step (under torchrun the next one too:
the ranks agree on stopping one step late, :class:`~graded.train.distributed.StopVote`), writes a
checkpoint and returns with ``interrupted=True`` and a message naming the resume command (a
second Ctrl-C aborts at once).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import json
import math
import random
import sys
import time
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from graded.checks import checked_inputs
from graded.kinds import TaskKind, as_kind
from graded.train import distributed as D
from graded.train.checkpoint import CheckpointManager
from graded.train.data import StepSampler, dataset_size, to_device
from graded.train.logging import RunLogger
from graded.train.objectives import evaluate
from graded.train.optim import param_groups
from graded.train.options import TrainOptions, monitor_mode_of
from graded.train.recipes import Recipe, get_recipe
from graded.train.resume import ResumePlan, plan_resume
from graded.train.runs import RunFolder, open_run, refuse_search_run, run_view
from graded.train.schedules import make_scheduler
from graded.train.signals import StopSignals
from graded.train.state_tensors import (
    capture_rng_state,
    jsonable,
    restore_rng_state,
    rng_state_from_bytes,
    rng_state_to_bytes,
)
from graded.train.stopping import Stopper
from graded.transformer.graded import held_gradings


@dataclass
class TrainResult:
    """What :meth:`Trainer.fit` returns."""

    step: int
    losses: list[float] = field(default_factory=list)  # training loss of each step run here
    final_eval: dict[str, float] = field(default_factory=dict)
    best_metric: float | None = None
    best_checkpoint: Path | None = None
    last_checkpoint: Path | None = None
    interrupted: bool = False
    early_stopped: bool = False
    elapsed_s: float = 0.0


@dataclass
class _StepValues:
    """What an optimizer step leaves on the device, read with others in one transfer
    (:meth:`Trainer._read`): the trainer waits for the GPU only where it needs the values."""

    step: int  # the global step number, counted from 1
    total: torch.Tensor  # this rank's summed loss
    count: int  # the step's items over all ranks
    grad_norm: torch.Tensor
    extra: dict[str, torch.Tensor | float]  # the kind's metrics, this rank's share
    lr: float
    recipe: Callable[[], dict[str, float]]  # the recipe's values (Recipe.start_step)
    regularization: torch.Tensor | None


def _no_values() -> dict[str, float]:
    """What a run without a recipe logs of it."""
    return {}


class _StopSignal(StopSignals):
    """Turns SIGINT/SIGTERM into a flag checked between steps; a second SIGINT aborts."""

    def on_signal(self, signum: int, first: bool) -> None:
        if self.aborted:
            raise KeyboardInterrupt
        if first:
            print("\nstopping: finishing the current step and writing a checkpoint "
                  "(Ctrl-C again to abort without saving)", file=sys.stderr, flush=True)


#: The autocast dtype of each ``TrainOptions.precision`` (None: no autocast).
AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
#: torch's warning when a scheduler steps before its optimizer first has (a skipped fp16 step).
_SCHEDULE_BEFORE_OPTIMIZER = (r"Detected call of `lr_scheduler\.step\(\)` before "
                              r"`optimizer\.step\(\)`")


def _close_at_exit(trainer: weakref.ref, ctx: D.DistContext) -> None:
    """At interpreter exit: close the trainer if it is alive, else leave its process group."""
    alive = trainer()
    if alive is not None:
        alive.close()
    else:
        D.teardown(ctx)


class Trainer:
    """Train ``model`` on ``train_data`` and evaluate on ``eval_data`` (dicts of tensors).

    Parameters: ``kind`` is a task kind of :mod:`graded.kinds`, or its name ("lm",
    "classification", "regression", "seq2seq"; the morphic LM kind for a morphic model);
    ``options`` a :class:`TrainOptions`; ``run_dir`` the run folder (created); ``seed`` fixes
    initial RNG state and data order; ``recipe`` a recipe name or a
    :class:`~graded.train.recipes.Recipe` (None = plain AdamW; subclass it for a recipe of your
    own);
    ``output_grades`` the task's grades of its output coordinates (``Task.output_grades``: one
    per target column or class), which a graded recipe's loss weights (a run without the
    grades its kind's graded loss needs trains on the plain loss and says so once:
    ``plain_loss_note``, a ``RuntimeWarning`` and a ``warning`` event in ``history.jsonl``);
    ``config`` a JSON-able dict saved in every checkpoint and as ``config.yaml``
    (:meth:`run_config`); ``resume_command`` the command printed after an interruption (default:
    how to resume through the Python API); ``overwrite`` lets :meth:`fit` replace a run already
    in ``run_dir`` (only what the library wrote there is removed). Building a trainer writes
    nothing; ``self.run`` is the run folder's lock, manifest and history
    (:class:`~graded.train.runs.RunFolder`).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        train_data: Mapping[str, torch.Tensor],
        eval_data: Mapping[str, torch.Tensor] | None,
        *,
        kind: str | TaskKind,
        options: TrainOptions | None = None,
        run_dir: str | Path,
        seed: int = 0,
        recipe: str | Recipe | None = None,
        output_grades: Sequence[float] | torch.Tensor | None = None,
        config: dict[str, Any] | None = None,
        resume_command: str | None = None,
        overwrite: bool = False,
    ) -> None:
        self.kind = as_kind(kind, model)
        self.opts = options or TrainOptions()
        self.run_dir = Path(run_dir)
        self.seed = seed
        self.config = config or {}
        self.resume_command = resume_command
        self.train_data = dict(train_data)
        self.eval_data = dict(eval_data) if eval_data is not None else None
        dataset_size(self.train_data)
        try:  # the inputs and targets a step reads
            self.kind.check_batch(self.train_data)
        except ValueError as exc:
            raise ValueError(f"training data: {exc}") from None
        self._check_options()
        self.ctx = D.setup(self.opts.device)
        self.model = model.to(self.ctx.device)
        self.recipe = get_recipe(recipe) if isinstance(recipe, str) else recipe
        if self.recipe is not None:
            self.recipe.check(self.model)
        self.output_grades = (None if output_grades is None else
                              torch.as_tensor(output_grades, dtype=torch.float32,
                                              device=self.ctx.device))
        self.plain_loss_note: str | None = None
        self.graded_loss = self._graded_loss_applies()
        self.optimizer = torch.optim.AdamW(
            self._param_groups(), lr=self.opts.lr, betas=self.opts.betas, eps=self.opts.eps
        )
        self.scheduler = make_scheduler(
            self.optimizer, self.opts.schedule, warmup_steps=self.opts.warmup_steps,
            total_steps=self.opts.steps, min_ratio=self.opts.min_lr_ratio,
        )
        # the training data checked once here: the steps then read no input values
        self.inputs_checked = self.kind.check_data(self.model, self.train_data)
        self._check_eval_data()
        self.step_module = D.wrap_model(self.kind.training_module(self.model), self.ctx)
        self._close_at_exit: Callable[[], None] | None = None
        if self.ctx.distributed:  # a script that never calls close() still leaves safely
            self._close_at_exit = functools.partial(_close_at_exit, weakref.ref(self), self.ctx)
            atexit.register(self._close_at_exit)
        if self.opts.compile:
            self.step_module = torch.compile(self.step_module)
        self.autocast_dtype = AUTOCAST_DTYPES[self.opts.precision]
        # made once: entering and leaving it is all a step needs (off for fp32)
        self._autocast = torch.autocast(self.ctx.device.type, dtype=self.autocast_dtype,
                                        enabled=self.autocast_dtype is not None)
        self.scaler = (torch.amp.GradScaler(self.ctx.device.type)
                       if self.opts.precision == "fp16" else None)
        # whether the schedule's next step may be its first after a skipped optimizer step
        self._quiet_schedule_step = self.scaler is not None
        self.sampler = StepSampler(
            dataset_size(self.train_data), self.opts.batch_size, seed=seed,
            grad_accum=self.opts.grad_accum, world_size=self.ctx.world_size, rank=self.ctx.rank,
        )
        self.checkpoints = CheckpointManager(self.run_dir / "checkpoints", self.opts.keep_last)
        self.overwrite = overwrite
        self.run = RunFolder(self.run_dir, writer=self.ctx.is_main)
        self._plan: ResumePlan | None = None
        # the recipe's values of the next step: what its last on_step or start_step prepared
        self._recipe_values: Callable[[], dict[str, float]] = _no_values

    def _check_options(self) -> None:
        """Options the kind and the evaluation data must agree with, checked before anything
        is written: ``monitor`` is a name the evaluation reports (otherwise the first
        evaluation would fail after training), and the kind takes ``label_smoothing``."""
        self.kind.check_options(label_smoothing=self.opts.label_smoothing)
        if self.eval_data is None:
            return
        monitor, mode = self.opts.monitor, self.opts.monitor_mode
        names = self.kind.report_names(self.eval_data)
        if monitor not in names:
            raise ValueError(f"train.monitor={monitor!r} is not reported by the evaluation of "
                             f"this {self.kind.name} run; expected one of {', '.join(names)}")
        better = monitor_mode_of(monitor)
        if better is not None and better != mode:
            warnings.warn(
                f"train.monitor_mode={mode!r} with train.monitor={monitor!r}: the best "
                f"checkpoint is the one with the {'lowest' if mode == 'min' else 'highest'} "
                f"{monitor}, though a {'larger' if better == 'max' else 'smaller'} one is "
                f"better (monitor_mode: {better}, the default for {monitor})", RuntimeWarning,
                stacklevel=3)

    def _check_eval_data(self) -> None:
        """The evaluation data checked as the training data are, when the trainer is built:
        a bad evaluation set would otherwise fail only at the first evaluation, after
        ``eval_every`` steps that no checkpoint holds yet."""
        if self.eval_data is None:
            return
        try:
            if dataset_size(self.eval_data) == 0:  # would fail the first evaluation
                raise ValueError(
                    f"no examples (tensors {sorted(self.eval_data)} have 0 rows); expected at "
                    "least one to evaluate, or eval_data=None for a run without evaluation")
            self.kind.check_batch(self.eval_data)
            self.kind.check_data(self.model, self.eval_data)
        except ValueError as exc:
            raise ValueError(f"evaluation data: {exc}") from None

    def _graded_loss_applies(self) -> bool:
        """Whether the steps minimise the recipe's graded loss: the recipe asks for it and the
        loss items have grades, checked here on all the training data (bad output grades or
        negative weights fail now). Where they have none, ``plain_loss_note`` says so."""
        recipe = self.recipe
        if recipe is None or not recipe.uses_graded_loss:
            return False
        grades = self.kind.loss_grades(self.train_data, self.output_grades)
        if grades is None:
            self.plain_loss_note = (
                f"recipe {recipe.name!r}: the {self.kind.name} loss is graded by "
                f"{self.kind.grades_source}, and this run has none, so it trains on the plain "
                "loss, not the graded loss of 000 Def 5.37 / 7.1 (the recipe option "
                "graded_loss: false asks for the plain loss without this warning)")
            return False
        recipe.check_loss_grades(self.model, grades)
        return True

    def _param_groups(self) -> list[dict]:
        o = self.opts
        if self.recipe is None:
            return param_groups(self.model, o.weight_decay)
        return self.recipe.param_groups(
            self.model, lr=o.lr, weight_decay=o.weight_decay, grade_lr=o.grade_lr
        )

    # ----------------------------------------------------------------- state

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
        cannot change raises RunError, no intact checkpoint CheckpointError. The CLI calls it
        as its preflight; ``fit(resume_from=source)`` then starts from this plan."""
        now = run_view(self.run_config(), options=self.opts.model_dump(mode="json"),
                       seed=self.seed, kind=self.kind.name)
        self._plan = plan_resume(source, self.model, self.optimizer, self.scheduler, now)
        return self._plan

    # ----------------------------------------------------------------- loop

    def _train_step(self, step: int) -> tuple[_StepValues, int]:
        """One optimizer step; its objective is the mean loss over every item (token, row or
        element) of the global batch, however it is split into ranks and micro-batches.
        Returns the step's values, still on the device, and its input items."""
        self.optimizer.zero_grad(set_to_none=True)
        micro = [{name: t[idx] for name, t in self.train_data.items()}
                 for idx in self.sampler.micro_batches(step)]
        counts = [self.kind.loss_count(host_batch) for host_batch in micro]
        # the step's item count comes first (it scales every micro-batch's loss); it reads only
        # the targets of the global batch, which every rank knows, on the host: no collective
        # (on one process without accumulation the global batch is the one micro-batch)
        if len(micro) == 1 and self.ctx.world_size == 1:
            count = max(counts[0], 1)
        else:
            targets = self.train_data["targets"][self.sampler.global_indices(step)]
            count = max(self.kind.loss_count({"targets": targets}), 1)
        scale = self.ctx.world_size / count  # × world_size undoes DDP's mean over ranks
        total = torch.zeros((), device=self.ctx.device)
        reg_total = None
        extra: dict[str, torch.Tensor | float] = {}
        items = 0
        for i, (host_batch, part_count) in enumerate(zip(micro, counts, strict=True)):
            items += self.kind.count_items(host_batch)  # on the host: no wait for the device
            batch = to_device(self.kind.drop_empty_padding(host_batch), self.ctx.device)
            last = i == len(micro) - 1
            sync = contextlib.nullcontext()
            if self.ctx.distributed and not last:
                sync = self.step_module.no_sync()
            trusted = checked_inputs(self.inputs_checked)
            with sync, trusted:
                weights = None
                if self.graded_loss:
                    weights = self.recipe.loss_weights(
                        self.model, self.kind.loss_grades(batch, self.output_grades))
                with self._autocast:
                    part = self.kind.loss(self.step_module, batch,
                                          label_smoothing=self.opts.label_smoothing,
                                          weights=weights, count=part_count)
                objective = part.total.float() * scale
                if self.recipe is not None and last:  # a function of the weights: once a step
                    reg = self.recipe.regularization(self.model)
                    objective = objective + reg
                    reg_total = torch.as_tensor(reg).detach()
                (objective if self.scaler is None else self.scaler.scale(objective)).backward()
            total += part.total.detach()
            for k, v in part.metrics.items():
                extra[k] = extra.get(k, 0.0) + v * part.count / count
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        clip = self.opts.clip_norm if self.opts.clip_norm is not None else float("inf")
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip)
        self._finish_recipe()  # the grade learning rate of this step, bounded after the last
        # what this step runs with, logged as its values: the learning rate (the scheduler's
        # step below sets the next step's) and the recipe's λ, bound and grade learning rate
        lr = self.optimizer.param_groups[0]["lr"]
        recipe = self._recipe_values
        if self.scaler is None:
            self.optimizer.step()
        else:  # skips the step when the unscaled gradients are not finite
            self.scaler.step(self.optimizer)
            self.scaler.update()
        self._step_schedule()
        if self.recipe is not None:  # bounds the next step's grade learning rate
            self._recipe_values = self._recipe_pending = self.recipe.start_step(
                self.model, self.optimizer, step + 1, self.opts.steps)
        values = _StepValues(step + 1, total, count, grad_norm.detach(), extra, lr, recipe,
                             reg_total)
        return values, items * self.ctx.world_size

    def _step_schedule(self) -> None:
        """Advance the learning-rate schedule by one trainer step, taken or skipped: a step the
        fp16 gradient scaler skips (gradients not finite) still counts, so the rate of step s
        is the schedule's formula at s whatever was skipped before it. torch warns when a
        scheduler's first step comes before any optimizer step, which a skipped first step
        is; that warning says nothing wrong here and is silenced, for the schedule's first
        step only (entering ``warnings.catch_warnings`` every step would show warnings issued
        once per place again)."""
        if not self._quiet_schedule_step:
            self.scheduler.step()
            return
        self._quiet_schedule_step = False
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_SCHEDULE_BEFORE_OPTIMIZER,
                                    category=UserWarning)
            self.scheduler.step()

    def _finish_recipe(self) -> None:
        """Apply what the recipe's last ``start_step`` prepared (the grade learning-rate
        bound): before an optimizer step and before the optimizer's state is saved."""
        if self._recipe_pending is not None:
            self._recipe_pending()
            self._recipe_pending = None

    _recipe_pending: Callable[[], dict[str, float]] | None = None

    def _read(self, window: list[_StepValues]) -> list[tuple[float, dict[str, float]]]:
        """The loss and scalars of each step of ``window``, read in one transfer (the losses
        and metrics summed over the ranks in one collective); FloatingPointError naming the
        first step whose loss is not finite."""
        if not window:
            return []
        keys = list(window[0].extra)
        with torch.no_grad():
            summed = torch.stack([self._column([w.total for w in window]),
                                  *(self._column([w.extra[k] for w in window]) for k in keys)],
                                 dim=1)
            summed = D.sum_tensor_across(self.ctx, summed)
            own = torch.stack([self._column([w.grad_norm for w in window]), self._column(
                [w.regularization if w.regularization is not None else 0.0 for w in window])],
                dim=1)
            rows = torch.cat([summed, own], dim=1).tolist()
        out = []
        for w, row in zip(window, rows, strict=True):
            loss = row[0] / w.count
            if not math.isfinite(loss):
                clip = ("enable clip_norm" if self.opts.clip_norm is None else
                        f"a smaller clip_norm (now {self.opts.clip_norm})")
                raise FloatingPointError(
                    f"training loss became {loss} at step {w.step}; lower lr (now "
                    f"{self.opts.lr}) or {clip}")
            scalars = {"loss": loss, "grad_norm": row[1 + len(keys)], "lr": w.lr,
                       **dict(zip(keys, row[1:1 + len(keys)], strict=True))}
            if self.recipe is not None:
                scalars["regularization"] = row[2 + len(keys)]
            scalars.update(w.recipe())
            out.append((loss, scalars))
        window.clear()
        return out

    def _column(self, values: list[torch.Tensor | float]) -> torch.Tensor:
        """One scalar of every step of a window as a float32 vector on the device: one stack
        of the 0-d tensors the steps left (loss sums, gradient norms), one tensor of numbers,
        else each value converted (the same float32 values in every case)."""
        device = self.ctx.device
        first = values[0]
        if isinstance(first, torch.Tensor):
            if all(isinstance(v, torch.Tensor) and v.dim() == 0 and v.device == first.device
                   and v.dtype == first.dtype for v in values):
                return torch.stack(values).to(device=device, dtype=torch.float32)
        elif all(isinstance(v, float) for v in values):
            return torch.tensor(values, dtype=torch.float32, device=device)
        return torch.stack([torch.as_tensor(v, dtype=torch.float32, device=device).reshape(())
                            for v in values])

    def _observe(self, value: float, step: int, stopper: Stopper) -> bool:
        """Count the evaluation of ``step`` (its monitored ``value``); return whether its
        checkpoint is the new best: strictly better than any before, whatever
        ``early_stopping.min_delta``, which counts only for the patience
        (:mod:`graded.train.stopping`)."""
        es = self.opts.early_stopping
        return stopper.observe(value, step, mode=self.opts.monitor_mode,
                               min_delta=es.min_delta if es is not None else 0.0)

    def _stopped_early(self, stopper: Stopper) -> bool:
        """Whether ``early_stopping.patience`` evaluations in a row brought no improvement."""
        es = self.opts.early_stopping
        return stopper.stopped(es.patience if es is not None else None)

    def evaluate(self) -> dict[str, float]:
        """Metrics of the current model on the evaluation data (every rank computes them)."""
        if self.eval_data is None:
            return {}
        return evaluate(self.model, self.eval_data, self.kind,
                        batch_size=self.opts.eval_batch_size, device=self.ctx.device)

    def fit(
        self, resume_from: str | Path | None = None, *, pause_after: int | None = None
    ) -> TrainResult:
        """Train to ``options.steps`` (from a checkpoint or run folder if ``resume_from``).

        ``pause_after`` stops after that global step with a checkpoint, as an interruption
        would (for time-sliced jobs); the schedule still spans ``options.steps``.

        The run folder is locked for the call (a second writer gets RunLockedError). A resume
        is checked in full (:meth:`prepare_resume`) before anything is written; without
        ``resume_from``, or with one of another folder, a folder that holds checkpoints is
        refused (RunError) unless the trainer was built with ``overwrite=True``; a folder that
        holds a search run of :mod:`graded.search` is refused (RunError) before the lock file
        is written. See :mod:`graded.train.runs`.
        """
        refuse_search_run(self.run_dir)
        with self.run.lock():
            plan = None
            if resume_from is not None:
                plan = self._plan
                if plan is None or plan.source != Path(resume_from):
                    plan = self.prepare_resume(resume_from)
                self._plan = None
            open_run(self.run, self.run_config(), plan, overwrite=self.overwrite,
                     existing=bool(self.checkpoints.folders()),
                     entries=("metrics.csv", "grades.jsonl", "metrics.json", "checkpoints",
                              "history.jsonl", *(("tensorboard",) if self.opts.tensorboard
                                                 else ())))
            if self.plain_loss_note is not None and self.ctx.is_main:
                warnings.warn(self.plain_loss_note, RuntimeWarning, stacklevel=2)
                self.run.append_history("warning", message=self.plain_loss_note)
            try:
                result = self._loop(plan, pause_after)
            except BaseException as exc:  # the history says how the run ended, as metrics.json
                self.run.append_history("end", status=self._end_status(None, exc),
                                        error=f"{type(exc).__name__}: {exc}")
                raise
            self.run.append_history("end", step=result.step, status=self._end_status(result, None))
        return result

    def _loop(self, plan: ResumePlan | None, pause_after: int | None) -> TrainResult:
        start, stopper = 0, Stopper()
        if plan is not None:
            start, stopper = plan.step, replace(plan.stopper)  # the plan's own is left as read
            restore_rng_state(*plan.rng, rank=self.ctx.rank)
            if self.ctx.is_main:  # best.json of a newer (skipped, damaged) checkpoint: rewound
                self.checkpoints.rewind_best(start, stopper.best)
            if self.scaler is not None and plan.grad_scaler:
                self.scaler.load_state_dict(plan.grad_scaler)
        else:
            torch.manual_seed(self.seed)
            random.seed(self.seed)
            np.random.seed(self.seed % 2**32)
        main = self.ctx.is_main
        logger = RunLogger(self.run_dir, enabled=main, tensorboard=self.opts.tensorboard,
                           resume_step=start if plan is not None else None)
        result = TrainResult(step=start, best_metric=stopper.best)
        total = self.opts.steps
        bar = _progress(total, start, enabled=main and self.opts.progress)
        began = time.perf_counter()
        tok_window, t_window = 0, time.perf_counter()
        window: list[_StepValues] = []  # steps whose values are still on the device
        step = start
        saved_at = start if plan is not None else -1
        ended: BaseException | None = None  # the exception that ended the run, if one did
        self.model.train()
        if self.recipe is not None:
            # Prepares step start+1 (λ annealing, grade-lr bound); idempotent after a resume,
            # where it restores λ, which may not be part of the model state.
            prepared = self.recipe.on_step(self.model, self.optimizer, start, total)
            self._recipe_values = lambda: prepared
        if start == 0 and main:
            logger.grades(0, self.model)
        # a run that stopped early resumes stopped: the uninterrupted run ends here too (a
        # larger early_stopping.patience, or none, continues it)
        result.early_stopped = self._stopped_early(stopper)
        try:
            vote = D.StopVote(self.ctx)  # a stop agreed by every rank, one step late
            with _StopSignal() as stop, held_gradings(self.model):
                while step < total and not result.early_stopped:
                    if pause_after is not None and step >= pause_after:
                        break
                    if vote(stop.flag):
                        result.interrupted = True
                        break
                    values, items = self._train_step(step)
                    step += 1
                    window.append(values)
                    tok_window += items
                    evaluates = self.eval_data is not None and (
                        step % self.opts.eval_every == 0 or step == total)
                    saves = bool(self.opts.checkpoint_every) and (
                        step % self.opts.checkpoint_every == 0)
                    if step % self.opts.log_every == 0 or step == total or evaluates or saves:
                        read = self._read(window)  # the one wait for the device
                        result.losses += [loss for loss, _ in read]
                    if step % self.opts.log_every == 0 or step == total:
                        loss, scalars = read[-1]
                        now = time.perf_counter()
                        scalars["tokens_per_s"] = tok_window / max(now - t_window, 1e-9)
                        tok_window, t_window = 0, now
                        logger.scalars(step, "train", scalars)
                        logger.grades(step, self.model)
                        # drawn by the update below, at most every mininterval (0.1 s)
                        bar.set_postfix(loss=f"{loss:.4f}",
                                        tok_s=f"{scalars['tokens_per_s']:.0f}", refresh=False)
                    bar.update(1)
                    paused = time.perf_counter()
                    if evaluates:
                        metrics = self.evaluate()
                        logger.scalars(step, "eval", metrics)
                        result.final_eval = metrics
                        best = self._observe(metrics[self.opts.monitor], step, stopper)
                        result.best_metric = stopper.best
                        if best or (self.opts.checkpoint_every is None):
                            result.last_checkpoint = self._save(step, stopper, is_best=best)
                            saved_at = step
                        if self._stopped_early(stopper):
                            result.early_stopped = True
                            break
                    if self.opts.checkpoint_every and step % self.opts.checkpoint_every == 0 \
                            and saved_at != step:
                        result.last_checkpoint = self._save(step, stopper)
                        saved_at = step
                    t_window += time.perf_counter() - paused  # tokens/s excludes eval and I/O
                vote.close()
                # still under the handler: a first signal during the last save lets it finish
                result.losses += [loss for loss, _ in self._read(window)]  # before any save
                if saved_at != step:
                    result.last_checkpoint = self._save(step, stopper)
                # a signal after the last step of a pause (during that step or the save) asked
                # for a stop the pause would otherwise absorb: a loop that resumes paused runs
                # must see it (one process; under torchrun only the ranks' vote is reported)
                if stop.flag and not self.ctx.distributed and step < total \
                        and not result.early_stopped:
                    result.interrupted = True
        except BaseException as exc:  # metrics.json says the run was aborted or failed, and why
            if isinstance(exc, KeyboardInterrupt):  # a second Ctrl-C: stopped, no checkpoint
                result.interrupted = True
            ended = exc
            raise
        finally:
            bar.close()
            result.step = step
            result.elapsed_s = time.perf_counter() - began
            if main:
                result.best_checkpoint = self.checkpoints.best()
                ending = self._end_fields(result, ended)
                previous = None if result.losses else _read_summary(self.run_dir / "metrics.json")
                if previous is None:
                    logger.summary({**self._summary(result), **ending})
                else:  # a resume that ran no step keeps the figures, with its own ending
                    logger.summary({**previous, **ending, "interrupted": result.interrupted})
            logger.close()
        if result.interrupted and main:
            print(self._resume_message(step), file=sys.stderr, flush=True)
        return result

    def close(self) -> None:
        """Leave the process group this trainer joined (under torchrun); call once at the end.

        The DDP wrapper goes first, while the process group is still registered: its C++
        reducer holds the group and is freed with the GIL held, so were it the group's last
        holder, the gloo group's destructor would join its worker threads under the GIL while
        one of them waits for the GIL to free a finished collective's tensors (a hang at exit,
        seen once in about 45 two-process launches). The group is then destroyed by
        ``destroy_process_group``, whose Python binding frees it without the GIL. Under
        torchrun a trainer that is never closed is closed at interpreter exit (``atexit``),
        before the interpreter frees what is left in an arbitrary order."""
        if self._close_at_exit is not None:
            atexit.unregister(self._close_at_exit)
            self._close_at_exit = None
        if self.step_module is not self.model and self.ctx.distributed:
            self.step_module = self.kind.training_module(self.model)
            gc.collect()  # the wrapper and its reducer, now, not at some later collection
        D.teardown(self.ctx)

    def _summary(self, result: TrainResult) -> dict[str, Any]:
        return {
            "step": result.step,
            "steps": self.opts.steps,
            "train_loss": result.losses[-1] if result.losses else None,
            # what train_loss measures: the recipe's graded loss (items weighted by their
            # grades) or the plain loss, the unit of every eval loss
            "train_objective": "graded" if self.graded_loss else "plain",
            "eval": result.final_eval,
            "monitor": self.opts.monitor,
            "best": result.best_metric,
            "best_checkpoint": str(result.best_checkpoint) if result.best_checkpoint else None,
            "interrupted": result.interrupted,
            "early_stopped": result.early_stopped,
            "elapsed_s": result.elapsed_s,
            "world_size": self.ctx.world_size,
        }

    def _end_status(self, result: TrainResult | None, ended: BaseException | None) -> str:
        """How a run ended, the word of ``history.jsonl``'s ``end`` event and of
        ``metrics.json``'s ``status``: ``aborted`` (a second Ctrl-C) or ``failed`` when an
        exception ``ended`` it, else ``interrupted``, ``early_stopped``, ``finished`` or
        ``paused`` as ``result`` says."""
        if ended is not None:
            return "aborted" if isinstance(ended, KeyboardInterrupt) else "failed"
        if result is None:
            raise ValueError("a run that no exception ended needs its result to say how")
        return ("interrupted" if result.interrupted else "early_stopped"
                if result.early_stopped else "finished" if result.step >= self.opts.steps
                else "paused")

    def _end_fields(self, result: TrainResult, ended: BaseException | None
                    ) -> dict[str, str | None]:
        """``metrics.json``'s ``status`` (:meth:`_end_status`) and ``error``: the exception
        that ended a failed run, else null (an aborted run did not fail: its status says
        it was aborted)."""
        failed = ended is not None and not isinstance(ended, KeyboardInterrupt)
        return {"status": self._end_status(result, ended),
                "error": f"{type(ended).__name__}: {ended}" if failed else None}

    def _resume_message(self, step: int) -> str:
        command = self.resume_command or (
            f"Trainer(...).fit(resume_from={str(self.run_dir)!r})"
        )
        return (
            f"interrupted at step {step}/{self.opts.steps}; checkpoint saved in "
            f"{self.checkpoints.path_for(step)}\nresume with: {command}"
        )


def _read_summary(path: Path) -> dict[str, Any] | None:
    """The ``metrics.json`` at ``path``; None when there is none or it cannot be read (a new
    summary is then written whole)."""
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def _progress(total: int, initial: int, *, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, disable=not enabled, unit="step",
                dynamic_ncols=True, file=sys.stderr)
