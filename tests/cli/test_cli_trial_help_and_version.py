"""`graded --help`, each command's `--help` and `graded --version` as a terminal shows them: no
line past the terminal's width, every command named, and `--version` into a reader that went
away ending with status 141, as the commands do."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from graded.cli import build_parser, main

COMMANDS = [["train"], ["eval"], ["generate"], ["bench"], ["report"], ["demo"], ["study"],
            ["search"], ["search", "program"]]


def _help(argv: list[str], capsys) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--help"])
    assert exc.value.code == 0
    return capsys.readouterr().out


def _longest_word(line: str) -> int:
    return max((len(w) for w in line.split()), default=0)


@pytest.mark.parametrize("width", [60, 80, 100])
@pytest.mark.parametrize("argv", [[], *COMMANDS], ids=lambda a: " ".join(a) or "graded")
def test_help_fits_the_terminal_width(argv, width, capsys, monkeypatch):
    # descriptions written as one long line (graded --help, demo, study) and the config keys
    # of train --help ran to 300 characters, past the edge of any terminal
    monkeypatch.setenv("COLUMNS", str(width))
    text = _help(argv, capsys)
    usage = text.split("\n\n", 1)[0]  # argparse's own layout of the usage lines
    long = [ln for ln in text[len(usage):].splitlines()
            if len(ln) > width and len(ln) - _longest_word(ln) > 30]  # not one long word
    assert long == []


def test_wrapped_help_keeps_every_word_in_order(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")
    wide = _help(["train"], capsys)
    monkeypatch.setenv("COLUMNS", "60")
    narrow = _help(["train"], capsys)
    assert narrow.split() == wide.split()
    # a wrapped config key goes on further in than the keys of its section
    lines = narrow.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("unseen (default"))
    assert lines[i + 1].startswith(" " * (len(lines[i]) - len(lines[i].lstrip()) + 2))


def test_top_level_description_names_every_command(capsys):
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    description = parser.description
    named = {"train": "train", "eval": "evaluate", "generate": "generate", "bench": "benchmark",
             "report": "report", "demo": "demo", "study": "study", "search": "search"}
    assert set(sub.choices) == set(named)
    assert [c for c, word in named.items() if word not in description] == []


VERSION = """
import sys
from graded.cli import main
sys.exit(main(["--version"]))
"""


def test_version_into_a_reader_that_went_away_ends_with_141_quietly():
    # it ended with a BrokenPipeError traceback and status 1
    writer = subprocess.Popen([sys.executable, "-c", VERSION], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    writer.stdout.close()  # the reader is gone before the version is printed
    err = writer.stderr.read().decode()
    assert writer.wait(timeout=120) == 141
    assert err == ""
