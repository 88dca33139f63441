"""The ``graded study`` subcommand: its arguments and handler (the logic is in
:mod:`graded.study.runner`)."""

from __future__ import annotations

import argparse

__all__ = ["add_study_parser", "cmd_study"]

from graded.cli.parser import path_argument


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def add_study_parser(sub: argparse._SubParsersAction, formatter: type) -> None:
    """Add ``study`` to the ``graded`` subcommands."""
    p = sub.add_parser(
        "study", help="the claims study: measure what the papers claim (report + figures)",
        formatter_class=formatter,
        description="Run the study's experiments (E1 sample efficiency ... E9 numerical checks) "
        "and write OUT/report.md, OUT/results.json and PNG figures: one row per claim with its "
        "estimate, 95% interval and verdict. Finished experiments are stored in OUT and "
        "not rerun; see docs/study.md.")
    p.add_argument("--quick", action="store_true",
                   help="tiny budgets: a smoke test of every experiment (about 1.5 minutes on 2 "
                   "cores, at most 6)")
    p.add_argument("--only", default=None, metavar="E1,E3",
                   help="comma-separated experiments to run (default: all)")
    p.add_argument("--seeds", type=_positive_int, default=None,
                   help="seeds per comparison (default: 2 with --quick, 5 otherwise; E1 uses "
                   "10 at n <= 400 unless given)")
    p.add_argument("--workers", type=_positive_int, default=2,
                   help="worker processes (1 = everything in this process)")
    p.add_argument("--out", type=path_argument, default="runs/study", help="output folder")
    p.set_defaults(handler=cmd_study)


def cmd_study(args: argparse.Namespace) -> int:
    """Run the study and print the report's path. The exit status is 1 when an experiment of
    this call failed (the report names it and says "not measured" for its claims), so that a
    script or ``make demo`` does not take a study with a crashed experiment for a good one."""
    from graded.cli.command import _fail
    from graded.study.runner import execute_study

    run = execute_study(args.out, quick=args.quick, only=args.only, seeds=args.seeds,
                        workers=args.workers)
    print(f"report: {run.report}")
    if run.failed:
        return _fail(f"experiment{'s' if len(run.failed) > 1 else ''} {', '.join(run.failed)} "
                     f"failed (see the tracebacks above and {run.report}); the others' results "
                     "are stored, and the same command reruns what failed", code=1)
    return 0
