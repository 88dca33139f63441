"""Runs in their folders: which run a folder holds, the resume rule, opening a run.

One run folder (its lock, ``run.lock``; its manifest of what the library wrote,
``.graded-run.json``; its ``history.jsonl``) is :mod:`graded.train.run_folder`, whose names this
module also gives (:class:`RunFolder`, :class:`RunError`, :class:`RunLockedError`,
:class:`LockHolder`, the file names). Here: the files by which a folder holds a search run
rather than a training run (:func:`search_run_files`, :func:`training_run_files`,
:func:`refuse_search_run`), the resume rule below, and :func:`open_run`, which readies a
folder for a fresh, overwritten or resumed run and records it in the history.

**The resume rule.** A resumed run continues the same optimisation, so the keys that define it
cannot change: the task, the model, the seed, the task kind, the recipe, and the training options
that shape the optimisation or its data order (``batch_size``, ``grad_accum``, ``schedule``,
``warmup_steps``, ``min_lr_ratio``, ``betas``, ``eps``, ``weight_decay``, ``clip_norm``,
``label_smoothing``, and ``monitor``/``monitor_mode``, which the best checkpoint was chosen by).
The keys of :data:`RESUMABLE_KEYS` may change: more (or fewer, but not fewer than the
run has made: refused by :func:`graded.train.resume.plan_resume`) ``train.steps``, which
re-spans the schedule; a new peak ``train.lr`` or ``train.grade_lr``, which is used from the
resume step on (:func:`graded.train.resume.use_peak_lrs`); how often to evaluate, log and
checkpoint; ``keep_last``, ``progress``, ``tensorboard``, ``eval_batch_size``, ``device``,
``early_stopping``; ``output.*`` and ``name``.
A key added after runs were first recorded (:data:`ADDED_KEYS`: ``task.unseen``,
``train.precision``, ...) is compared, where a recorded config lacks it, as the default it was
added with, which is what that run did: such a run resumes with the default, and a new value
of a key that cannot change is refused like any other change.
:func:`resume_changes` sorts the differences of two configs by that rule: those of the new config
against the checkpoint's decide what a resume refuses; those against the config the run last
ran with (:func:`last_run_view`: a change made at one resume is recorded once, not again at
each later resume from a checkpoint saved before it) are recorded in ``history.jsonl``.
How a resume is checked and loaded before anything is written: :mod:`graded.train.resume`.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graded.train.run_folder import (
    CONFIG_FILE,
    HISTORY_FILE,
    LIBRARY_ENTRIES,
    LOCK_FILE,
    LOCK_PURPOSES,
    MANIFEST_FILE,
    LockHolder,
    RunError,
    RunFolder,
    RunLockedError,
)

if TYPE_CHECKING:
    from graded.train.resume import ResumePlan

__all__ = ["ADDED_KEYS", "CONFIG_FILE", "HISTORY_FILE", "LIBRARY_ENTRIES", "LOCK_FILE",
           "LOCK_PURPOSES", "MANIFEST_FILE", "PATTERNBOOST_FILES", "PROGRAM_SEARCH_FILES",
           "RESUMABLE_KEYS", "SEARCH_RUN_FILES", "LockHolder", "RunError", "RunFolder",
           "RunLockedError", "checked_changes", "checkpoint_view", "holds_checkpoint",
           "last_run_view", "may_change_on_resume", "open_run",
           "refusal_message", "refuse_search_run", "resume_changes", "run_view",
           "search_run_files", "training_run_files"]

RESUMABLE_KEYS = ("name", "output", "train.steps", "train.lr", "train.grade_lr",
                  "train.eval_every", "train.log_every", "train.checkpoint_every",
                  "train.keep_last", "train.progress", "train.tensorboard",
                  "train.eval_batch_size", "train.device", "train.early_stopping",
                  "train.compile")
# Keys added after runs were first recorded, with the value a recorded config without them
# stands for: the default each was added with, which is what those runs did. A key of this
# table absent on one side of a resume compares as that value (a run recorded before
# ``task.unseen`` existed resumes with the default, and is refused ``task.unseen: false``).
ADDED_KEYS = {"task.unseen": True, "train.precision": "fp32", "train.compile": False,
              "output.plots": True}
_ABSENT = object()

#: The files by which a folder holds a run of the program search (``graded search program``):
#: its state and its evaluation log.
PROGRAM_SEARCH_FILES = ("database.json", "evaluations.csv")
#: The file by which a folder holds a PatternBoost run (``graded search patternboost``, which
#: writes a ``config.json`` and a ``metrics.csv`` of its own there too).
PATTERNBOOST_FILES = ("state.json",)
#: The files by which a folder holds a run of :mod:`graded.search`, not a training run.
SEARCH_RUN_FILES = PROGRAM_SEARCH_FILES + PATTERNBOOST_FILES


def search_run_files(folder: str | os.PathLike[str],
                     names: tuple[str, ...] = SEARCH_RUN_FILES) -> list[str]:
    """The entries of ``folder`` among ``names`` (default: those that mark any search run,
    :data:`SEARCH_RUN_FILES`); [] for none. The trainer refuses a folder holding a search run,
    each search a folder holding a training run or the other search's run."""
    return [name for name in names if (Path(folder) / name).exists()]


