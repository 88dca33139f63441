"""Program-search problems and evaluation: the Problem checks, the registry's checks, dict-valued
verifier scores, and the evaluation failures no other test reaches."""

import math
import re
from fractions import Fraction

import numpy as np
import pytest

import graded.search.program.problem as problem_module
from graded.search.program.evaluate import evaluate, scalar_score
from graded.search.program.problem import (
    Problem,
    available_problems,
    get_problem,
    register_problem,
)
from graded.search.program.program import Program, parse_skeleton

SKELETON = '''# EVOLVE-BLOCK-START
def f(x):
    return x + 1
# EVOLVE-BLOCK-END


def run(x):
    return f(x)
'''


def _score(x, artefact):
    return float(artefact)


def _problem(**changes):
    kwargs = dict(name="p", skeleton=SKELETON, entry="run", inputs=(1, 2), score=_score,
                  time_limit_s=5.0, memory_mb=512)
    kwargs.update(changes)
    return Problem(**kwargs)


@pytest.mark.parametrize("changes, message", [
    ({"name": ""}, r"a Problem needs a non-empty name, got ''"),
    ({"entry": "run it"}, r"entry='run it' is not a Python function name"),
    ({"inputs": ()}, r"problem 'p' has no inputs to evaluate on"),
    ({"score": 3}, r"problem 'p': score must be callable, got 3"),
    ({"time_limit_s": 0}, r"time_limit_s=0; expected a positive number"),
    ({"memory_mb": 1.5}, r"memory_mb=1.5; expected a positive integer"),
    ({"memory_mb": 0}, r"memory_mb=0; expected a positive integer"),
    # accepted here, then refused by the sandbox's Limits inside the first evaluation
    ({"time_limit_s": math.inf}, r"time_limit_s=inf; expected a positive number, finite"),
    ({"time_limit_s": math.nan}, r"time_limit_s=nan; expected a positive number, finite"),
    ({"time_limit_s": "30"}, r"time_limit_s='30'; expected a positive number, finite"),
    ({"time_limit_s": True}, r"time_limit_s=True; expected a positive number, finite"),
    ({"memory_mb": True}, r"memory_mb=True; expected a positive integer"),
])
def test_a_bad_problem_is_named(changes, message):
    with pytest.raises(ValueError, match=message):
        _problem(**changes)


def test_register_problem_needs_a_name_and_a_callable():
    with pytest.raises(ValueError, match=r"register_problem needs a name and a callable, got '', "):
        register_problem("", _problem)
    with pytest.raises(ValueError, match=r"got 'x', 3"):
        register_problem("x", 3)


class _Unreadable:
    """A factory whose signature inspect cannot read: its options are passed on unchecked."""

    __signature__ = "not a signature"

    def __call__(self, **options):
        return _problem(options=options)


def test_options_of_a_factory_with_an_unreadable_signature_are_passed_on(monkeypatch):
    # the shipped problems register themselves on first import: import them before the copy,
    # else they land in the copy, which is dropped, and later tests find no problem at all
    available_problems()
    monkeypatch.setattr(problem_module, "_REGISTRY", dict(problem_module._REGISTRY))
    register_problem("unreadable", _Unreadable())
    assert get_problem("unreadable", anything=3).options == {"anything": 3}


# -- scalar_score ------------------------------------------------------------------------------


def test_dict_scores_give_the_primary_and_every_named_score():
    p = _problem(primary="size", minimise=("time",))
    assert scalar_score(p, {"size": 3, "time": 0.5}) == (3.0, {"size": 3.0, "time": 0.5})


@pytest.mark.parametrize("primary", [None, "missing"])
def test_a_dict_without_the_primary_score_is_named(primary):
    with pytest.raises(TypeError, match=rf"the verifier returned a dict \['a', 'b'\] but the "
                                        rf"problem's primary score is {primary!r}"):
        scalar_score(_problem(primary=primary), {"b": 1.0, "a": 2.0})


@pytest.mark.parametrize("value", [True, "3", None])
def test_a_named_score_must_be_a_number(value):
    with pytest.raises(TypeError, match=rf"score 'b' is {value!r}; expected a number"):
        scalar_score(_problem(primary="a"), {"a": 1.0, "b": value})


@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_a_named_score_must_be_finite(value):
    with pytest.raises(ValueError, match=rf"score 'a' is {value!r}; expected a finite number"):
        scalar_score(_problem(primary="a"), {"a": value})
    with pytest.raises(ValueError, match=rf"the score is {value!r}; expected a finite number"):
        scalar_score(_problem(), value)


@pytest.mark.parametrize("value", [[1.0], False])
def test_a_score_must_be_a_number_or_a_dict(value):
    with pytest.raises(TypeError, match=re.escape(f"the verifier returned {value!r}; expected a "
                                                  "number or a dict")):
        scalar_score(_problem(), value)


@pytest.mark.parametrize("value, expected", [
    (np.int64(7), 7.0), (np.int8(-3), -3.0), (np.uint16(9), 9.0), (np.float32(0.5), 0.5),
    (np.float64(2.25), 2.25),
])
def test_numpy_scores_count_as_numbers(value, expected):
    # a verifier's `array.sum()` is a numpy integer: every program failed as "wrong_type"
    assert scalar_score(_problem(), value) == (expected, {})
    assert scalar_score(_problem(primary="a"), {"a": value}) == (expected, {"a": expected})


@pytest.mark.parametrize("value", [np.bool_(True), np.float64("nan"), np.float32("inf")])
def test_numpy_bools_and_non_finite_numpy_scores_are_refused(value):
    with pytest.raises((TypeError, ValueError), match=re.escape(repr(value))):
        scalar_score(_problem(), value)


