"""One optimizer step of the trainer: micro-batches, loss, gradient, AdamW, schedule, recipe.

:class:`OptimizerStep` holds what :class:`~graded.train.trainer.Trainer` does at each step
(000 Algorithms 5.1 and 7.1 under a graded recipe; steps 1 to 4 of :mod:`graded.train.trainer`):
the step's global batch split into this rank's micro-batches, the mean loss over all its
items accumulated (the graded loss of 000 Def 5.37 / 7.1 when the recipe's weights apply) under
autocast, the gradient norm clipped, AdamW stepped (through the fp16 gradient scaler when there
is one), the learning-rate schedule advanced and the recipe's next step prepared. The trainer
mixes it in: its methods read the model, optimizer, scheduler, sampler and options the trainer
built. What a step returns stays on the device until ``_read``
(:mod:`graded.train.step_values`).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from graded.checks import checked_inputs
from graded.kinds import TaskKind
from graded.train import distributed as D
from graded.train.data import StepSampler, to_device
from graded.train.options import TrainOptions
from graded.train.recipes import Recipe
from graded.train.step_values import SkippedSteps, StepValues, read_step_values

if TYPE_CHECKING:
    from graded.train.runs import RunFolder

__all__ = ["AUTOCAST_DTYPES", "OptimizerStep"]

#: The autocast dtype of each ``TrainOptions.precision`` (None: no autocast).
AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
#: torch's warning when a scheduler steps before its optimizer first has (a skipped fp16 step).
_SCHEDULE_BEFORE_OPTIMIZER = (r"Detected call of `lr_scheduler\.step\(\)` before "
                              r"`optimizer\.step\(\)`")


class OptimizerStep:
    """The trainer's optimizer step and the reading of its values, mixed into
    :class:`~graded.train.trainer.Trainer`, which sets the attributes below."""

    model: torch.nn.Module
    step_module: torch.nn.Module  # the model's training module (DDP-wrapped, compiled)
    kind: TaskKind
    opts: TrainOptions
    ctx: D.DistContext
    recipe: Recipe | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler | None
    sampler: StepSampler
    train_data: dict[str, torch.Tensor]
    output_grades: torch.Tensor | None
    graded_loss: bool
    inputs_checked: bool
    run: RunFolder
    _autocast: torch.autocast
    _quiet_schedule_step: bool
    _skipped_steps: SkippedSteps  # fp16: the steps the scaler skipped in a row, this fit
    # the recipe's values of the next step: what its last on_step or start_step prepared
    _recipe_values: Callable[[], dict[str, float]]
    _recipe_pending: Callable[[], dict[str, float]] | None = None

    def _train_step(self, step: int) -> tuple[StepValues, int]:
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
        grad_scale = None
        if self.scaler is None:
            self.optimizer.step()
        else:  # skips the step when the unscaled gradients are not finite
            self.scaler.step(self.optimizer)
            self.scaler.update()
            # the scale tensor is updated in place: a copy, on the device, read with the rest
            scale = self.scaler._get_scale_async()  # None only for a scaler that is off
            grad_scale = None if scale is None else scale.detach().clone()
        self._step_schedule()
        if self.recipe is not None:  # bounds the next step's grade learning rate
            self._recipe_values = self._recipe_pending = self.recipe.start_step(
                self.model, self.optimizer, step + 1, self.opts.steps)
        values = StepValues(step + 1, total, count, grad_norm.detach(), extra, lr, recipe,
                            reg_total, grad_scale)
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

    def _read(self, window: list[StepValues]) -> list[tuple[float, dict[str, float]]]:
        """The loss and scalars of each step of ``window``, read in one transfer
        (:func:`~graded.train.step_values.read_step_values`; under fp16 the gradient scaler's
        scale after each step is among them, ``grad_scale``, logged with the step's other
        scalars: no second read of the device). FloatingPointError naming the first step
        whose loss is not finite, and under fp16 the last step of ``window`` once the scale
        has fallen to 0: halved at each skipped step from 2^16, it gets there only after some
        166 steps in a row with non-finite gradients, which no smaller scale cures (a NaN
        gradient of the model itself), and from then on every step is skipped, so the run
        would end "finished" with the weights it had. Long before that, at
        :data:`~graded.train.step_values.SKIPS_WARNED` skipped steps in a row, a
        ``RuntimeWarning`` naming them is shown once and recorded as a ``warning`` event in
        ``history.jsonl`` (:class:`~graded.train.step_values.SkippedSteps`)."""
        steps = [w.step for w in window]
        read = read_step_values(window, self.ctx, self.opts, has_recipe=self.recipe is not None)
        if self.scaler is None or not read:
            return read
        note = self._skipped_steps.observe(steps, read, self.opts.lr)
        if note is not None and self.ctx.is_main:
            warnings.warn(note, RuntimeWarning, stacklevel=2)
            self.run.append_history("warning", message=note)
        if read[-1][1].get("grad_scale") == 0.0:
            raise FloatingPointError(
                f"the fp16 gradient scaler's scale fell to 0 by step {steps[-1]}: the steps "
                "before it all had non-finite gradients and were skipped, so the model no "
                "longer trains; an operation of the model has no finite gradient there (sqrt "
                f"or log at 0, a division by 0), or lower lr (now {self.opts.lr})")
        return read
