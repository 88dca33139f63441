"""`graded search patternboost` ends with one line naming the best score and the rounds it took:
"after 1 round", not "after 1 rounds" (a run of `rounds: 1`, or one stopped at its optimum
after the first round)."""

import argparse

import pytest

from graded.search.patternboost.cli import add_cli


def run(tmp_path, capsys, rounds: int) -> str:
    root = argparse.ArgumentParser(prog="graded search")
    add_cli(root.add_subparsers(dest="command"))
    args = root.parse_args(
        ["patternboost", "--problem", "triangle-free", "--n", "5", "--rounds", str(rounds),
         "--initial", "8", "--samples", "4", "--keep", "4", "--train-steps", "1",
         "--batch-size", "4", "--d-model", "8", "--n-heads", "2", "--n-layers", "1",
         "--d-ff", "8", "--no-progress", "--out", str(tmp_path / "run")])
    assert args.func(args) == 0
    return capsys.readouterr().out.splitlines()[0]


@pytest.mark.parametrize("rounds, words", [(0, "after 0 rounds;"), (1, "after 1 round;"),
                                           (2, "after 2 rounds;")])
def test_the_summary_line_counts_rounds_in_the_right_number(tmp_path, capsys, rounds, words):
    line = run(tmp_path, capsys, rounds)
    assert line.startswith("patternboost triangle-free n=5: best score 6 (known optimum 6) ")
    assert words in line, line
