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
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = [
    "FAILURES",
    "Isolation",
    "Limits",
    "Outcome",
    "Sandbox",
    "detect_isolation",
]

#: The whole environment of a child: one thread for OpenBLAS, OpenMP and MKL. Without it
#: numpy's OpenBLAS starts a thread per core, each reserving some 40 MB of address space, so on
#: a machine of some 24 cores importing numpy alone could reach a 1 GB ``memory_mb`` limit, and
#: the threads' CPU time would count against ``cpu_s`` several times over.
CHILD_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

#: Named failure reasons of one evaluation.
FAILURES: dict[str, str] = {
    "syntax": "the program does not parse",
    "redefinition": "the program redefines or alters a function or class of the fixed code",
    "crash": "the program raised an exception or exited abnormally",
    "timeout": "the wall-clock or CPU-time limit was reached",
    "memory": "the address-space limit was reached",
    "output": "the artefact was too large to send back",
    "non_finite": "an artefact or score is NaN or infinite",
    "wrong_type": "an artefact is not JSON-serialisable or a score has the wrong type",
    "invalid": "the verifier rejected the artefact",
}

_RUNNER = r'''
import json, math, sys, traceback

def _finite(x):
    if isinstance(x, float):
        return math.isfinite(x)
    if isinstance(x, (list, tuple)):
        return all(_finite(v) for v in x)
    if isinstance(x, dict):
        return all(_finite(v) for v in x.values())
    return True

def _write(payload):
    with open("result.json", "w") as f:
        json.dump(payload, f, allow_nan=False)

import os

def _fixed_guard(fixed, namespace, code):
    # Trusted: set up before the candidate runs. `fixed`: {file: [[name, kind, line,
    # has_defaults]]} ("" or "main.py": the candidate's own namespace, compiled as `code`).
    # Returns check(ran) -> None or why a fixed function or class is not the fixed code's.
    import builtins, types
    FunctionType, CodeType = types.FunctionType, types.CodeType  # as they are before it runs
    modules = {}
    for file in fixed:
        if file in ("", "main.py"):
            modules[file] = (lambda: namespace), code.co_consts, True
        else:
            with open(file) as f:
                consts = compile(f.read(), file, "exec").co_consts
            modules[file] = (lambda m=file[:-3]: getattr(sys.modules.get(m), "__dict__", None),
                             consts, False)
    expected, classes = {}, {}
    for file, entries in fixed.items():
        for name, kind, line, _ in entries:
            expected[file, name] = next(
                (c for c in modules[file][1] if isinstance(c, CodeType)
                 and c.co_name == name and c.co_firstlineno == line), None) if line else None
            if kind == "class" and expected[file, name] is not None:
                classes[file, name] = []
    if classes:  # every class built from a fixed class body, to tell the fixed class apart
        original = builtins.__build_class__
        def build_class(func, name, *bases, **kw):
            made = original(func, name, *bases, **kw)
            for key in classes:
                if getattr(func, "__code__", None) == expected[key]:
                    classes[key].append(made)
            return made
        builtins.__build_class__ = build_class
    missing, seen = object(), {}

    def state(obj):  # what must not change during the run
        if type(obj) is not FunctionType:
            return (obj,)  # a class, or what a decorator made of a fixed function
        kw = obj.__kwdefaults__
        return (obj, obj.__code__, obj.__defaults__, kw, obj.__globals__,
                *(tuple(kw.items()) if type(kw) is dict else ()))

    def defined(file, name, kind, line, has_defaults, obj, where):
        if obj is missing:
            return False
        if not line:
            return True  # decorated or bound twice: found now, checked from now on
        ref = expected[file, name]
        if kind == "class":
            return len(classes[file, name]) == 1 and classes[file, name][0] is obj
        if ref is None or type(obj) is not FunctionType:
            return False
        same = obj.__code__ is ref or (not modules[file][2] and obj.__code__ == ref)
        return (same and obj.__globals__ is where
                and obj.__closure__ is None
                and (has_defaults or (obj.__defaults__ is None and obj.__kwdefaults__ is None)))

    def check(ran):
        for file, entries in fixed.items():
            of = " of " + file if file not in ("", "main.py") else ""
            where = modules[file][0]()
            if where is None:
                continue  # a module of the program not imported (yet)
            if type(where) is not dict:
                return f"the module{of} is not the fixed code's"
            for name, kind, line, has_defaults in entries:
                obj = where.get(name, missing)
                before = seen.get((file, name))
                if before is None:
                    try:
                        ok = defined(file, name, kind, line, has_defaults, obj, where)
                    except Exception:
                        ok = False
                    if not ok:
                        when = ("after the run" if ran else
                                "once the program's module code had run")
                        return (f"the fixed {kind} {name!r}{of} is not the one the fixed code "
                                f"defined ({when})")
                    seen[file, name] = state(obj)
                    continue
                now = state(obj) if obj is before[0] else (obj,)
                if now[0] is not before[0]:
                    return f"the fixed {kind} {name!r}{of} was replaced while the program ran"
                for attr, old, new in zip(("__code__", "__defaults__", "__kwdefaults__",
                                           "__globals__"), before[1:5], now[1:5]):
                    if old is not new:
                        return (f"the fixed {kind} {name!r}{of} was altered while the program "
                                f"ran (its {attr} was replaced)")
                if len(now) != len(before) or any(
                        a[0] is not b[0] or a[1] is not b[1] for a, b in zip(now[5:], before[5:])):
                    return (f"the fixed {kind} {name!r}{of} was altered while the program ran "
                            "(its __kwdefaults__ were changed)")
        return None
    return check

def main():
    for name in sys.argv[1:]:
        try:
            __import__(name)
        except ImportError:
            pass
    if sys.stdin.readline().strip() != "go":
        import shutil
        shutil.rmtree(os.getcwd(), ignore_errors=True)  # a spare that was never used
        return
    request = json.load(open("request.json"))
    sys.path.insert(0, os.getcwd())  # the other files of a several-file program
    namespace = {"__name__": "candidate"}
    try:
        code = compile(open("candidate.py").read(), "candidate.py", "exec")
        check = _fixed_guard(request.get("fixed") or {}, namespace, code)
        exec(code, namespace)
        redefined = check(False)
        if redefined is not None:
            _write({"failure": "redefinition", "reason": redefined})
            return
        entry = namespace[request["entry"]]
        artefacts = []
        for value in request["inputs"]:
            artefact = entry(value)
            if hasattr(artefact, "tolist"):
                artefact = artefact.tolist()
            artefacts.append(artefact)
        redefined = check(True)
        if redefined is not None:  # the artefacts may not be the fixed code's: discarded
            _write({"failure": "redefinition", "reason": redefined})
            return
    except MemoryError:
        _write({"failure": "memory", "reason": "MemoryError"})
        return
    except RecursionError as e:
        _write({"failure": "crash", "reason": "RecursionError: " + str(e)[:200]})
        return
    except BaseException as e:
        tb = traceback.format_exc(limit=-3)
        _write({"failure": "crash", "reason": type(e).__name__ + ": " + str(e)[:300],
                "traceback": tb[-2000:]})
        return
    if not _finite(artefacts):
        _write({"failure": "non_finite", "reason": "an artefact contains NaN or infinity"})
        return
    try:
        text = json.dumps({"artefacts": artefacts}, allow_nan=False)
    except (TypeError, ValueError) as e:
        _write({"failure": "wrong_type", "reason": "artefact is not JSON: " + str(e)[:200]})
        return
    with open("result.json", "w") as f:
        f.write(text)

main()
'''


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


