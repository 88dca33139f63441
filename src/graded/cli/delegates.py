"""The commands whose work is done elsewhere: ``graded bench`` (the scripts of ``benchmarks/``),
``graded demo`` (:mod:`graded.demo`) and ``graded search`` (the command lines of
:mod:`graded.search`)."""

from __future__ import annotations

import argparse
import signal
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
    """Run the named scripts of ``benchmarks/`` in turn (the first that fails ends the command
    with its status, 128 + N for a script that signal N ended, naming those not run), or list
    them: all without names, the named ones with ``--list``. An
    unknown name is refused by name, listed or run alike; so is ``--args`` where nothing
    runs."""
    try:
        folder = _benchmarks_dir()
    except FileNotFoundError as exc:
        return _fail(str(exc))
    available = sorted(p.stem for p in folder.glob("*.py") if not p.name.startswith("_"))
    names = list(dict.fromkeys(args.names))  # a name given twice runs (or is listed) once
    unknown = [n for n in names if n not in available]
    if unknown:
        stems = [Path(n).stem for n in unknown if n.endswith(".py") and Path(n).stem in available]
        hint = f" (names are file stems: {', '.join(stems)})" if stems else ""
        return _fail(f"unknown benchmark{'s' if len(unknown) > 1 else ''} "
                     f"{', '.join(unknown)}{hint}; available: {', '.join(available) or 'none'}")
    listing = args.list or not names
    if args.args and listing:
        return _fail(f"--args {' '.join(args.args)} passes arguments to the benchmarks run, "
                     "and listing runs none; expected benchmark names without --list "
                     "(graded bench NAME ... --args ...)")
    if listing:
        print("benchmarks in", folder)
        for name in names or available:
            print(" ", name)
        return 0
    for i, name in enumerate(names):
        print(f"== {name}", flush=True)
        code = subprocess.call([sys.executable, str(folder / f"{name}.py"), *args.args])
        if code:
            how = (f"was ended by signal {_signal_name(-code)}" if code < 0 else
                   f"exited with status {code}")
            rest = f"; not run: {', '.join(names[i + 1:])}" if names[i + 1:] else ""
            # a shell's status for a process a signal ended: 128 + the signal's number
            return _fail(f"benchmark {name} {how}{rest}", 128 - code if code < 0 else code)
    return 0


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


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
    if func is None:  # the methods this installation has (PatternBoost's may be missing)
        methods = getattr(args, "search_methods", [])
        return _fail(f"choose a search method: {', '.join(methods) or 'none is installed'} "
                     "(`graded search METHOD --help` explains one)")
    return int(func(args) or 0)
