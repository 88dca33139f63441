"""How often the claims study's intervals cover the true mean: the percentile bootstrap alone,
the Student t interval alone, and their hull (the study's interval,
``graded.study.statistics.mean_interval``), over simulated samples of k normal replicates.

The figures of docs/study.md ("The verdict rule"):

    .venv/bin/python benchmarks/interval_coverage.py            # 4,000 samples at k = 5 and 10
    .venv/bin/python benchmarks/interval_coverage.py --quick    # 50 samples, a smoke run

Each sample draws k values from N(0, 1) (numpy's generator, seeded by --seed) and asks whether
each interval holds 0; a sample's bootstrap uses the study's 10,000 resamples and seed 0. The
coverage's own standard error is √(p(1 − p)/samples): about 0.6 points at 4,000 samples.
"""

from __future__ import annotations

import argparse

import numpy as np

from graded.study.statistics import mean_interval


def coverage(k: int, samples: int, seed: int) -> dict[str, float]:
    """The fraction of ``samples`` samples of ``k`` standard normal values whose percentile
    bootstrap, t and hull intervals hold the true mean 0."""
    rng = np.random.default_rng(seed)
    held = {"bootstrap": 0, "t": 0, "hull": 0}
    for _ in range(samples):
        iv = mean_interval(rng.standard_normal(k))
        held["bootstrap"] += iv.bootstrap[0] <= 0 <= iv.bootstrap[1]
        held["t"] += iv.t[0] <= 0 <= iv.t[1]
        held["hull"] += iv.low <= 0 <= iv.high
    return {name: n / samples for name, n in held.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50 samples per k")
    parser.add_argument("--samples", type=int, default=4000, help="simulated samples per k")
    parser.add_argument("--k", type=int, nargs="+", default=[5, 10], help="replicates per sample")
    parser.add_argument("--seed", type=int, default=0, help="seed of the simulated samples")
    args = parser.parse_args()
    if args.samples < 1 or min(args.k) < 2:
        parser.error(f"--samples must be at least 1 and every --k at least 2, got "
                     f"{args.samples} and {args.k}")
    samples = 50 if args.quick else args.samples
    print(f"# coverage of the mean over {samples} samples of k N(0, 1) replicates "
          f"(seed {args.seed}; 95% intervals)")
    print("| k | percentile bootstrap | t interval | hull (the study's) |")
    print("|---|---|---|---|")
    for k in args.k:
        c = coverage(k, samples, args.seed)
        print(f"| {k} | {c['bootstrap']:.1%} | {c['t']:.1%} | {c['hull']:.1%} |")


if __name__ == "__main__":
    main()
