"""Run folders that cannot be damaged: one writer at a time, a manifest, a history, resume rules.

A run folder (``output.dir/name/``, or a :class:`~graded.train.trainer.Trainer`'s ``run_dir``)
holds, besides the files of :mod:`graded.train.logging` and the checkpoints:

- ``run.lock``          held with :func:`fcntl.flock` (exclusive, non-blocking) while a process
                        writes the run; it holds the writer's pid and purpose (``training``,
                        ``evaluation``, ``report``: :data:`LOCK_PURPOSES`). A second writer is
                        refused with :class:`RunLockedError` naming both. The kernel drops the lock
                        when its process ends, so a lock file left by a killed process does not
                        block; the file is emptied on release.
- ``.graded-run.json``  the manifest: every entry (file or folder) the library wrote. Overwriting
                        a run (:meth:`RunFolder.remove_written`) removes those entries and nothing
                        else, so a user's own files in the folder survive. A folder without a
                        manifest is taken to hold the entries of :data:`LIBRARY_ENTRIES`.
- ``history.jsonl``     one JSON line per event: ``start``, ``resume`` (step, checkpoint, damaged
                        checkpoints skipped), ``override`` (key, old and new value, step),
                        ``warning`` (message: e.g. a graded recipe training on the plain loss)
                        and ``end`` (step, status).

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
:func:`resume_changes` sorts the differences of two configs by that rule; each accepted one is
recorded in ``history.jsonl``.
How a resume is checked and loaded before anything is written: :mod:`graded.train.resume`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graded._io import dump_yaml
from graded.train.checkpoint import atomic_write_text

if TYPE_CHECKING:
    from graded.train.resume import ResumePlan

try:
    import fcntl
except ImportError:  # not POSIX: runs are not locked
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = "run.lock"
#: What a process holds a run folder's lock for, as its lock file says: the trainer trains,
#: ``graded eval`` writes ``eval.json`` into it, ``graded report`` enters its ``report`` folder.
LOCK_PURPOSES = ("training", "evaluation", "report")
MANIFEST_FILE = ".graded-run.json"
HISTORY_FILE = "history.jsonl"
CONFIG_FILE = "config.yaml"
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
LIBRARY_ENTRIES = ("config.yaml", "metrics.csv", "metrics.json", "grades.jsonl", "tensorboard",
                   "checkpoints", "history.jsonl", "eval.json", "report")


class RunError(RuntimeError):
    """A run folder cannot be used as asked (in use, already a run, refused change, unwritable)."""


class RunLockedError(RunError):
    """Another process holds the run folder's lock; ``holder`` is its process id and
    ``purpose`` what it holds the lock for, as the lock file names them ("unknown" where it
    names none)."""

    def __init__(self, message: str, holder: str = "unknown", purpose: str = "unknown") -> None:
        super().__init__(message)
        self.holder = holder
        self.purpose = purpose


@dataclass(frozen=True)
class LockHolder:
    """The process that holds a run folder's lock, as its lock file names it: ``pid`` and
    ``purpose`` (one of :data:`LOCK_PURPOSES`; ``training`` for a lock file that names a pid
    alone, as those of earlier versions, whose only long holder was the trainer)."""

    pid: str
    purpose: str

    @classmethod
    def parse(cls, text: str) -> LockHolder | None:
        """The holder a lock file's ``text`` names; None for an empty one (a free lock)."""
        pid, _, purpose = text.strip().partition(" ")
        return cls(pid, purpose.strip() or "training") if pid else None

    @property
    def training(self) -> bool:
        return self.purpose == "training"

    def __str__(self) -> str:
        return f"process {self.pid} ({self.purpose})"


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


