"""The commands whose work is done elsewhere: ``graded bench`` (the scripts of ``benchmarks/``),
``graded demo`` (:mod:`graded.demo`) and ``graded search`` (the command lines of
:mod:`graded.search`)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from graded.cli.command import EXIT_INTERRUPTED, _fail


def _benchmarks_dir() -> Path:
    for base in (Path.cwd(), Path(__file__).resolve().parents[3]):
        if (base / "benchmarks").is_dir():
            return base / "benchmarks"
    raise FileNotFoundError("no benchmarks/ folder here or in the source checkout")


def cmd_bench(args: argparse.Namespace) -> int:
    try:
        folder = _benchmarks_dir()
    except FileNotFoundError as exc:
        return _fail(str(exc))
    available = sorted(p.stem for p in folder.glob("*.py") if not p.name.startswith("_"))
    if args.list or not args.names:
        print("benchmarks in", folder)
        for name in available:
            print(" ", name)
        return 0
    unknown = [n for n in args.names if n not in available]
    if unknown:
        return _fail(f"unknown benchmark(s) {unknown}; available: {available}")
    for name in args.names:
        print(f"== {name}", flush=True)
        code = subprocess.call([sys.executable, str(folder / f"{name}.py"), *args.args])
        if code:
            return code
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from graded.demo import DemoInterrupted, run_demo

    try:
        report = run_demo(out_dir=Path(args.out), seeds=args.seeds, quick=args.quick,
                          workers=args.workers)
    except DemoInterrupted as exc:
        print(f"graded demo: {exc}; their run folders are under {args.out}/<task>/; "
              "run `graded demo` again for the report", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"report: {report}")
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    func = getattr(args, "func", None)
    if func is None:
        return _fail("choose a search method, e.g. `graded search patternboost --help`")
    return int(func(args) or 0)
