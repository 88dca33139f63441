"""The composition root: task, data, model, recipe and trainer of a run config.

:func:`dry_build` is the last step of validation (:func:`graded.config.validate_config`): it
builds the task, the model config and the recipe, checks what the schema cannot see (task name
and options, the split, model fields against the task and against what the model of its kind
reads, recipe against grading) and keeps the three objects on the config. :func:`build_run`
then makes the run from those very objects: the data of the task, the model of the task kind
(:func:`graded.kinds.get_kind`) and the trainer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from graded.config.schema import ConfigError, RunConfig


def build_recipe(cfg: RunConfig):
    """The recipe object (``graded.train.recipes.get_recipe``) with the configured options."""
    from graded.train.recipes import get_recipe

    return get_recipe(cfg.recipe_name(), **cfg.recipe.options)


def build_task(cfg: RunConfig):
    """The task of ``cfg.task``: the one validation built, or a new one (``get_task``)."""
    if cfg.built_task is not None:
        return cfg.built_task
    from graded.tasks import get_task

    return get_task(cfg.task.name, **cfg.task.options)


def _max_len(cfg: RunConfig, task: Any) -> int:
    """The longest sequence the run sees (a size split tests on longer objects, 003 §3.2;
    a family split may too)."""
    if cfg.task.split in ("size", "family"):
        return max(t.max_len for t in (task, *task.split_configs(cfg.task.split)))
    return task.max_len


def transformer_config(cfg: RunConfig, task: Any):
    """The :class:`TransformerConfig` of ``cfg.model`` with the task's vocabulary and length."""
    from graded.transformer.config import TransformerConfig

    info = task.info()
    fields = cfg.model.transformer_fields()
    if fields.get("input_grades") == "task":  # the task's natural grades of its input features
        if info["graded_object"] != "features":
            raise ValueError(f"input_grades='task' needs a task with graded input features; "
                             f"task {task.name!r} grades {info['graded_object']!r}")
        fields["input_grades"] = [float(q) for q in info["grades"]]
    derived = {
        "vocab_size": info["vocab_size"],
        "input_dim": info["input_dim"],
        "max_len": _max_len(cfg, task),
        "pad_id": info["pad_id"],
    }
    return TransformerConfig.from_dict({**fields, **derived})


def morphic_config(cfg: RunConfig, task: Any):
    """The :class:`graded.morphic.MorphicConfig` of ``cfg.model.morphic`` for ``task``."""
    from graded.morphic import MorphicConfig

    info = task.info()
    return MorphicConfig.from_dict({**(cfg.model.morphic or {}),
                                    "vocab_size": info["vocab_size"],
                                    "max_len": _max_len(cfg, task)})


def _model_config(cfg: RunConfig, task: Any):
    if cfg.model.architecture == "morphic":
        if task.kind != "lm":
            raise ValueError(f"architecture 'morphic' needs a language-modelling task, "
                             f"task {task.name!r} is {task.kind!r}")
        return morphic_config(cfg, task)
    return transformer_config(cfg, task)


def _refuse_unapplied_token_stages(cfg: RunConfig, model_class: Any, model_config: Any,
                                   task: Any, fail: Callable[[str, str], ConfigError]) -> None:
    """Refuse ``model.token_grade_stages`` written with a stage the model class does not apply
    (its ``UNAPPLIED_TOKEN_STAGES``: a classifier's output layer reads the pooled vector,
    which has no token grade), as the stage would change nothing without a word. Left out,
    the stages are the config's default, every stage a model may have, and are accepted.
    Written, they are read as the model config took them (a tuple, from a dict built in
    Python, is the list it makes)."""
    from graded.transformer.config import TOKEN_GRADE_STAGES

    stages = cfg.model.transformer_fields().get("token_grade_stages")
    if stages is None or not getattr(model_config, "token_grading", False):
        return
    unapplied = getattr(model_class, "UNAPPLIED_TOKEN_STAGES", {})
    refused = [s for s in model_config.token_grade_stages if s in unapplied]
    if refused:
        applied = [s for s in TOKEN_GRADE_STAGES if s not in unapplied]
        why = "; ".join(unapplied[s] for s in refused)
        named = ", ".join(repr(s) for s in refused)
        raise fail("model.token_grade_stages",
                   f"got {stages!r}; task {task.name!r} is {task.kind!r}, whose model "
                   f"({model_class.__name__}) grades tokens at the stages {applied} only: "
                   f"{why}, so the {named} stage would change nothing; expected a list from "
                   f"{applied} (or leave it out)")


