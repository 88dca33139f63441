"""File writes that a crash or Ctrl-C cannot leave half done, the reading of line files that
such a crash may have cut short, and the YAML rules the library reads and writes by.

The library's YAML (:func:`graded.config.parse_yaml` reads it, :func:`dump_yaml` writes it) is
YAML 1.1 safe loading with two changes: floats are those YAML 1.2 reads (``1e-3``, ``-.5``,
which YAML 1.1 reads as text) and a number whose reading YAML 1.1 and 1.2 disagree on (``010``,
octal 8 in YAML 1.1 and 10 in YAML 1.2; ``1:30``, 90 in base 60 in YAML 1.1 and text in YAML
1.2) is refused rather than read either way. :func:`dump_yaml` quotes every string that these
rules would read as something else, so what it writes reads back as it was.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import stat
from pathlib import Path
from typing import Any

import yaml

__all__ = ["YAML_AMBIGUOUS_NUMBER", "YAML_FLOAT", "atomic_write_bytes", "atomic_write_text",
           "dump_yaml", "read_jsonl"]

# Plain scalars read as floats beyond YAML 1.1's: YAML 1.1 needs a dot and a signed exponent
# (``1.0e-3``) and no sign before a leading dot (``-.5``); YAML 1.2 does not.
YAML_FLOAT = re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X)
# Plain scalars YAML 1.1 and YAML 1.2 read differently: a leading zero (``010`` is octal 8 in
# YAML 1.1, 10 in YAML 1.2; ``08`` text in YAML 1.1) and base 60 (``1:30`` is 90 in YAML 1.1,
# text in YAML 1.2).
YAML_AMBIGUOUS_NUMBER = re.compile(r"""^(?:[-+]?0[0-9][0-9_]*
    |[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+
    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*)$""", re.X)
YAML_NUMBER_START = list("-+0123456789.")


class _Dumper(yaml.SafeDumper):
    """Safe dumping that quotes the strings :data:`YAML_FLOAT` or :data:`YAML_AMBIGUOUS_NUMBER`
    match (plain ``1e3`` would read back as a float)."""


_Dumper.add_implicit_resolver("tag:yaml.org,2002:float", YAML_FLOAT, YAML_NUMBER_START)
_Dumper.add_implicit_resolver("tag:yaml.org,2002:int", YAML_AMBIGUOUS_NUMBER, YAML_NUMBER_START)


def dump_yaml(data: Any) -> str:
    """``data`` (plain values: dicts, lists, strings, numbers, booleans, None) as YAML that the
    library reads back equal, keys in their order and text as written (not ``\\u`` escapes)."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True)


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
