"""The run-config schema: a run config read, overridden, validated and dry-built.

A run config (:class:`~graded.config.sections.RunConfig`, five sections: ``task``, ``model``,
``recipe``, ``train``, ``output``; see ``configs/`` and ``docs/cli.md``) is read from a YAML or
TOML file, ``--set a.b=value`` overrides are applied (:mod:`graded.config.files`) and the
sections are validated (:mod:`graded.config.sections`; the messages of
:mod:`graded.config.messages`). Validation ends in a dry build
(:func:`graded.config.compose.dry_build`): the task, the model config
(:class:`graded.TransformerConfig` or :class:`graded.morphic.MorphicConfig`) and the recipe are
built, checked and kept on the returned :class:`RunConfig` (``built_task``,
``built_model_config``, ``built_recipe``), and :func:`graded.config.compose.build_run` uses
those very objects. Every error is a :class:`ConfigError` naming the key, the bad value and
what is allowed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from graded.config.files import apply_overrides, read_config_file
from graded.config.messages import format_errors
from graded.config.sections import (
    TASK_DERIVED,
    ConfigError,
    ModelSection,
    OutputSection,
    RunConfig,
)

__all__ = [
    "TASK_DERIVED",
    "ConfigError",
    "ModelSection",
    "OutputSection",
    "RunConfig",
    "load_config",
    "load_run_config",
    "python_run_message",
    "validate_config",
]


def validate_config(data: dict[str, Any], source: str = "<dict>") -> RunConfig:
    """A checked :class:`RunConfig` from a raw mapping, holding the task, model config and
    recipe of its dry build (ConfigError naming every problem)."""
    from graded.config.compose import dry_build

    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_errors(exc, source)) from None
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
