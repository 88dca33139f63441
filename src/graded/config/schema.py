"""The run-config schema: sections, files, overrides and messages.

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

Sections are models on the library's strict base (:class:`graded._schema.Strict`). Their
choices come from the modules that own them: split kinds from :mod:`graded.tasks.base`,
architectures from :mod:`graded.kinds`, recipe names from :data:`graded.train.recipes.RECIPES`.
:func:`load_config` reads the file, applies ``--set a.b=value`` overrides (values parsed with
YAML scalar rules: ``true`` is a bool, ``null`` None, and also ``1e-3`` a float) and validates.
A key that can be off (null) and takes no booleans reads ``false`` as null in every format
(TOML has no null): ``train.clip_norm = false`` switches clipping off
(:func:`graded.train.options.takes_false_for_null`).
Validation ends in a dry build (:func:`graded.config.compose.dry_build`): the task, the model
config (:class:`graded.TransformerConfig` or :class:`graded.morphic.MorphicConfig`) and the
recipe are built, checked and kept on the returned :class:`RunConfig` (``built_task``,
``built_model_config``, ``built_recipe``), and :func:`graded.config.compose.build_run` uses
those very objects. Every error is a :class:`ConfigError` naming the key, the bad value and
what is allowed.
"""

from __future__ import annotations

import copy
import re
import sys
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import tomllib
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from graded._schema import Strict, allowed_keys, unknown_key_message
from graded.kinds import ARCHITECTURES
from graded.tasks.base import SPLIT_KINDS
from graded.train.options import TrainOptions, number_not_bool, takes_false_for_null
from graded.train.recipes import OPTIONAL_OPTIONS
from graded.train.recipes import RECIPES as RECIPE_OBJECTS
from graded.transformer.models import POOLINGS

# Recipe names a config may give: "auto" (follow model.grading) or one of the recipes.
RECIPES = ("auto", *RECIPE_OBJECTS)
# Seeds end in torch.manual_seed, which takes at most 64 bits.
SEED_LIMIT = 2**64
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


def _mapping_without_duplicates(loader: _Loader, node: yaml.MappingNode) -> dict[Any, Any]:
    """A mapping whose keys are all different: YAML loaders keep the last of two equal keys, so
    a second ``train:`` section would silently replace the first, keys and all."""
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # `<<: *anchor`: keys given beside it override the merged ones, by design
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str | int | float | bool):
            continue  # an unhashable key fails in construct_mapping, as in plain YAML
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"the key {key!r} is given twice (the second would silently "
                "replace the first)", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                        _mapping_without_duplicates)


def parse_yaml(text: str) -> Any:
    """``yaml.safe_load`` with ``1e-3``-style floats, refusing a key given twice in a mapping."""
    return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass: no objects


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
    dir: Path = Field("runs", validate_default=True, description="parent folder of run folders")
    overwrite: bool = Field(False, description="replace an existing run folder of the same name")
    plots: bool = Field(True, description="when training finishes, write RUN/report/ "
                        "(report.md, learning curves and grade plots as PNG)")


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
        by_kind = {r.kind: name for name, r in RECIPE_OBJECTS.items() if r.kind is not None}
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


# Keys whose default follows another key (a validator fills them in), shown as such.
_DERIVED_DEFAULTS = {("train", "monitor_mode"): "follows monitor"}


def _registered_choices(section: str, name: str) -> tuple[str, ...]:
    """Choices a string field takes from a registry rather than a ``Literal``."""
    if section != "model":
        return ()
    if name in ("attn_backend", "cross_attn_backend"):
        from graded.attention.backends import available_backends

        return tuple(available_backends())
    if name == "grade_init":
        from graded.transformer.graded import GRADE_INITS

        return GRADE_INITS
    return ()


def _choices(annotation: Any) -> tuple[Any, ...]:
    """The values a ``Literal`` (or an optional ``Literal``, with ``null``) allows; () else."""
    if get_origin(annotation) is Literal:
        return get_args(annotation)
    args = get_args(annotation)
    literal = next((a for a in args if get_origin(a) is Literal), None)
    if literal is None:
        return ()
    return (*get_args(literal), *(("null",) if type(None) in args else ()))


