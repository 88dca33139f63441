"""One run folder that cannot be damaged: one writer at a time, a manifest, a history.

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

:class:`RunFolder` holds the three. Which config changes a resume accepts, and how a run is
opened in its folder (fresh, overwritten or resumed), is :mod:`graded.train.runs`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graded._io import dump_yaml
from graded.train.checkpoint import atomic_write_text

__all__ = ["CONFIG_FILE", "HISTORY_FILE", "LIBRARY_ENTRIES", "LOCK_FILE", "LOCK_PURPOSES",
           "MANIFEST_FILE", "LockHolder", "RunError", "RunFolder", "RunLockedError"]

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
        """Append one event line to ``history.jsonl``, on a line of its own after a last line
        cut short (a writer killed mid-line), which would otherwise swallow it."""
        if not self.writer:
            return
        line = json.dumps({"event": event, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                           **fields}, default=str)
        with self.lock(), self._writing(), (self.path / HISTORY_FILE).open("a+b") as fh:
            if fh.seek(0, os.SEEK_END):
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":
                    line = "\n" + line
            fh.write((line + "\n").encode())

    def history(self) -> list[dict[str, Any]]:
        """The events of ``history.jsonl``, oldest first; a line that is not an event (cut
        short by a writer killed mid-line) is left out, as a resume reads the history to find
        the config the run last ran with and must not fail on it."""
        path = self.path / HISTORY_FILE
        if not path.is_file():
            return []
        events = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                event = json.loads(line) if line.strip() else None
            except ValueError:
                continue
            if isinstance(event, dict):
                events.append(event)
        return events