class RunFolder:
    """The lock, manifest and history of the run folder ``path``.

    ``lock()`` is reentrant on one object (a caller may hold it around :meth:`Trainer.fit`, which
    takes it again); a second object, in this process or another, is refused while it is held.
    With ``writer=False`` (the ranks of a distributed run that do not write) the lock and every
    write are no-ops. A write that the file system refuses raises :class:`RunError` naming the
    folder. ``purpose`` (one of :data:`LOCK_PURPOSES`) is what the lock is held for, written
    beside the pid in the lock file: a report of the run tells a run in training from one that
    an evaluation holds for a moment.
    """

    def __init__(self, path: str | os.PathLike[str], *, writer: bool = True,
                 purpose: str = "training") -> None:
        if purpose not in LOCK_PURPOSES:
            raise ValueError(f"purpose {purpose!r} is not one of {LOCK_PURPOSES}")
        self.path = Path(path)
        self.writer = writer
        self.purpose = purpose
        self._fd: int | None = None
        self._depth = 0

    # ----------------------------------------------------------------- lock

    @contextlib.contextmanager
    def lock(self) -> Iterator[RunFolder]:
        """Hold the run lock for the ``with`` block (creating the folder)."""
        self.acquire()
        try:
            yield self
        finally:
            self.release()

    @property
    def locked(self) -> bool:
        return self._depth > 0

    def acquire(self) -> None:
        if not self.writer or fcntl is None:
            return
        if self._depth:
            self._depth += 1
            return
        with self._writing():
            self.path.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = LockHolder.parse(os.pread(fd, 64, 0).decode(errors="replace")) \
                or LockHolder("unknown", "unknown")
            os.close(fd)
            raise self._in_use(holder) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {self.purpose}\n".encode(), 0)
        self._fd, self._depth = fd, 1

    def _in_use(self, holder: LockHolder) -> RunLockedError:
        return RunLockedError(
            f"run folder {self.path} is in use by process {holder.pid} for {holder.purpose} "
            f"(it holds {self.path / LOCK_FILE}); wait for it to end or stop it",
            holder.pid, holder.purpose)

    def refuse_in_use(self) -> None:
        """Raise the :class:`RunLockedError` that :meth:`acquire` would if another process
        holds the lock now (:meth:`holder`), writing nothing: a resume checks it before it
        loads a checkpoint, which it does before taking the lock. A no-op for a rank that
        does not write (``writer=False``): its rank 0 may hold the lock already."""
        holder = self.holder() if self.writer else None
        if holder is not None:
            raise self._in_use(holder)

    def holder(self) -> LockHolder | None:
        """The process that holds the lock now, another than this one, with its purpose as
        the lock file names them (``holder().training``: a run training there). None while
        the lock is free, held by this process, or never taken (no lock file); nothing is
        written. Only a lock file naming a process is probed (a free lock leaves it empty),
        so the probe, a shared lock taken and dropped at once, cannot turn away a writer
        starting beside it unless a killed writer left the file behind."""
        if fcntl is None or self._depth:
            return None
        try:
            fd = os.open(self.path / LOCK_FILE, os.O_RDONLY)
        except OSError:  # no lock file (or unreadable): no run has held it
            return None
        try:
            named = LockHolder.parse(os.pread(fd, 64, 0).decode(errors="replace"))
            if named is None:
                return None
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return None if named.pid == str(os.getpid()) else named
            fcntl.flock(fd, fcntl.LOCK_UN)  # the pid of a writer that was killed: free
            return None
        finally:
            os.close(fd)

    def release(self) -> None:
        if not self._depth:
            return
        self._depth -= 1
        if self._depth == 0 and self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """Turn a refused write (read-only folder, a file in the way) into a RunError."""
        try:
            yield
        except OSError as exc:
            reason = (exc.strerror or type(exc).__name__).lower()
            raise RunError(f"cannot write to {self.path}: {reason}") from exc

    # ----------------------------------------------------------------- manifest

    def _manifest(self) -> list[str] | None:
        path = self.path / MANIFEST_FILE
        if not path.is_file():
            return None
        return list(json.loads(path.read_text(encoding="utf-8"))["written"])

    def written(self) -> list[str]:
        """Entries the library wrote here (from the manifest; :data:`LIBRARY_ENTRIES` without)."""
        manifest = self._manifest()
        if manifest is None:
            return [name for name in LIBRARY_ENTRIES if (self.path / name).exists()]
        return manifest

    def record(self, *names: str) -> None:
        """Add entries (names directly inside the folder) to the manifest."""
        for name in names:
            if Path(name).name != name or name in ("", ".", "..", LOCK_FILE, MANIFEST_FILE):
                raise ValueError(f"manifest entries are names inside the run folder, got {name!r}")
        self._write_manifest(sorted({*(self._manifest() or []), *names}))

    def _write_manifest(self, names: list[str]) -> None:
        if not self.writer:
            return
        with self.lock(), self._writing():
            text = json.dumps({"format": "graded-run-1", "written": names}, indent=1)
            atomic_write_text(self.path / MANIFEST_FILE, text + "\n")

    def remove_written(self) -> list[Path]:
        """Remove every entry the library wrote (nothing else); return the paths removed."""
        if not self.writer:
            return []
        removed = []
        with self.lock(), self._writing():
            for name in self.written():
                path = self.path / name
                if Path(name).name != name or name in (LOCK_FILE, MANIFEST_FILE):
                    continue  # a hand-edited manifest cannot reach outside the folder
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                elif path.exists() or path.is_symlink():
                    path.unlink()
                else:
                    continue
                removed.append(path)
            self._write_manifest([])
        return removed

    def write_config(self, config: Mapping[str, Any]) -> bool:
        """Write ``config.yaml`` from ``config`` unless the caller wrote one (present, not in the
        manifest); return whether the file was written (an identical one is left alone)."""
        path = self.path / CONFIG_FILE
        text = dump_yaml(dict(config))  # read back equal (a name like 1e3 stays text)
        if path.exists() and (CONFIG_FILE not in (self._manifest() or [])
                              or path.read_text(encoding="utf-8") == text):
            return False
        if self.writer:
            self.record(CONFIG_FILE)
            with self.lock(), self._writing():
                atomic_write_text(path, text)
        return self.writer

    # ----------------------------------------------------------------- history

    def append_history(self, event: str, **fields: Any) -> None:
        """Append one event line to ``history.jsonl``."""
        if not self.writer:
            return
        line = json.dumps({"event": event, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                           **fields}, default=str)
        with self.lock(), self._writing(), (self.path / HISTORY_FILE).open("a") as fh:
            fh.write(line + "\n")

    def history(self) -> list[dict[str, Any]]:
        """The events of ``history.jsonl``, oldest first."""
        path = self.path / HISTORY_FILE
        if not path.is_file():
            return []
        return [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln]


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


