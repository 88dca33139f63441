"""The limits a sandboxed child runs under: resources, environment and namespaces.

:class:`Limits` holds the wall-clock limit the parent enforces and the ``setrlimit`` values the
child gets between fork and exec (CPU time, address space, file size, open files, processes;
core dumps are always off). :data:`CHILD_ENV` is the child's whole environment.
:func:`detect_isolation` checks once whether util-linux ``unshare`` can give children new network
and PID namespaces on this machine, and :class:`Isolation` says what it found.
:class:`~graded.search.program.sandbox.Sandbox` applies all of them; its module states the
threat model.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["CHILD_ENV", "Isolation", "Limits", "detect_isolation"]

#: The whole environment of a child: one thread for OpenBLAS, OpenMP and MKL. Without it
#: numpy's OpenBLAS starts a thread per core, each reserving some 40 MB of address space, so on
#: a machine of some 24 cores importing numpy alone could reach a 1 GB ``memory_mb`` limit, and
#: the threads' CPU time would count against ``cpu_s`` several times over.
CHILD_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@dataclass(frozen=True)
class Limits:
    """Resource limits of one evaluation.

    ``cpu_s`` defaults to the wall-clock limit rounded up plus one second; ``processes`` is the
    number of processes the child may add to those its user already runs.
    """

    wall_s: float = 30.0
    memory_mb: int = 2048
    cpu_s: int | None = None
    file_mb: int = 64
    open_files: int = 64
    processes: int = 32
    output_bytes: int = 65_536

    def __post_init__(self) -> None:
        wall = self.wall_s
        if isinstance(wall, bool) or not (isinstance(wall, (int, float)) and 0 < wall < math.inf):
            raise ValueError(f"Limits.wall_s={wall!r}; expected a positive finite number")
        # setrlimit takes integers, and reads -1 as "unlimited": these must be integers >= 1
        for name in ("cpu_s", "memory_mb", "file_mb", "open_files", "processes", "output_bytes"):
            value = getattr(self, name)
            if name == "cpu_s" and value is None:
                continue
            if isinstance(value, bool) or not (isinstance(value, int) and value > 0):
                raise ValueError(f"Limits.{name}={value!r}; expected a positive integer")


@dataclass(frozen=True)
class Isolation:
    """How children are isolated on this machine (see :func:`detect_isolation`)."""

    prefix: tuple[str, ...]
    network: bool
    pid: bool
    description: str


@lru_cache(maxsize=1)
def detect_isolation() -> Isolation:
    """Checks once whether ``unshare`` can give children new network and PID namespaces."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return Isolation((), False, False, "util-linux unshare not found: no network or PID "
                         "namespace; children can reach the network")
    base = [unshare, "--net", "--pid", "--fork", "--kill-child"]
    if os.geteuid() != 0:
        base.insert(1, "--map-root-user")
    probe = [*base, sys.executable, "-I", "-c",
             "import socket\ntry:\n socket.create_connection(('127.0.0.1', 9), 0.5)\n"
             "except OSError as e:\n raise SystemExit(0 if e.errno == 101 else 3)\n"]
    try:
        result = subprocess.run(probe, env={}, capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return Isolation((), False, False, f"unshare failed ({e}): no network or PID namespace")
    if result.returncode != 0:
        err = result.stderr.decode(errors="replace").strip().splitlines()
        why = err[-1] if err else f"exit status {result.returncode}"
        return Isolation((), False, False, f"the kernel refused new namespaces ({why}): "
                         "children can reach the network")
    return Isolation(tuple(base), True, True,
                     "network and PID namespaces (unshare): no network, no surviving processes")


def _user_processes() -> int:
    """The number of processes this user runs now (``Limits.processes`` is counted on top)."""
    uid = os.getuid()
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    count += 1
            except OSError:
                continue
    return count
