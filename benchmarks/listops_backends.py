"""ListOps at sequence length >= 512: the fused kernel against every efficient backend under
one training budget (issue: efficient attention, SPEC C8).

Every backend trains the same model (same seed, data, steps, optimiser) on the same ListOps
split through the library's trainer; only ``model.attn_backend`` differs. Prints and writes a
Markdown table of test accuracy and training time beside the majority-class baseline and Long
Range Arena's published ListOps figures.

    python benchmarks/listops_backends.py --out runs/listops_backends
    python benchmarks/listops_backends.py --quick            # a smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _timing import machine, parse_with_quick, table

from graded.config import build_run, validate_config
from graded.kinds import run_baselines

BACKENDS = ["full", "chunked", "sliding_window", "dilated", "sparse_fixed", "block_sparse",
            "bigbird", "linear", "performer", "linformer", "lsh"]

# Tay et al. 2021 (Long Range Arena), Table 1, ListOps accuracy at length up to 2K.
LRA = {"full": 36.37, "linformer": 35.70, "performer": 18.01, "linear": 16.13,
       "sliding_window": 15.82, "block_sparse": 17.07, "bigbird": 36.05, "lsh": 37.27}
LRA_NAMES = {"full": "Transformer", "linformer": "Linformer", "performer": "Performer",
             "linear": "Linear Trans.", "sliding_window": "Local Attention",
             "block_sparse": "Sparse Trans.", "bigbird": "BigBird", "lsh": "Reformer"}


def backend_options(name: str, max_len: int, block: int) -> dict:
    if name == "linformer":
        return {"max_len": max_len, "rank": 64}
    if name == "block_sparse":
        n = -(-max_len // block)
        layout = [[abs(i - j) <= 1 or i == 0 or j == 0 for j in range(n)] for i in range(n)]
        return {"layout": layout, "block_size": block}
    if name == "performer":
        return {"ignore_dropout": True}
    if name == "sparse_fixed":  # l ≈ √T, as the Sparse Transformer takes it
        stride = 2 ** round(math.log2(math.sqrt(max_len)))
        return {"block": stride, "summary": max(1, stride // 8)}
    return {}


def config(backend: str, args: argparse.Namespace, max_len: int) -> dict:
    return {
        "name": f"listops-{backend}",
        "seed": args.seed,
        "task": {"name": "listops",
                 "options": {"min_length": args.min_length, "max_length": args.max_length,
                             "max_depth": args.depth, "max_args": 10},
                 "n_train": args.n_train, "n_eval": args.n_eval},
        "model": {"d_model": args.d_model, "n_heads": 4, "n_layers": args.layers,
                  "d_ff": 2 * args.d_model, "positional": "learned", "pooling": "mean",
                  "attn_backend": backend,
                  "attn_backend_options": backend_options(backend, max_len, 64)},
        "recipe": "plain",
        "train": {"steps": args.steps, "batch_size": args.batch, "lr": 1e-3,
                  "warmup_steps": max(args.steps // 10, 1), "eval_every": args.steps,
                  "monitor": "accuracy", "monitor_mode": "max", "progress": False,
                  "tensorboard": False},
        "output": {"dir": str(args.out), "overwrite": True},
    }


QUICK = {"steps": 2, "batch": 8, "n_train": 32, "n_eval": 16, "min_length": 64,
         "max_length": 96, "depth": 3}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/listops_backends"))
    parser.add_argument("--backends", nargs="+", default=BACKENDS, choices=BACKENDS)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--n-train", dest="n_train", type=int, default=4000)
    parser.add_argument("--n-eval", dest="n_eval", type=int, default=500)
    parser.add_argument("--min-length", dest="min_length", type=int, default=512)
    parser.add_argument("--max-length", dest="max_length", type=int, default=640)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--d-model", dest="d_model", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true",
                        help=f"tiny budget smoke run (sets {', '.join(QUICK)} where not given)")
    return parse_with_quick(parser, argv, QUICK)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows, results, baseline = [], {}, None
    for backend in args.backends:
        cfg = validate_config(config(backend, args, _max_len(args)))
        parts = build_run(cfg, args.out / cfg.name)
        if baseline is None:
            baseline = run_baselines(parts.train, parts.test)
        start = time.perf_counter()
        result = parts.trainer.fit()
        elapsed = time.perf_counter() - start
        acc = 100 * result.final_eval["accuracy"]
        results[backend] = {"accuracy": acc, "seconds": elapsed}
        lra = f"{LRA[backend]:.2f} ({LRA_NAMES[backend]})" if backend in LRA else "-"
        rows.append([backend, f"{acc:.2f}", f"{elapsed:.0f}", lra])
        print(f"{backend}: accuracy {acc:.2f}% in {elapsed:.0f}s", flush=True)
    majority = 100 * baseline.get("majority", float("nan"))
    text = "\n".join([
        f"# ListOps, length {args.min_length}-{args.max_length}, {args.steps} steps × batch "
        f"{args.batch}, d_model {args.d_model}, {args.layers} layers ({machine()})", "",
        table(["backend", "test accuracy %", "train s", "LRA ListOps % (len 2K)"], rows), "",
        f"Majority class: {majority:.2f}%. Baselines: "
        + ", ".join(f"{k} {100 * v:.2f}%" for k, v in baseline.items()),
    ])
    (args.out / "report.md").write_text(text + "\n")
    (args.out / "results.json").write_text(json.dumps(
        {"results": results, "baselines": baseline, "args": vars(args) | {"out": str(args.out)}},
        indent=2))
    print(text)


def _max_len(args: argparse.Namespace) -> int:
    from graded.tasks import get_task

    task = get_task("listops", min_length=args.min_length, max_length=args.max_length,
                     max_depth=args.depth, max_args=10)
    return task.info()["max_len"]


if __name__ == "__main__":
    main()
