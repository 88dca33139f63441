"""How a command of the command line runs: :func:`run_command` turns a user's error into one line
``<prog>: error: ...`` with exit status 2, Ctrl-C into "aborted" with
:data:`EXIT_INTERRUPTED`, and a warning into one line ``graded: warning: ...``
(GRADED_TRACEBACK=1 shows the tracebacks instead); :func:`_fail` is a command's own refusal."""

from __future__ import annotations

import argparse
import os
import select
import sys
import warnings
from typing import Any

EXIT_INTERRUPTED = 130
#: The status of a command whose reader closed its output (``graded bench | head``): a shell's
#: 128 + SIGPIPE.
EXIT_BROKEN_PIPE = 141


def _fail(message: str, code: int = 2) -> int:
    print(f"graded: error: {message}", file=sys.stderr)
    return code


def run_command(handler: Any, args: argparse.Namespace, prog: str = "graded") -> int:
    """``handler(args)`` as the command line runs it: warnings in one line, Ctrl-C reported as
    aborted, an output whose reader went away (``| head``) ended quietly with status 141 (a
    broken pipe that is not the output's is an error), a user's error (:func:`_user_errors`)
    in one line ``<prog>: error: ...`` with exit status 2 (GRADED_TRACEBACK=1 shows the
    tracebacks instead)."""
    shown_as = warnings.formatwarning
    if not os.environ.get("GRADED_TRACEBACK"):
        warnings.formatwarning = _one_line_warning
    try:
        return int(handler(args) or 0)
    except KeyboardInterrupt:
        print("\naborted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError as exc:
        if _stdout_reader_gone() is False:  # another pipe broke: a worker, a child process
            return _report(exc, prog)
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except _user_errors() as exc:
        return _report(exc, prog)
    finally:
        warnings.formatwarning = shown_as


def _report(exc: BaseException, prog: str) -> int:
    """A user's error in one line with exit status 2 (GRADED_TRACEBACK=1 raises it)."""
    if os.environ.get("GRADED_TRACEBACK"):
        raise exc
    print(f"{prog}: error: {_one_line(exc)}", file=sys.stderr)
    return 2


def _stdout_reader_gone() -> bool | None:
    """Whether the reader of the output went away (``| head``), so that a ``BrokenPipeError``
    is the output's and not another pipe's (a worker's that died, a child process's): True
    when polling stdout reports an error or a hang-up (a pipe or socket whose other end is
    closed), False when it does not; None where it cannot be told (stdout is not a file
    descriptor, or there is no ``select.poll``), which is taken as the output's."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a capture, a closed stream)
        return None
    if not hasattr(select, "poll"):
        return None
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _quiet_stdout() -> None:
    """After the reader of the output went away (``| head``): send what is left of it to the
    null device, so that the interpreter's last flush at exit does not fail again; the
    command stops without an error, as a pipe's writer does."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a capture, a closed stream)
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str,
                      lineno: int, line: str | None = None) -> str:
    """A warning as the command line prints it: ``graded: warning: ...``, without the source
    file and line of the library code that raised it (GRADED_TRACEBACK=1 shows them)."""
    return f"graded: warning: {message}\n"


def _user_errors() -> tuple[type[BaseException], ...]:
    """What a user's input can cause: a bad value or config (ValueError, which ConfigError and
    CheckpointError are), a missing, unreadable or unwritable file, a run folder in use or a
    refused resume (RunError), a diverged run. Reported in one line with exit code 2;
    GRADED_TRACEBACK=1 shows the traceback instead."""
    from graded.train.runs import RunError

    return (ValueError, OSError, FloatingPointError, RunError)


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, PermissionError) and exc.filename:
        return f"cannot write or read {exc.filename}: permission denied"
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"{exc.filename} does not exist"
    if isinstance(exc, FileExistsError) and exc.filename:
        return f"{exc.filename} exists and is not a folder: expected a folder or a new path"
    if isinstance(exc, NotADirectoryError) and exc.filename:
        return f"cannot use {exc.filename}: a part of that path is a file, not a folder"
    if isinstance(exc, OSError) and exc.filename and exc.strerror:
        return f"cannot use {exc.filename}: {exc.strerror.lower()}"
    return str(exc) or type(exc).__name__