def dry_build(cfg: RunConfig, source: str = "<dict>") -> RunConfig:
    """Build and check the task, model config and recipe of ``cfg`` and keep them on it
    (``cfg.built_task``, ``built_model_config``, ``built_recipe``); ConfigError otherwise."""
    from graded.tasks import Task, available_tasks, get_task

    def fail(where: str, exc: Exception | str) -> ConfigError:
        return ConfigError(f"invalid config {source}:\n  {where}: {exc}")

    where = "task.options" if cfg.task.name in available_tasks() else "task.name"
    try:
        task = get_task(cfg.task.name, **cfg.task.options)
    except (TypeError, ValueError) as exc:
        raise fail(where, exc) from None
    try:
        if cfg.task.split in ("size", "family"):
            task.split_configs(cfg.task.split)
        elif cfg.task.split == "relabelled" and type(task).relabel is Task.relabel:
            raise ValueError(f"a relabelled split is not meaningful for task {task.name!r}")
    except ValueError as exc:
        raise fail("task.split", exc) from None
    try:
        model_config = _model_config(cfg, task)
    except (TypeError, ValueError) as exc:
        raise fail("model", exc) from None
    from graded.kinds import Classification, get_kind

    kind = get_kind(task.kind, cfg.model.architecture)
    model_class = kind.model_class()
    if model_class is not None:  # a field the kind's model does not read would do nothing
        from graded.transformer.models import unread_fields

        unread = [f"model.{name}: got {value!r}; task {task.name!r} is {task.kind!r}, whose "
                  f"model ({model_class.__name__}) does not read it: {why}; expected the "
                  f"default {default!r} (or leave it out)"
                  for name, value, default, why in unread_fields(model_class, model_config)]
        if unread:
            raise ConfigError("\n  ".join([f"invalid config {source}:", *unread]))
        _refuse_unapplied_token_stages(cfg, model_class, model_config, task, fail)
    # an LM or seq2seq model pools nothing
    if cfg.model.pooling != "mean" and not isinstance(kind, Classification):
        raise fail("model.pooling", f"got {cfg.model.pooling!r}; pooling is used by the "
                   f"encoder kinds (classification, regression), and task {task.name!r} "
                   f"is {task.kind!r}: expected the default 'mean' (or leave it out)")
    if getattr(model_config, "grading", None) is None and cfg.train.grade_lr is not None:
        raise fail("train.grade_lr", f"got {cfg.train.grade_lr}; the model has no grades "
                   "(model.grading is null), so no learning rate of grades applies: expected it "
                   "left out")
    if "clip_norm" in cfg.recipe.options:  # Recipe.clip_norm: the default of hand-written loops
        raise fail("recipe.options.clip_norm", f"got {cfg.recipe.options['clip_norm']!r}; a run "
                   "clips gradients at train.clip_norm, which it would leave in force: set "
                   "train.clip_norm instead")
    try:
        recipe = build_recipe(cfg)
    except (TypeError, ValueError) as exc:
        raise fail("recipe.options", exc) from None
    grading = getattr(model_config, "grading", None)
    if recipe.kind is not None and recipe.kind != grading:
        raise fail("recipe", f"{recipe.name!r} needs model.grading={recipe.kind}, "
                             f"got {grading!r}")
    cfg._task, cfg._model_config, cfg._recipe = task, model_config, recipe
    return cfg


def check_semantics(cfg: RunConfig, source: str = "<dict>") -> None:
    """What the schema cannot check (see :func:`dry_build`, which this runs)."""
    dry_build(cfg, source)


def _built(cfg: RunConfig) -> RunConfig:
    """``cfg`` with its dry-build objects (made now for a RunConfig built by hand)."""
    return cfg if cfg.built_task is not None else dry_build(cfg)


def build_model(cfg: RunConfig, task: Any):
    """The model for ``task``: an LM, seq2seq model or encoder classifier/regressor (or a
    morphic LM, 004), made by the task kind (:mod:`graded.kinds`) from the model config."""
    from graded.kinds import get_kind

    model_config = (cfg.built_model_config if task is cfg.built_task
                    else _model_config(cfg, task))
    kind = get_kind(task.kind, cfg.model.architecture)
    return kind.build_model(model_config, task, pooling=cfg.model.pooling)


def build_data(cfg: RunConfig, task: Any):
    """Train and evaluation :class:`~graded.tasks.TaskDataset` by the configured split
    (003 §3.2); their ``.tensors`` dicts feed the trainer. With ``task.unseen`` (the default)
    no evaluation input occurs among the training inputs; ``unseen: false`` keeps the
    evaluation draw as drawn (:meth:`graded.tasks.Task.split`). Sizes the task cannot draw
    are a ConfigError naming the config's keys (the task says ``n_test`` for ``task.n_eval``)."""
    seed = cfg.task.data_seed if cfg.task.data_seed is not None else cfg.seed
    t = cfg.task
    try:
        return task.split(t.split, t.n_train, t.n_eval, seed=seed, unseen=t.unseen)
    except ValueError as exc:
        raise ConfigError(f"task {t.name!r} cannot draw its data with task.split={t.split!r}, "
                          f"task.n_train={t.n_train}, task.n_eval={t.n_eval} (n_test below): "
                          f"{exc}") from exc


@dataclasses.dataclass
class RunParts:
    """Everything a run needs, built from its config (see :func:`build_run`)."""

    config: RunConfig
    task: Any
    train: Any  # TaskDataset
    test: Any  # TaskDataset
    model: Any  # torch.nn.Module
    trainer: Any  # graded.train.trainer.Trainer
    recipe: Any = None  # graded.train.recipes.Recipe


def build_run(
    cfg: RunConfig, run_dir: str | Path | None = None, *, resume_command: str | None = None
) -> RunParts:
    """Data, model (seeded with ``cfg.seed``) and trainer of a validated config, from the task,
    model config and recipe its validation built (the trainer gets the task's
    ``output_grades``, which a graded recipe's loss weights). The config the run records
    (``config.yaml``, the checkpoints) reads ``output.overwrite: false``: replacing a run is
    asked for each time, not inherited by a run started again from that file."""
    import torch

    from graded.train.trainer import Trainer

    cfg = _built(cfg)
    task = cfg.built_task
    train, test = build_data(cfg, task)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, task)
    recorded = cfg.model_dump(mode="json")
    recorded["output"]["overwrite"] = False
    trainer = Trainer(
        model, train.tensors, test.tensors, kind=task.kind, options=cfg.train,
        run_dir=Path(run_dir) if run_dir is not None else cfg.run_dir(), seed=cfg.seed,
        recipe=cfg.built_recipe, output_grades=task.output_grades, config=recorded,
        resume_command=resume_command, overwrite=cfg.output.overwrite,
    )
    return RunParts(cfg, task, train, test, model, trainer, cfg.built_recipe)
