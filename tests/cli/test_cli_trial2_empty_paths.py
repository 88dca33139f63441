"""A path argument given empty (`graded report "$RUN"` with RUN unset) is refused, naming the
argument, rather than read as the current folder: `graded report ""` in a folder of runs
reported them all into ./report, and `graded eval ""` evaluated the run in the current
folder, if it was one."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_configs import tiny_config

from graded.cli import main


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("empty_paths")
    assert main(["train", str(tiny_config(tmp))]) == 0
    return tmp / "runs"


def _usage_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def test_report_of_an_empty_run_argument_writes_no_report_of_the_current_folder(
        runs, monkeypatch, capsys):
    monkeypatch.chdir(runs)  # a folder holding a finished run: "" read as "." reported it
    assert _usage_error(capsys, ["report", ""]).endswith(
        "error: argument runs: expected a path, got ''")
    assert not (runs / "report").exists()


@pytest.mark.parametrize("argv", [
    ["eval", "RUN", "--out", ""], ["report", "RUN", "--out", "  "], ["eval", ""],
    ["generate", "", "--prompt", "("], ["train", ""]])
def test_an_empty_path_argument_is_refused_naming_it(runs, monkeypatch, capsys, argv):
    monkeypatch.chdir(runs / "tiny")  # "" read as "." was this run folder
    argv = [str(runs / "tiny") if a == "RUN" else a for a in argv]
    name = "--out" if "--out" in argv else {"train": "config", "report": "runs"}.get(argv[0],
                                                                                   "run")
    given = argv[argv.index("--out") + 1] if "--out" in argv else ""
    assert _usage_error(capsys, argv).endswith(
        f"error: argument {name}: expected a path, got {given!r}")
    assert not (runs / "tiny" / "eval.json").exists()
    assert not (runs / "tiny" / "report").exists()


@pytest.mark.parametrize("command", [["demo"], ["study"], ["search", "patternboost"],
                                     ["search", "program"]])
def test_an_empty_out_of_the_other_commands_is_refused(command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # "" read as "." would have written the run here
    assert _usage_error(capsys, [*command, "--out", ""]).endswith(
        "error: argument --out: expected a path, got ''")
    assert list(tmp_path.iterdir()) == []
