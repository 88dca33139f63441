"""``graded bench`` treats names alike whether it lists or runs them: ``--list NAME ...`` lists
the named benchmarks only, an unknown name is refused by name either way, a name given twice
counts once, and ``--args`` where nothing runs is refused. The benchmarks are scripts of a
``benchmarks/`` folder in the working directory, made here: each appends its name and
arguments to a log, so what ran is read back independently of the command's output."""

from __future__ import annotations

from pathlib import Path

import pytest

from graded.cli import main

SCRIPT = ("import sys\nfrom pathlib import Path\n"
          "with (Path(__file__).parent / 'ran.log').open('a') as fh:\n"
          "    fh.write(' '.join([Path(__file__).stem, *sys.argv[1:]]) + '\\n')\n"
          "sys.exit({code})\n")


@pytest.fixture
def bench(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    for name, code in [("alpha", 0), ("beta", 0), ("gamma", 0), ("broken", 3)]:
        (folder / f"{name}.py").write_text(SCRIPT.format(code=code))
    (folder / "_helper.py").write_text("")
    monkeypatch.chdir(tmp_path)
    return folder


def _ran(folder: Path) -> list[str]:
    log = folder / "ran.log"
    return log.read_text().splitlines() if log.exists() else []


def _listed(out: str) -> list[str]:
    return [line.strip() for line in out.splitlines()[1:]]


def test_list_with_names_lists_only_those_and_runs_nothing(bench, capsys):
    assert main(["bench", "--list", "gamma", "alpha"]) == 0
    assert _listed(capsys.readouterr().out) == ["gamma", "alpha"]
    assert _ran(bench) == []


def test_without_names_every_benchmark_is_listed(bench, capsys):
    for argv in (["bench"], ["bench", "--list"]):
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert out.splitlines()[0] == f"benchmarks in {bench}"
        assert _listed(out) == ["alpha", "beta", "broken", "gamma"]


@pytest.mark.parametrize("listing", [True, False])
def test_an_unknown_name_is_refused_by_name_listed_or_run(bench, capsys, listing):
    argv = ["bench", *(["--list"] if listing else []), "alpha", "nosuch", "other"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err == ("graded: error: unknown benchmarks nosuch, other; available: "
                            "alpha, beta, broken, gamma\n")
    assert captured.out == ""
    assert _ran(bench) == []


def test_a_file_name_is_told_that_names_are_file_stems(bench, capsys):
    assert main(["bench", "benchmarks/beta.py"]) == 2
    assert "unknown benchmark benchmarks/beta.py (names are file stems: beta)" \
        in capsys.readouterr().err


def test_a_name_given_twice_runs_once_in_the_order_named(bench):
    assert main(["bench", "gamma", "alpha", "gamma", "--args", "-x", "1"]) == 0
    assert _ran(bench) == ["gamma -x 1", "alpha -x 1"]


def test_the_first_failing_benchmark_ends_the_command_with_its_status(bench, capsys):
    assert main(["bench", "alpha", "broken", "beta"]) == 3
    assert _ran(bench) == ["alpha", "broken"]
    assert capsys.readouterr().err == ("graded: error: benchmark broken exited with status 3; "
                                       "not run: beta\n")


@pytest.mark.parametrize("argv", [["bench", "--list", "--args", "-x"],
                                  ["bench", "--list", "alpha", "--args", "-x"],
                                  ["bench", "--args", "-x"]])
def test_args_where_nothing_runs_are_refused(bench, capsys, argv):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("graded: error: --args -x passes arguments to the "
                                   "benchmarks run, and listing runs none")
    assert captured.out == "" and _ran(bench) == []


def test_a_benchmark_a_signal_ends_gives_the_shells_status_and_names_those_not_run(bench,
                                                                                  capsys):
    (bench / "killed.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n")
    assert main(["bench", "alpha", "killed", "beta", "gamma"]) == 128 + 15
    assert capsys.readouterr().err == ("graded: error: benchmark killed was ended by signal "
                                       "SIGTERM; not run: beta, gamma\n")
    assert _ran(bench) == ["alpha"]
