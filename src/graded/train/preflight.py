"""What a trainer checks when it is built, before it writes anything or runs a step.

The arguments' types first (:func:`check_arguments`; a fit's ``resume_from``:
:func:`check_resume_from`): a TypeError names the argument, the value given and what it takes.
The training data are checked once (the tensors a step reads: ``TaskKind.check_batch``; token
ids against the model's vocabulary and token grades, ``TaskKind.check_data``, by the trainer,
which keeps the result for :func:`graded.checks.checked_inputs`), the evaluation data as they
are (:func:`check_eval_data`), the options against the kind and the evaluation
(:func:`check_options`), and whether a graded recipe's loss has the grades it weights
(:func:`graded_loss_applies`). A bad value fails here, not after steps that no checkpoint holds.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from graded.checks import SEED_RANGE, check_bool, check_int
from graded.kinds import TaskKind
from graded.train.data import dataset_size
from graded.train.options import TrainOptions, monitor_mode_of
from graded.train.recipes import Recipe

__all__ = ["check_arguments", "check_eval_data", "check_options", "check_precision",
           "check_resume_from", "check_train_data", "graded_loss_applies"]


def _shown(value: Any) -> str:
    """A bad argument as an error names it: its type and a short repr."""
    text = " ".join(repr(value).split())
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _check_tensors(name: str, data: Any, *, optional: bool = False) -> None:
    """``data`` is a mapping of names to tensors (None too when ``optional``)."""
    if data is None and optional:
        return
    if not isinstance(data, Mapping):
        raise TypeError(f"{name} must be a dict of tensors (a task split's .tensors: inputs, "
                        f"targets, ...{', or None' if optional else ''}), got {_shown(data)}")
    for key, value in data.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name}[{key!r}] must be a torch.Tensor, got {_shown(value)} "
                            "(torch.as_tensor converts an array)")


def check_arguments(model: Any, train_data: Any, eval_data: Any, *, run_dir: Any,
                    options: Any, seed: Any, recipe: Any, config: Any, resume_command: Any,
                    overwrite: Any) -> tuple[int, bool]:
    """The types of a trainer's arguments, before any is used: TypeError naming the argument,
    the value given and what it takes (otherwise an attribute error deep in the set-up, or a
    ``seed`` of 1.5 that fails only when :meth:`~graded.train.trainer.Trainer.fit` has
    written the run folder); ValueError for a ``seed`` torch cannot take. Returns ``seed``
    and ``overwrite`` as checked (:func:`~graded.checks.check_int`, a NumPy integer as an int;
    :func:`~graded.checks.check_bool`). ``config`` is checked JSON-able by the trainer, which
    stores it. A model already wrapped by ``torch.compile`` is refused (TypeError): the
    wrapper's state dict prefixes every key with ``_orig_mod.``, and ``train.compile``
    compiles the training step while the checkpoints keep the model's own keys."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {_shown(model)}")
    inner = getattr(model, "_orig_mod", None)  # torch.compile's wrapper (OptimizedModule)
    if isinstance(inner, torch.nn.Module):
        name = type(inner).__name__
        raise TypeError(
            f"model is torch.compile's wrapper of a {name}: its checkpoints would hold "
            f"'_orig_mod.'-prefixed keys, which the {name} itself (a resume without the "
            "wrapper, a report) cannot load; expected the model itself, with "
            "TrainOptions(compile=True) (train.compile: true) to compile the training step")
    _check_tensors("train_data", train_data)
    _check_tensors("eval_data", eval_data, optional=True)
    if not isinstance(run_dir, (str, os.PathLike)):
        raise TypeError(f"run_dir must be a path (str or Path), got {_shown(run_dir)}")
    if options is not None and not isinstance(options, TrainOptions):
        raise TypeError(f"options must be a TrainOptions or None, got {_shown(options)}; "
                        "a dict of options is TrainOptions(**options)")
    seed = check_int("seed", seed, minimum=SEED_RANGE[0], maximum=SEED_RANGE[1])
    if recipe is not None and not isinstance(recipe, (str, Recipe)):
        raise TypeError(f"recipe must be a recipe name, a Recipe or None, got {_shown(recipe)}")
    if config is not None and not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict (JSON values) or None, got {_shown(config)}")
    if resume_command is not None and not isinstance(resume_command, str):
        raise TypeError(f"resume_command must be a str or None, got {_shown(resume_command)}")
    return seed, check_bool("overwrite", overwrite)


