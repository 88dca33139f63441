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
   state, the loss sum and evaluation stay fp32: a model given in another dtype is refused);
   fp16 scales the loss with a gradient scaler (its state is checkpointed); ``compile`` wraps
   the training module in ``torch.compile`` (a model given already compiled is refused);
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
checkpoint, and at the end (a non-finite loss, or a non-finite gradient norm outside fp16, then
raises ``FloatingPointError`` naming its step, before anything more is saved; under fp16, a
gradient scale fallen to 0 by skipped steps does too). Under fp16 the gradient scale after each
step is read with them and logged as ``grad_scale``, and 16 steps skipped in a row warn once,
naming them (:class:`~graded.train.step_values.SkippedSteps`). The training data
are checked once, when the trainer is built (token ids against the model's vocabulary, token
grades: ``TaskKind.check_data``; the evaluation data too), and the steps run inside
:func:`graded.checks.checked_inputs`. So with plain AdamW a step never waits for a GPU, and the
host queues the next step while the device computes this one; a graded recipe's bound waits,
before the next optimizer step, for a copy the device made right after this one; fp16's gradient
scaler reads whether the gradients are finite.

Resuming from a checkpoint restores the model, optimiser, scheduler, RNG states (each rank's
own) and step, so on CPU with the same seed the losses after resuming equal those of an
uninterrupted run. SIGINT or SIGTERM finishes the current step (under torchrun the next one too:
the ranks agree on stopping one step late, :class:`~graded.train.distributed.StopVote`), writes a
checkpoint and returns with ``interrupted=True`` and a message naming the resume command (a
second Ctrl-C aborts at once).