def _describe_field(name: str, field: Any, prefix: str, section: str) -> str:
    default = _DERIVED_DEFAULTS.get((section, name))
    if default is None:
        default = "required" if field.is_required() else repr(
            field.get_default(call_default_factory=True))
    choices = _choices(field.annotation) or _registered_choices(section, name)
    each = "each " if get_origin(field.annotation) is list else ""
    allowed = f"; {each}one of {', '.join(map(str, choices))}" if choices else ""
    desc = f" - {field.description}" if field.description else ""
    return f"  {prefix}{name} (default {default}{allowed}){desc}"


def describe_schema() -> str:
    """Every config key with its default, its allowed values and its description (for
    ``graded train --help``), the model section's :class:`TransformerConfig` fields included."""
    from graded.transformer.config import TransformerConfig

    out = ["config keys (YAML or TOML; unknown keys are errors):"]

    def walk(model: type[BaseModel], prefix: str, section: str) -> None:
        for name, field in model.model_fields.items():
            ann = field.annotation
            sub = next((c for c in (ann, *getattr(ann, "__args__", ()))
                        if isinstance(c, type) and issubclass(c, BaseModel)), None)
            if sub is not None:
                optional = " (optional; null or false = off)" if field.default is None else ""
                out.append(f"  {prefix}{name}:{optional}")
                walk(sub, prefix + "  ", name if not prefix else section)
                if sub is ModelSection:
                    out.append(f"  {prefix}  (transformer architecture) any "
                               "graded.TransformerConfig field but "
                               + ", ".join(TASK_DERIVED) + " (set by the task):")
                    for key, tfield in TransformerConfig.model_fields.items():
                        if key not in TASK_DERIVED:
                            out.append(_describe_field(key, tfield, prefix + "    ", "model"))
                continue
            out.append(_describe_field(name, field, prefix, section))

    walk(RunConfig, "", "")
    return "\n".join(out)


# --------------------------------------------------------------------------- messages


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"invalid config {source}:"]
    for e in err.errors():
        loc = tuple(e["loc"])
        where = ".".join(str(p) for p in loc) or "<top level>"
        if e["type"] == "extra_forbidden":
            lines.append("  " + unknown_key_message(where, str(loc[-1]),
                                                    allowed_keys(RunConfig, loc[:-1])))
        elif e["type"] == "missing" and loc and isinstance(loc[-1], int):
            # a fixed-length list (e.g. betas) given too few values
            parent = ".".join(str(p) for p in loc[:-1])
            lines.append(f"  {parent}: got {e['input']!r}; expected more values (no value at "
                         f"position {loc[-1]})")
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
        raise ConfigError(f"config file {path} does not parse: {_parse_error(exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping at the top, got {data!r}")
    return data


def _parse_error(exc: Exception) -> str:
    """A YAML or TOML parse error in one line: the problem and where."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is None or problem is None:
        return " ".join(str(exc).split())
    context = getattr(exc, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}"
    return f"{context + ': ' if context else ''}{problem} ({where})"


# Sections a config may give as a bare string, and the key that string stands for.
SHORTHANDS = {"recipe": "name"}


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b=value`` overrides (YAML scalar rules) to a copy of ``data``; a section in
    its shorthand (``recipe: auto``) is expanded (``{name: auto}``) to set a key inside it,
    and a section that is off (``early_stopping: null``, as every ``config.yaml`` without it
    reads, or ``false``, as TOML writes it) is started empty to set a key inside it. An item
    of a list is named by its index (``model.morphic.layers.1.router.rank=4``)."""
    data = copy.deepcopy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. train.lr=3e-4")
        try:
            value = parse_yaml(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {item!r}: value does not parse: {_parse_error(exc)}"
                              ) from None
        node: Any = data
        parts = key.strip().split(".")
        for i, part in enumerate(parts[:-1]):
            if isinstance(node, list):
                nxt = node[_list_index(item, parts[:i], part, node)]
            else:
                nxt = node.setdefault(part, {})
                if nxt is None or nxt is False:  # a section that is off (null, or false)
                    nxt = node[part] = {}
                if node is data and part in SHORTHANDS and isinstance(nxt, str):
                    nxt = node[part] = {SHORTHANDS[part]: nxt}
            if not isinstance(nxt, dict | list):
                where = ".".join(parts[: i + 1])
                raise ConfigError(f"--set {item!r}: {where} is {nxt!r}, not a section")
            node = nxt
        if isinstance(node, list):
            node[_list_index(item, parts[:-1], parts[-1], node)] = value
        else:
            node[parts[-1]] = value
    return data


