"""Run configurations: YAML or TOML files validated before any work starts.

A run config has five sections (see ``configs/`` for one per task and ``docs/cli.md``)::

    name: poly-lgt                # optional; the run folder is output.dir/name
    seed: 0
    task:   {name: polynomial_regression, options: {degree: 3}, split: random,
             n_train: 2000, n_eval: 500}
    model:  {architecture: transformer, d_model: 32, n_heads: 4, n_layers: 2,
             grading: linear, learnable_grades: true}   # any TransformerConfig field;
                                  # input_grades: task = the task's natural feature grades
    recipe: auto                  # plain | lgt-alg5.1 | egt-alg7.1 | auto, or {name:, options:}
    train:  {steps: 500, batch_size: 64, lr: 1.0e-3}    # graded.train.options.TrainOptions
    output: {dir: runs}

Sections are pydantic v2 models with ``extra="forbid"``. :func:`load_config` reads the file,
applies ``--set a.b=value`` overrides (values parsed with YAML scalar rules: ``true`` is a
bool, ``null`` None, and also ``1e-3`` a float), validates, and then checks what pydantic cannot
see: the task name and options (against :mod:`graded.tasks`), the model fields (against
:class:`graded.TransformerConfig`) and the recipe name. Every error is a :class:`ConfigError`
naming the key, the bad value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import tomllib
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from graded.train.options import Strict, TrainOptions

RECIPES = ("auto", "plain", "lgt-alg5.1", "egt-alg7.1")
# Model fields the task decides (vocabulary, feature size, length, padding id).
TASK_DERIVED = ("vocab_size", "input_dim", "max_len", "pad_id")


class _Loader(yaml.SafeLoader):
    """YAML 1.1 safe loading, except that ``1e-3`` is a float (YAML 1.1 needs ``1.0e-3``)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."),
)


def parse_yaml(text: str) -> Any:
    """``yaml.safe_load`` with ``1e-3``-style floats."""
    return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass: no objects


class ConfigError(ValueError):
    """A run config is invalid; the message names each bad key, its value and what is allowed."""


class TaskSection(Strict):
    name: str = Field(description="a task of graded.tasks (graded train --help lists them)")
    options: dict[str, Any] = Field(default_factory=dict, description="the task's options")
    split: Literal["random", "size", "family", "relabelled"] = "random"
    n_train: int = Field(2000, ge=1)
    n_eval: int = Field(500, ge=1)
    data_seed: int | None = Field(None, ge=0, description="seed of the data (default: seed)")


class ModelSection(BaseModel):
    """``architecture``, ``pooling``, ``morphic``; every other key is a
    :class:`TransformerConfig` field (transformer architecture only)."""

    model_config = ConfigDict(extra="allow")
    architecture: Literal["transformer", "morphic"] = Field(
        "transformer", description="transformer (LM/seq2seq/encoder by task kind) or morphic "
        "(004; LM tasks)")
    pooling: Literal["mean", "first", "last"] = Field(
        "mean", description="encoder pooling for classification/regression")
    morphic: dict[str, Any] | None = Field(
        None, description="graded.morphic.MorphicConfig fields except vocab_size and max_len")

    @model_validator(mode="after")
    def _known_fields(self) -> ModelSection:
        from graded.transformer.config import TransformerConfig

        own = {"architecture", "pooling", "morphic"}
        allowed = {f.name for f in dataclasses.fields(TransformerConfig)} - set(TASK_DERIVED)
        for key in self.model_extra or {}:
            if key in TASK_DERIVED:
                raise ValueError(f"model.{key} is set by the task; remove it from the config")
            if key not in allowed:
                raise ValueError(_unknown_key_message(f"model.{key}", key, allowed | own))
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
        return dict(self.model_extra or {})


class RecipeSection(Strict):
    """The training recipe (000 Alg. 5.1 / 7.1) and options overriding its hyperparameters
    (``gamma``, ``gamma_heads``, ``gamma_coord``, ``anneal``, ``lambda_max``, ``lr_margin``).
    A bare string is shorthand for ``{name: ...}``."""

    name: Literal["auto", "plain", "lgt-alg5.1", "egt-alg7.1"] = "auto"
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data


class OutputSection(Strict):
    dir: Path = Field("runs", validate_default=True, description="parent folder of run folders")
    overwrite: bool = Field(False, description="replace an existing run folder of the same name")


