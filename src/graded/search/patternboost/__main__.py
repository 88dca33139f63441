"""`python -m graded.search.patternboost [options]`: the same as `graded search patternboost`."""

import argparse
import sys

from .cli import add_cli


def main(argv: list[str] | None = None) -> int:
    root = argparse.ArgumentParser()
    add_cli(root.add_subparsers(dest="command", required=True)).prog = (
        "python -m graded.search.patternboost")
    args = root.parse_args(["patternboost", *(sys.argv[1:] if argv is None else argv)])
    from graded.cli import run_command  # errors in one line, as `graded search patternboost`

    return run_command(args.func, args, prog="python -m graded.search.patternboost")


if __name__ == "__main__":
    sys.exit(main())
