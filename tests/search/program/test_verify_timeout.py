"""The verifier's time limit (``Problem.verify_timeout_s``): a verifier that hangs fails its
candidate as ``verify_timeout``, its process and those it started are killed, and the search goes
on; within the limit, an evaluation is the one the verifier gives in-process. Limits larger than
the system can hold (1e300 s for "no limit") are no limit, where setrlimit and select refused
them mid-run; the proposer's, which it cannot honour, are refused by name when it is built."""

import math
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from graded.search.program.engine import SearchConfig, run_search
from graded.search.program.evaluate import evaluate
from graded.search.program.offline import OfflineProposer
from graded.search.program.problem import InvalidArtefact, Problem
from graded.search.program.program import Program, parse_skeleton
from graded.search.program.proposers import OpenAIProposer
from graded.search.program.sandbox import FAILURES

SKELETON = '''# EVOLVE-BLOCK-START
def f(x):
    return x + 1
# EVOLVE-BLOCK-END


def run(x):
    return f(x)
'''
INITIAL = parse_skeleton(SKELETON).initial
LIMIT = 0.4  # seconds


def problem(score, **changes) -> Problem:
    kwargs = dict(name="p", skeleton=SKELETON, entry="run", inputs=(1, 2), score=score,
                  time_limit_s=5.0, memory_mb=512, verify_timeout_s=LIMIT)
    kwargs.update(changes)
    return Problem(**kwargs)


def hangs_unless_initial(x, artefact):
    """Scores the initial program (artefact x + 1) and hangs on any other artefact."""
    if artefact != x + 1:
        time.sleep(3600)
    return float(artefact)


def hangs(x, artefact):
    time.sleep(3600)


def test_a_verifier_that_hangs_fails_each_candidate_and_the_search_goes_on():
    # the default executor: a pool of worker processes, each forking the verifier's child
    start = time.monotonic()
    result = run_search(problem(hangs_unless_initial), OfflineProposer(seed=1),
                        SearchConfig(budget=4, workers=2, seed=1))
    assert result.evaluations == 4
    timed_out = result.failures.get("verify_timeout", 0)
    assert timed_out >= 1  # the offline proposer changes what f returns
    assert sum(result.failures.values()) <= 4
    assert time.monotonic() - start < 30  # it hung for ever before
    assert result.best.score == 2.5  # the initial program's: (2 + 3) / 2


def test_a_hanging_verifier_is_stopped_at_its_limit_and_the_candidate_fails_by_name():
    start = time.monotonic()
    out = evaluate(problem(hangs), INITIAL)
    elapsed = time.monotonic() - start
    assert out.failure == "verify_timeout" and "verify_timeout" in FAILURES
    assert out.reason == f"the verifier did not finish within verify_timeout_s={LIMIT:g} s"
    assert out.score is None and out.signature is None
    assert LIMIT <= elapsed < LIMIT + 5.0  # the sandboxed run comes first
    # the evaluating process goes on: the next evaluation is scored
    assert evaluate(problem(hangs_unless_initial), INITIAL).score == 2.5


def test_a_timeout_in_the_prechecks_names_the_stage():
    out = evaluate(problem(hangs, prechecks=(0,)), INITIAL)
    assert out.failure == "verify_timeout" and out.reason.endswith(" (precheck)")