class RunConfig(Strict):
    name: str | None = Field(None, description="run folder name (default: the config file stem)")
    seed: int = Field(0, ge=0)
    task: TaskSection
    model: ModelSection = Field(default_factory=ModelSection)
    recipe: RecipeSection = Field(default_factory=RecipeSection)
    train: TrainOptions = Field(default_factory=TrainOptions)
    output: OutputSection = Field(default_factory=OutputSection)

    def recipe_name(self) -> str:
        """The recipe to run: ``auto`` follows ``model.grading`` (000 Alg. 5.1 / 7.1)."""
        if self.recipe.name != "auto":
            return self.recipe.name
        grading = self.model.transformer_fields().get("grading")
        return {"linear": "lgt-alg5.1", "exponential": "egt-alg7.1"}.get(grading, "plain")

    def run_dir(self) -> Path:
        return self.output.dir / (self.name or f"{self.task.name}-seed{self.seed}")


def describe_schema() -> str:
    """Every config key with its default and description (for ``graded train --help``)."""
    out = ["config keys (YAML or TOML; unknown keys are errors):"]

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            ann = field.annotation
            sub = next((c for c in (ann, *getattr(ann, "__args__", ()))
                        if isinstance(c, type) and issubclass(c, BaseModel)), None)
            if sub is not None:
                optional = " (optional; null = off)" if field.default is None else ""
                out.append(f"  {prefix}{name}:{optional}")
                walk(sub, prefix + "  ")
                continue
            default = "required" if field.is_required() else (
                "{}" if field.default_factory is not None else repr(field.default))
            choices = get_args(ann) if get_origin(ann) is Literal else ()
            allowed = f"; one of {', '.join(map(str, choices))}" if choices else ""
            desc = f" - {field.description}" if field.description else ""
            out.append(f"  {prefix}{name} (default {default}{allowed}){desc}")

    walk(RunConfig, "")
    out.append("  model: also any graded.TransformerConfig field except "
               + ", ".join(TASK_DERIVED) + " (set by the task)")
    return "\n".join(out)


# --------------------------------------------------------------------------- messages


def _unknown_key_message(where: str, key: str, allowed: set[str] | list[str]) -> str:
    close = difflib.get_close_matches(key, sorted(allowed), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{where}: unknown key{hint}; allowed keys: {', '.join(sorted(allowed))}"


def _section_fields(loc: tuple[Any, ...]) -> list[str]:
    """The allowed keys at ``loc`` in the RunConfig schema (for unknown-key messages)."""
    model: Any = RunConfig
    for part in loc[:-1]:
        field = model.model_fields.get(part) if hasattr(model, "model_fields") else None
        if field is None:
            return []
        ann = field.annotation
        candidates = [ann, *getattr(ann, "__args__", ())]
        model = next((c for c in candidates if isinstance(c, type) and
                      issubclass(c, BaseModel)), None)
        if model is None:
            return []
    return sorted(model.model_fields)


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"invalid config {source}:"]
    for e in err.errors():
        loc = tuple(e["loc"])
        where = ".".join(str(p) for p in loc) or "<top level>"
        if e["type"] == "extra_forbidden":
            lines.append("  " + _unknown_key_message(where, str(loc[-1]), _section_fields(loc)))
        elif e["type"] == "missing":
            lines.append(f"  {where}: required key is missing")
        elif e["type"] == "value_error":  # our validators' messages name key and value
            msg = e["msg"].removeprefix("Value error, ")
            lines.append(f"  {msg}" if msg.startswith(f"{where}.") else f"  {where}: {msg}")
        else:
            lines.append(f"  {where}: got {e['input']!r}; {e['msg']}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- loading


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The raw mapping of a ``.yaml``/``.yml`` or ``.toml`` file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix in (".yaml", ".yml"):
            data = parse_yaml(text)
        elif path.suffix == ".toml":
            data = tomllib.loads(text)
        else:
            raise ConfigError(f"config file {path}: expected a .yaml, .yml or .toml file")
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config file {path} does not parse: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping at the top, got {data!r}")
    return data


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b=value`` overrides (YAML scalar rules) to a copy of ``data``."""
    import copy

    data = copy.deepcopy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. train.lr=3e-4")
        try:
            value = parse_yaml(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {item!r}: value does not parse: {exc}") from None
        node = data
        parts = key.strip().split(".")
        for i, part in enumerate(parts[:-1]):
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                where = ".".join(parts[: i + 1])
                raise ConfigError(f"--set {item!r}: {where} is {nxt!r}, not a section")
            node = nxt
        node[parts[-1]] = value
    return data


def validate_config(data: dict[str, Any], source: str = "<dict>") -> RunConfig:
    """A checked :class:`RunConfig` from a raw mapping (ConfigError naming every problem)."""
    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, source)) from None
    check_semantics(cfg, source)
    return cfg


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Read, override, validate and check a run config file."""
    data = apply_overrides(read_config_file(path), overrides or [])
    data.setdefault("name", Path(path).stem)
    return validate_config(data, str(path))


def check_semantics(cfg: RunConfig, source: str = "<dict>") -> None:
    """What the schema cannot check: task name/options, model fields, recipe vs grading."""
    from graded.tasks import available_tasks

    where = "task.options" if cfg.task.name in available_tasks() else "task.name"
    try:
        task = build_task(cfg)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"invalid config {source}:\n  {where}: {exc}") from None
    try:
        if cfg.task.split in ("size", "family"):
            task.split_configs(cfg.task.split)
        elif cfg.task.split == "relabelled":
            from graded.tasks import Task

            if type(task).relabel is Task.relabel:
                raise ValueError(f"a relabelled split is not meaningful for task {task.name!r}")
    except ValueError as exc:
        raise ConfigError(f"invalid config {source}:\n  task.split: {exc}") from None
    try:
        if cfg.model.architecture == "morphic":
            if task.kind != "lm":
                raise ValueError(f"architecture 'morphic' needs a language-modelling task, "
                                 f"task {task.name!r} is {task.kind!r}")
            morphic_config(cfg, task)
        else:
            transformer_config(cfg, task)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"invalid config {source}:\n  model: {exc}") from None
    grading = cfg.model.transformer_fields().get("grading")
    recipe = cfg.recipe_name()
    try:
        build_recipe(cfg)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"invalid config {source}:\n  recipe.options: {exc}") from None
    if (recipe == "lgt-alg5.1" and grading != "linear") or (
        recipe == "egt-alg7.1" and grading != "exponential"
    ):
        raise ConfigError(
            f"invalid config {source}:\n  recipe: {recipe!r} needs model.grading="
            f"{'linear' if recipe == 'lgt-alg5.1' else 'exponential'}, got {grading!r}"
        )


