"""`graded search patternboost`: options reach the config, --help documents them, a run works."""

import argparse
import json

import pytest

from graded.search.patternboost.cli import add_cli, build_config, run_cli


def parser():
    root = argparse.ArgumentParser(prog="graded search")
    add_cli(root.add_subparsers(dest="command"))
    return root


def test_every_option_is_documented_in_help():
    sub = parser()._subparsers._group_actions[0].choices["patternboost"]
    for action in sub._actions:
        if action.dest != "help":
            assert action.help, f"option {action.option_strings} has no help text"


def test_options_override_config_file_and_defaults(tmp_path):
    cfg_file = tmp_path / "pb.json"
    cfg_file.write_text(json.dumps({"rounds": 7, "keep": 30, "model": {"d_model": 32}}))
    args = parser().parse_args(
        ["patternboost", "--problem", "permanent", "--n", "5", "--pattern", "123",
         "--config", str(cfg_file), "--keep", "40", "--n-layers", "3", "--time-limit", "60"])
    config = build_config(args)
    assert (config.problem, config.n, config.rounds, config.keep) == ("permanent", 5, 7, 40)
    assert config.model == {"d_model": 32, "n_layers": 3}
    assert config.problem_options == {"pattern": "123"}
    assert config.time_limit_s == 60.0
    assert args.func is run_cli


def test_stop_at_optimum_uses_the_known_optimum():
    args = parser().parse_args(["patternboost", "--n", "20", "--stop-at-optimum"])
    assert build_config(args).stop_at == 100.0  # Mantel: ⌊20²/4⌋
    args = parser().parse_args(["patternboost", "--problem", "hypercube", "--n", "4",
                                "--stop-at-optimum"])
    with pytest.raises(ValueError, match="no known optimum"):
        build_config(args)


def test_cli_runs_local_only_baseline_and_reports(tmp_path, capsys):
    out = tmp_path / "run"
    args = parser().parse_args(
        ["patternboost", "--problem", "c4-free", "--n", "6", "--mode", "local-only",
         "--rounds", "1", "--initial", "30", "--samples", "30", "--keep", "10",
         "--database-size", "50", "--out", str(out), "--no-progress"])
    assert run_cli(args) == 0
    text = capsys.readouterr().out
    assert "best score 7" in text and "known optimum 7" in text  # A006855(6) = 7
    assert (out / "metrics.csv").exists() and (out / "metrics.png").exists()


def test_the_add_a_problem_example_in_the_docs_runs(tmp_path):
    from pathlib import Path

    from graded.search.patternboost import PatternBoostConfig, problems, run_patternboost

    doc = (Path(__file__).parents[2] / "docs" / "patternboost.md").read_text()
    section = doc.split("## Adding a problem", 1)[1]
    code = section.split("```python", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(code, "docs/patternboost.md", "exec"), namespace)
    try:
        config = PatternBoostConfig(problem="independent-cycle", n=9, mode="local-only",
                                    rounds=1, initial=20, samples=20, keep=5,
                                    database_size=20, progress=False)
        result = run_patternboost(config, tmp_path)
        assert result.best_score == 4.0  # α(C_9) = ⌊9/2⌋
        assert result.problem.is_valid(result.best_object)
    finally:
        problems._REGISTRY.pop("independent-cycle", None)


def test_module_entry_point_shows_help(capsys):
    from graded.search.patternboost.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "python -m graded.search.patternboost" in capsys.readouterr().out


def test_an_option_the_problem_does_not_take_is_a_one_line_error_naming_it(tmp_path, capsys):
    # --pattern belongs to the permanent problem; elsewhere it used to end in a TypeError
    # traceback from the problem's constructor, after the run folder had been written
    from graded.cli import main

    out = tmp_path / "run"
    assert main(["search", "patternboost", "--problem", "hypercube", "--n", "3", "--pattern",
                 "123", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "problem_options={'pattern': '123'} is invalid" in err
    assert "options of problem 'hypercube', not 'pattern'; allowed keys: bits_per_token" in err
    assert not out.exists()


@pytest.mark.parametrize("pattern", ["abc", "1,2,3", "1234", "113"])
def test_a_bad_pattern_names_the_value_and_what_is_expected(pattern):
    from graded.search.patternboost.permanent import PatternAvoidingPermanent

    with pytest.raises(ValueError, match=f"permutation of 1, 2, 3.*got '{pattern}'"):
        PatternAvoidingPermanent(3, pattern=pattern)


def test_ctrl_c_in_the_initial_round_exits_130_with_the_resume_hint(tmp_path, monkeypatch, capsys):
    # no object exists yet: decoding the empty best tokens failed ("wrong length"), so the
    # command ended in an error instead of the interrupted exit and its hint
    import graded.search.patternboost.engine as engine

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(engine, "run_local_searches", interrupt)
    args = parser().parse_args(
        ["patternboost", "--n", "5", "--mode", "local-only", "--initial", "4", "--keep", "2",
         "--database-size", "4", "--samples", "2", "--rounds", "1", "--no-progress",
         "--out", str(tmp_path / "run")])
    assert run_cli(args) == 130
    out = capsys.readouterr().out
    assert "local-only triangle-free n=5: no valid object yet (known optimum 6)" in out
    assert "interrupted: rerun the same command to resume" in out
    assert not (tmp_path / "run" / "state.json").exists()  # nothing finished: a fresh start
