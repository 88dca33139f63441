"""A verifier run under ``verify_timeout_s`` that crashes (``os._exit``, a signal) fails its
candidate as ``invalid``, naming the exit status or signal, as soon as it ends; only one that
outruns the limit is ``verify_timeout``. The parent read a crash as a timeout, found only at the
limit, whenever another process held a copy of the reply pipe's write end (one forked meanwhile
by another thread of the evaluating process, or by the verifier), and read a verifier that closed
the pipe and hung on as a crash. The shipped problems' default limits are checked here too."""

import faulthandler
import os
import signal
import time

import pytest

from graded.search.program import sandbox_verifier
from graded.search.program.cli import _problem_option
from graded.search.program.evaluate import evaluate
from graded.search.program.problem import Problem, get_problem
from graded.search.program.problems import cap_set, matmul
from graded.search.program.program import parse_skeleton

SOURCE = ("# EVOLVE-BLOCK-START\ndef g(x):\n    return 2 * x\n# EVOLVE-BLOCK-END\n\n\n"
          "def main(x):\n    return g(x)\n")
LIMIT = 4.0  # seconds: a crash must be reported well before it


def _problem(verifier, limit=LIMIT, **changes) -> Problem:
    return Problem(name="crashes", skeleton=SOURCE, entry="main", inputs=(3,), score=verifier,
                   time_limit_s=10.0, memory_mb=512, verify_timeout_s=limit, **changes)


def _evaluate(verifier, limit=LIMIT, **changes):
    return evaluate(_problem(verifier, limit, **changes), parse_skeleton(SOURCE).initial)


def exits_3(x, artefact):
    os._exit(3)


def segfaults(x, artefact):
    faulthandler.disable()  # pytest's, inherited: no traceback on the test's stderr
    os.kill(os.getpid(), signal.SIGSEGV)


def kills_itself(x, artefact):
    os.kill(os.getpid(), signal.SIGKILL)


def sleeps(x, artefact):
    time.sleep(3600)


def _with_helper(verifier):
    """``verifier`` after forking a helper that sleeps holding the verifier's copy of every
    descriptor, the reply pipe's write end among them (it dies with the verifier's group)."""
    def forks_then(x, artefact):
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        return verifier(x, artefact)
    return forks_then


class _ForkingOs:
    """``os`` for :mod:`sandbox_verifier`, whose ``pipe`` also forks a process that holds both
    ends for a minute: what another thread's fork between ``pipe`` and ``close`` leaves."""

    def __init__(self, pidfd: bool = True):
        self.holders: list[int] = []
        self.pidfd = pidfd

    def __getattr__(self, name):
        if name == "pidfd_open" and not self.pidfd:
            raise AttributeError(name)  # as on macOS: the parent polls with waitid instead
        return getattr(os, name)

    def pipe(self):
        fds = os.pipe()
        holder = os.fork()
        if holder == 0:
            time.sleep(60)
            os._exit(0)
        self.holders.append(holder)
        return fds


@pytest.fixture
def forking_os(monkeypatch, request):
    fake = _ForkingOs(pidfd=getattr(request, "param", True))
    monkeypatch.setattr(sandbox_verifier, "os", fake)
    yield fake
    for holder in fake.holders:
        os.kill(holder, signal.SIGKILL)
        os.waitpid(holder, 0)


def _ended(how: str) -> str:
    return f"the verifier's process ended ({how}) before it returned the scores"


CRASHES = [
    (exits_3, "exit status 3"),
    (segfaults, f"killed by SIGSEGV, signal {int(signal.SIGSEGV)}"),
    (kills_itself, f"killed by SIGKILL, signal {int(signal.SIGKILL)}"),
]


@pytest.mark.parametrize("verifier, how", CRASHES)
@pytest.mark.parametrize("helper", [False, True], ids=["alone", "with-a-helper"])
def test_a_crashing_verifier_is_invalid_naming_its_end_at_once(verifier, how, helper):
    out = _evaluate(_with_helper(verifier) if helper else verifier)
    assert (out.failure, out.reason) == ("invalid", _ended(how))
    assert out.elapsed_s < LIMIT / 2  # the sandboxed run and the fork, not the limit


