"""`graded train --set`: a key given one value. Two values for one key, or a section given
after a key inside it, are refused naming both overrides (the last one silently won: a run
of `--set model.grading=null --set model.grading=linear` trained an LGT); a key with an empty
part (`model.=3`) is refused as malformed rather than looked up as the key ''. A run name
that YAML reads as a number or boolean (`--set name=2024`) is told to quote it."""

from __future__ import annotations

import pytest
from cli_configs import tiny_config

from graded.cli import main
from graded.config import load_config


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_a_key_given_two_values_is_refused_naming_both(tmp_path, capsys):
    config = tiny_config(tmp_path)
    assert main(["train", str(config), "--set", "model.grading=null",
                 "--set", "model.grading=linear"]) == 2
    assert _one_error_line(capsys.readouterr().err) == (
        "graded: error: --set 'model.grading=null' and --set 'model.grading=linear' give "
        "model.grading two values; give it once")
    assert not (tmp_path / "runs").exists()  # refused before anything is written


def test_a_section_given_after_a_key_inside_it_is_refused(tmp_path, capsys):
    config = tiny_config(tmp_path)
    assert main(["train", str(config), "--set", "train.early_stopping.patience=3",
                 "--set", "train.early_stopping=null"]) == 2
    assert _one_error_line(capsys.readouterr().err) == (
        "graded: error: --set 'train.early_stopping=null' replaces the section "
        "train.early_stopping, which --set 'train.early_stopping.patience=3' set a key of "
        "before; give the section first, then the keys inside it")


@pytest.mark.parametrize("key", ["model.", "train..lr", ".seed"])
def test_a_key_with_an_empty_part_is_refused_as_malformed(tmp_path, capsys, key):
    assert main(["train", str(tiny_config(tmp_path)), "--set", f"{key}=3"]) == 2
    assert _one_error_line(capsys.readouterr().err) == (
        f"graded: error: --set '{key}=3': the key '{key}' has an empty part; expected names "
        "joined by single dots, e.g. train.lr=3e-4")


def test_a_section_then_a_key_inside_it_and_a_repeated_equal_value_are_taken(tmp_path):
    cfg = load_config(tiny_config(tmp_path), [
        "train.early_stopping={patience: 2}", "train.early_stopping.min_delta=0.5",
        "model.grading=linear", "recipe=auto", "recipe.options.graded_loss=false",
        "train.steps=5", "train.steps=5"])
    assert (cfg.train.early_stopping.patience, cfg.train.early_stopping.min_delta) == (2, 0.5)
    assert cfg.recipe.name == "auto" and cfg.recipe.options == {"graded_loss": False}
    assert cfg.train.steps == 5


@pytest.mark.parametrize(("value", "got", "quoted"), [
    ("2024", "2024 (a number", "'2024'"), ("yes", "True (a boolean", "'...'")])
def test_a_name_read_as_a_number_or_boolean_is_told_to_quote_it(tmp_path, capsys, value, got,
                                                                 quoted):
    # was `name: got 2024; Input should be a valid string`, which says nothing of quoting
    assert main(["train", str(tiny_config(tmp_path)), "--set", f"name={value}"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"  name: got {got}: the value is not quoted); expected text: quote it, e.g. "
        f"--set \"name={quoted}\"")


def test_a_quoted_number_is_a_run_name(tmp_path):
    assert load_config(tiny_config(tmp_path), ["name='2024'"]).run_dir().name == "2024"
