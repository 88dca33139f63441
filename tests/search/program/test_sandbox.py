"""The sandbox: limits, isolation and named failures (issue's must-show list)."""

import os
import resource
import socket
import time

import pytest

from graded.search.program.sandbox import CHILD_ENV, FAILURES, Limits, Sandbox, detect_isolation

ISOLATED = detect_isolation().network


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(Limits(wall_s=2.0, memory_mb=1024), preimport=())


def test_returns_artefacts_as_json(sandbox):
    out = sandbox.run("def f(x):\n    return [x, x * 2]\n", "f", [1, 2.5])
    assert out.ok and out.artefacts == [[1, 2], [2.5, 5.0]]


def test_infinite_loop_killed_within_limit_plus_one_second(sandbox):
    start = time.perf_counter()
    out = sandbox.run("def f(x):\n    while True:\n        pass\n", "f", [0])
    assert out.failure == "timeout"
    assert time.perf_counter() - start < 2.0 + 1.0


def test_ten_gigabytes_fail_in_the_child_not_the_parent(sandbox):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = sandbox.run("def f(x):\n    b = bytearray(10 * 2**30)\n    return len(b)\n", "f", [0])
    assert out.failure == "memory"
    # the parent is untouched: still alive, its peak memory did not jump by gigabytes
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000


def _processes_in(directory: str) -> int:
    """Processes whose working directory is ``directory`` (the sandbox's, now deleted)."""
    count = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.readlink(f"/proc/{pid}/cwd").startswith(directory):
                    count += 1
            except OSError:
                pass
    return count


