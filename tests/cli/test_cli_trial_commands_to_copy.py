"""The commands `graded` prints for the user to run next (resume a run, write a report
elsewhere) are commands a shell runs as printed, whatever the run folder is called; a folder
given where `graded train` expects a config file is named as a folder, and an empty
`--resume` is refused rather than read as no resume."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from cli_configs import tiny_config
from test_cli_runs import held_lock

from graded.cli import main


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("graded: error: "), err
    assert "Traceback" not in err, err
    return lines[-1]


def _commands(text: str) -> list[list[str]]:
    """The commands quoted in backticks in ``text``, split as a shell splits them."""
    return [shlex.split(c) for c in re.findall(r"`([^`]*)`", text)]


@pytest.fixture(scope="module")
def spaced_run(tmp_path_factory) -> Path:
    """A finished run whose folder name holds a space (``--set "name=my run"``)."""
    tmp = tmp_path_factory.mktemp("spaced")
    assert main(["train", str(tiny_config(tmp)), "--set", "name=my run"]) == 0
    return tmp / "runs" / "my run"


def test_the_hint_to_continue_a_finished_run_splits_back_into_its_folder(spaced_run, capsys):
    # it printed `graded train --resume .../my run --set ...`: a shell reads two arguments
    capsys.readouterr()
    assert main(["train", "--resume", str(spaced_run)]) == 0
    (argv,) = _commands(capsys.readouterr().out)
    assert argv == ["graded", "train", "--resume", str(spaced_run), "--set",
                    "train.steps=<more>"]


def test_the_refusal_to_replace_a_run_names_a_resume_command_a_shell_runs(spaced_run, capsys):
    config = tiny_config(spaced_run.parents[1], "again")
    assert main(["train", str(config), "--set", "name=my run"]) == 2
    argv = _commands(_one_error_line(capsys.readouterr().err))[0]
    assert argv == ["graded", "train", "--resume", str(spaced_run)]


def test_the_resume_command_after_an_interruption_is_quoted(tmp_path, monkeypatch):
    # the trainer prints it after a Ctrl-C ("resume with: ...") and keeps it for the report
    import graded.config

    given = {}
    build_run = graded.config.build_run

    def recording(*args, **kwargs):
        given.update(kwargs)
        return build_run(*args, **kwargs)

    monkeypatch.setattr(graded.config, "build_run", recording)
    assert main(["train", str(tiny_config(tmp_path)), "--set", "name=it's mine"]) == 0
    assert shlex.split(given["resume_command"]) == [
        "graded", "train", "--resume", str(tmp_path / "runs" / "it's mine")]


def test_a_report_refused_in_a_run_in_use_suggests_a_command_a_shell_runs(spaced_run, capsys):
    capsys.readouterr()
    with held_lock(spaced_run):
        assert main(["report", str(spaced_run)]) == 2
    argv = shlex.split(_one_error_line(capsys.readouterr().err).split("e.g. ", 1)[1])
    assert argv == ["graded", "report", str(spaced_run), "--out",
                    str(spaced_run.parent / "my run-report")]


def test_train_given_a_run_folder_for_config_says_how_to_continue_it(spaced_run, capsys):
    # it said "config file .../my run does not exist" of a folder that exists
    capsys.readouterr()
    assert main(["train", str(spaced_run)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"CONFIG {spaced_run} is a run folder, not a config file" in line
    resume, anew = re.findall(r"`([^`]*)`", line)
    assert shlex.split(resume) == ["graded", "train", "--resume", str(spaced_run)]
    command, placeholder = anew.split(" --set ")
    assert shlex.split(command) == ["graded", "train", str(spaced_run / "config.yaml")]
    assert placeholder == "name=<new name>"


def test_train_given_a_plain_folder_for_config_expects_a_config_file(tmp_path, capsys):
    assert main(["train", str(tmp_path)]) == 2
    assert _one_error_line(capsys.readouterr().err) == (
        f"graded: error: CONFIG {tmp_path} is a folder; expected a run config file (.yaml, "
        ".yml or .toml)")
    assert list(tmp_path.iterdir()) == []


def test_an_empty_resume_is_refused_not_read_as_a_new_run(tmp_path, capsys):
    # `graded train CONFIG --resume "$RUN"` with RUN unset trained a new run from CONFIG
    assert main(["train", str(tiny_config(tmp_path)), "--resume", ""]) == 2
    assert _one_error_line(capsys.readouterr().err) == (
        "graded: error: --resume is empty; expected a run folder of graded train")
    assert not (tmp_path / "runs").exists()