def check_resume_from(resume_from: Any) -> Path | None:
    """A :meth:`~graded.train.trainer.Trainer.fit`'s ``resume_from`` as a path (None stays
    None), checked before anything is loaded or written: TypeError for another type than a
    path, ValueError for an empty one (``Path("")`` is the working folder: an unset variable
    would resume whatever run is there), FileNotFoundError for a path that does not exist."""
    if resume_from is None:
        return None
    if not isinstance(resume_from, (str, os.PathLike)):
        raise TypeError(f"resume_from must be a path (str or Path) or None, got "
                        f"{_shown(resume_from)}")
    if not os.fspath(resume_from).strip():
        raise ValueError("resume_from is empty; expected a run folder or one of its "
                         "checkpoints (None for a new run)")
    path = Path(resume_from)
    if not path.exists():
        raise FileNotFoundError(f"resume_from {str(resume_from)!r}: no such file or folder; "
                                "expected a run folder or one of its checkpoints")
    return path


def check_train_data(kind: TaskKind, train_data: Mapping[str, torch.Tensor]) -> None:
    """The training tensors have one length (:func:`~graded.train.data.dataset_size`) and hold
    the inputs and targets a step of ``kind`` reads, at least one example; ValueError naming
    the training data."""
    try:
        if dataset_size(train_data) == 0:  # no batch to draw
            raise ValueError(f"no examples (tensors {sorted(train_data)} have 0 rows); expected "
                             "at least train.batch_size")
        kind.check_batch(train_data)  # the inputs and targets a step reads
    except ValueError as exc:
        raise ValueError(f"training data: {exc}") from None


def check_options(kind: TaskKind, opts: TrainOptions,
                  eval_data: Mapping[str, torch.Tensor] | None) -> None:
    """Options the kind and the evaluation data must agree with, checked before anything
    is written: ``monitor`` is a name the evaluation reports (otherwise the first
    evaluation would fail after training), the kind takes ``label_smoothing``, and
    ``early_stopping`` has evaluations to count (a run without evaluation data never stops
    early: refused). A ``monitor_mode`` against the monitored metric's own direction warns
    (RuntimeWarning, attributed to the code that builds the trainer)."""
    kind.check_options(label_smoothing=opts.label_smoothing)
    if eval_data is None:
        if opts.early_stopping is not None:  # it counts evaluations, and none would run
            raise ValueError(
                f"train.early_stopping (patience {opts.early_stopping.patience}) needs "
                "evaluation data: with eval_data=None the run never evaluates, so it would "
                "never stop early; expected eval_data, or early_stopping=None")
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


def check_precision(model: torch.nn.Module, opts: TrainOptions) -> None:
    """Under ``precision`` bf16 or fp16 the model's floating parameters are float32: autocast
    computes in the low dtype from fp32 master weights, which AdamW updates. ValueError
    naming the first other parameter and its dtype: a float16 model fails only at the first
    fp16 step, after the run folder is written (torch's "Attempting to unscale FP16
    gradients"); a bfloat16 one trains without master weights; and autocast leaves float64
    operations as they are, so a float64 model would train in float64 under a bf16 run's
    name."""
    if opts.precision == "fp32":
        return
    for name, param in model.named_parameters():
        if param.is_floating_point() and param.dtype != torch.float32:
            dtype = str(param.dtype).removeprefix("torch.")
            raise ValueError(
                f"train.precision={opts.precision!r} runs autocast over float32 parameters "
                f"(the master weights AdamW updates), but parameter {name!r} of the model is "
                f"{dtype}; expected a float32 model (model.float() before the Trainer is "
                "built)")


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
