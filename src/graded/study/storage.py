"""Where the claims study keeps what it finished (:mod:`graded.study.runner` reads and writes
through these): the output folder's paths, JSON written atomically, stored files read back or
refused by name, the check that a folder holds one setting (quick or full, seeds, first
seed), ``study.json``, each experiment's ``findings.json`` and each stored job saying which, and
the check that its files and folders are of the kind the study writes.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from graded.checks import check_float
from graded.study.core import Finding, atomic_write_text

__all__ = ["SETTINGS", "check_layout", "check_settings", "experiment_dir", "job_file", "slug"]

SETTINGS = ("quick", "seeds", "seeds_given", "base_seed")  # what study.json holds


def slug(name: str) -> str:
    """A file-system name for an experiment or job key (``E4/E5`` → ``E4-E5``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-")


def experiment_dir(out: Path, name: str) -> Path:
    return Path(out) / slug(name)


def job_file(out: Path, name: str, key: str) -> Path:
    return experiment_dir(out, name) / "jobs" / f"{slug(key)}.json"


def _json_safe(value: Any) -> Any:
    """NaN and infinities become None (JSON has no such numbers)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(_json_safe(data), indent=1, ensure_ascii=False))


def _read_stored(path: Path, what: str, keys: tuple[str, ...] = ()) -> dict:
    """The JSON object stored in ``path`` (``what`` it holds), with ``keys``; a file that is
    not such an object (cut short by a crash, edited by hand) is refused by name rather than
    read as empty or failing later with no file named."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} ({what}) cannot be read: {e}; delete it to redo what it "
                         "stored") from None
    missing = [k for k in keys if not isinstance(data, dict) or k not in data]
    if not isinstance(data, dict) or missing:
        raise ValueError(f"{path} ({what}) is damaged: expected a JSON object with "
                         f"{', '.join(keys) or 'fields'}, missing {missing or type(data).__name__}"
                         "; delete it to redo what it stored")
    return data


def _seconds(data: dict, key: str) -> float | None:
    """``data[key]``, a stored time in seconds (None where absent or null); ``ValueError``
    naming ``key`` for any other value."""
    return None if data.get(key) is None else check_float(key, data[key], minimum=0.0)


def _read_findings(path: Path, name: str) -> tuple[list[Finding], float, float | None]:
    """The findings, wall time and summed job time (None if not stored) that
    :meth:`graded.study.runner._Scheduler._finish` stored for experiment ``name``; a file
    that does not hold them is refused by name."""
    what = f"the stored findings of {name}"
    stored = _read_stored(path, what, ("findings",))
    try:
        if not isinstance(stored["findings"], list):
            raise TypeError(f"findings is {stored['findings']!r}; expected a list")
        return ([Finding.from_dict(f) for f in stored["findings"]],
                _seconds(stored, "wall_s") or 0.0, _seconds(stored, "job_seconds"))
    except (TypeError, ValueError, KeyError) as e:
        raise ValueError(f"{path} ({what}) is damaged: {e}; delete it to rerun {name}") from None


def _read_job(path: Path, name: str, fields: tuple[str, ...] = ()) -> dict:
    """A finished job of experiment ``name`` as the runner had it (NaN read back for None),
    less the settings stored beside it (:meth:`graded.study.runner._Scheduler.done` writes
    both). A file that lacks one of ``fields`` (the experiment's ``result_fields``) or whose
    run time is not one is refused by name, as one that is not JSON is: its experiment's
    summary would otherwise fail on a bare ``KeyError``."""
    what = f"a finished job of {name}"
    data = _read_stored(path, what, fields)
    try:
        _seconds(data, "_wall_s")
    except ValueError as e:
        raise ValueError(f"{path} ({what}) is damaged: {e}; delete it to redo what it "
                         "stored") from None
    return {k: (math.nan if v is None and k in ("val", "test", "train_first", "train_last")
                else v) for k, v in data.items() if k != "_settings"}


def _describe(settings: dict[str, Any]) -> str:
    """A folder's setting in the command's terms (``--quick, --seeds 3, first seed 0``); a
    stored one that lacks a field is shown as stored."""
    if not (isinstance(settings, dict) and all(k in settings for k in SETTINGS)):
        return repr(settings)
    seeds = (f"--seeds {settings['seeds']}" if settings["seeds_given"] else
             f"the mode's default seeds ({settings['seeds']}; no --seeds)")
    return (f"{'--quick' if settings['quick'] else 'the full study (no --quick)'}, {seeds}, "
            f"first seed {settings['base_seed']}")


def check_settings(out: Path, settings: dict[str, Any]) -> None:
    """A folder holds the results of one setting: refuse to mix another into it, whether
    ``study.json``, a stored experiment's own ``findings.json`` or a stored job says so
    (before ``study.json`` is written, so a refused call changes nothing). The messages give
    both settings in the command's terms."""
    path = out / "study.json"
    this = f"not of this call's {_describe(settings)}"
    if path.exists():
        stored = _read_stored(path, "the folder's study settings", SETTINGS)
        if {k: stored.get(k) for k in settings} != settings:
            raise ValueError(f"{out} holds a study run of {_describe(stored)}, {this}; use "
                             "another --out (or delete the folder) to start afresh")
    for done in sorted(out.glob("*/findings.json")):
        own = _read_stored(done, "an experiment's stored findings", ("findings",))
        if own.get("settings") is not None and own["settings"] != settings:
            raise ValueError(f"{done} holds findings of {_describe(own['settings'])}, {this}; "
                             "delete it (or use another --out) to rerun its experiment")
    for job in sorted(out.glob("*/jobs/*.json")):  # E1's runs: reused whatever their budget
        own = _read_stored(job, "a finished job of a study run")
        if own.get("_settings") is not None and own["_settings"] != settings:
            raise ValueError(f"{job} holds a job run of {_describe(own['_settings'])}, {this}; "
                             f"delete {job.parent} (or use another --out) to rerun its "
                             "experiment's jobs")
    _write_json(path, settings)


def check_layout(out: Path, names: Iterable[str]) -> None:
    """Refuse by name, before anything runs, a folder edited by hand so that the study cannot
    write its files: a folder where ``report.md`` or ``results.json`` goes, a file where the
    folder of experiment ``names`` or its ``jobs`` go. The study would otherwise fail on a
    bare ``OSError`` when it stores a result or writes the report, after the runs."""
    for file in ("report.md", "results.json"):
        if (out / file).is_dir():
            raise ValueError(f"{out / file} is a folder; expected the study's {file} file (or "
                             "nothing): move or delete it")
    for name in names:
        folder = experiment_dir(out, name)
        for path, what in ((folder, f"the folder of experiment {name}"),
                           (folder / "jobs", f"the folder of {name}'s stored jobs")):
            if path.exists() and not path.is_dir():
                raise ValueError(f"{path} is a file; expected {what} (or nothing): move or "
                                 "delete it")
