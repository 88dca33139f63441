"""Run configurations: YAML or TOML files validated, by a dry build, before any work starts.

:mod:`graded.config.schema` holds the sections, loading, overrides and messages;
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
from graded.config.schema import (
    RECIPES,
    TASK_DERIVED,
    ConfigError,
    ModelSection,
    OutputSection,
    RecipeSection,
    RunConfig,
    TaskSection,
    apply_overrides,
    describe_schema,
    dump_config,
    load_config,
    load_run_config,
    parse_yaml,
    read_config_file,
    validate_config,
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
