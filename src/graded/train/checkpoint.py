"""The checkpoints of one run: :class:`CheckpointManager` keeps the last ``keep_last``
``step_<N>`` folders and the best, and finds the newest that loads.

One checkpoint folder (its files, atomic writes, loading with every check first) is
:mod:`graded.train.checkpoint_folder`, whose functions this module also names.
:meth:`CheckpointManager.find_intact` returns the newest checkpoint that loads, with the newer
damaged ones and why they were skipped; a checkpoint removed while it is read (the rotation of
a run training meanwhile) is not damaged: the folder is listed again. A step whose
``step_<N>`` folder is missing but whose copy a save of the same step moved aside is complete
(the save was cut short between its two renames: :data:`~graded.train.checkpoint_folder.
MOVED_ASIDE`) has that copy as its checkpoint; the run's next save puts it back in place.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

from graded._io import _fsync_folder, atomic_write_text
from graded.train.checkpoint_folder import (
    MODEL_FILE,
    MOVED_ASIDE,
    OPTIM_FILE,
    STATE_FILE,
    TEMP_DIR,
    CheckedCheckpoint,
    check_checkpoint,
    load_checkpoint,
    read_checkpoint_state,
    read_rng_state,
    save_checkpoint,
)
from graded.train.state_tensors import CheckpointError, RngState, checkpoint_error
from graded.train.stopping import sets_best

__all__ = ["CHECKPOINT_LOOKUPS", "MODEL_FILE", "MOVED_ASIDE", "OPTIM_FILE", "STATE_FILE",
           "STEP_DIR", "TEMP_DIR", "CheckedCheckpoint", "CheckpointError", "CheckpointManager",
           "CheckpointRemovedError", "IntactCheckpoint", "atomic_write_text", "check_checkpoint",
           "load_checkpoint", "read_checkpoint_state", "read_rng_state", "save_checkpoint"]

STEP_DIR = re.compile(r"^step_(\d{9})$")


# how many times a reader lists a run's checkpoints again when the ones it picked were removed
# while it read them (a run training meanwhile rotates its checkpoints away)
CHECKPOINT_LOOKUPS = 5


class CheckpointRemovedError(CheckpointError):
    """The checkpoints a reader picked were removed while it read them, at every look: the run
    is being written by another process (its trainer rotating its checkpoints)."""


class IntactCheckpoint(NamedTuple):
    """What :meth:`CheckpointManager.find_intact` found."""

    path: Path
    meta: dict[str, Any]
    skipped: list[tuple[Path, str]]  # newer checkpoints that did not load, and why
    rng: RngState | None = None  # its RNG states, as checked; None for a weights-only load


class CheckpointManager:
    """Checkpoints of one run: ``step_<N>`` folders, the last ``keep_last`` and the best kept.

    The best checkpoint is named in ``best.json`` (written atomically) and never rotated away.
    """

    def __init__(self, root: str | os.PathLike[str], keep_last: int = 3) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.root = Path(root)
        self.keep_last = keep_last

    def path_for(self, step: int) -> Path:
        return self.root / f"step_{step:09d}"

    def folders(self) -> list[Path]:
        """Every step's checkpoint folder, intact or not, by ascending step: ``step_<N>``, or
        the copy of it a same-step save moved aside (:meth:`_by_step`)."""
        found = self._by_step()
        return [found[step] for step in sorted(found)]

    def _by_step(self) -> dict[int, Path]:
        """Each step's checkpoint folder: ``step_<N>``; where it is missing, the complete copy
        (holding ``state.json``) a save of that step moved aside before it was cut short
        between its two renames (:data:`~graded.train.checkpoint_folder.MOVED_ASIDE`), the one
        moved aside last should there be several."""
        if not self.root.is_dir():
            return {}
        found: dict[int, Path] = {}
        aside: dict[int, list[Path]] = {}
        for child in self.root.iterdir():
            if (match := STEP_DIR.match(child.name)) and child.is_dir():
                found[int(match.group(1))] = child
            elif (match := MOVED_ASIDE.match(child.name)) and (child / STATE_FILE).is_file():
                aside.setdefault(int(match.group(1)), []).append(child)
        for step, copies in aside.items():
            if step not in found:
                found[step] = max(copies, key=_changed_at)
        return found

    def _put_back_moved_aside(self) -> None:
        """Rename each moved-aside checkpoint :meth:`_by_step` reads (its ``step_<N>``
        missing) back to ``step_<N>``: the writer of the run does, before its rotation removes
        the temporary folders."""
        moved = [(step, path) for step, path in self._by_step().items()
                 if MOVED_ASIDE.match(path.name)]
        for step, path in moved:
            os.replace(path, self.path_for(step))
        if moved:
            _fsync_folder(self.root)

    def find_intact(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
        accept: Callable[[dict[str, Any]], object] | None = None,
        reject: type[Exception] = CheckpointError,
        confirm: Callable[[Path, dict[str, Any]], object] | None = None,
        lookups: int = CHECKPOINT_LOOKUPS,
    ) -> IntactCheckpoint:
        """Load the newest checkpoint that loads (into ``model`` and ``optimizer``, RNG states
        untouched), trying older ones when newer ones are damaged; CheckpointError if none.

        ``accept(state)`` sees each checkpoint's JSON state before any of its tensors is read;
        raising ``reject`` skips the checkpoint. If no checkpoint is taken and ``accept``
        rejected any, its newest rejection is raised: the caller's reason comes first.
        ``confirm(path, state)`` sees the checkpoint to be taken once every check of its files
        passed, before anything is loaded: a CheckpointError it raises (a part of the state
        the caller cannot use: a resume's scheduler or gradient scaler state) skips the
        checkpoint as damaged, as a failed check of its files does; anything else it raises
        is raised, with ``model`` and ``optimizer`` as they were.

        A checkpoint whose folder is gone after it failed to load was removed while it was read
        (another process trains the run and rotated it away): it is not damaged, so it is not
        among ``skipped``, and when none of the listed checkpoints loads, the folder is listed
        again for those saved meanwhile, ``lookups`` times in all;
        :class:`CheckpointRemovedError` when checkpoints were removed at every look.
        """
        if lookups < 1:
            raise ValueError(f"lookups must be >= 1, got {lookups}")
        removed: list[Path] = []
        for _ in range(lookups):
            skipped: list[tuple[Path, str]] = []
            rejection: Exception | None = None
            for path in reversed(self.folders()):
                taken: list[CheckedCheckpoint] = []  # once its files passed every check
                loading: list[Path] = []  # once confirm passed too: the loading has begun
                try:
                    if accept is not None:
                        accept(read_checkpoint_state(path))
                    load_checkpoint(path, model, optimizer, restore_rng=False,
                                    confirm=_taking(path, taken, confirm, loading))
                except CheckpointError as exc:
                    if loading:  # a failure while loading: the model may be part loaded
                        raise
                    skipped.append((path, str(exc)))
                    continue
                except reject as exc:
                    if taken:  # the caller's refusal in confirm
                        raise
                    rejection = rejection or exc
                    skipped.append((path, f"not accepted: {exc}"))
                    continue
                return IntactCheckpoint(path, taken[0].meta,
                                        [s for s in skipped if s[0].is_dir()], taken[0].rng)
            gone = [path for path, _ in skipped if not path.is_dir()]
            removed.extend(gone)
            skipped = [s for s in skipped if s[0].is_dir()]
            if not gone:
                break
        if removed and (gone or not skipped):  # vanishing at the last look, or nothing left
            names = ", ".join(dict.fromkeys(p.name for p in removed))
            raise CheckpointRemovedError(
                f"{self.root}: the checkpoints picked were removed while being read ({names}; "
                f"{lookups} looks at most); another process is writing this run and rotating "
                "its checkpoints away: read it again, or once that process stops")
        if rejection is not None:
            raise rejection
        if not skipped:
            raise CheckpointError(f"{self.root} holds no checkpoint")
        raise CheckpointError(f"{self.root} holds no intact checkpoint: "
                              + "; ".join(reason for _, reason in skipped))

    def steps(self) -> list[int]:
        """Steps of the complete checkpoints present (a moved-aside copy of a missing
        ``step_<N>`` too: :meth:`folders`), ascending; other temporary folders ignored."""
        return sorted(step for step, path in self._by_step().items()
                      if (path / STATE_FILE).is_file())

    def latest(self) -> Path | None:
        found = self._by_step()
        steps = [step for step, path in found.items() if (path / STATE_FILE).is_file()]
        return found[max(steps)] if steps else None

    def best(self) -> Path | None:
        """The checkpoint ``best.json`` names (or its moved-aside copy: :meth:`folders`); None
        without one or when that folder is gone (:meth:`best_named` says which)."""
        named = self.best_named()
        if named is None or named.is_dir():
            return named
        return self._by_step().get(int(STEP_DIR.match(named.name).group(1)))

    def best_named(self) -> Path | None:
        """The folder ``best.json`` names, whether or not it is there; None without a
        ``best.json``. One that does not read as written is a CheckpointError naming it."""
        info = self.root / "best.json"
        if not info.is_file():
            return None
        try:
            named = json.loads(info.read_text(encoding="utf-8"))["checkpoint"]
            if not isinstance(named, str) or not STEP_DIR.match(named):
                raise ValueError(f"names {named!r}, not a step_<N> folder")
        except (ValueError, KeyError, TypeError, OSError) as exc:
            raise checkpoint_error(info, f"truncated, corrupt or unreadable ({exc}); expected "
                                         '{"checkpoint": "step_<N>", ...}') from None
        return self.root / named

    def forget_best(self) -> None:
        """Remove ``best.json``, at the start of a new run: a folder it may start in holds no
        checkpoint (one that holds any is refused, or overwritten), so a ``best.json`` left there
        names a checkpoint of an earlier run whose folders were removed, or one this run would
        write under the same name, which it would then report and keep as its best."""
        (self.root / "best.json").unlink(missing_ok=True)

    def rewind_best(self, step: int, best: float | None) -> None:
        """After a resume from ``step`` (older than a damaged newer checkpoint), make
        ``best.json`` name a checkpoint of the resumed run: one it names beyond ``step`` belongs
        to the abandoned future (and may be the damaged one), and one that does not read as
        written (truncated, JSON of another shape, its ``checkpoint`` not the ``step_<N>`` of
        its ``step``) would fail every later save's rotation. It then names the newest intact
        checkpoint up to ``step`` that set the monitored ``best`` (its evaluation improved on
        every earlier one, strictly: :func:`~graded.train.stopping.sets_best`), or is removed
        when that checkpoint is gone."""
        info = self.root / "best.json"
        if not info.is_file():
            return
        try:
            recorded = json.loads(info.read_text(encoding="utf-8"))
        except ValueError:
            recorded = None
        named = recorded.get("step") if isinstance(recorded, dict) else None
        if isinstance(named, int) and named <= step \
                and recorded.get("checkpoint") == self.path_for(named).name:
            return
        folders = self._by_step()
        for candidate in reversed([s for s in self.steps() if s <= step]):
            try:
                stopper = read_checkpoint_state(folders[candidate]).get("stopper")
            except CheckpointError:
                continue
            if sets_best(candidate, stopper, best):
                atomic_write_text(info, json.dumps({"checkpoint": self.path_for(candidate).name,
                                                    "step": candidate, "metric": best}))
                return
        info.unlink()

    def save(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        state: dict[str, Any],
        *,
        is_best: bool = False,
        metric: float | None = None,
        rng: Sequence[RngState] | None = None,
    ) -> Path:
        """Save the checkpoint of ``step`` (replacing one of the same step once it is complete:
        a failed save leaves it as it was), then rotate;
        ``rng``: every rank's RNG state, by rank, as :func:`save_checkpoint` takes it.

        Checkpoints beyond ``step`` belong to a future the run abandoned when it was resumed
        from an older checkpoint (a newer one was damaged, or a checkpoint folder was named):
        the save removes them (not the best), so they neither count among the last
        ``keep_last`` (which would rotate this very checkpoint away) nor are taken by the next
        resume instead of it."""
        path = self.path_for(step)
        save_checkpoint(path, model, optimizer, {**state, "step": step}, rng=rng, replace=True)
        if is_best:
            atomic_write_text(
                self.root / "best.json",
                json.dumps({"checkpoint": path.name, "step": step, "metric": metric}),
            )
        self._rotate(step)
        return path

    def _rotate(self, saved: int) -> None:
        """Remove the checkpoints beyond ``saved`` (the one just saved: they are of an abandoned
        future) and those older than the last ``keep_last`` (not the best), and the temporary
        folders a writer killed mid-save left: the run has one writer (its lock), and its own
        save is complete, so any temporary folder here is stale, but for a checkpoint moved
        aside by a save of its step that was cut short (:meth:`_by_step`): it is put back
        first."""
        self._put_back_moved_aside()
        best = self.best()
        # beyond ``saved``: every step folder, a damaged one without state.json too
        stale = [s for s in self._by_step() if s > saved]
        kept = [s for s in self.steps() if s <= saved]
        for step in stale + kept[: -self.keep_last]:
            path = self.path_for(step)
            if best is None or path.resolve() != best.resolve():
                shutil.rmtree(path, ignore_errors=True)
        for child in self.root.iterdir():
            if TEMP_DIR.match(child.name) and child.is_dir():
                shutil.rmtree(child, ignore_errors=True)


def _taking(
    path: Path, taken: list[CheckedCheckpoint],
    confirm: Callable[[Path, dict[str, Any]], object] | None, loading: list[Path],
) -> Callable[[CheckedCheckpoint], None]:
    """A ``confirm`` for :func:`load_checkpoint` of ``path`` that keeps the checked checkpoint
    in ``taken``, asks the caller's ``confirm(path, state)``, then notes in ``loading`` that
    the loading begins."""
    def confirming(checked: CheckedCheckpoint) -> None:
        taken.append(checked)
        if confirm is not None:
            confirm(path, checked.meta)
        loading.append(path)
    return confirming


def _changed_at(folder: Path) -> int:
    """When ``folder``'s ``state.json`` last changed (ns), or -1 once it is gone."""
    try:
        return (folder / STATE_FILE).stat().st_mtime_ns
    except OSError:
        return -1
