"""`graded search patternboost` with config files a user gets wrong: a section that is not a
mapping, and a run folder whose saved config.json no longer loads, are one-line errors naming
the field or the file."""

import json

import pytest

from graded.cli import main

SMALL = ["--n", "5", "--mode", "local-only", "--rounds", "0", "--initial", "4", "--keep", "2",
         "--database-size", "4", "--samples", "4", "--no-progress"]


@pytest.mark.parametrize("text, named", [
    ("model: 64\n", "PatternBoostConfig.model=64 is invalid: expected a dict of "
                    "TransformerConfig fields"),
    ("problem_options: abc\n", "PatternBoostConfig.problem_options='abc' is invalid: expected "
                               "a valid dictionary"),
    ("problem_options: [4]\n", "PatternBoostConfig.problem_options=[4] is invalid"),
])
def test_a_config_file_section_that_is_not_a_mapping_is_refused_naming_it(tmp_path, capsys,
                                                                         text, named):
    # `model: 64` ended in a TypeError traceback ("'int' object is not iterable"),
    # `problem_options: abc` in "dictionary update sequence element #0 has length 1"
    config = tmp_path / "pb.yaml"
    config.write_text(text)
    out = tmp_path / "run"
    assert main(["search", "patternboost", "--config", str(config), "--d-model", "32",
                 "--bits-per-token", "2", "--out", str(out), *SMALL]) == 2
    assert named in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("saved, named", [
    ([1], "PatternBoostConfig.from_dict expects a dict, got list"),
    ({"keep": 0}, "PatternBoostConfig.keep=0 is invalid: expected a positive integer"),
    ({"problem": "test-not-registered"}, "PatternBoostConfig.problem='test-not-registered' "
                                         "is invalid"),
])
def test_a_saved_config_that_does_not_load_is_refused_naming_the_file(tmp_path, capsys,
                                                                      monkeypatch, saved,
                                                                      named):
    # the saved file's error read as if the command were wrong ("keep=0 is invalid" for a
    # command giving --keep 2), and a list was a TypeError traceback
    import graded.search.patternboost.engine as engine

    monkeypatch.setattr(engine, "plot_metrics", lambda *args, **kwargs: None)  # not checked
    out = tmp_path / "run"
    assert main(["search", "patternboost", "--out", str(out), *SMALL]) == 0
    config = json.loads((out / "config.json").read_text())
    edited = [1] if isinstance(saved, list) else {**config, **saved}
    (out / "config.json").write_text(json.dumps(edited))
    state = (out / "state.json").read_text()
    capsys.readouterr()
    assert main(["search", "patternboost", "--out", str(out), *SMALL]) == 2
    err = capsys.readouterr().err
    assert f"{out / 'config.json'} does not hold a config of a PatternBoost run" in err
    assert named in err
    assert json.loads((out / "config.json").read_text()) == edited
    assert (out / "state.json").read_text() == state


def test_a_yaml_config_reads_exponent_floats_as_numbers(tmp_path):
    # PyYAML's safe_load reads 1e-3 as the string '1e-3': "lr='1e-3' is invalid"
    import argparse

    from graded.search.patternboost.cli import add_cli, build_config

    config = tmp_path / "pb.yaml"
    config.write_text("lr: 1e-3\nweight_decay: 5e-2\ntemperature: 1.5e+0\n")
    root = argparse.ArgumentParser()
    add_cli(root.add_subparsers())
    built = build_config(root.parse_args(["patternboost", "--config", str(config)]))
    assert (built.lr, built.weight_decay, built.temperature) == (0.001, 0.05, 1.5)


@pytest.mark.parametrize("name, text, named", [
    ("pb.yaml", "rounds: [1\n", "while parsing a flow sequence: expected ',' or ']', but got "
                                "'<stream end>' (line 2, column 1)"),
    ("pb.yaml", "rounds: 0\nrounds: 3\n", "the key 'rounds' is given twice"),
    ("pb.json", '{"rounds": 0,}', "Expecting property name enclosed in double quotes: line 1 "
                                  "column 14"),
])
def test_a_config_file_that_does_not_parse_is_a_one_line_error_naming_it(tmp_path, capsys,
                                                                        name, text, named):
    # a YAML syntax error was a yaml.parser.ParserError traceback, a key given twice took the
    # second value, and the JSON error did not name the file
    config = tmp_path / name
    config.write_text(text)
    out = tmp_path / "run"
    assert main(["search", "patternboost", "--config", str(config), "--out", str(out),
                 *SMALL]) == 2
    err = capsys.readouterr().err
    assert f"--config {config} does not parse (" in err and named in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
