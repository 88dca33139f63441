"""The argument a PatternBoost problem's size sets: declared by the class as `size_argument`,
checked and recorded by `register_problem`, read through the read-only `SIZE_ARGUMENT`."""

import re

import pytest

import graded.search.patternboost.engine as engine
from graded.search.patternboost import (
    PatternBoostConfig,
    TriangleFree,
    problem_from_size,
    problems,
    register_problem,
    run_patternboost,
)
from graded.search.patternboost.problems import SIZE_ARGUMENT


@pytest.fixture
def registry():
    """The registry as shipped, restored after the test whatever it registers."""
    saved = dict(problems._REGISTRY)
    yield
    problems._REGISTRY.clear()
    problems._REGISTRY.update(saved)


class VerticesTriangleFree(TriangleFree):
    """Triangle-free graphs whose size argument is called `vertices` (a test problem)."""

    name = "test-vertices-triangle-free"
    size_argument = "vertices"

    def __init__(self, vertices: int, bits_per_token: int = 4) -> None:
        super().__init__(vertices, bits_per_token)

    def params(self):
        return {"vertices": self.n, "bits_per_token": self.bits_per_token}


@pytest.mark.parametrize("write", [
    lambda: SIZE_ARGUMENT.__setitem__("hypercube", "n"),
    lambda: SIZE_ARGUMENT.__setitem__("triangle-free", "d"),
    lambda: SIZE_ARGUMENT.update({"hypercube": "n"}),
    lambda: SIZE_ARGUMENT.pop("hypercube"),
    lambda: SIZE_ARGUMENT.__delitem__("hypercube"),
])
def test_writing_to_size_argument_is_refused_pointing_at_register_problem(write):
    # a module dict: SIZE_ARGUMENT["hypercube"] = "n" made --n set an argument hypercube lacks
    with pytest.raises(TypeError, match=re.escape("SIZE_ARGUMENT is read-only: a problem class "
                                                  "names the constructor argument its size "
                                                  "sets as its `size_argument`")):
        write()
    assert SIZE_ARGUMENT["hypercube"] == "d" and SIZE_ARGUMENT["triangle-free"] == "n"
    assert problem_from_size("hypercube", 3).d == 3


def test_size_argument_names_each_registered_problems_argument():
    assert dict(SIZE_ARGUMENT) == {"triangle-free": "n", "c4-free": "n", "permanent": "n",
                                   "hypercube": "d"}


def test_a_registered_problem_sizes_the_argument_it_declares(registry, tmp_path, monkeypatch):
    # there was no way to declare it but writing to the module dict: `n` went to the
    # constructor as `n`, which this problem refuses
    monkeypatch.setattr(engine, "plot_metrics", lambda *args, **kwargs: None)  # not checked
    register_problem(VerticesTriangleFree)
    assert SIZE_ARGUMENT[VerticesTriangleFree.name] == "vertices"
    assert problem_from_size(VerticesTriangleFree.name, 7).n == 7
    config = PatternBoostConfig(problem=VerticesTriangleFree.name, n=5, mode="local-only",
                                rounds=0, initial=8, keep=4, database_size=8,
                                problem_options={"bits_per_token": 2}, progress=False)
    result = run_patternboost(config, tmp_path)
    # local search ends in a maximal triangle-free graph; on 5 vertices the best of 8 reaches
    # Mantel's bound ⌊25/4⌋ = 6 (K_{2,3})
    assert result.problem.n == 5 and result.best_score == 6.0
    with pytest.raises(ValueError, match=r"problem_options=\{'vertices': 6\} is invalid"):
        PatternBoostConfig(problem=VerticesTriangleFree.name, problem_options={"vertices": 6})


def test_register_problem_refuses_a_size_argument_the_constructor_lacks(registry):
    class Misnamed(VerticesTriangleFree):
        name = "test-misnamed"
        size_argument = "n"

    with pytest.raises(ValueError, match=re.escape(
            "Misnamed has size_argument='n': expected the constructor argument its size sets, "
            "one of ['bits_per_token', 'vertices']")):
        register_problem(Misnamed)
    assert "test-misnamed" not in problems.PROBLEMS


def test_an_option_naming_the_size_argument_is_refused_not_taken_over_n():
    # the option won: problem_from_size("hypercube", 3, d=5) built the 5-cube
    with pytest.raises(ValueError, match=re.escape(
            "problem 'hypercube' takes its size d from n=3, so the options cannot set it too "
            "(got d=5); expected options other than 'd'")):
        problem_from_size("hypercube", 3, d=5)
    assert problem_from_size("hypercube", 3, bits_per_token=2).d == 3
