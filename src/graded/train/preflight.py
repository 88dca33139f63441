"""What a trainer checks when it is built, before it writes anything or runs a step.

The training data are checked once (the tensors a step reads: ``TaskKind.check_batch``; token
ids against the model's vocabulary and token grades, ``TaskKind.check_data``, by the trainer,
which keeps the result for :func:`graded.checks.checked_inputs`), the evaluation data as they
are (:func:`check_eval_data`), the options against the kind and the evaluation
(:func:`check_options`), and whether a graded recipe's loss has the grades it weights
(:func:`graded_loss_applies`). A bad value fails here, not after steps that no checkpoint holds.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import torch

from graded.kinds import TaskKind
from graded.train.data import dataset_size
from graded.train.options import TrainOptions, monitor_mode_of
from graded.train.recipes import Recipe

__all__ = ["check_eval_data", "check_options", "check_train_data", "graded_loss_applies"]


def check_train_data(kind: TaskKind, train_data: Mapping[str, torch.Tensor]) -> None:
    """The training tensors have one length (:func:`~graded.train.data.dataset_size`) and hold
    the inputs and targets a step of ``kind`` reads; ValueError naming the training data."""
    dataset_size(train_data)
    try:  # the inputs and targets a step reads
        kind.check_batch(train_data)
    except ValueError as exc:
        raise ValueError(f"training data: {exc}") from None


def check_options(kind: TaskKind, opts: TrainOptions,
                  eval_data: Mapping[str, torch.Tensor] | None) -> None:
    """Options the kind and the evaluation data must agree with, checked before anything
    is written: ``monitor`` is a name the evaluation reports (otherwise the first
    evaluation would fail after training), and the kind takes ``label_smoothing``. A
    ``monitor_mode`` against the monitored metric's own direction warns (RuntimeWarning,
    attributed to the code that builds the trainer)."""
    kind.check_options(label_smoothing=opts.label_smoothing)
    if eval_data is None:
        return
    monitor, mode = opts.monitor, opts.monitor_mode
    names = kind.report_names(eval_data)
    if monitor not in names:
        raise ValueError(f"train.monitor={monitor!r} is not reported by the evaluation of "
                         f"this {kind.name} run; expected one of {', '.join(names)}")
    better = monitor_mode_of(monitor)
    if better is not None and better != mode:
        warnings.warn(
            f"train.monitor_mode={mode!r} with train.monitor={monitor!r}: the best "
            f"checkpoint is the one with the {'lowest' if mode == 'min' else 'highest'} "
            f"{monitor}, though a {'larger' if better == 'max' else 'smaller'} one is "
            f"better (monitor_mode: {better}, the default for {monitor})", RuntimeWarning,
            stacklevel=3)


def check_eval_data(kind: TaskKind, model: torch.nn.Module,
                    eval_data: Mapping[str, torch.Tensor] | None) -> None:
    """The evaluation data checked as the training data are, when the trainer is built:
    a bad evaluation set would otherwise fail only at the first evaluation, after
    ``eval_every`` steps that no checkpoint holds yet."""
    if eval_data is None:
        return
    try:
        if dataset_size(eval_data) == 0:  # would fail the first evaluation
            raise ValueError(
                f"no examples (tensors {sorted(eval_data)} have 0 rows); expected at "
                "least one to evaluate, or eval_data=None for a run without evaluation")
        kind.check_batch(eval_data)
        kind.check_data(model, eval_data)
    except ValueError as exc:
        raise ValueError(f"evaluation data: {exc}") from None


def graded_loss_applies(kind: TaskKind, recipe: Recipe | None, model: torch.nn.Module,
                        train_data: Mapping[str, torch.Tensor],
                        output_grades: torch.Tensor | None) -> tuple[bool, str | None]:
    """Whether the steps minimise the recipe's graded loss: the recipe asks for it and the
    loss items have grades, checked here on all the training data (bad output grades or
    negative weights fail now); and, where they have none, the note that says so (the
    trainer's ``plain_loss_note``), else None."""
    if recipe is None or not recipe.uses_graded_loss:
        return False, None
    grades = kind.loss_grades(train_data, output_grades)
    if grades is None:
        return False, (
            f"recipe {recipe.name!r}: the {kind.name} loss is graded by "
            f"{kind.grades_source}, and this run has none, so it trains on the plain "
            "loss, not the graded loss of 000 Def 5.37 / 7.1 (the recipe option "
            "graded_loss: false asks for the plain loss without this warning)")
    kind.check_loss_grades(model, grades)
    recipe.check_loss_grades(model, grades)
    return True, None
