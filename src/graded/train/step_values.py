"""What an optimizer step leaves on the device, how the trainer reads it, and the progress bar.

A step's loss, gradient norm and metrics stay on the device (:class:`StepValues`) until the
trainer needs them: :func:`read_step_values` reads every step since its last read in one
transfer (the losses and metrics summed over the ranks in one collective), at a log step,
before an evaluation or a checkpoint, and at the end; a non-finite loss, or gradient norm
(which made the parameters non-finite), then raises ``FloatingPointError`` naming its step.
:func:`progress_bar` is the bar the trainer shows on stderr, which a log step updates with the
loss and tokens per second it read.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

from graded.train import distributed as D
from graded.train.options import TrainOptions

__all__ = ["SKIPS_WARNED", "SkippedSteps", "StepValues", "device_column", "no_values",
           "progress_bar", "read_step_values"]


@dataclass
class StepValues:
    """What an optimizer step leaves on the device, read with others in one transfer
    (:func:`read_step_values`): the trainer waits for the GPU only where it needs the values."""

    step: int  # the global step number, counted from 1
    total: torch.Tensor  # this rank's summed loss
    count: int  # the step's items over all ranks
    grad_norm: torch.Tensor
    extra: dict[str, torch.Tensor | float]  # the kind's metrics, this rank's share
    lr: float
    recipe: Callable[[], dict[str, float]]  # the recipe's values (Recipe.start_step)
    regularization: torch.Tensor | None
    # fp16: a copy of the gradient scaler's scale after the step's update (halved when it
    # skipped the step), read with the step's other values; None without a scaler
    grad_scale: torch.Tensor | None = None


#: fp16 steps the gradient scaler skips in a row after which the trainer warns (once a fit):
#: sixteen halvings divide the scale by 2^16, torch's initial scale, to 1, so the gradients
#: were not finite even at a scale of 2; no smaller scale cures that (a few skips at the start
#: of a run, while the scale comes down to the loss's range, are the scaler working as meant).
SKIPS_WARNED = 16


class SkippedSteps:
    """The fp16 steps the gradient scaler skipped in a row, counted over the values the
    trainer reads (:func:`read_step_values`): a step is skipped when its unscaled gradients
    are not finite, which is when its gradient norm is not (the scaler's own test reads the
    same gradients; a norm overflowing from finite gradients, beyond 1e19, is not told
    apart). :meth:`observe` returns the warning due, once, when ``threshold`` steps in a row
    were skipped: a run whose gradients are never finite (a NaN gradient of the model itself)
    is told so long before the some 165 skipped steps after which its scale reaches 0 (and
    the trainer's ``FloatingPointError``)."""

    def __init__(self, threshold: int = SKIPS_WARNED) -> None:
        self.threshold = threshold
        self.in_row = 0  # skipped steps in a row up to the last step observed
        self.warned = False

    def observe(self, steps: list[int], read: list[tuple[float, dict[str, float]]],
                lr: float) -> str | None:
        """Count the steps ``steps`` (their values ``read``); the warning naming the step at
        which ``threshold`` skipped steps in a row were first reached, else None (``lr``:
        the configured peak, which the advice names)."""
        message = None
        for step, (_, scalars) in zip(steps, read, strict=True):
            self.in_row = 0 if math.isfinite(scalars["grad_norm"]) else self.in_row + 1
            if self.in_row >= self.threshold and not self.warned:
                self.warned = True
                message = (
                    f"the fp16 gradient scaler skipped steps {step - self.in_row + 1} to "
                    f"{step}, {self.in_row} in a row: their gradients were not finite, so "
                    "the optimizer did not step, and the scale fell to "
                    f"{scalars.get('grad_scale', math.nan):g} (logged as grad_scale); a "
                    "smaller scale does not cure gradients that are not finite unscaled: an "
                    "operation of the model has none there (sqrt or log at 0, a division by "
                    f"0), or lower lr (now {lr}); the run stops once the scale reaches 0")
        return message


def no_values() -> dict[str, float]:
    """What a run without a recipe logs of it."""
    return {}


def read_step_values(window: list[StepValues], ctx: D.DistContext, opts: TrainOptions, *,
                     has_recipe: bool) -> list[tuple[float, dict[str, float]]]:
    """The loss and scalars of each step of ``window``, read in one transfer (the losses
    and metrics summed over the ranks in one collective); FloatingPointError naming the
    first step whose loss is not finite (its advice names ``opts.lr`` and ``opts.clip_norm``).
    A non-finite gradient norm of a step whose loss is finite is a FloatingPointError too,
    except under fp16, whose gradient scaler skips that step: otherwise the step wrote
    non-finite parameters, which the next checkpoint would keep.
    ``regularization`` is among the scalars when the run ``has_recipe``, ``grad_scale`` (the
    gradient scaler's scale after the step) when the steps hold one (fp16): read in the same
    transfer, not by a read of the scaler's own. Empties ``window``."""
    if not window:
        return []
    device = ctx.device
    keys = list(window[0].extra)
    scaled = window[0].grad_scale is not None
    with torch.no_grad():
        summed = torch.stack([device_column([w.total for w in window], device),
                              *(device_column([w.extra[k] for w in window], device)
                                for k in keys)],
                             dim=1)
        summed = D.sum_tensor_across(ctx, summed)
        own = torch.stack([device_column([w.grad_norm for w in window], device), device_column(
            [w.regularization if w.regularization is not None else 0.0 for w in window],
            device), *([device_column([w.grad_scale for w in window], device)] if scaled
                       else [])], dim=1)
        rows = torch.cat([summed, own], dim=1).tolist()
    out = []
    for w, row in zip(window, rows, strict=True):
        loss, grad_norm = row[0] / w.count, row[1 + len(keys)]
        if not math.isfinite(loss):
            clip = ("enable clip_norm" if opts.clip_norm is None else
                    f"a smaller clip_norm (now {opts.clip_norm})")
            raise FloatingPointError(
                f"training loss became {loss} at step {w.step}; lower lr (now "
                f"{opts.lr}) or {clip}")
        if not math.isfinite(grad_norm) and opts.precision != "fp16":
            # clipping scales every gradient by a non-finite factor and AdamW writes it into
            # the parameters (fp16's gradient scaler skips such a step instead)
            raise FloatingPointError(
                f"gradient norm became {grad_norm} at step {w.step} (its loss {loss:.6g} is "
                "finite), so the step made the parameters non-finite; an operation of the "
                "model has no finite gradient there (sqrt or log at 0, a division by 0), "
                f"or lower lr (now {opts.lr})")
        scalars = {"loss": loss, "grad_norm": grad_norm, "lr": w.lr,
                   **dict(zip(keys, row[1:1 + len(keys)], strict=True))}
        if has_recipe:
            scalars["regularization"] = row[2 + len(keys)]
        if scaled:
            scalars["grad_scale"] = row[3 + len(keys)]
        scalars.update(w.recipe())
        out.append((loss, scalars))
    window.clear()
    return out


def device_column(values: list[torch.Tensor | float], device: torch.device) -> torch.Tensor:
    """One scalar of every step of a window as a float32 vector on ``device``: one stack
    of the 0-d tensors the steps left (loss sums, gradient norms), one tensor of numbers,
    else each value converted (the same float32 values in every case)."""
    first = values[0]
    if isinstance(first, torch.Tensor):
        if all(isinstance(v, torch.Tensor) and v.dim() == 0 and v.device == first.device
               and v.dtype == first.dtype for v in values):
            return torch.stack(values).to(device=device, dtype=torch.float32)
    elif all(isinstance(v, float) for v in values):
        return torch.tensor(values, dtype=torch.float32, device=device)
    return torch.stack([torch.as_tensor(v, dtype=torch.float32, device=device).reshape(())
                        for v in values])


def progress_bar(total: int, initial: int, *, enabled: bool):
    """A tqdm bar of ``total`` steps from ``initial`` on stderr (disabled: draws nothing)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, disable=not enabled, unit="step",
                dynamic_ncols=True, file=sys.stderr)