@dataclass
class Outcome:
    """What came back from one sandboxed run."""

    artefacts: list[Any] | None
    failure: str | None
    reason: str
    elapsed_s: float
    stdout: str = ""
    stderr: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.failure is None


def _user_processes() -> int:
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


class _NonFinite(ValueError):
    """NaN or ±Infinity in the child's result (the runner never writes them)."""


def _non_finite(constant: str) -> Any:
    raise _NonFinite(constant)


def _malformed_result(result: Any, n_inputs: int) -> str | None:
    """Why ``result`` is not what the runner writes (None when it is): either
    ``{"failure": <a name of FAILURES>, "reason": <text>, ...}`` or ``{"artefacts": <a list with
    one artefact per input>}``."""
    if not isinstance(result, dict):
        return f"expected a JSON object, got {type(result).__name__}"
    if "failure" in result:
        failure, reason = result["failure"], result.get("reason")
        if not isinstance(failure, str) or failure not in FAILURES:
            return f"failure {failure!r:.80} is not one of {sorted(FAILURES)}"
        if not isinstance(reason, str):
            return f"the reason of failure {failure!r} is {reason!r:.80}; expected text"
        return None
    artefacts = result.get("artefacts")
    if not isinstance(artefacts, list) or len(artefacts) != n_inputs:
        got = (f"{len(artefacts)} artefacts" if isinstance(artefacts, list)
               else f"artefacts={artefacts!r}"[:100])
        return f"expected a list of {n_inputs} artefacts (one per input), got {got}"
    return None


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


def _head(path: Path, limit: int) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode(errors="replace")
    except OSError:
        return ""
