"""File writes that a crash or Ctrl-C cannot leave half done, and the reading of line files
that such a crash may have cut short."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from pathlib import Path

__all__ = ["atomic_write_text", "read_jsonl"]


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder, ``fsync`` and
    ``os.replace``, so a reader never sees a half-written file. The file keeps the mode of the
    one it replaces; a new one gets its folder's read and write bits (``mkstemp`` makes it 0600,
    which other users could not read)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    source = path if path.exists() else path.parent
    mode = stat.S_IMODE(source.stat().st_mode) & 0o666
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            os.fchmod(fh.fileno(), mode)
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


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