This module holds the trainer's set-up and loop; beside it, the optimizer step
(:mod:`graded.train.step`), its values and the progress bar (:mod:`graded.train.step_values`),
the run's checkpointed state, its saves and resume (:mod:`graded.train.run_state`),
the checks made when a trainer is built (:mod:`graded.train.preflight`), how a run ended
(:mod:`graded.train.outcome`), and the stop signal and ``close`` (:mod:`graded.train.shutdown`).
"""

from __future__ import annotations

import random
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from graded.checks import check_int
from graded.kinds import TaskKind, as_kind
from graded.train import distributed as D
from graded.train.checkpoint import CheckpointManager
from graded.train.data import StepSampler, dataset_size
from graded.train.logging import RunLogger, read_grades
from graded.train.objectives import evaluate
from graded.train.optim import param_groups
from graded.train.options import TrainOptions
from graded.train.outcome import TrainResult, end_status, final_summary, resume_message
from graded.train.preflight import (
    check_arguments,
    check_eval_data,
    check_options,
    check_precision,
    check_resume_from,
    check_train_data,
    graded_loss_applies,
)
from graded.train.recipes import Recipe, get_recipe
from graded.train.resume import ResumePlan
from graded.train.run_state import RunState
from graded.train.runs import RunFolder, open_run, refuse_search_run
from graded.train.schedules import make_scheduler
from graded.train.shutdown import ClosesAtExit, TrainerStopSignal
from graded.train.state_tensors import (
    jsonable,
    restore_rng_state,
)
from graded.train.step import AUTOCAST_DTYPES, OptimizerStep
from graded.train.step_values import SkippedSteps, StepValues, no_values, progress_bar
from graded.train.stopping import Stopper
from graded.transformer.graded import held_gradings


class Trainer(OptimizerStep, RunState, ClosesAtExit):
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
        seed, overwrite = check_arguments(
            model, train_data, eval_data, run_dir=run_dir, options=options, seed=seed,
            recipe=recipe, config=config, resume_command=resume_command, overwrite=overwrite)
        self.kind = as_kind(kind, model)
        self.opts = options if options is not None else TrainOptions()
        self.run_dir = Path(run_dir)
        self.seed = seed
        try:  # stored in config.yaml and every checkpoint: refused now, not after the steps
            self.config = jsonable(config or {})
        except TypeError as exc:
            raise TypeError(f"config: {exc}; expected a dict of JSON values (str, numbers, "
                            "bools, None, lists and dicts of them)") from None
        self.resume_command = resume_command
        self.train_data = dict(train_data)
        self.eval_data = dict(eval_data) if eval_data is not None else None
        check_train_data(self.kind, self.train_data)
        check_options(self.kind, self.opts, self.eval_data)
        check_precision(model, self.opts)
        self.ctx = D.setup(self.opts.device)
        self.model = model.to(self.ctx.device)
        self.recipe = get_recipe(recipe) if isinstance(recipe, str) else recipe
        if self.recipe is not None:
            self.recipe.check(self.model)
        self.output_grades = (None if output_grades is None else
                              torch.as_tensor(output_grades, dtype=torch.float32,
                                              device=self.ctx.device))
        self.graded_loss, self.plain_loss_note = graded_loss_applies(
            self.kind, self.recipe, self.model, self.train_data, self.output_grades)
        self.optimizer = torch.optim.AdamW(
            self._param_groups(), lr=self.opts.lr, betas=self.opts.betas, eps=self.opts.eps
        )
        self.scheduler = make_scheduler(
            self.optimizer, self.opts.schedule, warmup_steps=self.opts.warmup_steps,
            total_steps=self.opts.steps, min_ratio=self.opts.min_lr_ratio,
        )
        # the training data checked once here: the steps then read no input values
        self.inputs_checked = self.kind.check_data(self.model, self.train_data)
        check_eval_data(self.kind, self.model, self.eval_data)
        self.step_module = D.wrap_model(self.kind.training_module(self.model), self.ctx)
        self._register_close_at_exit()
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
        self._skipped_steps = SkippedSteps()  # counted anew by each fit
        self.sampler = StepSampler(
            dataset_size(self.train_data), self.opts.batch_size, seed=seed,
            grad_accum=self.opts.grad_accum, world_size=self.ctx.world_size, rank=self.ctx.rank,
        )
        self.checkpoints = CheckpointManager(self.run_dir / "checkpoints", self.opts.keep_last)
        self.overwrite = overwrite
        self.run = RunFolder(self.run_dir, writer=self.ctx.is_main)
        self._plan: ResumePlan | None = None
        # what the model and optimizer hold besides their state as built (an earlier fit's
        # steps, a checkpoint a resume loaded); a fit without resume_from is refused then
        self._holds: str | None = None
        self._closed = False
        # the recipe's values of the next step: what its last on_step or start_step prepared
        self._recipe_values: Callable[[], dict[str, float]] = no_values

    def _param_groups(self) -> list[dict]:
        o = self.opts
        if self.recipe is None:
            return param_groups(self.model, o.weight_decay)
        return self.recipe.param_groups(
            self.model, lr=o.lr, weight_decay=o.weight_decay, grade_lr=o.grade_lr
        )

    def close(self) -> None:
        """Leave the process group this trainer joined (under torchrun); call once at the end:
        a later :meth:`fit` is refused (:meth:`ClosesAtExit.close
        <graded.train.shutdown.ClosesAtExit.close>`)."""
        super().close()
        self._closed = True

    # ----------------------------------------------------------------- loop

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
        would (for time-sliced jobs); the schedule still spans ``options.steps``. It is an int
        >= 0 (TypeError or ValueError naming another value, before anything is written).

        One trainer runs one run. A second ``fit`` of the same trainer continues it only
        through ``resume_from`` (``fit(resume_from=run_dir)`` after a pause, an interruption
        or a failure: the model, optimizer, schedule, RNG and step are reloaded from the
        newest checkpoint). Without ``resume_from``, a fit is refused (RunError) once the
        model and optimizer are no longer as built: after an earlier fit ran a step, or after
        a resume (:meth:`prepare_resume`) loaded a checkpoint; a new run needs a new trainer
        with a freshly initialised model (``overwrite`` replaces the folder's files, not the
        model's state). A trainer that was closed (:meth:`close`) refuses to fit
        (RuntimeError).

        The run folder is locked for the call (a second writer gets RunLockedError). A resume
        is checked and loaded in full (:meth:`prepare_resume`) before anything is written,
        before the lock file too: a ``resume_from`` that is not a path (TypeError), is empty
        (ValueError), does not exist (FileNotFoundError), is not a run or checkpoint folder
        (CheckpointError), has a refused config or no intact checkpoint, leaves no lock file
        and no new folder behind. Without ``resume_from``, or with one of another folder, a
        folder that holds checkpoints is refused (RunError) unless the trainer was built with
        ``overwrite=True``; a folder that holds a search run of :mod:`graded.search` is refused
        before the lock file is written. See :mod:`graded.train.runs`.
        """
        if self._closed:  # under torchrun its steps would no longer sync the ranks
            raise RuntimeError("this Trainer is closed: close() left its process group and "
                               "unwrapped its model, so it trains no more; build a new "
                               "Trainer to train again")
        if pause_after is not None:  # a global step, before anything is written
            pause_after = check_int("pause_after", pause_after, minimum=0)
        resume_from = check_resume_from(resume_from)
        if resume_from is None:
            self._refuse_reuse()
        refuse_search_run(self.run_dir)
        plan = None
        if resume_from is not None:  # checked and loaded before the lock file is written
            self.run.refuse_in_use()  # as the lock would, before a checkpoint is read
            plan = self._plan
            if plan is None or plan.source.resolve() != resume_from.resolve():
                plan = self.prepare_resume(resume_from)
            self._plan = None
        with self.run.lock():
            open_run(self.run, self.run_config(), plan, overwrite=self.overwrite,
                     existing=bool(self.checkpoints.folders()),
                     entries=("metrics.csv", "grades.jsonl", "metrics.json", "checkpoints",
                              "history.jsonl", *(("tensorboard",) if self.opts.tensorboard
                                                 else ())))
            notes = [self.plain_loss_note,
                     None if plan is not None else self._trained_elsewhere()]
            for note in notes:
                if note is not None and self.ctx.is_main:
                    warnings.warn(note, RuntimeWarning, stacklevel=2)
                    self.run.append_history("warning", message=note)
            try:
                result = self._loop(plan, pause_after)
            except BaseException as exc:  # the history says how the run ended, as metrics.json
                self.run.append_history("end", status=end_status(None, exc, self.opts.steps),
                                        error=f"{type(exc).__name__}: {exc}")
                raise
            self.run.append_history("end", step=result.step,
                                    status=end_status(result, None, self.opts.steps))
        return result

    def _loop(self, plan: ResumePlan | None, pause_after: int | None) -> TrainResult:
        start, stopper = 0, Stopper()
        self._skipped_steps = SkippedSteps()
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
            if self.ctx.is_main:  # a new run has no best yet
                self.checkpoints.forget_best()
        main = self.ctx.is_main
        logger = RunLogger(self.run_dir, enabled=main, tensorboard=self.opts.tensorboard,
                           resume_step=start if plan is not None else None)
        result = TrainResult(step=start, best_metric=stopper.best)
        total = self.opts.steps
        bar = progress_bar(total, start, enabled=main and self.opts.progress)
        began = time.perf_counter()
        tok_window, t_window = 0, time.perf_counter()
        window: list[StepValues] = []  # steps whose values are still on the device
        step = start
        # the step whose checkpoint this run's folder holds: a resume's, unless it resumed from
        # a checkpoint elsewhere (an interruption or pause before its first step saves it here)
        saved_at = start if plan is not None and Path(plan.checkpoint).resolve() \
            == self.checkpoints.path_for(start).resolve() else -1
        if saved_at == start:  # what a resume that runs no step leaves as its last checkpoint
            result.last_checkpoint = self.checkpoints.path_for(start)
        ended: BaseException | None = None  # the exception that ended the run, if one did
        self.model.train()
        if self.recipe is not None:
            # Prepares step start+1 (λ annealing, grade-lr bound); idempotent after a resume,
            # where it restores λ, which may not be part of the model state.
            prepared = self.recipe.on_step(self.model, self.optimizer, start, total)
            self._recipe_values = lambda: prepared
        # the grades before the first step, once: a resume from a checkpoint of step 0 (a run
        # paused or stopped before its first step) finds them logged, unless in a new folder
        if start == 0 and main and (plan is None or not read_grades(self.run_dir)):
            logger.grades(0, self.model)
        # a run that stopped early resumes stopped: the uninterrupted run ends here too (a
        # larger early_stopping.patience, or none, continues it)
        result.early_stopped = self._stopped_early(stopper)
        try:
            vote = D.StopVote(self.ctx)  # a stop agreed by every rank, one step late
            with TrainerStopSignal() as stop, held_gradings(self.model):
                while step < total and not result.early_stopped:
                    if pause_after is not None and step >= pause_after:
                        break
                    if vote(stop.flag):
                        result.interrupted = True
                        break
                    self._holds = f"the training of an earlier fit() (to step {step + 1})"
                    self._mark_model(f"the training to step {step + 1}")
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
                logger.summary(final_summary(result, ended, self.opts, run_dir=self.run_dir,
                                             graded_loss=self.graded_loss,
                                             world_size=self.ctx.world_size,
                                             resumed=plan is not None))
            logger.close()
        if result.interrupted and main:
            print(resume_message(step, self.opts.steps, self.checkpoints.path_for(step),
                                 self.resume_command, self.run_dir), file=sys.stderr, flush=True)
        return result
