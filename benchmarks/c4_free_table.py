"""4-cycle-free graphs: PatternBoost and local-only results against ex(n; C4) (OEIS A006855).

For each n, PatternBoost runs until it reaches the published maximum or its round/time limit;
the local-only baseline then gets the same number of local-search calls. Prints a Markdown
table (and writes it to --table if given).

    nice -n 10 python benchmarks/c4_free_table.py --n-max 20 --workers 2 \
        --rounds 12 --time-limit 300 --table runs/c4_free_table.md

`--quick` checks the script on n = 4..7 in seconds.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from graded.search.patternboost import C4_FREE_MAXIMA, PatternBoostConfig, run_patternboost
from graded.search.patternboost.parallel import make_executor


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n-min", type=int, default=None, help="smallest n (default 4)")
    p.add_argument("--n-max", type=int, default=None,
                   help="largest n, at most 20 (default 20; 7 with --quick)")
    p.add_argument("--rounds", type=int, default=12, help="PatternBoost rounds per n (default 12)")
    p.add_argument("--time-limit", type=float, default=300.0,
                   help="PatternBoost seconds of round work per n (default 300)")
    p.add_argument("--workers", type=int, default=2, help="local-search processes (default 2)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--out", type=Path, default=Path("runs/bench_c4_free"),
                   help="folder for the runs (replaced)")
    p.add_argument("--table", type=Path, default=None, help="also write the table here")
    p.add_argument("--quick", action="store_true",
                   help="tiny budgets, n = 4..7 unless --n-min / --n-max say otherwise")
    args = p.parse_args()
    n_min = 4 if args.n_min is None else args.n_min
    n_max = (7 if args.quick else 20) if args.n_max is None else args.n_max
    if n_max > max(C4_FREE_MAXIMA):
        raise SystemExit(f"--n-max must be <= {max(C4_FREE_MAXIMA)}, got {n_max}")
    if not 2 <= n_min <= n_max:  # a graph problem needs 2 vertices
        raise SystemExit(f"--n-min must be in [2, --n-max={n_max}], got {n_min}")

    sizes = range(n_min, n_max + 1)
    common = dict(problem="c4-free", problem_options={"bits_per_token": 4},
                  workers=args.workers, seed=args.seed, progress=not args.quick)
    if args.quick:
        common.update(initial=50, keep=20, database_size=100, samples=50, train_steps=20,
                      batch_size=16, model={"d_model": 16, "n_heads": 2, "n_layers": 1,
                                            "d_ff": 32})
    shutil.rmtree(args.out, ignore_errors=True)

    lines = [
        "| n | ex(n; C4) (A006855) | PatternBoost | rounds | local-search calls | "
        "local-only, same calls | PatternBoost wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    executor = make_executor(args.workers)  # one pool for every run
    for n in sizes:
        target = C4_FREE_MAXIMA[n]
        started = time.perf_counter()
        pb = run_patternboost(
            PatternBoostConfig(**common, n=n, rounds=1 if args.quick else args.rounds,
                               time_limit_s=args.time_limit, stop_at=target),
            args.out / f"n{n:02d}-patternboost", executor=executor)
        wall = time.perf_counter() - started
        if pb.interrupted:  # Ctrl-C or SIGTERM (a timeout): the rows so far, no baseline on a
            # pool the signal reached too; the runs' folders resume
            if executor is not None:
                executor.shutdown(wait=False, cancel_futures=True)
            print("\n".join(lines))
            raise SystemExit(f"interrupted at n = {n}: the table above holds the sizes before it")
        calls = pb.metrics[-1]["local_search_calls"]
        local = run_patternboost(
            PatternBoostConfig(**common, n=n, mode="local-only", rounds=10**6,
                               max_local_search_calls=calls),
            args.out / f"n{n:02d}-local-only", executor=executor)
        lines.append(f"| {n} | {target} | {pb.best_score:g} | {pb.rounds_done} | {calls} | "
                     f"{local.best_score:g} | {wall:.0f} |")
        print(lines[-1], flush=True)
    if executor is not None:
        executor.shutdown()
    table = "\n".join(lines)
    print("\n" + table)
    if args.table is not None:
        args.table.parent.mkdir(parents=True, exist_ok=True)
        args.table.write_text(table + "\n")


if __name__ == "__main__":
    main()
