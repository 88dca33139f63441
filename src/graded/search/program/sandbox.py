"""Runs candidate programs where they cannot hurt the parent: a fresh, limited child process.

Candidate code never runs in the parent process. :meth:`Sandbox.run` writes the program into a
private temporary directory and starts a fresh Python interpreter on it with:

- a wall-clock limit, after which the child's whole process group (and, with a PID namespace,
  every process it started) is killed;
- resource limits (``setrlimit``) on CPU time, address space, file size, open files, processes
  and core dumps;
- an environment of its own (no inherited tokens, keys or proxies: only :data:`CHILD_ENV`, one
  thread for the numerical libraries) and Python's isolated mode (``-I``: no ``PYTHON*``
  variables, no user site-packages, no script directory on ``sys.path``);
- stdout and stderr written to files in the private directory, of which at most
  ``Limits.output_bytes`` are read back;
- when the kernel allows it, new network and PID namespaces through util-linux ``unshare``
  (``unshare --net --pid --fork --kill-child``, with ``--map-root-user`` when not root): no
  network interface but a down loopback, and no process survives the child.
  :func:`detect_isolation` checks this once at start-up; when it is unavailable the run log says
  so and the child runs without the namespaces.

The child calls ``entry(input)`` for each input and sends the artefacts back as JSON. Every way an
evaluation can fail has a name (:data:`FAILURES`). Given the skeleton's fixed functions and
classes (``Sandbox.run(..., fixed=...)``), it also checks, after the module code and after the
run, that the candidate has not rebound or altered them (``redefinition``).

Threat model. Isolated: the parent's memory and Python state, its environment variables, the
network (with namespaces), runaway CPU, memory, output, files and processes. Not isolated: the
file system (the child runs as the same user and can read what that user can read, and write
outside its directory up to the file-size limit), shared kernel resources, and timing side
channels. For untrusted proposers on a shared machine, run the search inside a container or VM.

Its parts live beside it: :mod:`graded.search.program.sandbox_limits` (the limits, environment
and namespaces), :mod:`graded.search.program.sandbox_runner` (the program the child runs) and
:mod:`graded.search.program.sandbox_result` (the named failures and the reading back of the
child's result). Their names are importable from here as well.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from graded.search.program.sandbox_limits import (
    CHILD_ENV,
    Isolation,
    Limits,
    _user_processes,
    detect_isolation,
)
from graded.search.program.sandbox_result import (
    FAILURES,
    Outcome,
    _head,
    _malformed_result,
    _non_finite,
    _NonFinite,
)
from graded.search.program.sandbox_runner import RUNNER as _RUNNER

__all__ = [
    "FAILURES",
    "Isolation",
    "Limits",
    "Outcome",
    "Sandbox",
    "detect_isolation",
]


_RLIM_MAX = 2**63 - 1  # the largest limit setrlimit takes (a signed 64-bit rlim_t)


class Sandbox:
    """Evaluates programs in fresh, limited child processes (see the module docstring).

    ``isolation``: ``"auto"`` uses namespaces when :func:`detect_isolation` finds them,
    ``"require"`` refuses to run without them, ``"none"`` never uses them. ``preimport`` names
    modules the child imports before the candidate runs (their cost is not the candidate's).
    ``warm=k`` keeps k processes started ahead of time (see :meth:`run`).
    """

    def __init__(self, limits: Limits | None = None, *, isolation: str = "auto",
                 preimport: tuple[str, ...] = ("numpy",), python: str | None = None,
                 warm: int = 0) -> None:
        if isolation not in ("auto", "require", "none"):
            raise ValueError(f"isolation={isolation!r}; expected 'auto', 'require' or 'none'")
        self.limits = limits or Limits()
        found = detect_isolation() if isolation != "none" else Isolation(
            (), False, False, "isolation='none': no network or PID namespace")
        if isolation == "require" and not found.network:
            raise RuntimeError(f"isolation='require' but {found.description}")
        self.isolation = found
        self.preimport = tuple(preimport)
        self.python = python or sys.executable
        self.warm = int(warm)
        self._spares: list[tuple[subprocess.Popen, Path]] = []
        self._owner = os.getpid()

    def _own_spares(self) -> list[tuple[subprocess.Popen, Path]]:
        """The spare children this process started (a forked copy of the sandbox starts its
        own and never touches its parent's)."""
        if os.getpid() != self._owner:
            self._spares, self._owner = [], os.getpid()
        return self._spares

    def _limit(self) -> None:  # runs in the child between fork and exec
        lim = self.limits
        cpu = lim.cpu_s if lim.cpu_s is not None else math.ceil(lim.wall_s) + 1
        memory = lim.memory_mb * 2**20
        settings = [
            (resource.RLIMIT_CPU, cpu),
            (resource.RLIMIT_AS, memory),
            (resource.RLIMIT_FSIZE, lim.file_mb * 2**20),
            (resource.RLIMIT_NOFILE, lim.open_files),
            (resource.RLIMIT_CORE, 0),
            (resource.RLIMIT_NPROC, self._nproc),
        ]
        for kind, value in settings:
            # a limit past what rlim_t holds (time_limit_s=1e300 for "no limit") is no limit;
            # setrlimit refused it, and the child failed to start
            value = value if value <= _RLIM_MAX else resource.RLIM_INFINITY
            resource.setrlimit(kind, (value, value))

    def _spawn(self) -> tuple[subprocess.Popen, Path]:
        """A fresh child in a fresh private directory, its modules imported, waiting for 'go'."""
        workdir = Path(tempfile.mkdtemp(prefix="graded-sandbox-"))
        os.chmod(workdir, 0o700)
        (workdir / "runner.py").write_text(_RUNNER)
        self._nproc = _user_processes() + self.limits.processes
        command = [*self.isolation.prefix, self.python, "-I", "runner.py", *self.preimport]
        with open(workdir / "stdout", "wb") as out, open(workdir / "stderr", "wb") as err:
            child = subprocess.Popen(command, cwd=workdir, env=dict(CHILD_ENV),
                                     stdin=subprocess.PIPE,
                                     stdout=out, stderr=err, start_new_session=True,
                                     preexec_fn=self._limit)
        return child, workdir

    def close(self) -> None:
        """Stops the spare children started ahead of the next runs (see ``warm``)."""
        spares = self._own_spares()
        while spares:
            child, workdir = spares.pop()
            _kill_group(child)
            shutil.rmtree(workdir, ignore_errors=True)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def run(self, source: str | Mapping[str, str], entry: str, inputs: list | tuple, *,
            fixed: Mapping[str, list] | None = None) -> Outcome:
        """Runs ``source`` and returns the artefacts ``entry(x)`` for ``x`` in ``inputs``.

        ``source`` is one program, or several files {name: source} of which ``main.py`` holds
        ``entry`` and may import the others (they sit in the child's private directory).

        ``fixed`` (:func:`graded.search.program.program.fixed_definitions`) names the functions
        and classes of the skeleton's fixed code. The child checks, after the program's module
        code has run and again after the last ``entry`` call, that each is still what the fixed
        code defined: the same object, and for a function the same ``__code__``,
        ``__defaults__``, ``__kwdefaults__`` and ``__globals__``; otherwise the artefacts are
        discarded and the run is a ``redefinition`` naming the name.

        Each run gets its own fresh process and directory. With ``warm`` the processes for
        the next runs are started (and its ``preimport`` modules loaded) as soon as this one ends,
        so that start-up overlaps with the parent's own work; the wall-clock limit counts from
        the moment the candidate is handed over. With ``warm=k`` up to k processes wait ready (two
        cover a cascade's precheck and main run).
        """
        files = dict(source) if isinstance(source, Mapping) else {"candidate.py": source}
        if isinstance(source, Mapping):
            if "main.py" not in files:
                raise ValueError(f"a program of several files needs 'main.py'; got {sorted(files)}")
            files["candidate.py"] = files["main.py"]
        for name, text in files.items():
            if "/" in name or name.startswith(".") or name in ("runner.py", "request.json"):
                raise ValueError(f"program file name {name!r} is not allowed")
            try:
                compile(text, name, "exec")
            except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
                # RecursionError, MemoryError: code nested too deeply for CPython's parser
                return Outcome(None, "syntax", f"{name}: {type(e).__name__}: {e}", 0.0)
        spares = self._own_spares()
        child, workdir = spares.pop(0) if spares else self._spawn()
        try:
            for name, text in files.items():
                (workdir / name).write_text(text)
            # a spare's directory waited in /tmp, writable by any candidate of this user: what
            # comes back must be this candidate's result, not one left there before it started
            (workdir / "result.json").unlink(missing_ok=True)
            request = {"entry": entry, "inputs": list(inputs), "fixed": dict(fixed or {})}
            (workdir / "request.json").write_text(json.dumps(request))
            start = time.perf_counter()
            timed_out = False
            try:
                child.stdin.write(b"go\n")
                child.stdin.close()
            except (BrokenPipeError, OSError):
                pass  # the child is gone already; its exit status says why
            try:
                child.wait(timeout=self.limits.wall_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(child)
            elapsed = time.perf_counter() - start
            stdout = _head(workdir / "stdout", self.limits.output_bytes)
            stderr = _head(workdir / "stderr", self.limits.output_bytes)
            outcome = self._outcome(workdir, child.returncode, timed_out, elapsed, stdout, stderr,
                                    len(request["inputs"]))
            outcome.extra["workdir"] = str(workdir)
            return outcome
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
            while self.warm and len(spares) < self.warm:
                spares.append(self._spawn())

    def _outcome(self, workdir: Path, code: int, timed_out: bool, elapsed: float,
                 stdout: str, stderr: str, n_inputs: int) -> Outcome:
        def fail(kind: str, reason: str) -> Outcome:
            return Outcome(None, kind, reason, elapsed, stdout, stderr)

        if timed_out:
            return fail("timeout", f"wall-clock limit of {self.limits.wall_s:g} s reached")
        if code in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
            return fail("timeout", "CPU-time limit reached")
        result_path = workdir / "result.json"
        if result_path.exists():
            # the candidate runs in the runner's process and may have written this file itself:
            # nothing in it is trusted until it has the shape the runner writes
            try:
                result = json.loads(result_path.read_text(), parse_constant=_non_finite)
            except _NonFinite as e:
                return fail("non_finite", f"an artefact contains {e}")
            except (ValueError, UnicodeDecodeError, OSError, RecursionError) as e:
                # RecursionError: a result.json the candidate wrote itself, nested deeper than
                # the parser's recursion limit, must fail this evaluation, not the search
                return fail("output", f"the result could not be read back ({e})")
            malformed = _malformed_result(result, n_inputs)
            if malformed is not None:
                return fail("wrong_type", f"the child's result is not what the runner writes: "
                            f"{malformed}")
            if "failure" in result:
                return fail(result["failure"], result["reason"])
            return Outcome(result["artefacts"], None, "", elapsed, stdout, stderr)
        if code in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ):
            return fail("output", "file-size limit reached")
        if "MemoryError" in stderr or code in (-signal.SIGKILL, 128 + signal.SIGKILL):
            return fail("memory", f"killed or out of memory (exit status {code})")
        tail = stderr.strip().splitlines()[-1:] or [f"exit status {code}"]
        return fail("crash", f"the child exited with status {code}: {tail[0][:300]}")


def _kill_group(child: subprocess.Popen) -> None:
    """Kills every process of the child's group, repeatedly while any is left (a fork bomb
    keeps forking), for up to 5 s."""
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            break
        if child.poll() is not None and not _group_alive(child.pid):
            break  # only zombies are left in the group
        time.sleep(0.01)
    child.wait()


def _group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` is still running (not a zombie)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(stat[2]) == pgid and stat[0] != b"Z":
            return True
    return False
