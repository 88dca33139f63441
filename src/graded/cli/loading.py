"""Loading a run folder for ``graded eval``, ``generate`` and ``report``: its config, task and
model with the weights of a checkpoint (``best``, ``latest`` or a named folder), looked up again
when a run training meanwhile rotates it away, and checked against the run's ``config.yaml``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _load_run(run_dir: Path, which: str):
    """Config, task, model (weights loaded from the ``which`` checkpoint) of a run folder.

    Only the weights are read (``optimizer.safetensors`` may be absent). ``latest`` falls back to
    the newest intact checkpoint, saying which it skipped and why; ``best`` or a named folder
    that does not load is an error naming the file. The run may be training meanwhile (an
    evaluation takes no lock): a checkpoint its trainer rotates away between the lookup and the
    load is looked up again (:func:`_load_checkpoint_of_run`).
    """
    import torch

    from graded.config import build_model, build_task, load_run_config
    from graded.train.checkpoint import CheckpointManager

    cfg = load_run_config(run_dir)
    task = build_task(cfg)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, task)
    manager = CheckpointManager(run_dir / "checkpoints")
    ckpt, meta = _load_checkpoint_of_run(run_dir, manager, model, which)
    _check_checkpoint_config(run_dir, ckpt, meta, own=which in ("best", "latest") or (
        Path(ckpt).resolve().parent == manager.root.resolve()))
    model.eval()
    return cfg, task, model, ckpt, meta


def _load_checkpoint_of_run(run_dir: Path, manager: Any, model: Any,
                            which: str) -> tuple[Path, dict[str, Any]]:
    """Load the ``which`` checkpoint of ``run_dir`` into ``model``: its folder and JSON state.

    A run training meanwhile saves newer checkpoints and removes older ones (``keep_last``,
    and a best that is no longer the best). A checkpoint that fails to load while the lookup
    has moved on (its folder is gone, or ``best.json`` names another now) is looked up again,
    :data:`~graded.train.checkpoint.CHECKPOINT_LOOKUPS` times at most; a named folder removed
    so, and a run whose checkpoints kept vanishing, are a RunError saying the run is being
    written. A checkpoint that fails to load while the lookup stands still is damaged (or
    gone): that error is raised as it is.
    """
    from graded.train.checkpoint import (
        CHECKPOINT_LOOKUPS,
        CheckpointRemovedError,
        load_checkpoint,
    )
    from graded.train.runs import RunError

    being_written = f"run {run_dir} is being written"
    if which == "latest":
        try:
            found = manager.find_intact(model)
        except CheckpointRemovedError as exc:  # its message says why
            raise RunError(f"{being_written}: {exc}") from None
        for path, reason in found.skipped:
            print(f"graded: warning: skipped damaged checkpoint {path}: {reason}", file=sys.stderr)
        return found.path, found.meta
    being_written += " (a process training it rotates its checkpoints away)"
    tried: list[Path] = []
    failure: Exception | None = None
    while True:
        ckpt = _best_lookup(manager) if which == "best" else _checkpoint_folder(manager, which)
        if ckpt is None:
            raise FileNotFoundError(f"{run_dir} has no checkpoint")
        if failure is not None and ckpt == tried[-1]:  # the lookup stands still
            raise failure
        if len(tried) == CHECKPOINT_LOOKUPS:
            raise RunError(f"{being_written}: each of the {len(tried)} checkpoints picked "
                           f"({', '.join(p.name for p in tried)}) was removed before it "
                           "loaded; evaluate it again, or once it stops")
        tried.append(ckpt)
        try:
            if which == "best":
                _check_best_present(manager, ckpt)
            return ckpt, load_checkpoint(ckpt, model, restore_rng=False)
        except ValueError as exc:  # a CheckpointError, or the folder best.json names is gone
            failure = exc
        if which != "best":  # a named folder has no successor to look up
            if not Path(ckpt).is_dir():
                raise RunError(f"{being_written}: checkpoint {ckpt} was removed while it was "
                               "read; evaluate a newer one (--checkpoint latest or best)")
            raise failure


def _best_lookup(manager: Any) -> Path | None:
    """``--checkpoint best``: the folder ``best.json`` names (present or not), or the latest
    checkpoint of a run that never evaluated (no ``best.json``)."""
    named = manager.best_named()
    return manager.latest() if named is None else named


def _check_best_present(manager: Any, named: Path) -> None:
    """ValueError when the folder ``best.json`` names is gone, rather than another
    checkpoint's figures under the name of the best."""
    if not named.is_dir():
        found = ", ".join(p.name for p in manager.folders()) or "none"
        raise ValueError(f"{manager.root / 'best.json'} names {named.name}, which is gone from "
                         f"{manager.root} (there: {found}); evaluate another with --checkpoint "
                         "latest or --checkpoint <folder>")


