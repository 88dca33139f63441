"""Named failures of candidates that flood their output, return what JSON cannot hold, or give
the verifier a wrong type at the precheck."""

import pytest

from graded.search.program.evaluate import evaluate
from graded.search.program.problem import Problem
from graded.search.program.program import Program
from graded.search.program.sandbox import Limits, Sandbox

SKELETON = '''
def solve(x):
    return value(x)


# EVOLVE-BLOCK-START
def value(x):
    return 1.0
# EVOLVE-BLOCK-END
'''


@pytest.fixture(scope="module")
def sandbox():
    box = Sandbox(Limits(wall_s=5.0, memory_mb=512, file_mb=1), preimport=())
    yield box
    box.close()


def test_printing_past_the_file_size_limit_is_an_output_failure(sandbox):
    # CPython ignores SIGXFSZ, so the flood was an OSError and the run a "crash" named
    # "OSError: [Errno 27] File too large"
    source = "def f(x):\n    while True:\n        print('y' * 4096)\n"
    out = sandbox.run(source, "f", [0])
    assert out.failure == "output"
    assert out.reason.startswith("file-size limit reached (stdout, stderr or a file")
    assert "[Errno 27]" in out.reason


def test_another_os_error_is_still_a_crash(sandbox):
    out = sandbox.run("def f(x):\n    open('/nonexistent/x')\n", "f", [0])
    assert out.failure == "crash" and out.reason.startswith("FileNotFoundError")


@pytest.mark.parametrize("body", [
    "a = []\n    a.append(a)\n    return a",  # contains itself
    "a = []\n    for _ in range(100000):\n        a = [a]\n    return a",  # nested too deeply
])
def test_an_artefact_json_cannot_hold_is_wrong_type_not_a_crash_of_the_runner(sandbox, body):
    # the runner's own NaN check recursed past the limit: "crash" with the reason "the child
    # exited with status 1:     return all(_finite(v)", a line of the runner's traceback
    out = sandbox.run(f"def f(x):\n    {body}\n", "f", [0])
    assert out.failure == "wrong_type"
    assert out.reason == ("artefact is not JSON: it contains itself or is nested too deeply "
                          "(RecursionError)")


def test_a_list_with_nan_inside_is_still_non_finite(sandbox):
    out = sandbox.run("def f(x):\n    return [[1.0, float('nan')]]\n", "f", [0])
    assert out.failure == "non_finite"


def _score(x, artefact):
    return artefact


@pytest.mark.parametrize("body,failure,reason", [
    ("return 'abc'", "wrong_type", "the verifier returned 'abc'; expected a number or a dict"),
    ("return True", "wrong_type", "the verifier returned True; expected a number or a dict"),
    ("return 10 ** 400", "non_finite", "expected a finite number"),
])
def test_a_wrong_score_at_the_precheck_says_precheck(body, failure, reason):
    # the docs: "A precheck failure is reported with '(precheck)'"; the verifier's wrong type
    # and non-finite scores were not
    problem = Problem("t", SKELETON, "solve", (1,), _score, prechecks=(0,), time_limit_s=5.0,
                      memory_mb=512)
    result = evaluate(problem, Program((f"def value(x):\n    {body}\n",)))
    assert result.failure == failure
    assert reason in result.reason and result.reason.endswith(" (precheck)")
    plain = Problem("t", SKELETON, "solve", (1,), _score, time_limit_s=5.0, memory_mb=512)
    unchecked = evaluate(plain, Program((f"def value(x):\n    {body}\n",)))
    assert unchecked.failure == failure and not unchecked.reason.endswith("(precheck)")
