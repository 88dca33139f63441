"""What the graded recipes' grade learning-rate cap changes: ``lr_bound: paper`` against ``off``.

The recipes ``lgt-alg5.1`` and ``egt-alg7.1`` cap the grades' learning rate below 1/q_max (LGT)
or 1/(λ_t^{q_max} ln λ_t) (EGT) at every step (``recipe.lr_bound: paper``); the bound was derived
for plain gradient steps, not for the AdamW the trainer uses. This trains the Dyck-2 config
(``configs/dyck.yaml``: next-token prediction, grade = nesting depth) with learnable grades
started near neutral (``grade_init: warm_start``, q_k = c·k), for each grading and seed once
with the cap and once without (everything else equal), and reports the final evaluation loss
and token accuracy of both, their difference, and how far the cap sat below the scheduled
grade learning rate (``grade_lr`` against the scheduled rate in ``metrics.csv``: the share of
logged steps at which it bound). ``--grade-lr`` raises the grades' rate to where the cap binds.

    python benchmarks/lr_bound.py                       # 300 steps, seeds 0 1 2, LGT and EGT
    python benchmarks/lr_bound.py --grade-lr 3.0        # the grades' rate where the cap binds
    python benchmarks/lr_bound.py --quick               # a smoke run (seconds)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _timing import machine, table

from graded.config import build_run, load_config
from graded.train.logging import read_metrics

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "dyck.yaml"


def train(grading: str, seed: int, lr_bound: str, args: argparse.Namespace,
          folder: Path) -> dict[str, float]:
    """One run of the Dyck config; its final evaluation metrics and the cap's share of the
    logged steps (grade_lr below the scheduled lr)."""
    name = f"{grading}-{seed}-{lr_bound}"
    overrides = [f"name={name}", f"seed={seed}", f"model.grading={grading}",
                 "model.learnable_grades=true", "model.grade_init=warm_start",
                 f"model.grade_init_value={args.grade_init_value}",
                 f"recipe.options.lr_bound={lr_bound}", f"train.steps={args.steps}",
                 f"train.eval_every={args.steps}", f"train.warmup_steps={args.steps // 6}",
                 *([] if args.grade_lr is None else [f"train.grade_lr={args.grade_lr}"]),
                 "train.progress=false", f"output.dir={folder}", "output.plots=false",
                 *args.data]
    cfg = load_config(CONFIG, overrides)
    run_dir = cfg.run_dir()
    parts = build_run(cfg, run_dir)
    try:
        with parts.trainer.run.lock():
            result = parts.trainer.fit()
    finally:
        parts.trainer.close()
    logged = read_metrics(run_dir)["train"]
    ratio = (cfg.train.grade_lr or cfg.train.lr) / cfg.train.lr  # the grades' rate over lr's
    scheduled = {step: lr * ratio for step, lr in logged["lr"]}
    capped = [step for step, grade_lr in logged["grade_lr"]
              if step in scheduled and grade_lr < scheduled[step] * (1 - 1e-6)]
    return {"loss": result.final_eval["loss"],
            "token_accuracy": result.final_eval["token_accuracy"],
            "capped": len(capped) / max(len(logged["grade_lr"]), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--gradings", nargs="+", choices=["linear", "exponential"],
                        default=["linear", "exponential"])
    parser.add_argument("--grade-init-value", type=float, default=0.01,
                        help="c of the warm start q_k = c·k (near neutral)")
    parser.add_argument("--grade-lr", type=float, default=None,
                        help="the grades' peak learning rate (train.grade_lr; default: train.lr)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 8 steps, seed 0, the LGT, 256 training examples")
    args = parser.parse_args()
    args.data = []
    if args.quick:
        args.steps, args.seeds, args.gradings = 8, [0], ["linear"]
        args.data = ["task.n_train=256", "task.n_eval=64"]
    grade_lr = "train.lr" if args.grade_lr is None else args.grade_lr
    print(f"# lr_bound paper vs off: {CONFIG.name}, {args.steps} steps, learnable grades from "
          f"q_k = {args.grade_init_value}·k, grade learning rate {grade_lr}, seeds {args.seeds}; "
          f"{machine()}")
    rows, gaps = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for grading in args.gradings:
            for seed in args.seeds:
                on = train(grading, seed, "paper", args, Path(tmp))
                off = train(grading, seed, "off", args, Path(tmp))
                gap = on["loss"] - off["loss"]
                gaps.append(abs(gap))
                rows.append([grading, str(seed), f"{on['loss']:.4f}", f"{off['loss']:.4f}",
                             f"{gap:+.4f}", f"{on['token_accuracy']:.4f}",
                             f"{off['token_accuracy']:.4f}", f"{on['capped']:.0%}"])
    print(table(["grading", "seed", "eval loss, capped", "eval loss, off", "difference",
                 "token acc., capped", "token acc., off", "steps capped"], rows))
    print(f"largest |difference| {max(gaps):.4f}, median {statistics.median(gaps):.4f}")


if __name__ == "__main__":
    main()
