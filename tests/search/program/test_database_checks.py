"""Programs database: Pareto selection against a direct dominance check, the multi-block prompt
text, and the checks no other test reaches."""

import math

import pytest

from graded.search.program.database import DatabaseConfig, ProgramsDatabase, pareto_front
from graded.search.program.evaluate import Evaluation
from graded.search.program.program import Program


def ev(score, scores=None, blocks=None, body=None):
    program = Program(blocks or (f"def priority(x):\n    return {body or score}\n",))
    return Evaluation(program, float(score), (float(score),), scores or {})


def test_the_front_of_no_points_is_empty():
    assert pareto_front([]) == []


def test_temperature_init_must_be_positive():
    with pytest.raises(ValueError, match=r"temperature_init=0.0; expected > 0"):
        DatabaseConfig(temperature_init=0.0)


def test_pareto_selection_draws_the_non_dominated_programs():
    config = DatabaseConfig(islands=1, programs_per_prompt=10, selection="pareto")
    points = [{"size": 1.0, "time": 1.0}, {"size": 3.0, "time": 5.0},
              {"size": 2.0, "time": 2.0}, {"size": 2.0, "time": 3.0},  # dominated by the former
              {"size": 0.5, "time": 4.0}]  # dominated by the first
    evals = [ev(p["size"], p, body=f"{i}") for i, p in enumerate(points)]
    db = ProgramsDatabase(config, evals[0], seed=0, minimise=("time",))
    for e in evals[1:]:
        db.register(0, e)

    def dominates(a, b):  # larger size, smaller time
        return (a["size"] >= b["size"] and a["time"] <= b["time"]
                and (a["size"] > b["size"] or a["time"] < b["time"]))

    front = [e for e in evals if not any(dominates(o.scores, e.scores) for o in evals)]
    assert {e.scores["time"] for e in front} == {1.0, 5.0, 2.0}
    island, parents = db.sample(0)
    assert island == 0
    assert parents == sorted(front, key=lambda e: e.score)  # every front member, by score
    db.config = DatabaseConfig(islands=1, programs_per_prompt=2, selection="pareto")
    _, two = db.sample(0)
    assert len(two) == 2 and all(p in front for p in two)


def test_a_multi_block_prompt_lists_each_version_then_asks_for_diffs():
    parents = [ev(1.0, blocks=("a = 1\n", "b = 2\n")), ev(2.5, blocks=("a = 3\n", "b = 4\n"))]
    db = ProgramsDatabase(DatabaseConfig(islands=1), parents[0])
    prompt = db.prompt(0, parents, header="HEADER")
    assert prompt.parents == parents and prompt.island == 0
    assert prompt.text == (
        "HEADER\n"
        "# version 0, score: 1\n# block 0\na = 1\n\n# block 1\nb = 2\n\n"
        "# version 1, score: 2.5\n# block 0\na = 3\n\n# block 1\nb = 4\n\n"
        "# Propose changes to the blocks of the last version as SEARCH/REPLACE diffs.\n")


def test_a_single_block_without_a_function_cannot_be_versioned():
    parent = ev(1.0, blocks=("x = 1\n",))
    db = ProgramsDatabase(DatabaseConfig(islands=1), parent)
    with pytest.raises(ValueError, match=r"the evolvable block defines no function to version"):
        db.prompt(0, [parent])


@pytest.mark.parametrize("field, value, message", [
    ("islands", True, r"islands=True; expected an integer >= 1"),
    ("bins", False, r"bins=False; expected an integer >= 1"),
    ("temperature_init", "0.1", r"temperature_init='0.1'; expected > 0, a finite number"),
    ("temperature_init", math.inf, r"temperature_init=inf; expected > 0, a finite number"),
    ("temperature_init", math.nan, r"temperature_init=nan; expected > 0, a finite number"),
    ("temperature_init", True, r"temperature_init=True; expected > 0, a finite number"),
    ("descriptors", "ab", r"descriptors='ab'; expected a tuple of names of scores"),
    ("descriptors", None, r"descriptors=None; expected a tuple of names of scores"),
    ("descriptors", ("a", 3), r"descriptors=\('a', 3\); expected a tuple of names of scores"),
])
def test_a_bad_database_setting_is_named(field, value, message):
    # a bool passed as a count, "0.1" (a bare TypeError from the comparison), an infinite
    # temperature (uniform sampling), and a string taken for its characters were accepted
    with pytest.raises(ValueError, match=message):
        DatabaseConfig(**{field: value})


def test_descriptors_given_as_a_list_are_kept_as_a_tuple():
    config = DatabaseConfig(selection="map-elites", descriptors=["a", "b"])
    assert config.descriptors == ("a", "b")
    db = ProgramsDatabase(config, ev(1.0, {"a": 0.0, "b": 1.0}))
    assert ProgramsDatabase.from_state(db.state()).config == config


@pytest.mark.parametrize("selection", ["clusters", "pareto"])
def test_descriptors_without_map_elites_selection_are_refused(selection):
    """Descriptors span the MAP-Elites grid only; with another selection they were accepted
    and silently ignored."""
    with pytest.raises(ValueError, match=rf"descriptors=\('a', 'b'\) span the grid of "
                                         rf"map-elites selection only; selection='{selection}'"):
        DatabaseConfig(selection=selection, descriptors=("a", "b"))


def test_the_cli_refuses_descriptors_or_bins_without_map_elites(tmp_path, capsys):
    from graded.cli import main

    base = ["search", "program", "--problem", "matmul", "--budget", "2", "--workers", "1"]
    assert main([*base, "--descriptors", "rank,time", "--out", str(tmp_path / "a")]) == 2
    assert "span the grid of map-elites selection only" in capsys.readouterr().err
    assert main([*base, "--bins", "3", "--out", str(tmp_path / "b")]) == 2
    assert ("--bins 3 sizes the grid of --selection map-elites only; --selection clusters "
            "would ignore it") in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_pareto_selection_for_a_problem_with_one_unnamed_score_is_refused():
    """With no named score every program was on the "front": parents were drawn uniformly
    from the whole island (score 0 as often as score 9, counted: 57 against 59 in 500 draws)."""
    with pytest.raises(ValueError, match=r"pareto selection compares named scores, but the "
                                         r"problem's verifier returns one number"):
        ProgramsDatabase(DatabaseConfig(islands=1, selection="pareto"), ev(0.0))