def starts_a_sleeper_then_hangs(x, artefact):
    """Starts a process of its own (its pid in the file named by the input), then hangs."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    with open(x, "w") as f:
        f.write(str(sleeper.pid))
    time.sleep(3600)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_verifiers_process_and_those_it_started_are_killed(tmp_path):
    pid_file = str(tmp_path / "sleeper.pid")
    identity = "# EVOLVE-BLOCK-START\ndef f(x):\n    return x\n# EVOLVE-BLOCK-END\n\n\n" \
               "def run(x):\n    return f(x)\n"
    p = problem(starts_a_sleeper_then_hangs, skeleton=identity, inputs=(pid_file,),
                verify_timeout_s=1.0)  # time for the sleeper to start
    out = evaluate(p, parse_skeleton(identity).initial)
    assert out.failure == "verify_timeout"
    sleeper = int(Path(pid_file).read_text())
    deadline = time.monotonic() + 5.0
    while _running(sleeper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(sleeper)


def named(x, artefact):
    return {"value": float(artefact), "half": artefact / 2}


def rejects_two(x, artefact):
    if x == 2:
        raise InvalidArtefact(f"no {x}")
    return float(artefact)


def index_error(x, artefact):
    return [][artefact]


def nan_score(x, artefact):
    return math.nan


def text_score(x, artefact):
    return "high"


def exits(x, artefact):
    sys.exit(3)


@pytest.mark.parametrize("score, changes", [
    (hangs_unless_initial, {}),
    (named, {"primary": "value"}),
    (hangs_unless_initial, {"prechecks": (5,), "held_out": (7, 8)}),
    (rejects_two, {}),
    (index_error, {}),
    (nan_score, {}),
    (text_score, {}),
])
def test_within_the_limit_an_evaluation_is_the_in_process_one(score, changes):
    limited = evaluate(problem(score, **changes), INITIAL, held_out=True)
    in_process = evaluate(problem(score, verify_timeout_s=None, **changes), INITIAL,
                          held_out=True)
    for out in (limited, in_process):
        out.elapsed_s = 0.0
    assert limited == in_process


def test_a_verifier_that_exits_or_dies_fails_its_candidate_as_invalid():
    out = evaluate(problem(exits), INITIAL)
    assert (out.failure, out.reason) == ("invalid", "the verifier raised SystemExit: 3")
    out = evaluate(problem(dies), INITIAL)
    assert out.failure == "invalid"
    assert out.reason == ("the verifier's process ended (exit status 7) before it returned the "
                          "scores")


def dies(x, artefact):
    os._exit(7)


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, True, "1", [1]])
def test_a_bad_verify_timeout_is_refused_by_name(bad):
    with pytest.raises(ValueError, match=r"verify_timeout_s=.*expected a positive number of "
                                         r"seconds, finite, or None"):
        problem(hangs, verify_timeout_s=bad)


def test_no_limit_is_the_default_and_whole_numbers_are_accepted():
    assert problem(hangs, verify_timeout_s=None).verify_timeout_s is None
    assert Problem("p", SKELETON, "run", (1,), hangs).verify_timeout_s is None
    assert problem(hangs, verify_timeout_s=2).verify_timeout_s == 2


def test_a_program_that_fails_in_the_sandbox_never_reaches_the_verifier():
    crashing = Program(("def f(x):\n    raise RuntimeError('boom')\n",))
    out = evaluate(problem(hangs), crashing)
    assert out.failure == "crash"


@pytest.mark.parametrize("name, options", [("cap-set", {"n": 2}), ("bin-packing", {}),
                                           ("matmul", {})])
def test_every_registered_problem_takes_a_verify_timeout(name, options):
    from graded.search.program.problem import get_problem

    limited = get_problem(name, verify_timeout_s=60, **options)
    plain = get_problem(name, **options)
    shipped = {"cap-set": 5.0, "bin-packing": None, "matmul": 30.0}  # docs/program_search.md
    assert (limited.verify_timeout_s, plain.verify_timeout_s) == (60, shipped[name])
    assert limited.inputs == plain.inputs and limited.skeleton == plain.skeleton
    with pytest.raises(ValueError, match=r"verify_timeout_s=-1; expected a positive number"):
        get_problem(name, verify_timeout_s=-1, **options)


def test_the_command_line_sets_the_verify_timeout_and_records_it(tmp_path, capsys):
    import json

    from graded.cli import main

    out = tmp_path / "run"
    args = ["search", "program", "--problem", "cap-set", "--n", "2", "--budget", "2",
            "--workers", "1", "--islands", "1", "--option", "verify_timeout_s=30",
            "--out", str(out)]
    assert main(args) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["problem_options"] == {"verify_timeout_s": 30, "n": 2}
    # resuming with another limit is a change of configuration, refused
    changed = [a if a != "verify_timeout_s=30" else "verify_timeout_s=5" for a in args]
    assert main([*changed, "--resume"]) == 2
    assert "problem_options" in capsys.readouterr().err


@pytest.mark.parametrize("limits", [
    {"time_limit_s": 1e300},  # RLIMIT_CPU past rlim_t: the child did not start
    {"memory_mb": 2**50},  # RLIMIT_AS of 2^70 bytes: the same
    {"verify_timeout_s": 1e300},  # select's timeout past time_t
])
def test_limits_past_the_system_are_no_limits(limits):
    out = evaluate(Problem("p", SKELETON, "run", (1, 2), hangs_unless_initial, **limits),
                   INITIAL)
    assert (out.failure, out.score, out.signature) == (None, 2.5, (2.0, 3.0))


@pytest.mark.parametrize("kwargs, message", [
    ({"timeout_s": math.inf}, f"timeout_s=inf; expected a positive number of seconds, at most "
                              f"{threading.TIMEOUT_MAX:g}"),
    ({"timeout_s": 1e10}, "timeout_s=10000000000.0; expected a positive number of seconds"),
    ({"backoff_s": math.inf}, "backoff_s=inf; expected a number of seconds >= 0 whose last "
                              "back-off, backoff_s·2^retries with retries=3, is at most"),
    ({"backoff_s": 1e9, "retries": 5}, "backoff_s=1000000000.0; expected a number of seconds"),
    ({"backoff_s": math.nan}, "backoff_s=nan; expected a number of seconds >= 0"),
])
def test_proposer_waits_the_system_cannot_honour_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        OpenAIProposer(base_url="http://127.0.0.1:1/v1", model="m", **kwargs)


def test_the_longest_wait_the_system_honours_is_accepted():
    proposer = OpenAIProposer(base_url="http://127.0.0.1:1/v1", model="m",
                              timeout_s=threading.TIMEOUT_MAX,
                              backoff_s=threading.TIMEOUT_MAX / 2**3)
    assert proposer.timeout_s == threading.TIMEOUT_MAX
