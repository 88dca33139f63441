"""What the command line tells a new user who got something slightly wrong: a stray KEY=VALUE
after --set, a run folder that does not exist, a finished run to continue."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from cli_configs import tiny_config

from graded.cli import main

DOCS = Path(__file__).parents[2] / "docs" / "cli.md"


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("graded: error: "), err
    assert "Traceback" not in err, err
    return lines[-1]


def test_a_second_key_value_after_one_set_is_told_to_repeat_set(tmp_path, capsys):
    path = tiny_config(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["train", str(path), "--set", "train.steps=3", "train.lr=1e-3"])
    assert exc.value.code == 2
    assert _one_error_line(capsys.readouterr().err) == (
        "graded: error: unrecognized arguments: train.lr=1e-3 (each --set takes one KEY=VALUE; "
        "repeat --set for more: --set train.lr=1e-3)")
    assert not (tmp_path / "runs").exists()


def test_a_stray_argument_of_another_command_keeps_the_plain_argparse_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["eval", str(tmp_path), "extra"])
    assert exc.value.code == 2
    assert _one_error_line(capsys.readouterr().err) == (
        "graded: error: unrecognized arguments: extra")


def test_the_documented_train_synopsis_repeats_set_once_per_value():
    synopsis = next(ln for ln in DOCS.read_text().splitlines() if ln.startswith("graded train "))
    assert "[--set KEY=VALUE]..." in synopsis and "KEY=VALUE ..." not in synopsis


def test_the_hint_for_a_finished_run_is_a_command_that_continues_it(tmp_path, capsys):
    path = tiny_config(tmp_path, steps=2)
    assert main(["train", str(path)]) == 0
    run = tmp_path / "runs" / "tiny"
    capsys.readouterr()
    assert main(["train", "--resume", str(run)]) == 0
    out = capsys.readouterr().out
    hint = re.search(r"continue it with `([^`]*)`", out)
    assert hint, out
    assert hint.group(1) == f"graded train --resume {run} --set train.steps=<more>"
    argv = shlex.split(hint.group(1).replace("<more>", "3"))
    assert argv[0] == "graded"
    assert main(argv[1:]) == 0  # the hint, as printed, trains the run on to step 3
    assert "done: step 3" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    ["eval", "{run}"],
    ["generate", "{run}", "--prompt", "("],
    ["report", "{run}"],
    ["train", "--resume", "{run}"],
], ids=["eval", "generate", "report", "train --resume"])
def test_a_run_folder_that_does_not_exist_is_called_missing(tmp_path, capsys, argv):
    run = tmp_path / "nope"
    assert main([a.format(run=run) for a in argv]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert str(run) in line and "no such folder" in line, line
    assert "config.yaml" not in line and "metrics.json" not in line, line
    assert not run.exists()


@pytest.mark.parametrize("command", ["eval", "train --resume"])
def test_an_existing_folder_without_a_config_is_still_called_not_a_run(tmp_path, capsys,
                                                                       command):
    run = tmp_path / "empty"
    run.mkdir()
    assert main([*command.split(), str(run)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert str(run) in line and "no config.yaml" in line, line
