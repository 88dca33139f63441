"""File writes that a crash or Ctrl-C cannot leave half done, and the reading of line files
that such a crash may have cut short."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
from pathlib import Path

__all__ = ["atomic_write_bytes", "atomic_write_text", "read_jsonl"]


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """``text`` in UTF-8 written to ``path`` by :func:`atomic_write_bytes` (encoded first: a
    string that cannot be encoded leaves nothing behind)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the new one, never a
    part, and a crash after the return loses neither.

    The bytes go to a temporary file in the same folder (a rename across file systems would
    not be atomic), which is ``fsync``-ed and moved over ``path`` with ``os.replace``; the
    folder is ``fsync``-ed after, so the rename itself survives a power cut. The file gets the
    permissions a plain ``open(path, "w")`` would give it: a file it replaces keeps its mode; a
    new one is created with 0o666 less the umask (and the folder's default ACL), where
    ``tempfile.mkstemp`` would make it 0600. A symbolic link is written through, as a plain
    write would: the file it points to is replaced, the link stays. On any exception (a full
    disk, Ctrl-C) the temporary file is removed and ``path`` is left as it was; an OSError
    about the temporary file names ``path`` instead."""
    path = Path(path)
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode: int | None = stat.S_IMODE(path.stat().st_mode) & 0o777
    except FileNotFoundError:
        mode = None  # a new file: the umask decides, as at os.open below
    tmp: Path | None = None
    fd = -1
    try:
        while fd < 0:
            tmp = path.parent / f".{path.name[:200]}.{secrets.token_hex(4)}.tmp"
            with contextlib.suppress(FileExistsError):
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(
                    os, "O_CLOEXEC", 0), 0o666)
        if mode is not None:
            os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
        tmp = None
        _fsync_folder(path.parent)
    except BaseException as exc:
        if fd >= 0:
            os.close(fd)
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            if isinstance(exc, OSError) and exc.filename == str(tmp):
                # the error names the file asked for: the temporary one is an inner detail
                # ("/proc/.x.json.ed8cdcc3.tmp does not exist" for --out /proc/x.json)
                exc.filename, exc.filename2 = str(path), None
        raise


def _fsync_folder(folder: Path) -> None:
    """``fsync`` of a folder, which makes the renames in it durable (POSIX; a folder this
    process may not read, or a file system that cannot sync one, EINVAL, is left as it is:
    the file is in place either way)."""
    if os.name != "posix":
        return
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except PermissionError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
    finally:
        os.close(fd)


def read_jsonl(path: str | os.PathLike[str], what: str) -> list:
    """The JSON values of the non-blank lines of ``path``; a line that is not JSON (e.g. cut
    short by a killed writer) is a ValueError naming the file, the line and ``what`` a line
    should hold."""
    path = Path(path)
    values = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            values.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number} is not {what} ({exc.msg}): {line[:60]!r}") from None
    return values
