"""PatternBoost's problem registry: `register_problem` refuses a taken name naming both classes,
`PROBLEMS` is read-only, and a registered problem is found by the CLI and the engine."""

import re

import pytest

from graded.search.patternboost import PROBLEMS, TriangleFree, problems, register_problem
from graded.search.patternboost.graphs import C4Free


@pytest.fixture
def registry():
    """The registry as shipped, restored after the test whatever it registers."""
    saved = dict(problems._REGISTRY)
    yield problems._REGISTRY
    problems._REGISTRY.clear()
    problems._REGISTRY.update(saved)


class SmallTriangleFree(TriangleFree):
    """Triangle-free graphs under a name of their own (a test problem)."""

    name = "test-small-triangle-free"


def test_the_shipped_problems_are_registered_under_their_names():
    assert dict(PROBLEMS) == {"triangle-free": TriangleFree, "c4-free": C4Free,
                              "permanent": problems.PatternAvoidingPermanent,
                              "hypercube": problems.HypercubeDiameter}


def test_a_shipped_name_is_refused_naming_both_classes(registry):
    class Impostor(C4Free):
        name = "triangle-free"

    with pytest.raises(ValueError) as error:
        register_problem(Impostor)
    message = str(error.value)
    assert "'triangle-free' is already registered to graded.search.patternboost.graphs." \
           "TriangleFree" in message
    assert "Impostor" in message
    assert PROBLEMS["triangle-free"] is TriangleFree


def test_registering_the_same_class_again_is_a_no_op(registry):
    assert register_problem(SmallTriangleFree) is SmallTriangleFree
    assert register_problem(SmallTriangleFree) is SmallTriangleFree  # its module imported again
    assert PROBLEMS[SmallTriangleFree.name] is SmallTriangleFree
    assert len(PROBLEMS) == 5


@pytest.mark.parametrize("write", [
    lambda: PROBLEMS.__setitem__("triangle-free", C4Free),
    lambda: PROBLEMS.__setitem__("test-new", C4Free),
    lambda: PROBLEMS.__delitem__("triangle-free"),
    lambda: PROBLEMS.pop("triangle-free"),
    lambda: PROBLEMS.update({"triangle-free": C4Free}),
])
def test_writing_to_problems_directly_is_refused_pointing_at_register_problem(write):
    with pytest.raises(TypeError, match=re.escape("PROBLEMS is read-only: add a problem class "
                                                  "with graded.search.patternboost."
                                                  "register_problem(cls)")):
        write()
    assert PROBLEMS["triangle-free"] is TriangleFree and "test-new" not in PROBLEMS


def test_register_problem_needs_a_named_problem_class(registry):
    class Nameless(TriangleFree):
        name = ""

    with pytest.raises(TypeError, match=r"expects a Problem subclass, got <class 'int'>"):
        register_problem(int)
    with pytest.raises(ValueError, match=r"Nameless needs a non-empty string `name`, got ''"):
        register_problem(Nameless)


def test_a_registered_problem_runs_from_the_command_line(registry, tmp_path, capsys):
    from graded.cli import main

    register_problem(SmallTriangleFree)
    out = tmp_path / "run"
    assert main(["search", "patternboost", "--problem", SmallTriangleFree.name, "--n", "5",
                 "--mode", "local-only", "--rounds", "0", "--initial", "8", "--samples", "8",
                 "--keep", "4", "--database-size", "8", "--out", str(out),
                 "--no-progress"]) == 0
    text = capsys.readouterr().out
    # local search ends in a maximal triangle-free graph; on 5 vertices the best of 8 reaches
    # Mantel's bound ⌊25/4⌋ = 6 (K_{2,3}), the optimum TriangleFree reports
    assert f"local-only {SmallTriangleFree.name} n=5: best score 6 (known optimum 6)" in text
