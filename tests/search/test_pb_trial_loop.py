"""PatternBoost used as a researcher uses it: config files, resumed runs and their run folder."""

import csv
import json

import numpy as np
import pytest
import yaml
from pb_brute import pattern_occurrences_by_loops, permanent_by_permutations

import graded.search.patternboost.engine as engine
from graded.search.patternboost import PatternBoostConfig, problem_from_size, run_patternboost


def _small(**fields) -> PatternBoostConfig:
    base = dict(problem="c4-free", n=5, mode="local-only", initial=8, samples=8, keep=4,
                database_size=16, rounds=2, progress=False)
    return PatternBoostConfig(**{**base, **fields})


@pytest.mark.parametrize("text, pattern",
                         [("pattern: 123", (1, 2, 3)), ("pattern: 312", (3, 1, 2))])
def test_unquoted_pattern_in_a_yaml_config_is_the_pattern_of_its_digits(text, pattern):
    # YAML (and JSON) read `pattern: 123` as the int 123; it was refused as "not a permutation
    # of 1, 2, 3"
    options = yaml.safe_load(text)
    config = PatternBoostConfig(problem="permanent", n=4, problem_options=options)
    config.check_runnable()
    problem = problem_from_size(config.problem, config.n, **config.problem_options)
    assert problem.pattern == pattern
    rng = np.random.default_rng(5)
    for _ in range(20):
        a = (rng.random((4, 4)) < 0.5).astype(np.uint8)
        occurrences = pattern_occurrences_by_loops(a, pattern)
        expected = permanent_by_permutations(a) if occurrences == 0 else -occurrences
        assert problem.score(a) == expected


def test_resumed_finished_run_rewrites_the_metrics_csv_an_interrupt_left_a_round_behind(
        tmp_path, monkeypatch):
    config = _small()
    write_csv = engine.write_csv

    def interrupted_after_state(path, rows):  # Ctrl-C between state.json and metrics.csv
        if len(rows) == config.rounds + 1:
            raise KeyboardInterrupt
        write_csv(path, rows)

    monkeypatch.setattr(engine, "write_csv", interrupted_after_state)
    assert run_patternboost(config, tmp_path).interrupted
    monkeypatch.setattr(engine, "write_csv", write_csv)
    result = run_patternboost(config, tmp_path)  # finished already: no round to run
    assert not result.interrupted and result.rounds_done == config.rounds
    state = json.loads((tmp_path / "state.json").read_text())
    with open(tmp_path / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["round"]) for r in rows] == [m["round"] for m in state["metrics"]] == [0, 1, 2]
    assert [float(r["best"]) for r in rows] == [m["best"] for m in state["metrics"]]


def test_resume_accepts_problem_options_spelled_at_their_defaults(tmp_path):
    # the defaults written out (bits_per_token 4, pattern 312 as a list) are the same problem:
    # the run resumes and ends as the uninterrupted run with the options left out
    fields = dict(problem="permanent", n=3)
    straight = run_patternboost(_small(**fields), tmp_path / "straight")
    expected = json.loads((tmp_path / "straight" / "state.json").read_text())["database"]
    run_patternboost(_small(rounds=0, **fields), tmp_path / "resumed")
    options = {"bits_per_token": 4, "pattern": [3, 1, 2]}
    resumed = run_patternboost(_small(problem_options=options, **fields), tmp_path / "resumed")
    assert resumed.rounds_done == straight.rounds_done == 2
    assert json.loads((tmp_path / "resumed" / "state.json").read_text())["database"] == expected


def test_resume_still_refuses_a_problem_option_that_changes_the_problem(tmp_path):
    fields = dict(problem="permanent", n=3)
    run_patternboost(_small(rounds=0, **fields), tmp_path)
    with pytest.raises(ValueError, match=r"problem_options.*'pattern': '123'"):
        run_patternboost(_small(problem_options={"pattern": "123"}, **fields), tmp_path)


def test_a_changed_size_is_named_alone_not_as_a_changed_problem_option():
    permanent = dict(problem="permanent", problem_options={"pattern": "312"})
    assert _small(n=4, **permanent).differs_from(_small(n=5, **permanent)) == ["n"]
    assert _small(problem="hypercube", n=3).differs_from(_small(problem="hypercube", n=4)) == ["n"]
    assert _small(problem="permanent", n=3).differs_from(
        _small(problem="permanent", n=3, problem_options={"pattern": 123})) == ["problem_options"]
