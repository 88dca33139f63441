"""Variable-k modular addition (004 §5.3.1, App. A.3): routing must pick the adder from context.

Trains the two-layer morphic model of ``graded.morphic.tasks.adder`` on [x, ADD_k, =] → (x+k) mod p
and evaluates with context-only routing (``model(ids)``: no targets). Prints training time, answer
accuracy, routing accuracy, and for comparison the routing accuracy of the utility-augmented
logits ℓ̃ (which need the targets). ``--tool external`` swaps the internal adders A_k for a Python
calculator wrapped as Enc ∘ calculator ∘ Dec (a non-differentiable block).

    OMP_NUM_THREADS=2 nice .venv/bin/python benchmarks/morphic_variable_k.py --tool both
    .venv/bin/python benchmarks/morphic_variable_k.py --quick     # smoke run
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from graded.morphic.tasks import VariableAdditionTask, build_adder_model, evaluate_adder
from graded.morphic.training import train_morphic


def run(*, tool: str = "internal", p: int = 11, shifts: tuple[int, ...] = (1, 2, 3, 4),
        steps: int = 400, batch: int = 64, lr: float = 0.01, seed: int = 0,
        report_dir: str | None = None) -> dict[str, float]:
    task = VariableAdditionTask(p, shifts)
    torch.manual_seed(seed)
    model = build_adder_model(task, tool=tool)

    def batches(g: torch.Generator):
        ids, targets, _ = task.sample(batch, g)
        return ids, targets

    start = time.perf_counter()
    result = train_morphic(model, batches, steps=steps, lr=lr, seed=seed, log_every=steps,
                           keep_initial=report_dir is not None)
    seconds = time.perf_counter() - start
    metrics = evaluate_adder(model, task)
    # a fresh random sample as well, in case the user changes p so that all_examples is large
    ids, targets, adder = task.sample(2048, torch.Generator().manual_seed(seed + 1))
    sampled = evaluate_adder(model, task, (ids, targets, adder))
    if report_dir is not None:
        from graded.morphic.diagnostics import write_report

        ex_ids, ex_targets, _ = task.all_examples()
        write_report(model, [(ex_ids, ex_targets)], report_dir, before=result.initial_model)
    return {"tool": tool, "p": p, "adders": len(shifts), "steps": steps, "batch": batch,
            "seconds": seconds, **metrics,
            "sampled_answer_accuracy": sampled["answer_accuracy"],
            "sampled_routing_accuracy": sampled["routing_accuracy"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tool", choices=["internal", "external", "both"], default="both")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--report", default=None, help="write diagnostics (PNG + JSON) here")
    ap.add_argument("--quick", action="store_true", help="20 steps, to check the script runs")
    args = ap.parse_args()
    if args.quick:
        args.steps = 20
    torch.set_num_threads(args.threads)
    tools = ["internal", "external"] if args.tool == "both" else [args.tool]
    for tool in tools:
        report = f"{args.report}/{tool}" if args.report else None
        print(json.dumps(run(tool=tool, steps=args.steps, seed=args.seed, report_dir=report)))


if __name__ == "__main__":
    main()