@pytest.mark.parametrize("forking_os", [True, False], ids=["pidfd", "waitid"], indirect=True)
@pytest.mark.parametrize("verifier, how", CRASHES[:2])
def test_a_crash_while_another_process_holds_the_pipe_is_no_timeout(forking_os, verifier, how):
    out = _evaluate(verifier)
    assert len(forking_os.holders) == 1  # the pipe was shared
    assert (out.failure, out.reason) == ("invalid", _ended(how))
    assert out.elapsed_s < LIMIT / 2


def test_a_crash_in_the_prechecks_names_the_stage():
    out = _evaluate(exits_3, prechecks=(1,))
    assert (out.failure, out.reason) == ("invalid", _ended("exit status 3") + " (precheck)")


@pytest.mark.parametrize("helper", [False, True], ids=["alone", "with-a-helper"])
def test_a_verifier_that_sleeps_past_the_limit_is_still_a_timeout(helper):
    out = _evaluate(_with_helper(sleeps) if helper else sleeps, limit=0.3)
    assert out.failure == "verify_timeout"
    assert out.reason == "the verifier did not finish within verify_timeout_s=0.3 s"
    assert out.elapsed_s >= 0.3


def test_a_timeout_while_another_process_holds_the_pipe_is_a_timeout(forking_os):
    out = _evaluate(sleeps, limit=0.3)
    assert out.failure == "verify_timeout" and out.elapsed_s >= 0.3


def closes_its_pipe_then_sleeps(x, artefact):
    os.closerange(3, 4096)  # the reply pipe's write end among them
    time.sleep(3600)


def test_a_verifier_that_closes_its_pipe_and_hangs_is_a_timeout_not_a_crash():
    out = _evaluate(closes_its_pipe_then_sleeps, limit=0.3)
    assert out.failure == "verify_timeout"
    assert out.reason == "the verifier did not finish within verify_timeout_s=0.3 s"


def test_a_verifier_that_returns_is_scored_whatever_holds_the_pipe(forking_os):
    out = _evaluate(lambda x, artefact: float(artefact) + 0.5)
    assert (out.failure, out.score, out.signature) == (None, 6.5, (6.5,))  # 2·3 + 0.5


# -- the shipped problems' default limits --

SMALL_BIN_PACKING = {"dataset": "weibull5k", "evolve_instances": 1, "train_items": 10}


@pytest.mark.parametrize("name, options, default", [
    ("cap-set", {"n": 3}, cap_set.VERIFY_TIMEOUT_S),
    ("matmul", {}, matmul.VERIFY_TIMEOUT_S),
    ("bin-packing", SMALL_BIN_PACKING, None),  # its factory does not name the option
])
def test_the_shipped_problems_limits_are_the_documented_ones(name, options, default):
    assert (cap_set.VERIFY_TIMEOUT_S, matmul.VERIFY_TIMEOUT_S) == (5.0, 30.0)
    assert get_problem(name, **options).verify_timeout_s == default
    assert get_problem(name, verify_timeout_s=2.5, **options).verify_timeout_s == 2.5
    assert get_problem(name, verify_timeout_s="none", **options).verify_timeout_s is None


@pytest.mark.parametrize("name", ["cap-set", "matmul"])
def test_a_default_limit_is_turned_off_by_none_and_zero_is_refused(name):
    for off in (None, "none", "None"):  # JSON's null, and the command line's text
        assert get_problem(name, verify_timeout_s=off).verify_timeout_s is None
    with pytest.raises(ValueError, match=r"verify_timeout_s=0; expected a positive number"):
        get_problem(name, verify_timeout_s=0)


@pytest.mark.parametrize("text, limit", [("verify_timeout_s=null", None),
                                         ("verify_timeout_s=none", None),
                                         ("verify_timeout_s=7", 7)])
def test_the_command_lines_option_overrides_the_default(text, limit):
    key, value = _problem_option(text)
    assert get_problem("cap-set", n=3, **{key: value}).verify_timeout_s == limit


def test_a_shipped_problem_under_its_default_limit_scores_as_in_process():
    limited = get_problem("cap-set", n=3)
    out = evaluate(limited, parse_skeleton(limited.skeleton).initial)
    plain = evaluate(get_problem("cap-set", n=3, verify_timeout_s=None),
                     parse_skeleton(limited.skeleton).initial)
    assert limited.verify_timeout_s == 5.0
    assert (out.failure, out.score, out.signature) == (None, 8.0, (8.0,))  # {0, 1}^3
    assert (plain.failure, plain.score) == (None, 8.0)