def checked_changes(
    run: str | os.PathLike[str], checkpoint_state: Mapping[str, Any], new: Mapping[str, Any]
) -> dict[str, tuple[Any, Any]]:
    """The accepted changes from a checkpoint's run to ``new`` (a :func:`run_view`); a refused
    one raises :class:`RunError` (:func:`refusal_message`)."""
    old = run_view(checkpoint_state.get("config") or {},
                   options=checkpoint_state.get("options") or {},
                   seed=checkpoint_state.get("seed"), kind=checkpoint_state.get("kind"))
    allowed, refused = resume_changes(old, new)
    if refused:
        raise RunError(refusal_message(run, refused))
    return allowed


def open_run(run: RunFolder, config: Mapping[str, Any], plan: ResumePlan | None, *,
             existing: bool, overwrite: bool, entries: Sequence[str]) -> None:
    """Ready a run folder (its lock held) for a fresh run (``plan`` None) or a resume: refuse
    an ``existing`` run unless ``overwrite`` (then remove what the library wrote), record the
    ``entries`` about to be written, write ``config.yaml`` and the history's events, and say on
    stderr what was removed or skipped. A resume from a checkpoint of another folder is a new
    run here: it is refused over an ``existing`` run as a fresh run is (its checkpoints would
    replace those of the folder's own run, step by step)."""
    elsewhere = plan is not None and not Path(plan.checkpoint).resolve().is_relative_to(
        run.path.resolve())
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