def test_an_integer_score_beyond_the_float_range_is_not_finite():
    # math.isfinite(10**400) raised OverflowError out of the evaluation
    with pytest.raises(ValueError, match=r"the score is 1000\d+; expected a finite number"):
        scalar_score(_problem(), 10**400)


# -- evaluate ----------------------------------------------------------------------------------


def test_a_verifier_returning_a_numpy_integer_scores_the_program():
    p = _problem(score=lambda x, artefact: np.int64(artefact) * 2)
    result = evaluate(p, parse_skeleton(SKELETON).initial)
    assert result.ok and result.signature == (4.0, 6.0) and result.score == 5.0  # f(x) = x + 1


def test_named_scores_that_change_between_inputs_fail_as_wrong_type_naming_both():
    # the mean of each named score over the inputs raised KeyError 'extra' out of evaluate
    def score(x, artefact):
        return {"size": float(artefact), "extra": 1.0} if x == 1 else {"size": float(artefact)}

    result = evaluate(_problem(score=score, primary="size"), parse_skeleton(SKELETON).initial)
    assert result.failure == "wrong_type" and result.score is None
    assert result.reason == ("the verifier named the scores ['size'] on input 1 but "
                             "['extra', 'size'] on input 0; expected the same names on every "
                             "input")


def test_a_program_with_the_wrong_number_of_blocks_fails_as_syntax():
    result = evaluate(_problem(), Program(("def f(x):\n    return x\n", "y = 2\n")))
    assert result.failure == "syntax" and result.score is None
    assert result.reason == "the skeleton has 1 evolvable blocks, the program fills 2"


def test_a_verifier_returning_a_non_number_fails_as_wrong_type():
    p = _problem(score=lambda x, artefact: str(artefact))
    result = evaluate(p, parse_skeleton(SKELETON).initial)
    assert result.failure == "wrong_type"
    assert result.reason == "the verifier returned '2'; expected a number or a dict"


def test_the_exit_hook_closes_every_warm_sandbox(monkeypatch):
    import importlib

    # the package exports the function evaluate under the module's name: import the module
    evaluate_module = importlib.import_module("graded.search.program.evaluate")

    closed = []

    class _Fake:
        def __init__(self, name):
            self.name = name

        def close(self):
            closed.append(self.name)

    monkeypatch.setattr(evaluate_module, "_SANDBOXES", {1: _Fake("a"), 2: _Fake("b")})
    evaluate_module._close_sandboxes()
    assert closed == ["a", "b"]


def test_evaluating_under_new_limits_stops_the_last_limits_waiting_children():
    # one warm sandbox (two waiting children) was kept per (limits, isolation) ever used, for
    # the life of the process: a test session held 37 idle children of 20 limits
    import importlib

    evaluate_module = importlib.import_module("graded.search.program.evaluate")
    evaluate_module._close_sandboxes()
    initial = parse_skeleton(SKELETON).initial
    first = evaluate(_problem(time_limit_s=5.0), initial)
    (sandbox,) = evaluate_module._SANDBOXES.values()
    waiting = [child for child, _ in sandbox._spares]
    assert first.ok and len(waiting) == 2 and all(child.poll() is None for child in waiting)
    second = evaluate(_problem(time_limit_s=6.0), initial)
    assert second.ok and second.score == first.score == 2.5
    assert [key[0].wall_s for key in evaluate_module._SANDBOXES] == [6.0]
    assert all(child.poll() is not None for child in waiting)
    evaluate_module._close_sandboxes()
    assert evaluate_module._SANDBOXES == {}


def _exact_mean(values):
    return float(sum(map(Fraction, values)) / len(values))


def test_the_means_of_huge_finite_scores_are_their_exact_means_not_inf():
    # sum(primary) / len(primary) overflowed to inf: 1.5e308 + 1.7e308 > the largest float
    def score(x, artefact):  # f(x) = x + 1: artefacts 2, 3 on the inputs, 4, 3 held out
        big = {2: 1.5e308, 3: 1.7e308, 4: 1.6e308}[artefact]
        return {"size": big, "other": -big}

    p = _problem(score=score, primary="size", held_out=(3, 2))
    result = evaluate(p, parse_skeleton(SKELETON).initial, held_out=True)
    assert result.ok and result.signature == (1.5e308, 1.7e308)
    assert result.score == _exact_mean([1.5e308, 1.7e308]) == 1.6e308
    assert result.scores == {"size": 1.6e308, "other": -1.6e308}
    assert result.held_out["mean"] == _exact_mean([1.6e308, 1.7e308])


def test_named_scores_other_than_the_initial_programs_fail_as_wrong_type_naming_both():
    # the program joined the database, and Pareto selection raised KeyError 'extra' later
    def score(x, artefact):
        return {"size": float(artefact), "extra": 1.0}

    result = evaluate(_problem(score=score, primary="size"), parse_skeleton(SKELETON).initial,
                      names=("size",))
    assert result.failure == "wrong_type" and result.score is None
    assert result.reason == ("the verifier named the scores ['extra', 'size'] but ['size'] for "
                             "the initial program; expected the same names for every program")
    same = evaluate(_problem(score=score, primary="size"), parse_skeleton(SKELETON).initial,
                    names=["size", "extra"])
    assert same.ok and same.scores == {"size": 2.5, "extra": 1.0}


def test_names_given_as_one_string_are_refused():
    with pytest.raises(TypeError, match=r"names='size'; expected a collection of names"):
        evaluate(_problem(), parse_skeleton(SKELETON).initial, names="size")
