"""docs/program_search.md: the commands at the top of the page run one after another.

Each `graded search program` command without `--resume` starts a run, and a folder that
already holds a run is refused (`--out ... already holds a program search run; add
--resume`). Without `--out` the folder is `runs/program/<problem>-seed<seed>`, so two commands
for the same problem and seed share it: the page once listed two matmul searches without
`--out`, and the second was refused. Here every command of that block is parsed by the
command's own parser, its folder worked out as the command does, and the folders compared.
"""

import argparse
import re
import shlex
from pathlib import Path

from graded.search.program.cli import add_cli

DOC = Path(__file__).resolve().parents[2] / "docs" / "program_search.md"


def commands(text: str) -> list[list[str]]:
    """The `graded search program` lines of the page's first bash block, continuations joined,
    as argument lists after `graded search program`."""
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1).replace("\\\n", " ")
    prefix = ["graded", "search", "program"]
    lines = [shlex.split(line) for line in block.splitlines() if line.strip()]
    assert all(line[:3] == prefix for line in lines), lines
    return [line[3:] for line in lines]


def run_folder(args: argparse.Namespace) -> Path:
    """The folder the command writes: --out, or runs/program/<problem>-seed<seed>."""
    return args.out or Path("runs/program") / f"{args.problem}-seed{args.seed}"


def folders_in_order(text: str) -> list[tuple[Path, bool]]:
    parser = argparse.ArgumentParser(prog="graded search")
    add_cli(parser.add_subparsers(dest="command"))
    parsed = [parser.parse_args(["program", *argv]) for argv in commands(text)]
    return [(run_folder(args), args.resume) for args in parsed]


def clashes(text: str) -> list[str]:
    """Commands that would find their folder taken (a new run) or empty (a resume)."""
    started: set[Path] = set()
    problems = []
    for folder, resume in folders_in_order(text):
        if resume and folder not in started:
            problems.append(f"--resume of {folder}, which no earlier command started")
        elif not resume and folder in started:
            problems.append(f"a new run in {folder}, which an earlier command holds")
        started.add(folder)
    return problems


def test_the_pages_program_search_commands_each_start_a_run_in_a_folder_of_its_own():
    text = DOC.read_text(encoding="utf-8")
    assert len(commands(text)) >= 6
    assert clashes(text) == []


def test_the_check_finds_two_new_runs_in_one_default_folder():
    text = ("```bash\ngraded search program --problem matmul --budget 4\n"
            "graded search program --problem matmul --selection pareto --budget 4\n```\n")
    assert clashes(text) == ["a new run in runs/program/matmul-seed0, which an earlier command "
                             "holds"]