def test_fork_bomb_is_stopped(tmp_path):
    box = Sandbox(Limits(wall_s=2.0, memory_mb=512, processes=16), preimport=())
    source = (
        "import os\n"
        "def f(x):\n"
        "    while True:\n"
        "        try:\n"
        "            os.fork()\n"
        "        except OSError:\n"
        "            pass\n"
    )
    start = time.perf_counter()
    out = box.run(source, "f", [0])
    assert out.failure in ("timeout", "crash", "memory")
    assert time.perf_counter() - start < 10
    # the kernel tears a killed PID namespace down asynchronously: allow it a few seconds
    deadline = time.monotonic() + 10
    while _processes_in(out.extra["workdir"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_in(out.extra["workdir"]) == 0


@pytest.mark.skipif(not ISOLATED, reason=detect_isolation().description)
def test_no_socket_to_localhost_inside_the_namespace():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        box = Sandbox(Limits(wall_s=5.0, memory_mb=512), preimport=(), isolation="require")
        source = (
            "import socket\n"
            "def f(port):\n"
            "    socket.create_connection(('127.0.0.1', port), 1).close()\n"
            "    return 'connected'\n"
        )
        out = box.run(source, "f", [port])
        assert out.failure == "crash" and ("unreachable" in out.reason or "refused" in out.reason)
    finally:
        server.close()


def test_child_sees_none_of_the_parents_environment(sandbox, monkeypatch):
    monkeypatch.setenv("GRADED_SECRET_TOKEN", "do-not-leak")
    out = sandbox.run("import os\ndef f(x):\n    return dict(os.environ)\n", "f", [0])
    assert out.ok
    env = out.artefacts[0]
    assert "GRADED_SECRET_TOKEN" not in env and "HOME" not in env and "PATH" not in env
    # LC_CTYPE is set by the interpreter itself (C locale coercion)
    assert set(env) - {"LC_CTYPE"} == set(CHILD_ENV)
    assert all(env[name] == "1" for name in CHILD_ENV)


def test_numpy_in_the_child_runs_one_thread(sandbox):
    """Numpy's OpenBLAS started a thread per core in the child (each with some 40 MB of
    address space, counted against memory_mb, and CPU time counted against cpu_s): the child
    now has one thread after importing numpy and multiplying matrices."""
    out = sandbox.run("import os\nimport numpy as np\ndef f(x):\n    a = np.ones((256, 256))\n"
                      "    float((a @ a).sum())\n    return len(os.listdir('/proc/self/task'))\n",
                      "f", [0])
    assert out.ok, out
    assert out.artefacts[0] == 1


def test_private_directory_is_removed(sandbox):
    out = sandbox.run("import os\ndef f(x):\n    return os.getcwd()\n", "f", [0])
    assert out.ok and not os.path.exists(out.artefacts[0])


@pytest.mark.parametrize(
    "source,failure",
    [
        ("def f(x:\n", "syntax"),
        ("def f(x):\n    raise KeyError('k')\n", "crash"),
        ("def f(x):\n    return float('nan')\n", "non_finite"),
        ("def f(x):\n    return object()\n", "wrong_type"),
        ("def f(x):\n    return f(x)\n", "crash"),
    ],
)
def test_named_failures(sandbox, source, failure):
    out = sandbox.run(source, "f", [0])
    assert out.failure == failure and failure in FAILURES and out.reason


def test_output_is_capped():
    box = Sandbox(Limits(wall_s=5.0, memory_mb=512, output_bytes=100), preimport=())
    out = box.run("def f(x):\n    print('y' * 100000)\n    return 1\n", "f", [0])
    assert out.ok and len(out.stdout) == 100


def test_bad_limits_and_modes_are_refused():
    with pytest.raises(ValueError, match="wall_s"):
        Limits(wall_s=0)
    with pytest.raises(ValueError, match="wall_s=inf"):
        Limits(wall_s=float("inf"))
    with pytest.raises(ValueError, match="isolation"):
        Sandbox(isolation="maybe")


@pytest.mark.parametrize("field,value", [("cpu_s", -1), ("cpu_s", 0), ("cpu_s", 1.5),
                                         ("memory_mb", 0.5), ("processes", True)])
def test_limits_that_setrlimit_would_misread_are_refused_naming_the_value(field, value):
    # cpu_s=-1 is RLIM_INFINITY (no CPU limit at all), 0 kills every child at once, and a
    # float only failed later inside the child's preexec_fn with an anonymous SubprocessError
    expected = rf"Limits\.{field}={value!r}; expected a positive integer"
    with pytest.raises(ValueError, match=expected):
        Limits(**{field: value})


_FORGE = "import os\ndef f(x):\n    open('result.json', 'w').write({!r})\n    os._exit(0)\n"


@pytest.mark.parametrize(
    "written,failure,reason",
    [
        ("5", "wrong_type", "expected a JSON object, got int"),
        ("[1, 2]", "wrong_type", "expected a JSON object, got list"),
        ('{"artefacts": [1]}', "wrong_type", "expected a list of 2 artefacts (one per input), "
         "got 1 artefacts"),
        ('{"artefacts": 7}', "wrong_type", "artefacts=7"),
        ('{"failure": "weird", "reason": "x"}', "wrong_type", "failure 'weird' is not one of"),
        ('{"failure": [1], "reason": "x"}', "wrong_type", "failure [1] is not one of"),
        ('{"failure": "crash", "reason": 5}', "wrong_type", "the reason of failure 'crash' is 5"),
        ('{"artefacts": [NaN, 1]}', "non_finite", "NaN"),
        ('{"artefacts": [[1, -Infinity], 1]}', "non_finite", "-Infinity"),
        # nested past the parser's recursion limit: json.loads raises RecursionError, which is
        # not a ValueError and used to escape into the parent (and stop the whole search)
        ('{"artefacts": [' + "[" * 100_000 + "]" * 100_000 + ', 1]}', "output",
         "could not be read back"),
    ],
)
def test_a_result_file_the_candidate_forges_is_a_named_failure_not_a_parent_error(
        sandbox, written, failure, reason):
    # the candidate runs in the runner's process, so it can write result.json and exit before
    # the runner does; the parent must neither raise nor pass on what the runner never writes
    out = sandbox.run(_FORGE.format(written), "f", [0, 1])
    assert out.failure == failure and failure in FAILURES
    assert reason in out.reason and out.artefacts is None


def test_a_forged_result_of_the_right_shape_still_goes_to_the_verifier(sandbox):
    out = sandbox.run(_FORGE.format('{"artefacts": [3, 4]}'), "f", [0, 1])
    assert out.ok and out.artefacts == [3, 4]


def test_a_result_left_in_a_waiting_childs_directory_is_not_credited_to_its_candidate():
    # spare children wait in private directories that any candidate of the same user can
    # write to; one that plants a result there must not make the next candidate look good
    box = Sandbox(Limits(wall_s=5.0, memory_mb=512), preimport=(), warm=1)
    try:
        assert box.run("def f(x):\n    return 0\n", "f", [0]).ok  # leaves a spare waiting
        (_, spare_dir), = box._spares
        (spare_dir / "result.json").write_text('{"artefacts": [42]}')
        out = box.run("import os\ndef f(x):\n    os._exit(0)\n", "f", [0])
        assert out.failure == "crash" and out.artefacts is None
    finally:
        box.close()
