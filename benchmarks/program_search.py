"""Program search throughput and the sandbox's cost per evaluation (issue 14).

1. Sandbox overhead: the same candidate function (the cap-set greedy of the shipped skeleton,
   n = --n; a cascade of a precheck and the main input, so two children per evaluation)
   evaluated through ``graded.search.program.evaluate`` (fresh child processes, limits,
   namespaces when available, JSON round trip, trusted verifier) against calling it and
   verifying it in-process; overhead = median(sandboxed) − median(in-process). Measured cold
   (evaluations back to back: every child starts and imports numpy on the clock) and warm
   (--gap seconds of other work between evaluations, as verification and proposals give in a
   search, so the sandbox's spare children are ready). Target: ≤ 100 ms.
2. Throughput: evaluations per second of the search loop (offline proposer, process pool of
   --workers) over --budget evaluations.

    .venv/bin/python benchmarks/program_search.py               # n = 4, 30 rounds, budget 100
    .venv/bin/python benchmarks/program_search.py --quick       # tiny smoke run
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import interleaved, machine

from graded.search.program.database import DatabaseConfig
from graded.search.program.engine import SearchConfig, run_search
from graded.search.program.evaluate import evaluate
from graded.search.program.offline import OfflineProposer
from graded.search.program.problem import get_problem
from graded.search.program.program import parse_skeleton
from graded.search.program.sandbox import detect_isolation


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--budget", type=int, default=100)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--gap", type=float, default=0.5,
                    help="seconds of other work between evaluations in the warm measurement")
    ap.add_argument("--quick", action="store_true",
                    help="n = 3, 2 rounds, gap 0.1 s, budget 4: checks it runs")
    args = ap.parse_args()
    if args.quick:
        args.n, args.rounds, args.budget, args.gap = 3, 2, 4, 0.1

    problem = get_problem("cap-set", n=args.n)
    skeleton = parse_skeleton(problem.skeleton)
    namespace: dict = {}
    exec(compile(skeleton.assemble(skeleton.initial), "candidate.py", "exec"), namespace)

    def in_process():
        return [problem.score(x, namespace[problem.entry](x)) for x in problem.inputs]

    def sandboxed():
        result = evaluate(problem, skeleton.initial, skeleton=skeleton)
        assert result.ok, result.reason
        return result

    # cold: evaluations back to back, so every child starts (and imports numpy) on the clock
    times = interleaved({"in-process": in_process, "sandboxed": sandboxed},
                        rounds=args.rounds, warmup=1)
    overhead_ms = 1000 * (times["sandboxed"] - times["in-process"])
    # warm: as in a search, other work (verification, proposals) separates evaluations, and
    # the sandbox's spare children are ready when the next evaluation starts
    warm, local = [], []
    for _ in range(args.rounds):
        time.sleep(args.gap)
        t = time.perf_counter()
        sandboxed()
        warm.append(time.perf_counter() - t)
        t = time.perf_counter()
        in_process()
        local.append(time.perf_counter() - t)
    warm_overhead_ms = 1000 * (statistics.median(warm) - statistics.median(local))

    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        result = run_search(problem, OfflineProposer(seed=0),
                            SearchConfig(budget=args.budget, workers=args.workers, seed=0,
                                         database=DatabaseConfig(islands=2)),
                            out=Path(folder) / "run")
        elapsed = time.perf_counter() - start
        with open(Path(folder) / "run" / "evaluations.csv", newline="") as f:
            seconds = [float(row["seconds"]) for row in csv.DictReader(f)]
    out = {
        "machine": machine(),
        "isolation": detect_isolation().description,
        "n": args.n,
        "in_process_ms": round(1000 * times["in-process"], 2),
        "sandboxed_ms": round(1000 * times["sandboxed"], 2),
        "cold_overhead_ms_median": round(overhead_ms, 1),
        "warm_sandboxed_ms": round(1000 * statistics.median(warm), 2),
        "warm_overhead_ms_median": round(warm_overhead_ms, 1),
        "gap_s": args.gap,
        "target_overhead_ms": 100,
        "search_evaluations": result.evaluations,
        "search_seconds": round(elapsed, 2),
        "evaluations_per_second": round(result.evaluations / elapsed, 2),
        "median_evaluation_s": round(statistics.median(seconds), 3),
        "workers": args.workers,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