def training_run_files(folder: str | os.PathLike[str]) -> list[str]:
    """The entries of ``folder`` that mark a run of the trainer: its manifest, its
    ``checkpoints`` folder and its ``history.jsonl``; [] for none. A user's own files do not
    count, as the trainer refuses only a folder holding a run. The searches (program search,
    PatternBoost) refuse a folder holding one."""
    return [name for name in (MANIFEST_FILE, "checkpoints", "history.jsonl")
            if (Path(folder) / name).exists()]


def refuse_search_run(folder: str | os.PathLike[str]) -> None:
    """Raise :class:`RunError` naming ``folder`` and the files of the search run it holds, if
    it holds one: a training run there would write beside them (fresh, overwritten or
    resumed alike: ``overwrite`` removes only what the trainer wrote)."""
    found = search_run_files(folder)
    if found:
        raise RunError(
            f"run folder {folder} holds a search run ({', '.join(found)}), not a training "
            "run; training writes config.yaml, metrics.csv, checkpoints/ and its logs there, "
            "so choose another folder (in the CLI another output.dir or name)")


# --------------------------------------------------------------------------- the resume rule


def may_change_on_resume(key: str) -> bool:
    """Whether the dotted config ``key`` may differ on resume (see the module docstring)."""
    return any(key == k or key.startswith(k + ".") for k in RESUMABLE_KEYS)