def _list_index(item: str, where: list[str], part: str, items: list[Any]) -> int:
    """The index ``part`` names in the list ``items`` (at the dotted key ``where``)."""
    if not part.isdigit() or int(part) >= len(items):
        expected = f"an index 0 to {len(items) - 1}" if items else "no index: it is empty"
        raise ConfigError(f"--set {item!r}: {'.'.join(where)} is a list of {len(items)} "
                          f"item(s); expected {expected}, got {part!r}")
    return int(part)


def validate_config(data: dict[str, Any], source: str = "<dict>") -> RunConfig:
    """A checked :class:`RunConfig` from a raw mapping, holding the task, model config and
    recipe of its dry build (ConfigError naming every problem)."""
    from graded.config.compose import dry_build

    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, source)) from None
    dry_build(cfg, source)
    return cfg


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Read, override, validate and dry-build a run config file."""
    data = apply_overrides(read_config_file(path), overrides or [])
    data.setdefault("name", Path(path).stem)
    return validate_config(data, str(path))


def load_run_config(run_dir: str | Path) -> RunConfig:
    """The validated config of a run folder (its ``config.yaml``, as ``graded train`` wrote
    it), for commands that work on finished runs (``graded report``, ``eval``, ``generate``);
    a recorded ``train.device`` this version refuses does not block them
    (:func:`_stored_device`)."""
    path = Path(run_dir) / "config.yaml"
    if not Path(run_dir).exists():
        raise ConfigError(f"{run_dir}: no such folder; expected a run folder of graded train")
    if not path.is_file():
        raise ConfigError(f"{run_dir} has no config.yaml: not a run folder of graded train")
    data = read_config_file(path)
    if "task" not in data and "kind" in data:
        raise ConfigError(python_run_message(run_dir, data))
    return validate_config(_stored_device(data, path), str(path))


def _stored_device(data: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """``data`` (a run folder's recorded config) with a ``train.device`` that this version
    refuses read as the device it stands for. The device a run trained on is a record: the
    commands that read a finished run (``graded eval``, ``generate``, ``report``) do not train
    there, so an old value must not keep them from reading it. Earlier versions took ``cpu:N``
    (an index torch ignores on the CPU), now refused by
    :func:`graded.train.distributed.check_device_name`: it is read as ``cpu``, what such a run
    ran on; any other refused value is left out (the default, ``auto``). Either way a warning
    on stderr names the stored value and the file. A new config (:func:`load_config`, also
    ``graded train --resume``, which trains on its device) is still refused such a value."""
    from graded.train.distributed import check_device_name

    train = data.get("train")
    if not isinstance(train, dict) or "device" not in train:
        return data
    device = train["device"]
    try:
        check_device_name(device)
        return data
    except ValueError:
        train = dict(train)
    if isinstance(device, str) and re.fullmatch(r"cpu:[0-9]+", device):
        train["device"] = "cpu"
        read = "read as 'cpu' (the CPU it ran on: torch ignores a CPU index)"
    else:
        del train["device"]
        read = "left out (the default, 'auto'): the device it trained on is not read here"
    print(f"graded: warning: {path}: train.device={device!r}, which this version no longer "
          f"takes (expected 'auto', 'cpu', 'cuda' or 'cuda:N'), is {read}; a resume, which "
          "trains there, needs --set train.device=cpu (or another device)", file=sys.stderr)
    return {**data, "train": train}


def python_run_message(run_dir: str | Path, data: dict[str, Any]) -> str:
    """Why a run folder written by the Python ``Trainer`` (its ``config.yaml`` records the task
    kind and the model, no task) cannot be rebuilt from its config."""
    return (f"{run_dir} is a run of the Python Trainer (its config.yaml records kind "
            f"{data.get('kind')!r} and no task): its data are the caller's tensors, which the "
            "command line cannot rebuild; expected a run folder of graded train or the demo "
            f"(from Python: Trainer(...).fit(resume_from={str(run_dir)!r}), "
            "graded.train.evaluate)")


def dump_config(cfg: RunConfig) -> str:
    """The config as YAML (written to every run folder; ``--resume`` reads it back)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
