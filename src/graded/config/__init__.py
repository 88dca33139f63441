"""Run configurations: YAML or TOML files validated, by a dry build, before any work starts.

:mod:`graded.config.sections` holds the sections and the run config they make;
:mod:`graded.config.files` reads files and applies ``--set`` overrides;
:mod:`graded.config.messages` lists the keys (``graded train --help``) and words the errors;
:mod:`graded.config.schema` loads and validates a run config;
:mod:`graded.config.compose` is the composition root that builds the task, data, model, recipe
and trainer of a run. Everything is importable from here.
"""

from graded.config.compose import (
    RunParts,
    build_data,
    build_model,
    build_recipe,
    build_run,
    build_task,
    check_semantics,
    dry_build,
    morphic_config,
    transformer_config,
)
from graded.config.files import apply_overrides, dump_config, parse_yaml, read_config_file
from graded.config.messages import describe_schema
from graded.config.schema import load_config, load_run_config, validate_config
from graded.config.sections import (
    RECIPES,
    TASK_DERIVED,
    ConfigError,
    ModelSection,
    OutputSection,
    RecipeSection,
    RunConfig,
    TaskSection,
)

__all__ = [
    "RECIPES",
    "TASK_DERIVED",
    "ConfigError",
    "ModelSection",
    "OutputSection",
    "RecipeSection",
    "RunConfig",
    "RunParts",
    "TaskSection",
    "apply_overrides",
    "build_data",
    "build_model",
    "build_recipe",
    "build_run",
    "build_task",
    "check_semantics",
    "describe_schema",
    "dry_build",
    "dump_config",
    "load_config",
    "load_run_config",
    "morphic_config",
    "parse_yaml",
    "read_config_file",
    "transformer_config",
    "validate_config",
]