def _differences(old: Any, new: Any, prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """``{dotted key: (old, new)}`` of the values that differ, down to where one side is not a
    section: a section turned on or off (``early_stopping: null`` against ``{patience: 2}``)
    is one difference of the section, not of each key inside it."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out: dict[str, tuple[Any, Any]] = {}
        for key in [*old, *(k for k in new if k not in old)]:
            out.update(_differences(old.get(key, _ABSENT), new.get(key, _ABSENT),
                                    f"{prefix}.{key}" if prefix else str(key)))
        return out
    if prefix in ADDED_KEYS:  # absent from a config recorded before the key existed
        old, new = (ADDED_KEYS[prefix] if v is _ABSENT else v for v in (old, new))
    return {} if old == new else {prefix: (old, new)}


def resume_changes(
    old: Mapping[str, Any], new: Mapping[str, Any]
) -> tuple[dict[str, tuple[Any, Any]], dict[str, tuple[Any, Any]]]:
    """The differences of two nested configs (``config.yaml`` contents) as ``{dotted key: (old,
    new)}``, split into those a resume accepts and those it refuses (module docstring). A key
    on one side only is a difference (its other value is shown as ``absent``); a section on
    one side and a value (null) on the other is one difference of the section."""
    allowed: dict[str, tuple[Any, Any]] = {}
    refused: dict[str, tuple[Any, Any]] = {}
    for key, (before, after) in _differences(old, new).items():
        target = allowed if may_change_on_resume(key) else refused
        target[key] = (_shown(before), _shown(after))
    return allowed, refused


def _shown(value: Any) -> Any:
    return "absent" if value is _ABSENT else value


def refusal_message(run: str | os.PathLike[str], refused: Mapping[str, tuple[Any, Any]]) -> str:
    """One line naming each refused key with its old and new value."""
    changes = "; ".join(f"{k} was {json.dumps(o)}, now {json.dumps(n)}"
                        for k, (o, n) in refused.items())
    return (f"cannot resume {run} with a changed config: {changes} (these cannot change "
            f"mid-run; start a new run for that, or change only {', '.join(RESUMABLE_KEYS)})")


def run_view(config: Mapping[str, Any], *, options: Mapping[str, Any], seed: Any,
             kind: Any) -> dict[str, Any]:
    """What a resume compares: the run's config with its seed, task kind and train options."""
    return {**config, "seed": seed, "kind": kind, "train": dict(options)}


def checkpoint_view(checkpoint_state: Mapping[str, Any]) -> dict[str, Any]:
    """The :func:`run_view` of the run that saved a checkpoint (its JSON state)."""
    return run_view(checkpoint_state.get("config") or {},
                    options=checkpoint_state.get("options") or {},
                    seed=checkpoint_state.get("seed"), kind=checkpoint_state.get("kind"))


def checked_changes(
    run: str | os.PathLike[str], checkpoint_state: Mapping[str, Any], new: Mapping[str, Any]
) -> dict[str, tuple[Any, Any]]:
    """The accepted changes from a checkpoint's run to ``new`` (a :func:`run_view`); a refused
    one raises :class:`RunError` (:func:`refusal_message`)."""
    allowed, refused = resume_changes(checkpoint_view(checkpoint_state), new)
    if refused:
        raise RunError(refusal_message(run, refused))
    return allowed


def holds_checkpoint(run_dir: str | os.PathLike[str], checkpoint: str | os.PathLike[str]) -> bool:
    """Whether ``checkpoint`` is one of the run folder ``run_dir``'s own (not of another run
    resumed into it)."""
    return Path(checkpoint).resolve().is_relative_to(Path(run_dir).resolve())


def last_run_view(saved: Mapping[str, Any],
                  history: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The config a run last ran with: ``saved`` (the :func:`checkpoint_view` of one of its
    checkpoints) with each change its ``history`` recorded since the run last started
    (``override`` events after the last ``start``) applied in order. A checkpoint keeps the
    config of the run that saved it, so a change made at a resume that saved no checkpoint
    before it stopped (or whose later checkpoints are damaged) is in the history only;
    compared against the checkpoint alone, each later resume would record it again. An
    override recorded before the checkpoint was saved sets what the
    checkpoint holds already, or what a later override sets again, as the history is the
    run's one line of events."""
    view = copy.deepcopy(dict(saved))
    starts = [i for i, event in enumerate(history) if event.get("event") == "start"]
    for event in history[starts[-1] + 1 if starts else 0:]:
        key = event.get("key")
        if event.get("event") != "override" or not isinstance(key, str) or "new" not in event:
            continue
        *sections, name = key.split(".")
        node = view
        for section in sections:
            if not isinstance(node.get(section), dict):
                node[section] = {}
            node = node[section]
        node[name] = event["new"]
    return view


def open_run(run: RunFolder, config: Mapping[str, Any], plan: ResumePlan | None, *,
             existing: bool, overwrite: bool, entries: Sequence[str]) -> None:
    """Ready a run folder (its lock held) for a fresh run (``plan`` None) or a resume: refuse
    an ``existing`` run unless ``overwrite`` (then remove what the library wrote), record the
    ``entries`` about to be written, write ``config.yaml`` and the history's events, and say on
    stderr what was removed or skipped. A resume from a checkpoint of another folder is a new
    run here: it is refused over an ``existing`` run as a fresh run is (its checkpoints would
    replace those of the folder's own run, step by step)."""
    elsewhere = plan is not None and not holds_checkpoint(run.path, plan.checkpoint)
    if existing and (plan is None or elsewhere):
        if not overwrite and plan is None:
            raise RunError(
                f"run folder {run.path} already holds checkpoints; resume it with "
                f"fit(resume_from={str(run.path)!r}) or build the Trainer with overwrite=True "
                "to replace what the library wrote there")
        if not overwrite:
            raise RunError(
                f"run folder {run.path} already holds checkpoints of its own run; resuming "
                f"from {plan.checkpoint} there would write over them: resume into a new "
                "folder, or build the Trainer with overwrite=True to replace what the "
                "library wrote there")
        removed = run.remove_written()
        if removed:
            print(f"overwriting {run.path}: removed " + ", ".join(p.name for p in removed),
                  file=sys.stderr)
    if not run.writer:
        return
    run.record(*entries)
    run.write_config(config)
    if plan is None:
        run.append_history("start", step=0)
        return
    for path, reason in plan.skipped:
        print(f"warning: skipped damaged checkpoint {path}: {reason}", file=sys.stderr)
    if plan.skipped:
        print(f"resuming from {plan.checkpoint} (step {plan.step}), the newest intact "
              "checkpoint", file=sys.stderr)
    run.append_history("resume", step=plan.step, checkpoint=str(plan.checkpoint),
                       skipped=[[str(p), reason] for p, reason in plan.skipped])
    for key, (old, new) in plan.changes.items():
        run.append_history("override", key=key, old=old, new=new, step=plan.step)
