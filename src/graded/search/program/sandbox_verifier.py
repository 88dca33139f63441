"""The trusted verifier in a forked child, under a wall-clock limit (``Problem.verify_timeout_s``).

:func:`call_within` calls a function in a child forked from the evaluating process, in a process
group of its own, and gives back what it returned, or raises again the exception that ended it.
Three ends, told apart by the parent:

- the child sent its whole reply: the value, or its ``InvalidArtefact``, ``TypeError`` or
  ``ValueError`` raised here again (what :func:`graded.search.program.evaluate.evaluate` reads as
  ``invalid``, ``wrong_type``, ``non_finite``); any other exception it raised (``SystemExit``
  from ``sys.exit()`` in the verifier, say) is an ``InvalidArtefact`` naming it;
- the limit passed first: the parent kills the group (the child and whatever it started) and
  raises :class:`VerifyTimeout` (``verify_timeout``);
- the child ended on its own before its whole reply was in (``os._exit``, a signal such as
  SIGSEGV, the kernel's out-of-memory killer): an ``InvalidArtefact`` naming its exit status or
  signal, raised as soon as it ends, not at the limit.

The child's end is watched, not the pipe's end of file: a process forked meanwhile by another
thread of the evaluating process, or by the verifier, may hold a copy of the pipe's write end,
and then no end of file comes until that process ends (a crash was read as a timeout, found
only at the limit).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

from graded.search.program.problem import InvalidArtefact

__all__ = ["VerifyTimeout", "call_within"]


class VerifyTimeout(Exception):
    """The verifier did not finish within its limit; its process group was killed."""


def call_within(limit_s: float, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a forked child, within ``limit_s`` seconds of wall clock (see the module
    docstring). The reply is pickled and length-prefixed; the group is killed once it is in,
    the child has ended or the limit has passed, so nothing the verifier started outlives the
    call. The child shares nothing back: what ``fn`` changes in its module state is lost."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        status = 1
        try:
            os.close(read_fd)
            os.setpgid(0, 0)
            try:
                reply: tuple = ("value", fn(*args))
            except (InvalidArtefact, TypeError, ValueError) as e:
                reply = (type(e).__name__, str(e))
            except BaseException as e:  # sys.exit() in the verifier, say
                reply = ("InvalidArtefact", f"the verifier raised {type(e).__name__}: {e}")
            data = pickle.dumps(reply)
            with os.fdopen(write_fd, "wb") as f:
                f.write(struct.pack("<Q", len(data)) + data)
            status = 0
        finally:
            with contextlib.suppress(BaseException):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(status)
    fds = [read_fd, write_fd]  # those still open here (never closed twice: a number reused)
    try:  # (a SIGTERM that ends a worker's evaluation raises SystemExit anywhere in here)
        os.close(fds.pop())  # the write end, the child's
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)  # as the child does: the kill below cannot miss its group
        data, ended = _read_reply(read_fd, pid, time.monotonic() + limit_s)
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        for kill in (os.killpg, os.kill):  # the group, and the child should it have none yet
            with contextlib.suppress(OSError):
                kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    size = _reply_size(data)
    if size is None:
        if not ended:  # the limit passed first: the group was killed above
            raise VerifyTimeout(f"the verifier did not finish within verify_timeout_s="
                                f"{limit_s:g} s")
        raise InvalidArtefact(f"the verifier's process ended ({_exit_status(status)}) before "
                              "it returned the scores")
    kind, value = pickle.loads(data[8:size])
    if kind == "value":
        return value
    raise {"InvalidArtefact": InvalidArtefact, "TypeError": TypeError,
           "ValueError": ValueError}[kind](value)


def _reply_size(data: bytes) -> int | None:
    """The length of the whole length-prefixed reply at the start of ``data``; None while
    ``data`` holds less."""
    if len(data) < 8:
        return None
    size = 8 + struct.unpack("<Q", data[:8])[0]
    return size if len(data) >= size else None


#: How often the child's end is polled where there is no pidfd (seconds).
_POLL_S = 0.05


def _read_reply(fd: int, pid: int, deadline: float) -> tuple[bytes, bool]:
    """What the child ``pid`` wrote to ``fd``, and whether it ended on its own.

    Reading stops at the whole reply (``ended`` False), once the child has ended (True: what it
    wrote before is in the pipe and read), or once ``deadline`` (``time.monotonic``) has passed
    (False). The pipe's end of file says nothing: another process may hold its write end (one
    forked meanwhile by another thread, or by the verifier), and a child may close its own end
    and go on. Its end is watched through a pidfd (Linux), else polled every
    :data:`_POLL_S` with ``waitid`` (``WNOWAIT``: the status is read once its group is killed),
    else (neither) taken to be the pipe's end of file. The child is never reaped here.
    """
    try:
        watch: int | None = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd: macOS, a kernel before 5.3, a seccomp filter
        watch = None
    readers = [fd] if watch is None else [fd, watch]
    data = b""
    try:
        while _reply_size(data) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return data, False
            # in slices of a day at most: select refuses a timeout past time_t (1e300 for "no
            # limit")
            wait = min(left, 86_400.0 if watch is not None else _POLL_S)
            ready = select.select(readers, [], [], wait)[0]
            if fd in ready:
                chunk = os.read(fd, 1 << 16)
                data += chunk
                if not chunk:  # every writer closed the pipe; the child may still run
                    readers.remove(fd)
            if watch in ready or (watch is None and _has_ended(pid, eof=fd not in readers)):
                return data + _drain(fd), True
        return data, False
    finally:
        if watch is not None:
            os.close(watch)


def _has_ended(pid: int, eof: bool) -> bool:
    """Whether the child has ended, without reaping it; where ``waitid`` is missing (macOS
    before Python 3.13), whether its pipe has reached end of file."""
    if not hasattr(os, "waitid"):
        return eof
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _drain(fd: int) -> bytes:
    """What the pipe holds now, without waiting: its writer has ended, but another process may
    hold a copy of its write end, so no end of file comes."""
    data = b""
    while select.select([fd], [], [], 0)[0]:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        data += chunk
    return data


def _exit_status(status: int) -> str:
    """A wait status in words: "exit status 3", "killed by SIGSEGV, signal 11"."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            return f"killed by {signal.Signals(number).name}, signal {number}"
        except ValueError:  # a real-time signal, which has no name in the enum
            return f"killed by signal {number}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"
