"""The run config's sections and the run config they make (validated by pydantic on the
library's strict base, :class:`graded._schema.Strict`).

A run config has five sections (see ``configs/`` for one per task and ``docs/cli.md``)::

    name: poly-lgt                # optional; the run folder is output.dir/name
    seed: 0
    task:   {name: polynomial_regression, options: {degree: 3}, split: random,
             unseen: true, n_train: 2000, n_eval: 500}
    model:  {architecture: transformer, d_model: 32, n_heads: 4, n_layers: 2,
             grading: linear, learnable_grades: true}   # any TransformerConfig field;
                                  # input_grades: task = the task's natural feature grades
    recipe: auto                  # plain | lgt-alg5.1 | egt-alg7.1 | auto, or {name:, options:}
                                  # e.g. {name: auto, options: {graded_loss: false}}
    train:  {steps: 500, batch_size: 64, lr: 1.0e-3}    # graded.train.options.TrainOptions
    output: {dir: runs}

Their choices come from the modules that own them: split kinds from
:mod:`graded.tasks.base`, architectures from :mod:`graded.kinds`, recipe names from
:data:`graded.train.recipes.RECIPES`. A key that can be off (null) and takes no booleans reads
``false`` as null in every format (TOML has no null): ``train.clip_norm = false`` switches
clipping off (:func:`graded.train.options.takes_false_for_null`). Every error of a run config
is a :class:`ConfigError` naming the key, the bad value and what is allowed.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from graded._schema import Strict, unknown_key_message
from graded.checks import SEED_RANGE
from graded.kinds import ARCHITECTURES
from graded.tasks.base import SPLIT_KINDS
from graded.train.options import TrainOptions, number_not_bool, takes_false_for_null
from graded.train.recipes import OPTIONAL_OPTIONS
from graded.train.recipes import RECIPES as RECIPE_OBJECTS
from graded.transformer.models import POOLINGS

__all__ = [
    "RECIPES",
    "SEED_LIMIT",
    "TASK_DERIVED",
    "ConfigError",
    "ModelSection",
    "OutputSection",
    "RecipeSection",
    "RunConfig",
    "TaskSection",
]

# Recipe names a config may give: "auto" (follow model.grading) or one of the recipes.
RECIPES = ("auto", *RECIPE_OBJECTS)
# Seeds end in torch.manual_seed, which takes at most 64 bits.
SEED_LIMIT = SEED_RANGE[1] + 1
# Model fields the task decides (vocabulary, feature size, length, padding id).
TASK_DERIVED = ("vocab_size", "input_dim", "max_len", "pad_id")


class ConfigError(ValueError):
    """A run config is invalid; the message names each bad key, its value and what is allowed."""


class TaskSection(Strict):
    name: str = Field(description="a task of graded.tasks (graded train --help lists them)")
    options: dict[str, Any] = Field(default_factory=dict, description="the task's options")
    split: Literal[SPLIT_KINDS] = "random"
    unseen: bool = Field(
        True, description="no test input occurs among the training inputs (the loss on "
        "unseen objects); false keeps the test draw as drawn, repeats of training inputs "
        "included (an i.i.d. test set: the population risk)")
    n_train: int = Field(2000, ge=1)
    n_eval: int = Field(500, ge=1)
    data_seed: int | None = Field(None, ge=0, lt=SEED_LIMIT,
                                  description="seed of the data (default: seed)")

    @field_validator("*", mode="before")
    @classmethod
    def _numbers(cls, value: Any, info: ValidationInfo) -> Any:
        return number_not_bool(cls, value, info)


class ModelSection(BaseModel):
    """``architecture``, ``pooling``, ``morphic``; every other key is a
    :class:`TransformerConfig` field (transformer architecture only)."""

    model_config = ConfigDict(extra="allow")
    architecture: Literal[ARCHITECTURES] = Field(
        "transformer", description="transformer (LM/seq2seq/encoder by task kind) or morphic "
        "(004; LM tasks)")
    pooling: Literal[POOLINGS] = Field(
        "mean", description="encoder pooling for classification/regression")
    morphic: dict[str, Any] | None = Field(
        None, description="graded.morphic.MorphicConfig fields except vocab_size and max_len")

    @model_validator(mode="before")
    @classmethod
    def _false_is_null(cls, data: Any) -> Any:
        """``false`` for a key that can be off (``morphic``, a TransformerConfig field that may
        be null and takes no booleans, e.g. ``grading``) is null, as in every section
        (:func:`graded.train.options.takes_false_for_null`)."""
        from graded.transformer.config import TransformerConfig

        if not isinstance(data, dict):
            return data
        fields = {"morphic": cls.model_fields["morphic"], **TransformerConfig.model_fields}
        return {key: None if value is False and key in fields
                and takes_false_for_null(fields[key].annotation) else value
                for key, value in data.items()}

    @model_validator(mode="after")
    def _known_fields(self) -> ModelSection:
        from graded.transformer.config import TransformerConfig

        own = {"architecture", "pooling", "morphic"}
        allowed = set(TransformerConfig.model_fields) - set(TASK_DERIVED)
        for key in self.model_extra or {}:
            if key in TASK_DERIVED:
                raise ValueError(f"model.{key} is set by the task; remove it from the config")
            if key not in allowed:
                raise ValueError(unknown_key_message(f"model.{key}", key, allowed | own))
            if self.architecture == "morphic":
                raise ValueError(f"model.{key} applies to transformer models; a morphic model "
                                 "takes its options under model.morphic")
        if self.architecture == "morphic" and not self.morphic:
            raise ValueError("model.morphic: required for architecture 'morphic' (the fields of "
                             "graded.morphic.MorphicConfig: grades, layers, objective, ...)")
        if self.architecture == "transformer" and self.morphic is not None:
            raise ValueError("model.morphic is only used with architecture: morphic")
        return self

    def transformer_fields(self) -> dict[str, Any]:
        return copy.deepcopy(dict(self.model_extra or {}))


class RecipeSection(Strict):
    """The training recipe (000 Alg. 5.1 / 7.1) and options overriding its hyperparameters
    (``gamma``, ``gamma_heads``, ``gamma_coord``, ``anneal``, ``lambda_max``, ``lr_margin``,
    ``clip_norm``, ``lr_bound``, ``graded_loss``: false trains on the plain loss instead of
    the graded loss), of which each recipe takes only those it reads
    (:attr:`graded.train.recipes.Recipe.options`). A bare string is shorthand for
    ``{name: ...}``; ``--set recipe.options.graded_loss=false`` works on either form."""

    name: Literal[RECIPES] = "auto"
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data

    @field_validator("options")
    @classmethod
    def _false_is_null(cls, options: dict[str, Any]) -> dict[str, Any]:
        """``false`` for an option that can be off (``clip_norm``, ``lambda_max``) is null."""
        return {key: None if value is False and key in OPTIONAL_OPTIONS else value
                for key, value in options.items()}


class OutputSection(Strict):
    dir: Path = Field("runs", validate_default=True, description="parent folder of run folders "
                      "(~ is the home folder)")
    overwrite: bool = Field(False, description="replace an existing run folder of the same name")
    plots: bool = Field(True, description="when training finishes, write RUN/report/ "
                        "(report.md, learning curves and grade plots as PNG)")

    @field_validator("dir")
    @classmethod
    def _home(cls, value: Path) -> Path:
        """``~`` and ``~user`` as a shell reads them (a config file is not read by one: ``dir:
        ~/runs`` made a folder named ``~`` in the current one)."""
        return value.expanduser()


class RunConfig(Strict):
    """A run config. After :func:`validate_config` (or :func:`load_config`) it also holds the
    objects its dry build made: ``built_task``, ``built_model_config``, ``built_recipe``."""

    name: str | None = Field(None, description="run folder name, one folder inside "
                                   "output.dir (default: the config file stem)")
    seed: int = Field(0, ge=0, lt=SEED_LIMIT)
    task: TaskSection
    model: ModelSection = Field(default_factory=ModelSection)
    recipe: RecipeSection = Field(default_factory=RecipeSection)
    train: TrainOptions = Field(default_factory=TrainOptions)
    output: OutputSection = Field(default_factory=OutputSection)

    _task: Any = PrivateAttr(None)
    _model_config: Any = PrivateAttr(None)
    _recipe: Any = PrivateAttr(None)

    @field_validator("*", mode="before")
    @classmethod
    def _numbers(cls, value: Any, info: ValidationInfo) -> Any:
        return number_not_bool(cls, value, info)

    @field_validator("name")
    @classmethod
    def _folder_name(cls, name: str | None) -> str | None:
        """The run folder is ``output.dir/name``: a name is one folder name, so that a run
        never lands in ``output.dir`` itself, beside it or elsewhere on the disk."""
        if name is not None and (name.strip() in ("", ".", "..") or "/" in name
                                 or "\\" in name):
            raise ValueError(f"got {name!r}; expected a folder name (not empty, '.' or '..', "
                             "no '/' or '\\'): the run folder is output.dir/name")
        return name

    def recipe_name(self) -> str:
        """The recipe to run: ``auto`` picks the recipe of ``model.grading``'s kind (000 Alg.
        5.1 for linear, 7.1 for exponential), ``plain`` for an ungraded model."""
        if self.recipe.name != "auto":
            return self.recipe.name
        grading = self.model.transformer_fields().get("grading")
        # the first recipe of each kind (the paper's algorithm): a recipe added later does
        # not take over the runs that name none
        by_kind: dict[str, str] = {}
        for name, recipe in RECIPE_OBJECTS.items():
            if recipe.kind is not None:
                by_kind.setdefault(recipe.kind, name)
        return by_kind.get(grading, "plain")

    def run_dir(self) -> Path:
        return self.output.dir / (self.name or f"{self.task.name}-seed{self.seed}")

    @property
    def built_task(self) -> Any:
        """The task built while validating (None before :func:`validate_config`)."""
        return self._task

    @property
    def built_model_config(self) -> Any:
        """The TransformerConfig or MorphicConfig built while validating."""
        return self._model_config

    @property
    def built_recipe(self) -> Any:
        """The :class:`graded.train.recipes.Recipe` built while validating."""
        return self._recipe