# --------------------------------------------------------------------------- building


def build_recipe(cfg: RunConfig):
    """The recipe object (``graded.train.recipes.get_recipe``) with the configured options."""
    from graded.train.recipes import get_recipe

    return get_recipe(cfg.recipe_name(), **cfg.recipe.options)


def build_task(cfg: RunConfig):
    """The task object of ``cfg.task`` (``graded.tasks.get_task``)."""
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


def build_model(cfg: RunConfig, task: Any):
    """The model for ``task``: an LM, seq2seq model or encoder classifier/regressor (or a
    morphic LM, 004)."""
    if cfg.model.architecture == "morphic":
        from graded.morphic import build_morphic_model

        return build_morphic_model(morphic_config(cfg, task))
    from graded.transformer import Seq2SeqTransformer, TransformerClassifier, TransformerLM

    tcfg = transformer_config(cfg, task)
    if task.kind == "lm":
        return TransformerLM(tcfg)
    if task.kind == "seq2seq":
        return Seq2SeqTransformer(tcfg)
    return TransformerClassifier(tcfg, task.num_outputs, pooling=cfg.model.pooling)


def build_data(cfg: RunConfig, task: Any):
    """Train and evaluation :class:`~graded.tasks.TaskDataset` by the configured split
    (003 §3.2); their ``.tensors`` dicts feed the trainer."""
    seed = cfg.task.data_seed if cfg.task.data_seed is not None else cfg.seed
    return task.split(cfg.task.split, cfg.task.n_train, cfg.task.n_eval, seed=seed)


@dataclasses.dataclass
class RunParts:
    """Everything a run needs, built from its config (see :func:`build_run`)."""

    config: RunConfig
    task: Any
    train: Any  # TaskDataset
    test: Any  # TaskDataset
    model: Any  # torch.nn.Module
    trainer: Any  # graded.train.trainer.Trainer


def build_run(
    cfg: RunConfig, run_dir: str | Path | None = None, *, resume_command: str | None = None
) -> RunParts:
    """Task, data, model (seeded with ``cfg.seed``) and trainer of a validated config."""
    import torch

    from graded.train.trainer import Trainer

    task = build_task(cfg)
    train, test = build_data(cfg, task)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, task)
    trainer = Trainer(
        model, train.tensors, test.tensors, kind=task.kind, options=cfg.train,
        run_dir=Path(run_dir) if run_dir is not None else cfg.run_dir(), seed=cfg.seed,
        recipe=build_recipe(cfg), config=cfg.model_dump(mode="json"),
        resume_command=resume_command,
    )
    return RunParts(cfg, task, train, test, model, trainer)


def dump_config(cfg: RunConfig) -> str:
    """The config as YAML (written to every run folder; ``--resume`` reads it back)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