def _check_checkpoint_config(run_dir: Path, ckpt: Path, meta: dict[str, Any], *,
                             own: bool) -> None:
    """The model and data rebuilt from ``RUN/config.yaml`` are those the checkpoint's weights
    were trained with: every key a resume may not change (task, model, seed, ...) equals the
    checkpoint's recorded config. A ``config.yaml`` edited since (another seed, task option or
    grading base builds another split or model, into which the weights may still load) is
    refused, naming each key, for the run's own checkpoints; a checkpoint of another folder,
    given by path, is evaluated with this run's config, with a warning naming the keys."""
    from graded.config import read_config_file
    from graded.train.runs import resume_changes

    recorded = meta.get("config")
    if not isinstance(recorded, dict):  # a checkpoint that records no config: nothing to check
        return
    _, refused = resume_changes(recorded, read_config_file(run_dir / "config.yaml"))
    if not refused:
        return
    changes = "; ".join(f"{k} was {json.dumps(o)}, now {json.dumps(n)}"
                        for k, (o, n) in refused.items())
    if own:
        raise ValueError(f"{run_dir / 'config.yaml'} does not match the config checkpoint "
                         f"{ckpt} was trained with: {changes}; restore those keys (the weights "
                         "belong to the recorded model and data), or train a new run")
    print(f"graded: warning: checkpoint {ckpt} was trained with another config than "
          f"{run_dir / 'config.yaml'}: {changes}; evaluating it with {run_dir}'s",
          file=sys.stderr)


def _checkpoint_folder(manager: Any, which: str) -> Path:
    """``--checkpoint PATH``: a folder, as given or inside the run's ``checkpoints/`` (e.g.
    ``step_000000400``); ValueError naming what there is otherwise (an empty ``which``, as
    ``--checkpoint "$UNSET"`` gives, names no folder: as a path it was the current one)."""
    found = ", ".join(p.name for p in manager.folders()) or "none"
    if not which.strip():
        raise ValueError(f"--checkpoint {which!r} is empty; expected 'best', 'latest', a "
                         f"checkpoint folder of {manager.root} ({found}) or a path to one")
    for path in (Path(which), manager.root / which):
        if path.is_dir():
            return path
    raise ValueError(f"--checkpoint {which!r}: no such folder; expected 'best', 'latest', a "
                     f"checkpoint folder of {manager.root} ({found}) or a path to one")


def _is_run_config(run_dir: Path) -> bool:
    """Whether the run was started from a run config (``graded train``, the demo), whose task
    can be rebuilt, rather than from the Python ``Trainer`` with tensors of the user's."""
    from graded.config import read_config_file

    return "task" in read_config_file(run_dir / "config.yaml")


def _library_entry(run_dir: Path, path: Path) -> str | None:
    """The entry of ``run_dir`` that graded wrote and manages (``config.yaml``,
    ``checkpoints``, ..., the lock and the manifest; see :mod:`graded.train.runs`) which
    ``path`` is or lies inside, or None (a path outside the run, the run folder itself, or a
    name of the user's inside it). A command's output there would replace what training
    wrote, or be removed with it (a resume rotates checkpoints away; ``output.overwrite``
    removes the entries the manifest lists)."""
    from graded.train.runs import LIBRARY_ENTRIES, LOCK_FILE, MANIFEST_FILE

    target, run = path.resolve(), run_dir.resolve()
    if not target.is_relative_to(run) or target == run:
        return None
    entry = target.relative_to(run).parts[0]
    return entry if entry in (*LIBRARY_ENTRIES, LOCK_FILE, MANIFEST_FILE) else None
