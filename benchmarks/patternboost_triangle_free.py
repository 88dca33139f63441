"""PatternBoost on triangle-free graphs (003 §3.3) beside its local-only baseline.

For each seed, runs PatternBoost until it reaches Mantel's bound ⌊n²/4⌋ (100 for n = 20) or
the time limit, then the local-only baseline (local search from the empty graph, 003 §3.3)
with the same time limit, and optionally the global-only baseline with as many rounds. Writes
the runs under --out, figures of best score against local-search calls and against seconds,
and prints a Markdown table (calls and seconds until the bound is reached).

    nice -n 10 python benchmarks/patternboost_triangle_free.py --n 20 --workers 2 \
        --time-limit 900 --seeds 0 1 2 --figure docs/figures/patternboost_triangle_free.png

`--quick` runs a tiny version (n = 8, seconds) to check that the script works.

`--step-cost` runs no search: it times one training step (the run's defaults: batch 64, a
2-layer, 4-head, width-64 model) on the best K = 500 of 2000 local-search graphs encoded
4 bits per token and 1 bit per token (the raw upper-triangle string), side by side.

    nice -n 10 python benchmarks/patternboost_triangle_free.py --n 20 --step-cost
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from graded.search.patternboost import PatternBoostConfig, mantel_bound, run_patternboost
from graded.search.patternboost.parallel import make_executor
from graded.search.patternboost.records import plot_comparison


def first_reaching(rows: list[dict], target: float, column: str) -> float | None:
    for row in rows:
        if row["best"] >= target:
            return float(row[column])
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=20, help="vertices (default 20)")
    p.add_argument("--time-limit", type=float, default=900.0,
                   help="seconds of round work for PatternBoost (default 900 = 15 minutes)")
    p.add_argument("--workers", type=int, default=2, help="local-search processes (default 2)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="random seeds (default 0)")
    p.add_argument("--out", type=Path, default=Path("runs/bench_patternboost_triangle_free"),
                   help="folder for the runs (replaced)")
    p.add_argument("--figure", type=Path, default=None,
                   help="write the comparison PNG here (and <name>_time.png against seconds)")
    p.add_argument("--global-only", action="store_true",
                   help="also run the global-only baseline for as many rounds")
    p.add_argument("--quick", action="store_true", help="tiny sizes, to check the script")
    p.add_argument("--report-only", action="store_true",
                   help="do not run: redraw the figures and table from the runs under --out")
    p.add_argument("--step-cost", action="store_true",
                   help="do not search: time a training step at 4 bits per token against the "
                        "raw 1-bit string, side by side")
    args = p.parse_args()

    n = 8 if args.quick else args.n
    if args.step_cost:
        step_cost(n, quick=args.quick)
        return
    optimum = mantel_bound(n)
    common = dict(problem="triangle-free", n=n, problem_options={"bits_per_token": 4},
                  workers=args.workers, progress=not args.quick, stop_at=optimum)
    if args.quick:
        common.update(initial=50, keep=20, database_size=100, samples=50, train_steps=20,
                      batch_size=16, model={"d_model": 16, "n_heads": 2, "n_layers": 1,
                                            "d_ff": 32})
    runs: dict[str, list[dict]] = {}
    walls: dict[str, float] = {}
    if args.report_only:
        for seed in args.seeds:
            for mode, label in (("patternboost", "PatternBoost"), ("local-only", "local-only"),
                                ("global-only", "global-only")):
                state = args.out / f"{mode}-seed{seed}" / "state.json"
                if state.exists():
                    runs[f"{label}, seed {seed}"] = json.loads(state.read_text())["metrics"]
        report(args, n, optimum, runs, walls)
        return
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)

    executor = make_executor(args.workers)  # one pool for every run
    for seed in args.seeds:
        started = time.perf_counter()
        pb = run_patternboost(
            PatternBoostConfig(**common, seed=seed, rounds=2 if args.quick else 10_000,
                               time_limit_s=args.time_limit),
            args.out / f"patternboost-seed{seed}", executor=executor)
        walls[f"PatternBoost, seed {seed}"] = time.perf_counter() - started
        runs[f"PatternBoost, seed {seed}"] = pb.metrics
        # the baseline gets PatternBoost's full budget, whether or not PatternBoost used it all
        budget = args.time_limit
        started = time.perf_counter()
        local = run_patternboost(
            PatternBoostConfig(**common, seed=seed, mode="local-only", rounds=10**6,
                               time_limit_s=budget),
            args.out / f"local-only-seed{seed}", executor=executor)
        walls[f"local-only, seed {seed}"] = time.perf_counter() - started
        runs[f"local-only, seed {seed}"] = local.metrics
        if args.global_only:
            glob = run_patternboost(
                PatternBoostConfig(**common, seed=seed, mode="global-only",
                                   rounds=max(1, pb.rounds_done)),
                args.out / f"global-only-seed{seed}", executor=executor)
            runs[f"global-only, seed {seed}"] = glob.metrics

    if executor is not None:
        executor.shutdown()
    report(args, n, optimum, runs, walls)


def step_cost(n: int, *, quick: bool) -> None:
    """Seconds per training step with 4 and with 1 bit per token, timed in alternation.

    The training set is the engine's: the best K distinct graphs of 2000 local searches from
    the empty graph (K = 500, as `--keep`), encoded both ways; the models are the run's default
    one, each with its own vocabulary and length. One call is `--train-steps`-like: a fresh
    AdamW and `steps` steps, as a round trains, so the per-round set-up is counted too.
    """
    import numpy as np
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _timing import interleaved, machine

    from graded.search.patternboost import PatternBoostConfig as Config
    from graded.search.patternboost.graphs import TriangleFree
    from graded.search.patternboost.model import SpecialTokens, build_model, train_on_sequences

    cfg = Config()  # the run's defaults: keep, batch size, lr, model
    initial, keep, steps, rounds = (50, 20, 2, 3) if quick else (cfg.initial, cfg.keep, 20, 15)
    rng = np.random.default_rng(0)
    graphs, raw_problem = {}, TriangleFree(n, 1)
    for _ in range(initial):
        g = raw_problem.local_search(raw_problem.empty(), rng)
        graphs.setdefault(g.tobytes(), g)
    best = sorted(graphs.values(), key=lambda g: -int(g.sum()))[:keep]
    candidates, lengths = {}, {}
    for bits in (4, 1):
        problem = TriangleFree(n, bits)
        special = SpecialTokens(problem.vocab_size)
        model = build_model(problem.vocab_size, problem.max_length, cfg.model, seed=0)
        seqs = [problem.encode(g) for g in best]
        gen = torch.Generator().manual_seed(0)
        label = f"{bits} bit{'s' if bits > 1 else ''} per token"
        lengths[label] = problem.max_length
        candidates[label] = (lambda model=model, seqs=seqs, special=special, gen=gen:
                             train_on_sequences(model, seqs, special, steps=steps,
                                                batch_size=cfg.batch_size, lr=cfg.lr,
                                                weight_decay=cfg.weight_decay, generator=gen))
    times = interleaved(candidates, rounds=rounds, warmup=1)
    print(f"\ntriangle-free n = {n}: {n * (n - 1) // 2} upper-triangle bits, best {len(best)} "
          f"of {initial} local searches, batch {cfg.batch_size}, model {cfg.model}, "
          f"{steps} steps per call, median of {rounds} alternating calls; {machine()}\n")
    print("| encoding | tokens per object | ms per training step | relative |")
    print("|---|---|---|---|")
    raw = times["1 bit per token"]
    for label, seconds in times.items():
        print(f"| {label} | {lengths[label]} | {1e3 * seconds / steps:.2f} | "
              f"{seconds / raw:.2f} |")


def report(args: argparse.Namespace, n: int, optimum: int, runs: dict[str, list[dict]],
           walls: dict[str, float]) -> None:
    """Figures (if --figure) and the Markdown table."""
    if args.figure is not None:
        args.figure.parent.mkdir(parents=True, exist_ok=True)
        title = f"triangle-free graphs, n={n} (Mantel bound {optimum})"
        plot_comparison(args.figure, runs, x="local_search_calls", title=title, optimum=optimum,
                        log_x=True)
        plot_comparison(args.figure.with_name(args.figure.stem + "_time.png"), runs,
                        x="elapsed_s", title=title, optimum=optimum)

    print(f"\nn = {n}, Mantel bound {optimum}, time limit {args.time_limit:g} s per run, "
          f"{args.workers} local-search workers\n")
    print("| run | best | rounds | local-search calls | calls to reach bound | "
          "round-work s to reach bound | wall s |")
    print("|---|---|---|---|---|---|---|")
    for label, rows in runs.items():
        calls = first_reaching(rows, optimum, "local_search_calls")
        secs = first_reaching(rows, optimum, "elapsed_s")
        wall = walls.get(label)
        print(f"| {label} | {rows[-1]['best']:g} | {rows[-1]['round']} | "
              f"{rows[-1]['local_search_calls']} | {'-' if calls is None else int(calls)} | "
              f"{'-' if secs is None else f'{secs:.0f}'} | "
              f"{'-' if wall is None else f'{wall:.0f}'} |")


if __name__ == "__main__":
    main()
